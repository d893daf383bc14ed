"""The service's turning of engine deltas into events, on fake engine streams: choices
interleaved, tool calls parsed as they stream, finish reasons, usage, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from edgeinfer.engine.delta import Delta, Failure, FailureCode
from edgeinfer.errors import Timeout
from edgeinfer.prompt.reasoning import THINK
from edgeinfer.prompt.toolformat import GENERIC, MINIMAX_M3, QWEN3_CODER, ToolFormat
from edgeinfer.service.events import (
    ErrorEvent,
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)
from edgeinfer.service.generation import (
    failure_error,
    merge,
    middle_cut,
    to_events,
    with_context,
)
from edgeinfer.service.reader import Reading


async def fake(*deltas: Delta, pause: float = 0.0) -> AsyncIterator[Delta]:
    for d in deltas:
        await asyncio.sleep(pause)
        yield d


def run(streams: list[AsyncIterator[Delta]], prompt_of: list[int], lengths: list[int],
        tools: bool = False, reasoning: bool = False, in_thought: bool = False) -> list[Event]:
    reading = Reading(tools=GENERIC if tools else None, markers=THINK if reasoning else None,
                      in_thought=in_thought)
    async def main() -> list[Event]:
        return [e async for e in to_events(merge(streams), prompt_of, lengths, reading)]
    return asyncio.run(main())


def end(reason: str, n: int, cached: int = 0) -> Delta:
    return Delta("", finish_reason=reason, completion_tokens=n, cached_tokens=cached)


def test_text_of_two_choices_then_finishes_then_one_usage() -> None:
    events = run([fake(Delta("Hel"), Delta("lo"), end("stop", 2, cached=5), pause=0.001),
                  fake(Delta("Hi"), end("length", 1, cached=3), pause=0.001)],
                 prompt_of=[0, 0], lengths=[10])
    text = {c: "".join(e.text for e in events if isinstance(e, TextDelta) and e.choice == c)
            for c in (0, 1)}
    assert text == {0: "Hello", 1: "Hi"}
    finishes = {e.choice: e.reason for e in events if isinstance(e, Finish)}
    assert finishes == {0: "stop", 1: "length"}
    assert events[-1] == UsageReport(prompt_tokens=10, completion_tokens=3, cached_tokens=3)
    assert sum(isinstance(e, UsageReport) for e in events) == 1


def test_each_prompt_counted_once_with_its_fewest_cached_tokens() -> None:
    events = run([fake(end("stop", 1, cached=8)), fake(end("stop", 1, cached=2)),
                  fake(end("stop", 4, cached=6))], prompt_of=[0, 0, 1], lengths=[10, 20])
    assert events[-1] == UsageReport(prompt_tokens=30, completion_tokens=6, cached_tokens=8)


def test_a_streamed_tool_call_becomes_call_events_and_finish_reason_tool_calls() -> None:
    pieces = ["Sure.<tool", '_call>\n{"name": "get_weather", "arg', 'uments": {"city": ',
              '"Paris"}}\n</tool_call>']
    events = run([fake(*(Delta(p) for p in pieces), end("stop", 9))], [0], [4], tools=True)
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls[0].name == "get_weather" and calls[0].id and calls[0].index == 0
    assert "".join(c.arguments for c in calls) == '{"city": "Paris"}'
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "Sure."  # no marker leaks into the text
    (fin,) = [e for e in events if isinstance(e, Finish)]
    assert fin.reason == "tool_calls"


def test_tools_offered_but_plain_text_answered_finishes_with_stop() -> None:
    events = run([fake(Delta("No call <tool"), Delta(" needed"), end("stop", 3))], [0], [4],
                 tools=True)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "No call <tool needed"
    assert [e.reason for e in events if isinstance(e, Finish)] == ["stop"]


def test_a_failure_ends_the_stream_with_one_typed_error_and_aborts_the_rest() -> None:
    aborted = asyncio.Event()

    async def endless() -> AsyncIterator[Delta]:
        try:
            while True:
                await asyncio.sleep(0.001)
                yield Delta("x")
        finally:
            aborted.set()

    timeout = Delta("", finish_reason="error", failure=Failure(FailureCode.TIMEOUT, "too slow"))

    async def main() -> list[Event]:
        gen = to_events(merge([endless(), fake(Delta("a"), timeout, pause=0.005)]), [0, 0], [3])
        out = [e async for e in gen]
        await asyncio.sleep(0)
        assert aborted.is_set()  # the other choice's engine request was aborted
        return out

    events = asyncio.run(main())
    assert isinstance(events[-1], ErrorEvent) and isinstance(events[-1].error, Timeout)
    assert not any(isinstance(e, (Finish, UsageReport)) for e in events)


def test_failure_codes_map_to_api_errors() -> None:
    assert failure_error(Failure(FailureCode.TIMEOUT, "t")).status == 504
    assert failure_error(Failure(FailureCode.SHUTDOWN, "s")).status == 503
    err = failure_error(Failure(FailureCode.KV_FULL, "k"))  # capacity: retry later
    assert err.status == 503 and err.code == "kv_cache_full"
    assert int(err.headers["Retry-After"]) >= 1
    assert failure_error(None).status == 500


def test_reasoning_is_split_from_the_answer_and_a_call_after_it_is_parsed() -> None:
    pieces = ["Let me th", "ink.</thi", "nk>\n\n<tool_call>\n", '{"name": "f", "arguments": {}}',
              "\n</tool_call>"]
    events = run([fake(*(Delta(p) for p in pieces), end("stop", 12))], [0], [4], tools=True,
                 reasoning=True, in_thought=True)
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert thought == "Let me think."
    assert not [e for e in events if isinstance(e, TextDelta) and e.text]
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls[0].name == "f" and "".join(c.arguments for c in calls) == "{}"
    assert [e.reason for e in events if isinstance(e, Finish)] == ["tool_calls"]
    # the finish carries the output as the model wrote it (Ollama's context is made of it)
    assert [e.raw for e in events if isinstance(e, Finish)] == ["".join(pieces)]


def test_context_goes_after_the_bos_or_first() -> None:
    assert with_context([1, 5, 6], (7, 8), [1]) == [1, 7, 8, 5, 6]
    assert with_context([5, 6], (7, 8), [1]) == [7, 8, 5, 6]  # no BOS in the prompt
    assert with_context([5, 6], (7, 8), []) == [7, 8, 5, 6]  # a model with no BOS


def test_reasoning_off_leaves_think_tags_in_the_text() -> None:
    events = run([fake(Delta("<think>x</think>y"), end("stop", 3))], [0], [4])
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "<think>x</think>y"
    assert not any(isinstance(e, ReasoningDelta) for e in events)


def test_a_prompt_over_the_context_keeps_its_head_and_tail_with_room_for_the_answer() -> None:
    tokens = list(range(100))
    assert middle_cut(tokens[:63], 64, 4, 8) == tokens[:63]  # fits: untouched
    cut = middle_cut(tokens, 64, 4, 8)
    assert cut == tokens[:4] + tokens[100 - 52:] and len(cut) == 64 - 8
    assert len(middle_cut(tokens, 64, 4, None)) == 64 - 16  # no max_tokens: a quarter
    assert len(middle_cut(tokens, 64, 4, 1000)) == 32  # at most half the context
    assert middle_cut(tokens, 64, 1 << 30, 8)[:28] == tokens[:28]  # the head: half at most
    assert middle_cut(tokens, 64, 0, 8) == tokens[100 - 56:]


def test_a_whole_answer_keeps_a_call_cut_off_by_max_tokens() -> None:
    """As OpenAI and llama-server answer: finish "length" with the call as far as it was
    written; a call that does not parse for any other reason is left out."""
    from edgeinfer.service.outcome import gather

    async def events(reason: str) -> AsyncIterator[Event]:
        yield ToolCallDelta(0, 0, '{"name": "Ad', id="c1", name="Person")
        yield Finish(0, reason, 20, None)
        yield UsageReport(5, 20, 0)

    cut = asyncio.run(gather(events("length"), 1)).choices[0]
    assert cut.finish == "length" and [(k.name, k.arguments) for k in cut.calls] == [
        ("Person", '{"name": "Ad')]
    odd = asyncio.run(gather(events("tool_calls"), 1)).choices[0]
    assert odd.calls == [] and odd.finish == "stop"


def test_a_base_models_answer_cut_inside_its_chatml_marker_leaves_the_marker_out() -> None:
    """max_tokens ran out as a base model wrote "<|im_end|>" (a stop the server added):
    none of the marker is text; a request's own text that merely ends in "<" stays."""
    async def main(implicit: tuple[str, ...]) -> str:
        streams = [fake(Delta("Hello "), Delta("<|im", finish_reason="length",
                                                  completion_tokens=3))]
        events = [e async for e in to_events(merge(streams), [0], [4], None, implicit)]
        return "".join(e.text for e in events if isinstance(e, TextDelta))

    assert asyncio.run(main(("<|im_end|>", "<|im_start|>"))) == "Hello "
    assert asyncio.run(main(())) == "Hello <|im"


