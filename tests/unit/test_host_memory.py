"""Host buffers for KV states: populated mappings for large ones, bytearrays otherwise."""

from __future__ import annotations

import ctypes
import mmap
import sys

import pytest

from edgeinfer.engine.host_memory import MAPPED_MIN, host_buffer


def test_a_small_state_is_a_bytearray() -> None:
    buf = host_buffer(1000)
    assert isinstance(buf, bytearray) and len(buf) == 1000 and not any(buf)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MAP_POPULATE")
def test_a_large_state_is_a_zeroed_writable_mapping_llama_cpp_can_fill() -> None:
    buf = host_buffer(MAPPED_MIN + 123)
    assert isinstance(buf, mmap.mmap) and len(buf) == MAPPED_MIN + 123
    view = (ctypes.c_uint8 * len(buf)).from_buffer(buf)  # as seq_state hands it to llama.cpp
    assert view[0] == view[len(buf) - 1] == 0
    ctypes.memset(view, 7, len(buf))
    del view
    assert buf[:3] == b"\x07\x07\x07" and buf[-1] == 7
    assert b"\x07" + buf == b"\x07" * (len(buf) + 1)  # joins like bytes (the disk tier)
