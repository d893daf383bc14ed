"""Completions' ``text_offset``: characters, where a token may hold part of one."""

from __future__ import annotations

from edgeinfer.api.openai_render import char_offsets

TEXT = "😀é漢字😀".encode()
PIECES = [TEXT[0:2], TEXT[2:4], TEXT[4:6], TEXT[6:9], TEXT[9:12], TEXT[12:]]


def test_offsets_count_characters_not_tokens_or_bytes() -> None:
    """Six tokens writing five characters (the first two halves of one emoji): offsets
    0..4, as the answer's text indexes them (they ran 0..12, a replacement character
    counted for each half)."""
    offsets, end, partial = char_offsets(PIECES)
    assert offsets == [0, 0, 1, 2, 3, 4] and end == 5 == len(TEXT.decode()) and partial == b""


def test_offsets_go_on_across_streamed_chunks() -> None:
    """Streamed, the chunks' offsets join to the whole answer's, a character split
    between two chunks included."""
    whole = char_offsets(PIECES)[0]
    for cut in range(len(PIECES) + 1):
        first, end, partial = char_offsets(PIECES[:cut])
        assert first + char_offsets(PIECES[cut:], end, partial)[0] == whole, cut
