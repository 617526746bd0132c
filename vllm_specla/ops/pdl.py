"""Programmatic dependent launch (PDL) for the decode step's Triton kernels (sm90+).

A batch-1 decode step is ~170 short kernels back to back (7 per layer, runtime/fused_model.py).
Each one-row GEMM streams its weights in ~10 us, and every launch pays a ramp-up (its first
loads) and a tail (its last programs) in which HBM sits partly idle. With PDL (CUDA's
``cudaLaunchAttributeProgrammaticStreamSerialization``; PTX ``griddepcontrol``, Triton
``tl.extra.cuda.gdc_wait`` / ``gdc_launch_dependents``) the next kernel may start while the
current one still runs: the row GEMV issues its weight loads (constant data) at once, then waits
(``gdc_wait``) for the previous kernel's results before it reads anything else.

The contract every kernel launched with ``launch_pdl`` keeps (so the step computes exactly what
it computes without PDL):
  * before its ``gdc_wait`` it reads only constant data (weights) and writes nothing;
  * it calls ``gdc_wait`` on every path before any other memory access. ``gdc_wait`` returns when
    the previous kernel has completed and its writes are visible; since that kernel also waited
    for its own predecessor before completing, every earlier kernel is complete too;
  * ``gdc_launch_dependents`` is only a hint (the next kernel starts once every program of this
    one has called it or exited).
A kernel launched without PDL (cuBLAS, torch ops) keeps plain stream order, before and after.

``VLLM_SPECLA_PDL=0`` turns it off (``1``, the default: on where supported). Under Triton's
interpreter, on the CPU and below sm90 it is off. Measured: benchmarks/RESULTS.md, session 12.
"""

from __future__ import annotations

import functools
import os

import torch

_ENV = os.environ.get("VLLM_SPECLA_PDL", "1")
if _ENV not in ("0", "1"):
    raise ValueError(f"VLLM_SPECLA_PDL must be '0' (plain launches) or '1' (programmatic dependent launch where "
                     f"the GPU supports it, the default), got {_ENV!r}")
ENABLED = _ENV == "1"


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(t: torch.Tensor) -> bool:
    """Whether kernels on ``t``'s device launch with PDL: :data:`ENABLED`, a CUDA tensor, sm90 or
    newer, not Triton's interpreter. Host-only (no sync; CUDA-graph safe)."""
    if not (ENABLED and t.is_cuda) or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def launch_kw(on: bool) -> dict:
    """Extra launch options for a Triton kernel: ``{"launch_pdl": True}`` when ``on``, else none."""
    return {"launch_pdl": True} if on else {}
