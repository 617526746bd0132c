"""Public chain-verify op: state-resident verify of a draft chain with factor output.

Dispatch: the Triton kernel on CUDA tensors when available (``vllm_specla.ops.triton_chain``),
the C++ CPU op (``csrc/``, :mod:`vllm_specla.ops._cpp`) on CPU tensors when built, else the
plain-torch :func:`vllm_specla.ops.reference.chain_verify_ref` (fallback, oracle).
Arguments, shapes and semantics: see :func:`~vllm_specla.ops.reference.chain_verify_ref`
(ALGORITHMS.md §3, §6).
"""

from __future__ import annotations

import os

import torch

from vllm_specla.ops import _cpp
from vllm_specla.ops.reference import chain_verify_ref, chain_verify_snapshots_ref, conv_verify_ref


def _triton_impl():
    try:
        from vllm_specla.ops import triton_chain  # noqa: PLC0415
    except Exception:  # triton missing or no GPU backend
        return None
    return triton_chain


# CUDA kernel for chain verify: "serial" (triton_chain: per-token walk on the state tile), "ut"
# (triton_chain_ut: tensor-core UT/chunk form), or "auto": UT for windows of >= UT_MIN_TOKENS
# tokens per row at >= UT_MIN_ROWS rows, serial otherwise (AR decode, small batch). Shapes only:
# no host sync, CUDA-graph safe. Thresholds from benchmarks/RESULTS.md (bench_ut.py, H200).
VERIFY_KERNEL = os.environ.get("VLLM_SPECLA_VERIFY_KERNEL", "serial")
UT_MIN_TOKENS = 2.0
UT_MIN_ROWS = 8


def _use_ut(q: torch.Tensor, kw: dict) -> bool:
    if VERIFY_KERNEL == "serial":
        return False
    if VERIFY_KERNEL == "ut":
        return True
    rows = kw["cu_seqlens"].numel() - 1
    return rows >= UT_MIN_ROWS and q.shape[0] >= UT_MIN_TOKENS * max(rows, 1)


def _ut_impl():
    try:
        from vllm_specla.ops import triton_chain_ut  # noqa: PLC0415
    except Exception:
        return None
    return triton_chain_ut


def chain_verify(q, k, v, g, beta, **kw) -> torch.Tensor:
    """Chain verify (outputs ``[N, HV, V]`` float32); see :func:`chain_verify_ref`."""
    if q.is_cuda:
        if _use_ut(q, kw):
            ut = _ut_impl()
            if ut is not None:
                return ut.chain_verify_ut(q, k, v, g, beta, **kw)
        impl = _triton_impl()
        if impl is not None and hasattr(impl, "chain_verify"):
            return impl.chain_verify(q, k, v, g, beta, **kw)
    elif _cpp.use("chain_verify", q, kw.get("state")):
        return _cpp.chain_verify(q, k, v, g, beta, **kw)
    return chain_verify_ref(q, k, v, g, beta, **kw)


def chain_verify_snapshots(q, k, v, g, beta, **kw) -> torch.Tensor:
    """Per-token-snapshot verify (baseline); see :func:`chain_verify_snapshots_ref`."""
    if q.is_cuda:
        impl = _triton_impl()
        if impl is not None and hasattr(impl, "chain_verify_snapshots"):
            return impl.chain_verify_snapshots(q, k, v, g, beta, **kw)
    return chain_verify_snapshots_ref(q, k, v, g, beta, **kw)


def conv_verify(x, weight, cu_seqlens, conv_state, slots, **kw) -> torch.Tensor:
    """Conv of a verify window with deferred conv commit; see :func:`conv_verify_ref`."""
    if x.is_cuda:
        impl = _triton_impl()
        if impl is not None and hasattr(impl, "conv_verify"):
            return impl.conv_verify(x, weight, cu_seqlens, conv_state, slots, **kw)
    elif _cpp.use("conv_verify", x, conv_state):
        return _cpp.conv_verify(x, weight, cu_seqlens, conv_state, slots, **kw)
    return conv_verify_ref(x, weight, cu_seqlens, conv_state, slots, **kw)
