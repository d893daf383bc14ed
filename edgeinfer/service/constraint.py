"""The grammar a request's output must follow, made from its constraint and checked."""

from __future__ import annotations

from typing import Any

from edgeinfer.prompt.callgrammar import tool_calls_gbnf
from edgeinfer.prompt.grammar import (
    after_marker,
    check_gbnf,
    check_generated,
    either,
    json_object_gbnf,
    schema_to_gbnf,
)
from edgeinfer.prompt.toolformat import GENERIC, ToolFormat
from edgeinfer.service.request import Constraint

MAX_PARALLEL_CALLS = 4


def _grammar(vocab: Any, c: Constraint, fmt: ToolFormat) -> tuple[str | None, tuple[str, ...]]:
    """``grammar_for`` without the ``after`` marker."""
    if c.grammar is not None:
        check_gbnf(vocab, c.grammar)
        return c.grammar, ()
    answer = None
    if c.json_schema is not None:
        answer = schema_to_gbnf(c.json_schema, c.schema_param)
    elif c.json_object:
        answer = json_object_gbnf()
    if answer is not None:
        check_generated(vocab, answer, "response_format")
    if not c.offers_tools:
        return answer, ()
    named = [t for t in c.tools if t.name == c.tool_choice]
    chosen = named or list(c.tools)
    # parallel: the same tool may be called again (calls that repeat are dropped as read)
    calls = MAX_PARALLEL_CALLS if c.parallel_tool_calls and not named else 1
    lazy = c.tool_choice == "auto" and answer is None  # started by the format's trigger
    offered = [(t.name, t.parameters) for t in chosen]
    if lazy and fmt.decline:  # (Command R+) the template's way of calling no tool
        offered.append((fmt.decline, {"type": "object", "properties": {}}))
    gbnf = tool_calls_gbnf(offered, calls, fmt=fmt, lazy=lazy)
    check_generated(vocab, gbnf, "tools")
    if c.tool_choice != "auto":  # a forced call: the answer's format is for a later turn
        return gbnf, ()
    if answer is not None:  # calls, or the answer in its format, from the first token
        both = either(gbnf, answer)
        check_generated(vocab, both, "tools")
        return both, ()
    if fmt.messages:  # Muse Glimmer: a message to a tool starts a call (the markup in one
        return gbnf, tuple(fmt.header(t.name) for t in chosen)  # to user or self: text)
    if fmt.text_name:  # Functionary: ">>>NAME" starts a call, ">>>all" the answer's text
        return gbnf, tuple(fmt.call_open + t.name for t in chosen)
    return gbnf, fmt.triggers


def grammar_for(vocab: Any, c: Constraint, after: str | None = None,
                fmt: ToolFormat = GENERIC) -> tuple[str | None, tuple[str, ...]]:
    """(GBNF, lazy trigger words) for a constraint; (None, ()) when there is none.

    ``after``: a marker the output writes before the constraint applies (the end of a
    reasoning block the prompt left open): the grammar is then lazy, triggered by it.
    ``fmt``: the model's tool-call format (calls are forced in its syntax).
    Blocking (schema conversion, grammar parsing by llama.cpp): run it off the event
    loop, holding the model (``ServedModel.run``). Raises InvalidRequest (400) for
    what cannot be turned into a grammar or is over the grammar budget.
    """
    gbnf, triggers = _grammar(vocab, c, fmt)
    if gbnf is None or after is None or triggers:
        return gbnf, triggers  # a lazy tool grammar already waits for its own marker
    wrapped = after_marker(gbnf, after)
    check_generated(vocab, wrapped, "response_format" if c.grammar is None else "grammar")
    return wrapped, (after,)
