"""On a llama.cpp built with Intel AMX, models load without the extra CPU buffer types
(whose AMX kernels crash the first decode: llama.cpp #20824); elsewhere the defaults."""

from __future__ import annotations

import llama_cpp
import pytest

from edgeinfer.engine import handles

AMX_INFO = b"CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | REPACK = 1 | "
PLAIN_INFO = b"CPU : SSE3 = 1 | AVX2 = 1 | LLAMAFILE = 1 | REPACK = 1 | "


@pytest.mark.parametrize(("info", "extra"), [(AMX_INFO, False), (PLAIN_INFO, True)])
def test_extra_buffer_types_are_off_only_on_an_amx_build(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture,
                                                         info: bytes, extra: bool) -> None:
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: info)
    handles.amx_build.cache_clear()
    try:
        assert handles.model_params().use_extra_bufts is extra
        assert handles.model_params().use_extra_bufts is extra
    finally:
        handles.amx_build.cache_clear()
    assert sum("AMX" in r.getMessage() for r in caplog.records) == (0 if extra else 1)
