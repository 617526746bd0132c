"""Public chain-verify op: state-resident verify of a draft chain with factor output.

Dispatch: the Triton kernel on CUDA tensors when available (``vllm_specla.ops.triton_chain``),
the C++ CPU op (``csrc/``, :mod:`vllm_specla.ops._cpp`) on CPU tensors when built, else the
plain-torch :func:`vllm_specla.ops.reference.chain_verify_ref` (fallback, oracle).
Arguments, shapes and semantics: see :func:`~vllm_specla.ops.reference.chain_verify_ref`
(ALGORITHMS.md §3, §6).
"""

from __future__ import annotations

import torch

from vllm_specla.ops import _cpp
from vllm_specla.ops.reference import chain_verify_ref, chain_verify_snapshots_ref, conv_verify_ref


def _triton_impl():
    try:
        from vllm_specla.ops import triton_chain  # noqa: PLC0415
    except Exception:  # triton missing or no GPU backend
        return None
    return triton_chain


def chain_verify(q, k, v, g, beta, **kw) -> torch.Tensor:
    """Chain verify (outputs ``[N, HV, V]`` float32); see :func:`chain_verify_ref`."""
    if q.is_cuda:
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
