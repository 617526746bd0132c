"""Public recovery ops: DeltaConstruct commit of an accepted prefix from the factor banks.

Dispatch: Triton on CUDA when available (``vllm_specla.ops.triton_recover``), the C++ CPU ops
(``csrc/``, :mod:`vllm_specla.ops._cpp`) on CPU tensors when built, else the plain-torch
:func:`~vllm_specla.ops.reference.recover_ref` /
:func:`~vllm_specla.ops.reference.conv_commit_ref` (ALGORITHMS.md §2).
"""

from __future__ import annotations

import torch

from vllm_specla.ops import _cpp
from vllm_specla.ops.reference import conv_commit_ref, recover_ref


def _triton_impl():
    try:
        from vllm_specla.ops import triton_recover  # noqa: PLC0415
    except Exception:
        return None
    return triton_recover


def recover(state, slots, bank_k, bank_v, bank_g, bank_idx, num_accepted) -> None:
    """Fold the first ``num_accepted[r]`` factors into ``state[slots[r]]`` in place."""
    if state.is_cuda:
        impl = _triton_impl()
        if impl is not None and hasattr(impl, "recover"):
            return impl.recover(state, slots, bank_k, bank_v, bank_g, bank_idx, num_accepted)
    elif _cpp.use("recover", state):
        return _cpp.recover(state, slots, bank_k, bank_v, bank_g, bank_idx, num_accepted)
    return recover_ref(state, slots, bank_k, bank_v, bank_g, bank_idx, num_accepted)


def conv_commit(conv_state, slots, bank_x, bank_idx, num_accepted) -> None:
    """Commit the accepted raw conv inputs into the conv window in place."""
    if conv_state.is_cuda:
        impl = _triton_impl()
        if impl is not None and hasattr(impl, "conv_commit"):
            return impl.conv_commit(conv_state, slots, bank_x, bank_idx, num_accepted)
    elif _cpp.use("conv_commit", conv_state):
        return _cpp.conv_commit(conv_state, slots, bank_x, bank_idx, num_accepted)
    return conv_commit_ref(conv_state, slots, bank_x, bank_idx, num_accepted)


__all__ = ["recover", "conv_commit", "torch"]
