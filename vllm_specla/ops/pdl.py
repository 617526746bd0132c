"""Programmatic dependent launch (PDL) for the decode step's Triton kernels (sm90+).

A batch-1 decode step is ~150-170 short kernels back to back (7 per layer, 21-24 layers,
runtime/fused_model.py).
Each one-row GEMM streams its weights in ~10 us, and every launch pays a ramp-up (its first
loads) and a tail (its last programs) in which HBM sits partly idle. With PDL (CUDA's
``cudaLaunchAttributeProgrammaticStreamSerialization``; PTX ``griddepcontrol``, Triton
``tl.extra.cuda.gdc_wait`` / ``gdc_launch_dependents``) the next kernel may start while the
current one still runs: the row GEMV loads its first weight chunk at once, then waits
(``gdc_wait``) for the previous kernel's results before it reads anything else.

The contract every kernel launched with ``launch_pdl`` keeps (so the step computes exactly what
it computes without PDL):
  * before its ``gdc_wait`` it reads only data that no kernel of the stream writes (model weights,
    set once at load) and writes nothing. A kernel that lets its dependents launch before its own
    wait, as the row GEMV does, can have several kernels in flight at once, so "not written by the
    previous kernel" is not enough: a weight cast by the kernel just before the call would race;
  * it calls ``gdc_wait`` on every path before any other memory access. ``gdc_wait`` returns when
    the previous kernel has completed and its writes are visible; since that kernel also waited
    for its own predecessor before completing, every earlier kernel is complete too;
  * ``gdc_launch_dependents`` is only a hint (the next kernel starts once every program of this
    one has called it or exited).
A kernel launched without PDL (cuBLAS, torch ops) keeps plain stream order, before and after.

``VLLM_SPECLA_PDL=0`` turns it off (``1``, the default: on where supported). Under Triton's
interpreter, on the CPU, on ROCm and below sm90 it is off. Measured: benchmarks/RESULTS.md, session 12.
"""

from __future__ import annotations

import functools
import os

import torch

_ENV = (os.environ.get("VLLM_SPECLA_PDL") or "1")  # (set but empty: the default)
if _ENV not in ("0", "1"):
    raise ValueError(f"VLLM_SPECLA_PDL must be '0' (plain launches) or '1' (programmatic dependent launch where "
                     f"the GPU supports it, the default), got {_ENV!r}")
ENABLED = _ENV == "1"


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(t: torch.Tensor) -> bool:
    """Whether kernels on ``t``'s device launch with PDL: :data:`ENABLED` (read per call), a CUDA
    tensor on an NVIDIA sm90+ GPU, not Triton's interpreter. Host-only (no sync; CUDA-graph safe)."""
    if not (ENABLED and t.is_cuda) or torch.version.hip is not None:
        return False
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes"):
        return False
    return _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def launch_kw(on: bool) -> dict:
    """Extra launch options for a Triton kernel: ``{"launch_pdl": True}`` when ``on``, else none."""
    return {"launch_pdl": True} if on else {}