def _calls(events: list[Event]) -> list[tuple[int, str, str]]:
    out: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            out.setdefault(e.index, [e.name or "", ""])[1] += e.arguments
    return [(k, *v) for k, v in sorted(out.items())]


def _call(city: str, space: str = " ") -> str:
    call = f'{{"name": "get_weather", "arguments": {{"city":{space}"{city}"}}}}'
    return f"<tool_call>{call}</tool_call>"


def test_parallel_calls_to_one_tool_pass_and_a_repeat_ends_the_answer() -> None:
    """Two cities are two calls; a call written again (same name, same arguments, however
    spaced) ends the answer: it and all after it are left out, the engine is asked to
    stop, and blanks between calls are not content; streamed in any pieces."""
    text = (_call("Paris") + "\n" + _call("Oslo") + "\n" + _call("Paris", "") + "\n"
            + _call("Rome") + "\nTrailing words")
    for size in (1, 7, len(text)):
        pieces = [text[k:k + size] for k in range(0, len(text), size)]
        ended: list[int] = []

        async def main(pieces: list[str], ended: list[int]) -> list[Event]:
            streams = [fake(*(Delta(p) for p in pieces), end("stop", 40))]
            return [e async for e in to_events(merge(streams), [0], [4], Reading(tools=GENERIC),
                                               end=ended.append)]
        events = asyncio.run(main(pieces, ended))
        assert _calls(events) == [(0, "get_weather", '{"city": "Paris"}'),
                                  (1, "get_weather", '{"city": "Oslo"}')]
        assert ended == [0]
        assert [e.reason for e in events if isinstance(e, Finish)] == ["tool_calls"]
        assert not [e for e in events if isinstance(e, TextDelta)]


