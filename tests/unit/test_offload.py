"""GPU offload decisions, without a GPU."""

from __future__ import annotations

from edgeinfer.models.offload import GPU_RESERVE, plan_gpu_layers


def test_cpu_build_or_zero_means_cpu() -> None:
    assert plan_gpu_layers(99, False, 30, 100 << 20, 8 << 30) == 0
    assert plan_gpu_layers("auto", False, 30, 100 << 20, 8 << 30) == 0
    assert plan_gpu_layers(0, True, 30, 100 << 20, 8 << 30) == 0


def test_explicit_count_is_kept() -> None:
    assert plan_gpu_layers(12, True, 30, 100 << 20, None) == 12


def test_auto_offloads_what_fits() -> None:
    size = 31 << 30  # 31 GiB over 30 layers + output: 1 GiB a layer
    assert plan_gpu_layers("auto", True, 30, size, (40 << 30) + GPU_RESERVE) == 31  # all
    assert plan_gpu_layers("auto", True, 30, size, (10 << 30) + GPU_RESERVE) == 10
    assert plan_gpu_layers("auto", True, 30, size, GPU_RESERVE // 2) == 0
    assert plan_gpu_layers("auto", True, 30, size, None) == 0  # no GPU memory reading
