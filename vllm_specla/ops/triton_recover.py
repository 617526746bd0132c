"""Triton kernels: DeltaConstruct commit of an accepted prefix from the factor banks.

Same signatures and semantics as :func:`vllm_specla.ops.reference.recover_ref` and
:func:`~vllm_specla.ops.reference.conv_commit_ref` (ALGORITHMS.md §2); the dispatchers in
``recover.py`` call them for CUDA tensors.

``recover``: one program per ``(V-tile, value head, row)`` loads its ``[BV, K]`` state tile once,
applies the serial flush ``M = e^{g_u} M + v~_u k_u^T`` for ``u < num_accepted`` (same result as the
closed form of the reference up to fp32 rounding) and stores it once: one state read + one state
write however many tokens were accepted (per-token replay needs one of each per token).
``conv_commit``: the new conv window = last ``W-1`` rows of (window ++ accepted raw inputs).
Both launch with programmatic dependent launch where ``ops/pdl.py`` allows it (they wait for their
predecessors before any memory access), as the chain kernels do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_specla.ops import pdl as _pdl
from vllm_specla.ops import triton_chain
from vllm_specla.ops.triton_fused import pdl_enter


@triton.jit
def _recover_kernel(
    state, slots, bank_k, bank_v, bank_g, bank_idx, num_accepted,
    Tmax,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_r = tl.program_id(2)
    i_h = i_hv // (HV // H)
    n = tl.load(num_accepted + i_r).to(tl.int32)
    n = tl.minimum(n, Tmax)
    if n > 0:
        slot = tl.load(slots + i_r).to(tl.int64)
        b = tl.load(bank_idx + i_r).to(tl.int64)
        o_k = tl.arange(0, BK)
        o_v = i_v * BV + tl.arange(0, BV)
        mk = o_k < K
        mv = o_v < V
        mh = mv[:, None] & mk[None, :]
        p_s = state + (slot * HV + i_hv) * (V * K) + o_v[:, None] * K + o_k[None, :]
        b_h = tl.load(p_s, mask=mh, other=0.0)
        base = (slot * 2 + b) * Tmax
        for u in range(0, n):
            b_k = tl.load(bank_k + ((base + u) * H + i_h) * K + o_k, mask=mk, other=0.0)
            b_v = tl.load(bank_v + ((base + u) * HV + i_hv) * V + o_v, mask=mv, other=0.0)
            b_g = tl.load(bank_g + (base + u) * HV + i_hv)
            b_h = b_h * tl.exp(b_g) + b_v[:, None] * b_k[None, :]
        tl.store(p_s, b_h, mask=mh)


def recover(
    state: torch.Tensor,
    slots: torch.Tensor,
    bank_k: torch.Tensor,
    bank_v: torch.Tensor,
    bank_g: torch.Tensor,
    bank_idx: torch.Tensor,
    num_accepted: torch.Tensor,
    config: tuple[int, int] | None = None,
) -> None:
    """Fold the first ``num_accepted[r]`` factors of bank ``bank_idx[r]`` into ``state[slots[r]]``
    in place (see :func:`vllm_specla.ops.reference.recover_ref`). The counts are read on the device
    (no host sync), so they are not checked: one above the bank's ``Tmax`` is clamped to it, where the
    reference and the C++ op raise ValueError.

    ``config``: ``(BV, num_warps)`` (benchmark sweeps: ``bench_kernels.py --recover-configs``); default
    ``triton_chain.CONFIG_OVERRIDE[:2]`` when set, else ``triton_chain.TUNED["recover"]``. Each state element
    takes the same serial updates at every config, but tilings with another ``num_warps`` may round differently
    (within fp32 rounding of ``recover_ref``; H200, session 46).

    Raises:
        ValueError: ``config`` is not two positive integers."""
    R = slots.numel()
    if R == 0:
        return
    _, HV, V, K = state.shape
    H = bank_k.shape[3]
    assert state.dtype == torch.float32 and state.is_contiguous()
    BK = triton.next_power_of_2(K)
    if config is None:
        config = (triton_chain.CONFIG_OVERRIDE[:2] if triton_chain.CONFIG_OVERRIDE is not None
                  else triton_chain.TUNED["recover"])
    if len(config) != 2 or not all(isinstance(c, int) and c > 0 for c in config):
        raise ValueError(f"recover config={tuple(config)!r}: must be (BV, num_warps), two positive integers")
    BV, nw = config
    BV = min(BV, triton.next_power_of_2(V))
    grid = (triton.cdiv(V, BV), HV, R)
    on = _pdl.enabled(state)
    _recover_kernel[grid](
        state, slots, bank_k, bank_v, bank_g, bank_idx, num_accepted,
        bank_k.shape[2],
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, PDL=on, num_warps=nw, num_stages=1, **_pdl.launch_kw(on),
    )


@triton.jit
def _conv_commit_kernel(
    conv_state, slots, bank_x, bank_idx, num_accepted,
    Tmax, C,
    W1: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    i_c = tl.program_id(0)
    i_r = tl.program_id(1)
    n = tl.load(num_accepted + i_r).to(tl.int64)
    n = tl.minimum(n, Tmax)
    if n > 0:
        slot = tl.load(slots + i_r).to(tl.int64)
        b = tl.load(bank_idx + i_r).to(tl.int64)
        o_c = i_c * BC + tl.arange(0, BC)
        mc = o_c < C
        o_j = tl.arange(0, BW)
        mj = o_j < W1
        z = n + o_j  # positions in (window ++ accepted x) that form the new window
        from_h = z < W1
        zh = tl.where(from_h, z, 0)
        zx = tl.where(from_h, 0, z - W1)
        p_cs = conv_state + slot * W1 * C
        bh = tl.load(p_cs + zh[:, None] * C + o_c[None, :], mask=(mj & from_h)[:, None] & mc[None, :], other=0.0)
        bx = tl.load(bank_x + ((slot * 2 + b) * Tmax + zx[:, None]) * C + o_c[None, :],
                     mask=(mj & (~from_h))[:, None] & mc[None, :], other=0.0)
        val = tl.where(from_h[:, None], bh.to(tl.float32), bx)
        # rows are shifted in place: every read of the old window happens before any write
        tl.debug_barrier()
        tl.store(p_cs + o_j[:, None] * C + o_c[None, :], val.to(conv_state.dtype.element_ty),
                 mask=mj[:, None] & mc[None, :])


def conv_commit(
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    bank_x: torch.Tensor,
    bank_idx: torch.Tensor,
    num_accepted: torch.Tensor,
) -> None:
    """``conv_state[s] = last W-1 rows of (conv_state[s] ++ bank_x[s, b, :A])`` in place
    (see :func:`vllm_specla.ops.reference.conv_commit_ref`); an ``A`` above the bank's ``Tmax`` is
    clamped to it (unchecked, no host sync), where the reference and the C++ op raise ValueError."""
    R = slots.numel()
    if R == 0:
        return
    _, W1, C = conv_state.shape
    assert conv_state.is_contiguous()
    BC = min(1024, triton.next_power_of_2(C))
    BW = max(2, triton.next_power_of_2(W1))
    grid = (triton.cdiv(C, BC), R)
    on = _pdl.enabled(conv_state)
    _conv_commit_kernel[grid](
        conv_state, slots, bank_x, bank_idx, num_accepted, bank_x.shape[2], C,
        W1=W1, BW=BW, BC=BC, PDL=on, num_warps=4, **_pdl.launch_kw(on),
    )