def test_nothing_after_a_repeat_is_passed_on() -> None:
    """Text right after a repeated call (no blank between), and a call whose arguments
    differ only in JSON types (true is not 1), are told apart from a repeat."""
    text = (_call("Oslo") + _call("Oslo") + "I called it twice.")
    events = run([fake(Delta(text), end("stop", 40))], [0], [4], tools=True)
    assert [c[2] for c in _calls(events)] == ['{"city": "Oslo"}']
    assert not [e for e in events if isinstance(e, TextDelta)]
    one = '<tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call>'
    events = run([fake(Delta(one + one.replace("1", "true")), end("stop", 40))], [0], [4],
                 tools=True)
    assert [c[2] for c in _calls(events)] == ['{"n": 1}', '{"n": true}']


def test_output_cut_after_whole_calls_ends_with_tool_calls() -> None:
    """max_tokens ran out inside a repeat, between calls, or inside a call's closing
    marker: the calls passed on are whole, so the answer ends as "tool_calls"; cut inside
    a new call (or in text after the calls), it is "length"."""
    two = _call("Oslo") + "\n" + _call("Rome") + "\n"
    full = two + _call("Oslo")
    cases = [(full[:full.rindex("Oslo") + 2], ['{"city": "Oslo"}', '{"city": "Rome"}'],
              "tool_calls"),
             (two + "<tool_c", ['{"city": "Oslo"}', '{"city": "Rome"}'], "tool_calls"),
             (two[:-len("</tool_call>\n") + 3], ['{"city": "Oslo"}', '{"city": "Rome"}'],
              "tool_calls"),
             ((two + _call("Bergen"))[:len(two) + two.index("Oslo") + 2],
              ['{"city": "Oslo"}', '{"city": "Rome"}', '{"city": "Be'], "length"),
             (two + "It is", ['{"city": "Oslo"}', '{"city": "Rome"}'], "length")]
    for text, calls, reason in cases:
        events = run([fake(Delta(text), end("length", 40))], [0], [4], tools=True)
        assert [c[2] for c in _calls(events)] == calls, text
        assert [e.reason for e in events if isinstance(e, Finish)] == [reason], text


def test_output_cut_after_a_calls_name_before_its_arguments_is_length() -> None:
    """A named format announces a call at its name: cut off before any argument was
    written, the call is not whole (it was taken for a call without arguments)."""
    for fmt, text in ((QWEN3_CODER, "<tool_call>\n<function=get_weather>\n"),
                      (MINIMAX_M3, ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="'
                                   'get_weather">]<]minimax[>[<city>Pa')):
        async def main(text: str = text, fmt: ToolFormat = fmt) -> list[Event]:
            streams = [fake(Delta(text), end("length", 40))]
            return [e async for e in to_events(merge(streams), [0], [4], Reading(tools=fmt))]
        events = asyncio.run(main())
        assert [c[1] for c in _calls(events)] == ["get_weather"], fmt.name
        assert [e.reason for e in events if isinstance(e, Finish)] == ["length"], fmt.name


def test_a_reasoning_markers_tokens_carry_no_answer_logprob() -> None:
    """Only tokens whose text is the answer's come with a logprob: not the reasoning's,
    not the marker that ends it, not the blank the split trims after it."""
    from edgeinfer.engine.logprobs import TokenLogprob

    pieces = ["<think>", "hmm", "</think>", "\n\n", "Hello", " world", "!"]
    deltas = [Delta(p, (k,), logprob=TokenLogprob(k, -0.5, ())) for k, p in enumerate(pieces)]
    events = run([fake(*deltas, end("stop", 7))], [0], [4], reasoning=True)
    texts = [e for e in events if isinstance(e, TextDelta)]
    assert "".join(e.text for e in texts) == "Hello world!"
    assert [e.logprob.token for e in texts if e.logprob] == [4, 5, 6]
