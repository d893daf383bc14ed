"""How many layers go to the GPU: a pure decision, tested without a GPU.

``gpu_layers`` in models.toml is a count, or "auto": as many layers as fit the
GPU's free memory after a reserve, judged from the model's size. A build
without GPU support runs everything on the CPU and says so once.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

log = logging.getLogger("edgeinfer.models.offload")

GPU_RESERVE = 512 << 20  # left free on the GPU for compute buffers and other programs
_warned = False


def plan_gpu_layers(requested: int | str, gpu_supported: bool, n_layers: int,
                    model_bytes: int, gpu_free_bytes: int | None) -> int:
    """Layers to offload (n_layers + 1 puts the output layer there too, i.e. everything)."""
    if requested == 0:
        return 0
    if not gpu_supported:
        return 0
    if requested != "auto":
        return int(requested)
    if not gpu_free_bytes or n_layers <= 0:
        return 0
    per_layer = model_bytes / (n_layers + 1)
    fit = int((gpu_free_bytes - GPU_RESERVE) // per_layer) if per_layer else 0
    return max(0, min(n_layers + 1, fit))


def warn_cpu_only_once(model_id: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("this llama-cpp-python build has no GPU support: %s and every other model "
                    "run on the CPU (see README, 'CUDA')", model_id)


def gpu_free_bytes() -> int | None:
    """Free memory of the first NVIDIA GPU, from nvidia-smi (None when there is none)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return int(out.splitlines()[0].strip()) << 20
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None
