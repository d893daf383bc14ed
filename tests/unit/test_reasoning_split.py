"""Reasoning blocks split from the answer, whole and cut at every position while streaming."""

from __future__ import annotations

import pytest

from edgeinfer.prompt.reasoning import (
    ReasoningSplit,
    Said,
    Thought,
    splits,
    starts_in_thought,
)


def split(text: str, in_thought: bool = False, cuts: tuple[int, ...] = ()) -> tuple[str, str]:
    s = ReasoningSplit(in_thought)
    events = []
    last = 0
    for c in (*cuts, len(text)):
        events += s.feed(text[last:c])
        last = c
    events += s.finish()
    thought = "".join(e.text for e in events if isinstance(e, Thought))
    said = "".join(e.text for e in events if isinstance(e, Said))
    return thought, said


CASES = [
    ("<think>Let me see.</think>\n\nThe answer is 4.", False, ("Let me see.", "The answer is 4.")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("Plain answer, no thinking.", False, ("", "Plain answer, no thinking.")),
    ("The tag <think> later is text", False, ("", "The tag <think> later is text")),
    ("<", False, ("", "<")),
    ("<thi", False, ("", "<thi")),
    ("still thinking when cut off", True, ("still thinking when cut off", "")),
    ("reasoning</think>answer", True, ("reasoning", "answer")),
    ("x < y </thin k></think>ok</think>", True, ("x < y </thin k>", "ok</think>")),
    ("<think></think>", False, ("", "")),
    ("<think>a</think>   ", False, ("a", "")),
    # a bare end of no block first (MiniMax M3 answers so without reasoning): dropped
    ("</think>\n\nThe answer.", False, ("", "The answer.")),
    ("</thi", False, ("", "</thi")),
]


@pytest.mark.parametrize(("text", "in_thought", "expected"), CASES)
def test_whole_outputs(text: str, in_thought: bool, expected: tuple[str, str]) -> None:
    assert split(text, in_thought) == expected


@pytest.mark.parametrize(("text", "in_thought", "expected"), CASES)
def test_every_single_cut_and_every_character_alone_give_the_same(
        text: str, in_thought: bool, expected: tuple[str, str]) -> None:
    for cut in range(len(text) + 1):
        assert split(text, in_thought, (cut,)) == expected, cut
    assert split(text, in_thought, tuple(range(1, len(text)))) == expected


def test_no_marker_leaks_while_streaming() -> None:
    s = ReasoningSplit()
    pieces = ["<th", "ink>pla", "n</th", "ink>\n", "Do", " it"]
    seen = [e for p in pieces for e in s.feed(p)] + s.finish()
    assert all("<" not in e.text for e in seen)
    assert [type(e) for e in seen] == [Thought, Thought, Said, Said]


def test_format_choice() -> None:
    thinking_template = "{% if enable_thinking %}<think>{% endif %}"
    assert splits("auto", thinking_template) and not splits("auto", "{{ messages }}")
    assert splits("deepseek", "{{ messages }}")
    assert not splits("none", thinking_template)
    assert starts_in_thought("<|im_start|>assistant\n<think>\n")
    assert not starts_in_thought("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_cohere_thinking_blocks_are_split() -> None:
    """Command R7B / A write ``<|START_THINKING|> ... <|END_THINKING|>`` (Command A's
    generation prompt leaves it open)."""
    from edgeinfer.prompt.reasoning import COHERE_THINK, ReasoningSplit, markers_for
    source = "<|CHATBOT_TOKEN|>{% if thinking %}<|START_THINKING|>{% endif %}"
    assert markers_for("auto", source) == COHERE_THINK
    assert starts_in_thought("<|CHATBOT_TOKEN|><|START_THINKING|>", COHERE_THINK)
    s = ReasoningSplit(True, COHERE_THINK)
    seen = s.feed("I should call it.<|END_") + s.feed("THINKING|>Done.") + s.finish()
    assert "".join(e.text for e in seen if isinstance(e, Thought)) == "I should call it."
    assert "".join(e.text for e in seen if isinstance(e, Said)) == "Done."


def test_a_call_marker_ends_an_open_block_when_the_call_grammar_starts_there() -> None:
    """Kimi K2 Thinking may write its calls without closing its reasoning; with a lazy call
    grammar (tool_choice auto) the call is constrained from its marker on, so the block
    ends there and the call is read, whole and streamed alike. Without that grammar (a
    forced call waits for the block's end) the marker stays reasoning."""
    from edgeinfer.engine.delta import Delta
    from edgeinfer.prompt.reasoning import THINK
    from edgeinfer.prompt.toolformat import KIMI_K2
    from edgeinfer.service.events import ReasoningDelta, ToolCallDelta
    from edgeinfer.service.reader import ChoiceReader, Reading
    text = ("I will look it up.<|tool_calls_section_begin|><|tool_call_begin|>functions."
            'get_weather:0<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|>'
            "<|tool_calls_section_end|>")
    for ends in (True, False):
        reading = Reading(tools=KIMI_K2, markers=THINK, in_thought=True,
                          calls_end_thought=ends)
        for pieces in ([text], list(text)):
            reader = ChoiceReader(0, reading)
            events = [e for k, p in enumerate(pieces) for e in reader.read(Delta(
                p, finish_reason="stop" if k == len(pieces) - 1 else None))]
            thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
            calls = [e for e in events if isinstance(e, ToolCallDelta)]
            if ends:
                assert thought == "I will look it up."
                assert [c.name for c in calls if c.name] == ["get_weather"]
                assert "".join(c.arguments for c in calls) == '{"city": "Oslo"}'
            else:
                assert thought == text and not calls
    from edgeinfer.service.generation import _calls_end_thought
    reading = Reading(tools=KIMI_K2, markers=THINK, in_thought=True)
    assert _calls_end_thought(reading, KIMI_K2.triggers).calls_end_thought  # tool_choice auto
    assert not _calls_end_thought(reading, ("</think>",)).calls_end_thought  # a forced call


def test_a_reasoning_budget_forces_the_closing_tokens_once_spent() -> None:
    from edgeinfer.engine.thought_budget import ThoughtBudget

    b = ThoughtBudget(3, (90, 91))
    out = []
    for sampled in (5, 6, 7, 8, 9, 10):
        tok = b.forced()
        tok = sampled if tok is None else tok
        b.saw(tok)
        out.append(tok)
    assert out == [5, 6, 7, 90, 91, 10] and b.done
    # a model that closes the block itself is never forced
    b = ThoughtBudget(3, (90, 91))
    for tok in (5, 90, 91):
        assert b.forced() is None
        b.saw(tok)
    assert b.done and b.forced() is None


def test_gemma4_empty_thought_block_without_its_line_break_is_split() -> None:
    """Gemma 4 writes an empty thought as ``<|channel>thought<channel|>`` (llama.cpp's
    test-chat expects content alone): split at any cut, as the usual form is."""
    from edgeinfer.prompt.reasoning import GEMMA_THOUGHT, ReasoningSplit, Said, Thought
    for text, want in [("<|channel>thought<channel|>Hello, world!", ("", "Hello, world!")),
                       ("<|channel>thought\nI think<channel|>Hi", ("I think", "Hi"))]:
        for cut in range(1, len(text)):
            r = ReasoningSplit(False, GEMMA_THOUGHT)
            out = r.feed(text[:cut]) + r.feed(text[cut:]) + r.finish()
            got = ("".join(p.text for p in out if isinstance(p, Thought)),
                   "".join(p.text for p in out if isinstance(p, Said)))
            assert got == want, cut
