"""The grammar a request's output must follow, made from its constraint and checked."""

from __future__ import annotations

from typing import Any

from edgeinfer.prompt.grammar import (
    check_gbnf,
    check_generated,
    json_object_gbnf,
    schema_to_gbnf,
    tool_calls_gbnf,
)
from edgeinfer.prompt.tools import TOOL_CALL_TRIGGER
from edgeinfer.service.request import Constraint

MAX_PARALLEL_CALLS = 4


def grammar_for(vocab: Any, c: Constraint) -> tuple[str | None, tuple[str, ...]]:
    """(GBNF, lazy trigger words) for a constraint; (None, ()) when there is none.

    Blocking (schema conversion, grammar parsing by llama.cpp): run it off the event
    loop, holding the model (``ServedModel.run``). Raises InvalidRequest (400) for
    what cannot be turned into a grammar or is over the grammar budget.
    """
    if c.grammar is not None:
        check_gbnf(vocab, c.grammar)
        return c.grammar, ()
    if c.json_schema is not None:
        gbnf = schema_to_gbnf(c.json_schema, "response_format.json_schema.schema")
        check_generated(vocab, gbnf, "response_format")
        return gbnf, ()
    if c.json_object:
        gbnf = json_object_gbnf()
        check_generated(vocab, gbnf, "response_format")
        return gbnf, ()
    if not c.offers_tools:
        return None, ()
    named = [t for t in c.tools if t.name == c.tool_choice]
    chosen = named or list(c.tools)
    # parallel: at most one call per tool (a small model repeats a lone call endlessly)
    calls = min(MAX_PARALLEL_CALLS, len(chosen)) if c.parallel_tool_calls and not named else 1
    gbnf = tool_calls_gbnf([(t.name, t.parameters) for t in chosen], calls)
    check_generated(vocab, gbnf, "tools")
    return gbnf, ((TOOL_CALL_TRIGGER,) if c.tool_choice == "auto" else ())
