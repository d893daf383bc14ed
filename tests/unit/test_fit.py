"""The fit step (``models.fit``): context and slots models.toml leaves out, chosen to fit
the free memory; values it sets are kept."""

from __future__ import annotations

from pathlib import Path

from edgeinfer.config import ModelConfig, load_config, override_model
from edgeinfer.models.fit import MIN_CONTEXT, MODEL_OVERHEAD, Memory, fit

MIB = 1 << 20
AUTO = ModelConfig(id="m", path=Path("m.gguf"), explicit=())
# a 1 GiB model, 128 KiB of KV per token, 32 layers, trained for 128k tokens
BIG = Memory(1024 * MIB, 128 << 10, 32, 131072, ram_free=64 << 30)


def test_plenty_of_memory_gives_the_training_context_up_to_the_cap() -> None:
    cfg, note = fit(AUTO, BIG)
    assert cfg.context == 32768 and cfg.slots == 8
    assert "context 32768" in note and "trained for 131072" in note


def test_a_small_training_context_is_kept() -> None:
    cfg, _ = fit(AUTO, Memory(100 * MIB, 23040, 30, 8192, ram_free=8 << 30))
    assert cfg.context == 8192 and cfg.slots == 8


def test_short_memory_lowers_the_context_until_it_fits() -> None:
    room = 1024 * MIB + MODEL_OVERHEAD + (128 << 10) * 5000  # room for 5,000 cells
    cfg, note = fit(AUTO, Memory(1024 * MIB, 128 << 10, 32, 131072, ram_free=room))
    assert cfg.context == 4864  # the largest multiple of 256 that fits
    assert "lowered from 32768 to fit" in note
    assert cfg.slots == 8  # 608 cells a slot


def test_slots_follow_a_small_context() -> None:
    room = 1024 * MIB + MODEL_OVERHEAD + (128 << 10) * 2100
    cfg, _ = fit(AUTO, Memory(1024 * MIB, 128 << 10, 32, 131072, ram_free=room))
    assert cfg.context == MIN_CONTEXT and cfg.slots == 4  # 512 cells a slot at least


def test_a_model_that_cannot_fit_loads_at_the_minimum_and_says_so() -> None:
    cfg, note = fit(AUTO, Memory(1024 * MIB, 128 << 10, 32, 131072, ram_free=512 * MIB))
    assert cfg.context == MIN_CONTEXT and "does not fit even so" in note


def test_gpu_layers_count_against_the_gpus_free_memory() -> None:
    # every layer on the GPU
    gpu = ModelConfig(id="m", path=Path("m.gguf"), explicit=(), gpu_layers=33)
    room = (1024 << 20) + (128 << 10) * 10000  # VRAM for 10,000 cells
    cfg, note = fit(gpu, Memory(1024 * MIB, 128 << 10, 32, 131072, ram_free=64 << 30,
                                vram_free=room))
    assert cfg.context == 9984 and "GPU memory" in note
    cpu, _ = fit(AUTO, Memory(1024 * MIB, 128 << 10, 32, 131072, ram_free=64 << 30,
                              vram_free=room))
    assert cpu.context == 32768  # no layer offloaded: the GPU's memory does not count


def test_values_set_in_models_toml_or_on_the_command_line_are_kept(tmp_path: Path) -> None:
    toml = tmp_path / "models.toml"
    toml.write_text('[[models]]\nid = "a"\npath = "a.gguf"\ncontext = 1024\n\n'
                    '[[models]]\nid = "b"\npath = "b.gguf"\n')
    a, b = load_config(toml).models
    assert a.explicit == ("context",) and b.explicit == ()
    tight = Memory(1024 * MIB, 128 << 10, 32, 131072, ram_free=512 * MIB)
    cfg, _ = fit(a, tight)
    assert cfg.context == 1024 and cfg.slots == 2  # slots chosen: 512 cells each
    both = override_model(b, context=4096, slots=3)
    assert fit(both, tight) == (both, "")
    assert fit(ModelConfig(id="m", path=Path("m.gguf")), tight)[1] == ""  # built in code: as given


def test_a_draft_models_cache_is_fitted_at_the_context_chosen() -> None:
    """The draft's KV cache has the target's cells: counted at the context being tried, not
    at the one before the fit (a config that fits at 2,048 cells was refused at start-up)."""
    draft = 64 * MIB + MODEL_OVERHEAD  # the draft's weights and buffers
    per_token = (128 << 10) + (32 << 10)  # the target's KV bytes a token, and the draft's
    room = 1024 * MIB + MODEL_OVERHEAD + draft + per_token * 3000
    cfg, note = fit(AUTO, Memory(1024 * MIB, 128 << 10, 32, 131072, ram_free=room,
                                 draft_file_bytes=64 * MIB, draft_kv_bytes_per_token=32 << 10))
    assert cfg.context == 2816 and "does not fit" not in note
    alone, _ = fit(AUTO, Memory(1024 * MIB, 128 << 10, 32, 131072, ram_free=room))
    assert alone.context > cfg.context  # without a draft, more cells fit
