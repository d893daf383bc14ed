from __future__ import annotations

from edgeinfer.engine.textstream import TextStream


def feed(stream: TextStream, pieces: list[bytes]) -> str:
    return "".join(stream.push(p) for p in pieces) + stream.flush()


def test_holds_back_incomplete_utf8() -> None:
    s = TextStream()
    euro = "€".encode()  # 3 bytes
    assert s.push(b"a" + euro[:1]) == "a"
    assert s.push(euro[1:2]) == ""
    assert s.push(euro[2:]) == "€"


def test_invalid_bytes_become_replacement_not_broken_text() -> None:
    out = feed(TextStream(), [b"ok", b"\xff", b"!"])
    assert out == "ok\ufffd!"


def test_stop_string_split_across_tokens() -> None:
    s = TextStream(("</end>",))
    out = [s.push(p) for p in [b"hello </", b"en", b"d> tail"]]
    assert "".join(out) == "hello "
    assert s.stopped_by == "</end>"
    assert s.push(b"more") == "" and s.flush() == ""


def test_partial_stop_prefix_released_when_it_does_not_match() -> None:
    s = TextStream(("STOP",))
    assert s.push(b"ab ST") == "ab "
    assert s.push(b"AR") == "STAR"
    assert s.flush() == ""
    s2 = TextStream(("STOP",))
    s2.push(b"x ST")
    assert s2.flush() == "ST"  # held text is released at the end


def test_earliest_of_several_stops_wins() -> None:
    s = TextStream(("bb", "a"))
    assert feed(s, [b"xxbba"]) == "xx"
    assert s.stopped_by == "bb"


def test_a_character_the_output_ran_out_in_is_left_out() -> None:
    """max_tokens between the bytes of an emoji: the text ends before it, not with U+FFFD
    (what comes back is always whole UTF-8 characters)."""
    smile = "🙂".encode()  # 4 bytes
    assert feed(TextStream(), [b"Hi ", smile[:2]]) == "Hi "
    assert feed(TextStream(("x",)), [b"Hi ", smile[:3]]) == "Hi "
    assert feed(TextStream(), [b"Hi ", smile]) == "Hi 🙂"


def test_stop_strings_are_not_looked_for_where_told() -> None:
    """Once a lazy grammar constrains the output (a tool call), stop strings no longer
    apply: text held as a possible stop string's start comes out, and a stop string
    written inside the call does not end it."""
    ts = TextStream(stop=("\n", "}"))
    assert ts.push(b"Sure") == "Sure"
    assert ts.push(b"<tool_call>", stops=False) == "<tool_call>"
    assert ts.push(b'\n{"a": 1}', stops=False) == '\n{"a": 1}'
    assert ts.stopped_by is None
    assert ts.push(b"\nafter") == ""  # looked for again: it stops here
    assert ts.stopped_by == "\n"
