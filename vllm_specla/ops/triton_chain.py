"""Triton kernels: state-resident chain verify (+ deferred commit, factors) and verify-window conv.

Public functions have exactly the signatures and semantics of their references in
:mod:`vllm_specla.ops.reference` (``chain_verify_ref``, ``conv_verify_ref``); the dispatchers in
``chain_verify.py`` call them for CUDA tensors. Layouts: ``ops/__init__.py``. Math: ALGORITHMS.md
§1 ([V, K] form), §3 (chain verify), §6 (deferred commit). Design notes: docs/KERNELS.md.

Chain verify, one program per ``(V-tile, value head, row)``:

* the ``[BV, K]`` slice of ``state[slot, hv]`` is loaded once and stays in registers; the full key
  dim is inside the program so ``M k`` / ``M q`` need no cross-program reduction, and one request
  spreads over ``HV * V / BV`` programs (many SMs at batch 1);
* pending factors (deferred commit) are folded first with the serial flush
  ``M = e^{g_u} M + v~_u k_u^T`` and the committed tile is written once (skipped when the final
  state is written anyway);
* per token: q/k l2norm (eps 1e-6) fused, ``hk = M k``, ``hq = M q`` from the *pre-decay* tile,
  ``v~ = beta (v - e^g hk)``, ``o = e^g hq + v~ (k.q)``, ``M = e^g M + v~ k^T`` — 4 FP32 ops per state
  element per token, exact fp32 (no tensor-core dots);
* factors go to bank ``write_bank``: ``bank_v`` by every V-tile (its own V slice), ``bank_g`` by
  V-tile 0 only, ``bank_k`` by V-tile 0 of the first value head of each GVA group only — so every
  bank element has exactly one writer. Programs of the same row read the *other* bank
  (``read_bank``) for pending factors: callers must keep ``read_bank != write_bank`` whenever
  ``pending_len > 0`` (double buffering, ``core/state.py``), else a program could overwrite a
  pending k/g another V-tile still reads;
* no per-token state writes; ``write_final_state`` stores the tile after the last token (AR decode).

Rows must use distinct slots (two rows on one slot would race, as in any state-slot kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BV, num_warps) forced for every chain/recover launch when not None (benchmark sweeps).
CONFIG_OVERRIDE: tuple[int, int] | None = None
# Host-side window-length check (ValueError like the reference). It reads cu_seqlens, which syncs
# when cu_seqlens is on the GPU; it is skipped during CUDA-graph capture. Set False to skip always.
CHECK_BOUNDS = True


def pick_config(num_rows: int, HV: int, V: int, K: int) -> tuple[int, int]:
    """``(BV, num_warps)`` for a ``[BV, next_pow2(K)]`` state tile per program.

    Largest V tile (fewer redundant q/k loads per token) that still gives >= ~8 programs per SM
    on a 132-SM H200; ~64 fp32 state elements per thread.
    """
    if CONFIG_OVERRIDE is not None:
        return CONFIG_OVERRIDE
    BK = triton.next_power_of_2(K)
    bv_max = triton.next_power_of_2(V)
    BV = 8
    for cand in (32, 16, 8):
        if num_rows * HV * triton.cdiv(V, cand) >= 1024:
            BV = cand
            break
    BV = max(1, min(BV, bv_max))
    num_warps = max(1, min(8, BV * BK // 2048))
    return BV, num_warps


def _bounds_check(cu_seqlens: torch.Tensor, tmax: int) -> None:
    if not CHECK_BOUNDS:
        return
    if cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    if lens.numel() and int(lens.max()) > tmax:
        raise ValueError(f"window of {int(lens.max())} tokens exceeds the factor bank (Tmax={tmax})")


@triton.jit
def _chain_verify_kernel(
    q, k, v, g, beta, o,
    state, slots, cu_seqlens,
    bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
    snap,
    scale, Tmax,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr, WRITE_FINAL: tl.constexpr,
    L2NORM: tl.constexpr, SNAPSHOT: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_r = tl.program_id(2)
    G: tl.constexpr = HV // H
    i_h = i_hv // G

    bos = tl.load(cu_seqlens + i_r).to(tl.int64)
    eos = tl.load(cu_seqlens + i_r + 1).to(tl.int64)
    slot = tl.load(slots + i_r).to(tl.int64)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_k < K
    mv = o_v < V
    mh = mv[:, None] & mk[None, :]

    p_s = state + (slot * HV + i_hv) * (V * K) + o_v[:, None] * K + o_k[None, :]
    b_h = tl.load(p_s, mask=mh, other=0.0).to(tl.float32)

    # ---- deferred commit: fold the pending factors of bank read_bank, write the state once ----
    if HAS_PENDING:
        n_p = tl.load(pending_len + i_r).to(tl.int32)
        n_p = tl.minimum(n_p, Tmax)
        if n_p > 0:
            rb = tl.load(read_bank + i_r).to(tl.int64)
            base = (slot * 2 + rb) * Tmax
            for u in range(0, n_p):
                b_pk = tl.load(bank_k + ((base + u) * H + i_h) * K + o_k, mask=mk, other=0.0)
                b_pv = tl.load(bank_v + ((base + u) * HV + i_hv) * V + o_v, mask=mv, other=0.0)
                b_pg = tl.load(bank_g + (base + u) * HV + i_hv)
                b_h = b_h * tl.exp(b_pg) + b_pv[:, None] * b_pk[None, :]
            if not WRITE_FINAL:
                tl.store(p_s, b_h, mask=mh)

    if HAS_BANK:
        wb = tl.load(write_bank + i_r).to(tl.int64)
        wbase = (slot * 2 + wb) * Tmax

    # ---- the window, state tile on chip ----
    for t in range(0, eos - bos):
        i_t = bos + t
        b_q = tl.load(q + (i_t * H + i_h) * K + o_k, mask=mk, other=0.0).to(tl.float32)
        b_k = tl.load(k + (i_t * H + i_h) * K + o_k, mask=mk, other=0.0).to(tl.float32)
        b_v = tl.load(v + (i_t * HV + i_hv) * V + o_v, mask=mv, other=0.0).to(tl.float32)
        b_g = tl.load(g + i_t * HV + i_hv).to(tl.float32)
        b_beta = tl.load(beta + i_t * HV + i_hv).to(tl.float32)
        if L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        eg = tl.exp(b_g)
        hk = tl.sum(b_h * b_k[None, :], 1)
        hq = tl.sum(b_h * b_q[None, :], 1)
        b_vt = b_beta * (b_v - eg * hk)
        kq = tl.sum(b_k * b_q)
        b_o = eg * hq + b_vt * kq
        b_h = b_h * eg + b_vt[:, None] * b_k[None, :]
        tl.store(o + (i_t * HV + i_hv) * V + o_v, b_o, mask=mv)
        if HAS_BANK:
            if t < Tmax:
                tl.store(bank_v + ((wbase + t) * HV + i_hv) * V + o_v, b_vt, mask=mv)
                if i_v == 0:
                    tl.store(bank_g + (wbase + t) * HV + i_hv, b_g)
                    if i_hv % G == 0:
                        tl.store(bank_k + ((wbase + t) * H + i_h) * K + o_k, b_k, mask=mk)
        if SNAPSHOT:
            # baseline only (vLLM-native style): a full state after every window token
            p_sn = snap + ((i_r * Tmax + t) * HV + i_hv) * (V * K) + o_v[:, None] * K + o_k[None, :]
            tl.store(p_sn, b_h, mask=mh)

    if WRITE_FINAL:
        tl.store(p_s, b_h, mask=mh)


def _launch_chain(
    q, k, v, g, beta, scale, state, slots, cu_seqlens,
    bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
    write_final_state, use_qk_l2norm, snap=None, config=None,
):
    N, H, K = k.shape
    HV, V = v.shape[-2:]
    assert HV % H == 0, "HV must be a multiple of H"
    assert state.shape[1:] == (HV, V, K) and state.dtype == torch.float32 and state.is_contiguous()
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    R = cu_seqlens.numel() - 1
    o = torch.empty(N, HV, V, dtype=torch.float32, device=v.device)
    if R == 0:
        return o
    has_bank = write_bank is not None
    has_pending = pending_len is not None and read_bank is not None and bank_k is not None
    tmax = bank_k.shape[2] if bank_k is not None else 1
    if snap is not None:
        tmax = snap.shape[1]
    if has_bank:
        _bounds_check(cu_seqlens, tmax)
    dummy = o
    BK = triton.next_power_of_2(K)
    BV, nw = config if config is not None else pick_config(R, HV, V, K)
    grid = (triton.cdiv(V, BV), HV, R)
    _chain_verify_kernel[grid](
        q, k, v, g, beta, o,
        state, slots, cu_seqlens,
        bank_k if bank_k is not None else dummy,
        bank_v if bank_v is not None else dummy,
        bank_g if bank_g is not None else dummy,
        write_bank if has_bank else slots,
        pending_len if has_pending else slots,
        read_bank if has_pending else slots,
        snap if snap is not None else dummy,
        float(scale), tmax,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV,
        HAS_BANK=has_bank, HAS_PENDING=has_pending, WRITE_FINAL=bool(write_final_state),
        L2NORM=bool(use_qk_l2norm), SNAPSHOT=snap is not None,
        num_warps=nw, num_stages=1,
    )
    return o


def chain_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bank_k: torch.Tensor | None = None,
    bank_v: torch.Tensor | None = None,
    bank_g: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
    write_final_state: bool = False,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """Triton chain verify; same arguments, semantics and return as
    :func:`vllm_specla.ops.reference.chain_verify_ref` (``o [N, HV, V]`` float32, ``state`` and the
    write bank updated in place). Extra requirement: ``read_bank[r] != write_bank[r]`` for rows with
    ``pending_len[r] > 0`` (the double-buffer contract)."""
    return _launch_chain(
        q, k, v, g, beta, scale, state, slots, cu_seqlens,
        bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
        write_final_state, use_qk_l2norm,
    )


def chain_verify_snapshots(q, k, v, g, beta, *, scale, state, slots, cu_seqlens, snap, use_qk_l2norm=True):
    """Baseline for benchmarks (vLLM-native style): like :func:`chain_verify` without factors, but
    writes the full state after every window token into ``snap [R, Tmax, HV, V, K]`` fp32."""
    return _launch_chain(
        q, k, v, g, beta, scale, state, slots, cu_seqlens,
        None, None, None, None, None, None, False, use_qk_l2norm, snap=snap,
    )


# ------------------------------------------------------------------------------------------------
# Verify-window conv (depthwise causal conv + SiLU) with deferred conv commit
# ------------------------------------------------------------------------------------------------


@triton.jit
def _conv_verify_kernel(
    x, weight, y, cu_seqlens, conv_state, slots,
    bank_x, write_bank, pending_len, read_bank,
    Tmax, C,
    W: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr,
    HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr, WRITE_FINAL: tl.constexpr,
):
    # One program per (channel tile, row). All accesses of conv_state by this program are ordered
    # by debug_barrier (bar.sync orders global memory within the CTA) between read and write phases.
    i_c = tl.program_id(0)
    i_r = tl.program_id(1)
    W1: tl.constexpr = W - 1
    bos = tl.load(cu_seqlens + i_r).to(tl.int64)
    eos = tl.load(cu_seqlens + i_r + 1).to(tl.int64)
    T = eos - bos
    slot = tl.load(slots + i_r).to(tl.int64)
    o_c = i_c * BC + tl.arange(0, BC)
    mc = o_c < C
    o_j = tl.arange(0, BW)
    mj = o_j < W1
    p_cs = conv_state + slot * W1 * C  # [W1, C] window of this slot

    if HAS_PENDING:
        n_p = tl.load(pending_len + i_r).to(tl.int64)
        n_p = tl.minimum(n_p, Tmax)
        if n_p > 0:
            rb = tl.load(read_bank + i_r).to(tl.int64)
            z = n_p + o_j  # positions in (conv_state ++ pending x) kept as the new window
            from_h = z < W1
            zh = tl.where(from_h, z, 0)
            zx = tl.where(from_h, 0, z - W1)
            bh = tl.load(p_cs + zh[:, None] * C + o_c[None, :], mask=(mj & from_h)[:, None] & mc[None, :], other=0.0)
            bx = tl.load(bank_x + ((slot * 2 + rb) * Tmax + zx[:, None]) * C + o_c[None, :],
                         mask=(mj & (~from_h))[:, None] & mc[None, :], other=0.0)
            val = tl.where(from_h[:, None], bh.to(tl.float32), bx)
            tl.debug_barrier()
            tl.store(p_cs + o_j[:, None] * C + o_c[None, :], val.to(conv_state.dtype.element_ty),
                     mask=mj[:, None] & mc[None, :])
            tl.debug_barrier()

    if HAS_BANK:
        wb = tl.load(write_bank + i_r).to(tl.int64)

    for t in range(0, T):
        acc = tl.zeros([BC], dtype=tl.float32)
        for i in tl.static_range(W):
            z = t + i + 0 * o_c  # position in (window ++ row), as a [BC] vector
            in_h = z < W1
            zh = tl.where(in_h, z, 0)
            zx = tl.where(in_h, 0, z - W1)
            bh = tl.load(p_cs + zh * C + o_c, mask=mc & in_h, other=0.0).to(tl.float32)
            bx = tl.load(x + (bos + zx) * C + o_c, mask=mc & (~in_h), other=0.0).to(tl.float32)
            w = tl.load(weight + o_c * W + i, mask=mc, other=0.0).to(tl.float32)
            acc += w * tl.where(in_h, bh, bx)
        out = acc * tl.sigmoid(acc)
        tl.store(y + (bos + t) * C + o_c, out, mask=mc)
        if HAS_BANK:
            if t < Tmax:
                xt = tl.load(x + (bos + t) * C + o_c, mask=mc, other=0.0).to(tl.float32)
                tl.store(bank_x + ((slot * 2 + wb) * Tmax + t) * C + o_c, xt, mask=mc)

    if WRITE_FINAL:
        z = T + o_j
        from_h = z < W1
        zh = tl.where(from_h, z, 0)
        zx = tl.where(from_h, 0, z - W1)
        bh = tl.load(p_cs + zh[:, None] * C + o_c[None, :], mask=(mj & from_h)[:, None] & mc[None, :], other=0.0)
        bx = tl.load(x + (bos + zx[:, None]) * C + o_c[None, :], mask=(mj & (~from_h))[:, None] & mc[None, :],
                     other=0.0)
        val = tl.where(from_h[:, None], bh.to(tl.float32), bx.to(tl.float32))
        tl.debug_barrier()
        tl.store(p_cs + o_j[:, None] * C + o_c[None, :], val.to(conv_state.dtype.element_ty),
                 mask=mj[:, None] & mc[None, :])


def conv_verify(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    *,
    bank_x: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
    write_final_state: bool = False,
) -> torch.Tensor:
    """Triton verify-window conv; same arguments, semantics and return as
    :func:`vllm_specla.ops.reference.conv_verify_ref` (``y [N, C]`` float32)."""
    N, C = x.shape
    W = weight.shape[-1]
    assert conv_state.shape[1:] == (W - 1, C) and conv_state.is_contiguous()
    x, weight = x.contiguous(), weight.contiguous()
    R = cu_seqlens.numel() - 1
    y = torch.empty(N, C, dtype=torch.float32, device=x.device)
    if R == 0:
        return y
    has_bank = write_bank is not None
    has_pending = pending_len is not None and read_bank is not None and bank_x is not None
    tmax = bank_x.shape[2] if bank_x is not None else 1
    if has_bank:
        _bounds_check(cu_seqlens, tmax)
    BC = min(1024, triton.next_power_of_2(C))
    BW = max(2, triton.next_power_of_2(W - 1))
    grid = (triton.cdiv(C, BC), R)
    _conv_verify_kernel[grid](
        x, weight, y, cu_seqlens, conv_state, slots,
        bank_x if bank_x is not None else y,
        write_bank if has_bank else slots,
        pending_len if has_pending else slots,
        read_bank if has_pending else slots,
        tmax, C,
        W=W, BW=BW, BC=BC, HAS_BANK=has_bank, HAS_PENDING=has_pending,
        WRITE_FINAL=bool(write_final_state), num_warps=4,
    )
    return y
