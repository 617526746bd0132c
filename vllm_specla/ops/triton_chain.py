"""Triton kernels: state-resident chain verify (+ deferred commit, factors) and verify-window conv.

Public functions have exactly the signatures and semantics of their references in
:mod:`vllm_specla.ops.reference` (``chain_verify_ref``, ``conv_verify_ref``); the dispatchers in
``chain_verify.py`` call them for CUDA tensors. Layouts: ``ops/__init__.py``. Math: ALGORITHMS.md
§1 ([V, K] form), §3 (chain verify), §6 (deferred commit). Design notes and measurements:
docs/KERNELS.md, benchmarks/RESULTS.md.

Chain verify, one program per ``(V-tile, value head, row)``:

* the ``BV x K`` slice of ``state[slot, hv]`` is loaded once and stays in registers; the full key
  dim is inside the program so ``M k`` / ``M q`` need no cross-program reduction, and one request
  spreads over ``HV * V / BV`` programs (many SMs at batch 1);
* pending factors (deferred commit) are folded first with the serial flush
  ``M = e^{g_u} M + v~_u k_u^T`` and the committed tile is written once (skipped when the final
  state is written anyway);
* per token: q/k l2norm (eps 1e-6) fused, ``hk = M k``, ``hq = M q`` from the *pre-decay* tile,
  ``v~ = beta (v - e^g hk)``, ``o = e^g hq + v~ (k.q)``, ``M = e^g M + v~ k^T``; exact fp32 FMA
  arithmetic (no tensor-core dots);
* factors go to bank ``write_bank``: ``bank_v`` by every V-tile (its own V slice), ``bank_g`` by
  V-tile 0 only, ``bank_k`` by V-tile 0 of the first value head of each GVA group only — so every
  bank element has exactly one writer. Programs of the same row read the *other* bank
  (``read_bank``) for pending factors: callers must keep ``read_bank != write_bank`` whenever
  ``pending_len > 0`` (double buffering, ``core/state.py``), else a program could overwrite a
  pending k/g another V-tile still reads;
* no per-token state writes; ``write_final_state`` stores the tile after the last token (AR decode).

Two kernel bodies with the same contract: ``_chain_verify_kernel_2d`` (a ``[BV, K]`` tile) and
``_chain_verify_kernel`` (a ``[BV, K/KI, KI]`` tile, scaled state, optional prefetch of the next
token); :data:`TUNED` picks one per regime from shapes only (no host sync, CUDA-graph safe).
Rows must use distinct slots (two rows on one slot would race, as in any state-slot kernel).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from vllm_specla.ops import pdl as _pdl
from vllm_specla.ops.reference import check_out_slots, conv_step_heads
from vllm_specla.ops.triton_fused import pdl_enter

# (BV, num_warps[, KI[, prefetch]]) forced for every chain/recover/tree launch when not None
# (benchmark sweeps, tests).
CONFIG_OVERRIDE: tuple[int, ...] | None = None
# Host-side window-length check (ValueError like the reference). It reads cu_seqlens, which syncs
# when cu_seqlens is on the GPU; it is skipped during CUDA-graph capture. Set False to skip always.
CHECK_BOUNDS = True

# (BV, num_warps, KI, prefetch) per regime for K = 256 heads. "ar": one token per row (decode:
# bandwidth-bound); "verify": several tokens per row (issue-bound per token). "small": at most 16
# (row, head) pairs (batch 1-2). KI: inner key split of the [BV, K/KI, KI] tile of
# _chain_verify_kernel; KI = 0 selects the plain [BV, K] kernel (_chain_verify_kernel_2d).
# "recover": (BV, num_warps) of the recover kernel: 8/2 from the H200 sweeps of session 46
# (bench_kernels.py --recover-configs, A = 5 vs 5 replay launches: 4.55-4.58x / 4.44x at batch 32, 6x256x512 /
# 8x256x256, against 8/1's 4.46x / 4.33-4.34x; 4.75x / 4.73x at batch 128 against 4.67x / 4.69x; RESULTS.md
# "Session 46"; K-tiles, grouped factor loads and the one-token kernel's [BV, K/KI, KI] tile were slower on an H100,
# "Session 48"). The others from the H200 sweeps of benchmarks/bench_kernels.py (benchmarks/RESULTS.md "Kernels",
# docs/KERNELS.md):
#   ar_large     4/1/16/1   198.1 us vs 202.3 ([BV, K] 8/1) at B=128 6x256x512 (fla 198.0)
#   ar_small     4/1/32/1     4.4 us vs 4.8 at B=1
#   verify_large [BV, K] 8/1  T=8 B=128: 379.6 vs 382.2 (8/1/32/1); with pending fused (step T=5)
#                             405.7 vs 444.0 -- the scaled-state fold is slower at large batch
#   verify_small 8/1/32/1     T=8 B=1: 8.0 vs 9.5 us (6x256x512), 7.4 vs 8.9 (8x256x256)
TUNED: dict[str, tuple[int, ...]] = {
    "ar_large": (4, 1, 16, 1),
    "ar_small": (4, 1, 32, 1),
    "verify_large": (8, 1, 0, 0),
    "verify_small": (8, 1, 32, 1),
    "recover": (8, 2),
}
SMALL_PAIRS = 16  # (row, head) pairs at or below which the "small" configs apply


def _env_choice(name: str, default: str, allowed: tuple[str, ...]) -> int:
    """The integer value of environment variable ``name`` (``default`` when unset or empty).

    Raises:
        ValueError: a value outside ``allowed``, naming the variable and the allowed values."""
    val = os.environ.get(name) or default
    if val not in allowed:
        raise ValueError(f"{name}={val!r}: allowed values are {', '.join(allowed)}")
    return int(val)


# How many pending factors ahead _chain_verify_kernel's deferred commit loads them: 0 (each factor's
# loads wait for the fold of the one before), 1-4 (VLLM_SPECLA_PENDING_PREFETCH). Session 39 (H100,
# RESULTS.md; bench_ut.py, graph-timed, us per layer, benchmarks/ut_h100_s39c_*.json): SpecLA steps of 5 and
# 8 tokens with as many pending factors, depth 0 -> 4: 9.8 -> 9.1 / 13.2 -> 12.2 us (6x256x512, batch 1),
# 8.9 -> 8.0 / 12.2 -> 11.1 (8x256x256), 13.8 -> 13.2 / 18.2 -> 17.3 and 10.6 -> 9.8 / 14.1 -> 13.1 (batch
# 2); verify windows (nothing pending) within 0.1 us; end to end at batch 1, K = 7, a step 2.115 / 2.117
# -> 2.111 ms (flame) and 2.189 / 2.189 -> 2.180 (map; e2e_h100_s39d.jsonl). Only launches of that regime take
# it (_pend_prefetch). Loading tokens two ahead instead of one was measured there too and removed (commit 08293f2
# keeps it; RESULTS.md: slower verify windows, faster 6x256x512 steps at pending depth 4, no end-to-end run).
PENDING_PREFETCH = _env_choice("VLLM_SPECLA_PENDING_PREFETCH", "4", ("0", "1", "2", "3", "4"))


# Whether _chain_verify_kernel tests its scaled tile for renormalisation per fold and token (0), or once per
# program from all of its decays (1: _rescale_needed; the loops without the test where nothing can need it), or by
# shape (auto, the default: windows of more than one token per row, and one-token rows at <= PRECHECK_AR_MAX_PAIRS
# (row, value head) pairs). VLLM_SPECLA_RESCALE_PRECHECK. Session 47, H100s (RESULTS.md; kernels_h100_s47_s46f_*.json,
# e2e_h100_s47_s46g.jsonl, e2e_h100_s47a.jsonl), the precheck against 0: verify and step windows at batch 1 / 2
# 1.7-6.2 % faster, batch-1 K = 7 SpecLA steps 6-12 us faster (flame / map); one-token launches at batch 1 4.5 %
# faster to 6.4 % slower (the AR step the same (flame) or 4-9 us faster (map)), at batch 2 up to 10 % slower
# (6x256x512: 6.0 -> 6.5 us per launch), so auto leaves them from 9 pairs on, as it does large-batch AR (whose
# ar_large config the precheck's loops cost 7 registers, 148 -> 155, sm_90 SASS; at batch 128 windows measured the
# same with and without it).
RESCALE_PRECHECK = os.environ.get("VLLM_SPECLA_RESCALE_PRECHECK") or "auto"
if RESCALE_PRECHECK not in ("auto", "0", "1"):
    raise ValueError(f"VLLM_SPECLA_RESCALE_PRECHECK={RESCALE_PRECHECK!r}: allowed values are auto, 0, 1")
PRECHECK_AR_MAX_PAIRS = 8


def _rescale_precheck(N: int, R: int, HV: int) -> bool:
    """``RESCALE_PRECHECK`` of a ``_chain_verify_kernel`` launch of ``N`` tokens in ``R`` rows of ``HV`` value heads
    (shapes only)."""
    if RESCALE_PRECHECK != "auto":
        return RESCALE_PRECHECK == "1"
    return N > R or R * HV <= PRECHECK_AR_MAX_PAIRS


def _pend_prefetch(has_pending: bool, N: int, R: int, HV: int) -> int:
    """``PEND_PF`` of a ``_chain_verify_kernel`` launch: :data:`PENDING_PREFETCH` where it was measured,
    windows of more than one token per row with pending factors at <= :data:`SMALL_PAIRS` (row, value head)
    pairs (the ``verify_small`` regime: batch-1 / 2 SpecLA steps); 0 elsewhere (one-token windows with
    pending factors, larger batches: unmeasured, and the prefetched factors cost registers). Shapes only."""
    return PENDING_PREFETCH if has_pending and N > R and R * HV <= SMALL_PAIRS else 0


def pick_config(num_rows: int, HV: int, V: int, K: int, tokens_per_row: float = 1.0) -> tuple[int, int, int, int]:
    """``(BV, num_warps, KI, prefetch)`` for the chain kernel (recover/tree use ``BV, num_warps``).

    Host-only inputs (shapes), so no sync and CUDA-graph safe. For K = 256 the per-regime entries
    of :data:`TUNED`; for other K the warps keep ~64 fp32 tile elements per thread.
    """
    if CONFIG_OVERRIDE is not None:
        return CONFIG_OVERRIDE
    BK = triton.next_power_of_2(K)
    regime = "ar" if tokens_per_row <= 1.0 else "verify"
    size = "small" if num_rows * HV <= SMALL_PAIRS else "large"
    BV, nw, KI, PF = (tuple(TUNED[f"{regime}_{size}"]) + (0, 0))[:4]
    BV = max(1, min(BV, triton.next_power_of_2(V)))
    if BK != 256:
        nw = max(1, min(16, BV * BK // 2048))
        KI = min(KI, BK) if KI else 0
    return BV, nw, KI, PF


def _bounds_check(cu_seqlens: torch.Tensor, tmax: int) -> None:
    if not CHECK_BOUNDS:
        return
    if cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    if lens.numel() and int(lens.max()) > tmax:
        raise ValueError(f"window of {int(lens.max())} tokens exceeds the factor bank (Tmax={tmax})")


@triton.jit
def _chain_verify_kernel_2d(
    q, k, v, g, beta, o,
    state, slots, out_slots, cu_seqlens,
    bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
    snap,
    scale, Tmax, sq, sk, sv, sg, sb,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr, WRITE_FINAL: tl.constexpr,
    L2NORM: tl.constexpr, SNAPSHOT: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
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
        b_q = tl.load(q + i_t * sq + i_h * K + o_k, mask=mk, other=0.0).to(tl.float32)
        b_k = tl.load(k + i_t * sk + i_h * K + o_k, mask=mk, other=0.0).to(tl.float32)
        b_v = tl.load(v + i_t * sv + i_hv * V + o_v, mask=mv, other=0.0).to(tl.float32)
        b_g = tl.load(g + i_t * sg + i_hv).to(tl.float32)
        b_beta = tl.load(beta + i_t * sb + i_hv).to(tl.float32)
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
        # re-read the slot so the compiler rebuilds the [BV, BK] addresses here instead of keeping
        # 64-bit pointers for the whole tile live across the window (~2x the registers of the tile);
        # out_slots (= slots unless the caller gives other write slots) holds the slot written
        slot2 = tl.load(out_slots + i_r).to(tl.int64)
        p_s2 = state + (slot2 * HV + i_hv) * (V * K) + o_v[:, None] * K + o_k[None, :]
        tl.store(p_s2, b_h, mask=mh)


# Renormalise the scaled state (M = s * Mt) when s falls below this (keeps v~/s far from overflow).
_RESCALE_MIN = 1e-12
_LOG_RESCALE_MIN = math.log(_RESCALE_MIN)


@triton.jit
def _tok_load(q, k, v, g, beta, i, sq, sk, sv, sg, sb, i_h, i_hv, o_kk, mk, o_v, mv, K: tl.constexpr, V: tl.constexpr):
    """Token ``i``'s ``q``, ``k`` (``[KO, KI]``), ``v`` (the tile's ``[BV]``), ``g``, ``beta``, float32."""
    b_q = tl.load(q + i * sq + i_h * K + o_kk, mask=mk, other=0.0).to(tl.float32)
    b_k = tl.load(k + i * sk + i_h * K + o_kk, mask=mk, other=0.0).to(tl.float32)
    b_v = tl.load(v + i * sv + i_hv * V + o_v, mask=mv, other=0.0).to(tl.float32)
    b_g = tl.load(g + i * sg + i_hv).to(tl.float32)
    b_b = tl.load(beta + i * sb + i_hv).to(tl.float32)
    return b_q, b_k, b_v, b_g, b_b


@triton.jit
def _pend_load(bank_k, bank_v, bank_g, base, u, n_p, i_h, i_hv, o_kk, mk, o_v, mv, H: tl.constexpr, HV: tl.constexpr,
               K: tl.constexpr, V: tl.constexpr):
    """Pending factor ``u`` of the read bank (``base``: its position 0): ``k^`` (``[KO, KI]``), the tile's
    ``v~`` (``[BV]``) and ``g``. ``u`` is clamped to ``n_p - 1`` (``n_p >= 1``): a prefetch past the last
    pending factor re-reads it (in bounds; unused)."""
    u = tl.minimum(u, n_p - 1)
    b_pk = tl.load(bank_k + ((base + u) * H + i_h) * K + o_kk, mask=mk, other=0.0)
    b_pv = tl.load(bank_v + ((base + u) * HV + i_hv) * V + o_v, mask=mv, other=0.0)
    b_pg = tl.load(bank_g + (base + u) * HV + i_hv)
    return b_pk, b_pv, b_pg


@triton.jit
def _pend_fold(b_h, sc, bank_k, bank_v, bank_g, base, n_p, i_h, i_hv, o_kk, mk, o_v, mv,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               RESCALE_MIN: tl.constexpr, PEND_PF: tl.constexpr, CHECK: tl.constexpr):
    """The deferred commit's fold of ``n_p >= 1`` pending factors into the scaled tile ``(b_h, sc)`` (see
    :func:`_chain_verify_kernel`); ``CHECK``: renormalise when ``sc < RESCALE_MIN`` (False where
    :func:`_rescale_needed` said no prefix of the decays gets there). Returns ``(b_h, sc)``."""
    if PEND_PF > 0:  # factors u + 1 .. u + PEND_PF in flight while u is folded
        pa_k, pa_v, pa_g = _pend_load(bank_k, bank_v, bank_g, base, 0, n_p, i_h, i_hv, o_kk, mk, o_v, mv,
                                      H, HV, K, V)
        if PEND_PF > 1:
            pb_k, pb_v, pb_g = _pend_load(bank_k, bank_v, bank_g, base, 1, n_p, i_h, i_hv, o_kk, mk, o_v,
                                          mv, H, HV, K, V)
        if PEND_PF > 2:
            pc_k, pc_v, pc_g = _pend_load(bank_k, bank_v, bank_g, base, 2, n_p, i_h, i_hv, o_kk, mk, o_v,
                                          mv, H, HV, K, V)
        if PEND_PF > 3:
            pd_k, pd_v, pd_g = _pend_load(bank_k, bank_v, bank_g, base, 3, n_p, i_h, i_hv, o_kk, mk, o_v,
                                          mv, H, HV, K, V)
    for u in range(0, n_p):
        if PEND_PF > 0:
            b_pk, b_pv, b_pg = pa_k, pa_v, pa_g
            if PEND_PF == 1:
                pa_k, pa_v, pa_g = _pend_load(bank_k, bank_v, bank_g, base, u + 1, n_p, i_h, i_hv, o_kk, mk,
                                              o_v, mv, H, HV, K, V)
            else:
                pa_k, pa_v, pa_g = pb_k, pb_v, pb_g
            if PEND_PF == 2:
                pb_k, pb_v, pb_g = _pend_load(bank_k, bank_v, bank_g, base, u + 2, n_p, i_h, i_hv, o_kk, mk,
                                              o_v, mv, H, HV, K, V)
            elif PEND_PF > 2:
                pb_k, pb_v, pb_g = pc_k, pc_v, pc_g
            if PEND_PF == 3:
                pc_k, pc_v, pc_g = _pend_load(bank_k, bank_v, bank_g, base, u + 3, n_p, i_h, i_hv, o_kk, mk,
                                              o_v, mv, H, HV, K, V)
            elif PEND_PF > 3:
                pc_k, pc_v, pc_g = pd_k, pd_v, pd_g
                pd_k, pd_v, pd_g = _pend_load(bank_k, bank_v, bank_g, base, u + 4, n_p, i_h, i_hv, o_kk, mk,
                                              o_v, mv, H, HV, K, V)
        else:
            b_pk, b_pv, b_pg = _pend_load(bank_k, bank_v, bank_g, base, u, n_p, i_h, i_hv, o_kk, mk, o_v, mv,
                                          H, HV, K, V)
        sc = sc * tl.exp(b_pg)
        if CHECK:
            if sc < RESCALE_MIN:
                b_h = b_h * sc
                sc = tl.full([], 1.0, dtype=tl.float32)
        b_h += (b_pv / sc)[:, None, None] * b_pk[None, :, :]
    return b_h, sc


@triton.jit
def _window(b_h, sc, q, k, v, g, beta, o, bank_k, bank_v, bank_g, snap, wbase, scale, Tmax, sq, sk, sv, sg, sb,
            bos, eos, i_v, i_h, i_hv, i_r, o_kk, mk, o_v, mv, offs, mh,
            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, G: tl.constexpr,
            HAS_BANK: tl.constexpr, L2NORM: tl.constexpr, SNAPSHOT: tl.constexpr, RESCALE_MIN: tl.constexpr,
            PREFETCH: tl.constexpr, CHECK: tl.constexpr):
    """The row's window ``bos .. eos - 1`` through the scaled tile ``(b_h, sc)`` (see :func:`_chain_verify_kernel`):
    outputs, factors into the write bank at ``wbase``, snapshots; ``CHECK`` as in :func:`_pend_fold`. Returns
    ``(b_h, sc)``."""
    T = eos - bos
    if PREFETCH:
        # clamped indices instead of masks: always a valid token (the launcher disables PREFETCH
        # for N == 0); a row's last iteration re-reads its last token, unused
        n_q, n_k, n_v, n_g, n_b = _tok_load(q, k, v, g, beta, tl.maximum(tl.minimum(bos, eos - 1), 0), sq, sk, sv, sg,
                                            sb, i_h, i_hv, o_kk, mk, o_v, mv, K, V)
    for t in range(0, T):
        i_t = bos + t
        if PREFETCH:
            b_q, b_k, b_v, b_g, b_beta = n_q, n_k, n_v, n_g, n_b
            n_q, n_k, n_v, n_g, n_b = _tok_load(q, k, v, g, beta, tl.minimum(i_t + 1, eos - 1), sq, sk, sv, sg, sb,
                                                i_h, i_hv, o_kk, mk, o_v, mv, K, V)
        else:
            b_q, b_k, b_v, b_g, b_beta = _tok_load(q, k, v, g, beta, i_t, sq, sk, sv, sg, sb, i_h, i_hv, o_kk, mk, o_v,
                                                   mv, K, V)
        if L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(tl.sum(b_q * b_q, 1), 0) + 1e-6)
            b_k = b_k * tl.rsqrt(tl.sum(tl.sum(b_k * b_k, 1), 0) + 1e-6)
        b_q = b_q * scale
        sc = sc * tl.exp(b_g)
        if CHECK:
            if sc < RESCALE_MIN:
                b_h = b_h * sc
                sc = tl.full([], 1.0, dtype=tl.float32)
        hk = tl.sum(tl.sum(b_h * b_k[None, :, :], 1), 1)  # (Mt k): [BV]
        hq = tl.sum(tl.sum(b_h * b_q[None, :, :], 1), 1)
        b_vt = b_beta * (b_v - sc * hk)
        kq = tl.sum(tl.sum(b_k * b_q, 1), 0)
        b_o = sc * hq + b_vt * kq
        b_h += (b_vt / sc)[:, None, None] * b_k[None, :, :]
        tl.store(o + (i_t * HV + i_hv) * V + o_v, b_o, mask=mv)
        if HAS_BANK:
            if t < Tmax:
                tl.store(bank_v + ((wbase + t) * HV + i_hv) * V + o_v, b_vt, mask=mv)
                if i_v == 0:
                    tl.store(bank_g + (wbase + t) * HV + i_hv, b_g)
                    if i_hv % G == 0:
                        tl.store(bank_k + ((wbase + t) * H + i_h) * K + o_kk, b_k, mask=mk)
        if SNAPSHOT:
            # baseline only (vLLM-native style): a full state after every window token
            p_sn = snap + ((i_r * Tmax + t) * HV + i_hv) * (V * K) + offs
            tl.store(p_sn, b_h * sc, mask=mh)

    return b_h, sc


@triton.jit
def _rescale_needed(g, bank_g, sg, bos, eos, base, n_p, i_hv, HV: tl.constexpr, TW: tl.constexpr,
                    TP: tl.constexpr, LOG_RESCALE_MIN: tl.constexpr):
    """Whether the scaled tile's ``sc`` (1, then times ``e^g`` per pending factor and per window token) can fall
    below ``RESCALE_MIN``: a prefix sum of the ``n_p`` pending decays (bank ``g`` at ``base``) and then the window's
    (``g`` rows ``bos .. eos - 1``) below ``LOG_RESCALE_MIN``, or a window longer than ``TW`` (not read). All the
    decays in two vector loads beside the state tile's."""
    o_p = tl.arange(0, TP)
    g_p = tl.load(bank_g + (base + o_p) * HV + i_hv, mask=o_p < n_p, other=0.0)
    c_p = tl.cumsum(g_p, 0)
    o_w = tl.arange(0, TW)
    g_w = tl.load(g + (bos + o_w) * sg + i_hv, mask=o_w < eos - bos, other=0.0).to(tl.float32)
    c_w = tl.cumsum(g_w, 0) + tl.sum(g_p, 0)
    lo = tl.minimum(tl.min(c_p, 0), tl.min(c_w, 0))
    return (lo < LOG_RESCALE_MIN) | (eos - bos > TW)


@triton.jit
def _chain_verify_kernel(
    q, k, v, g, beta, o,
    state, slots, out_slots, cu_seqlens,
    bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
    snap,
    scale, Tmax, sq, sk, sv, sg, sb,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, KO: tl.constexpr, KI: tl.constexpr,
    HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr, WRITE_FINAL: tl.constexpr,
    L2NORM: tl.constexpr, SNAPSHOT: tl.constexpr, RESCALE_MIN: tl.constexpr, PREFETCH: tl.constexpr,
    PDL: tl.constexpr = False, PEND_PF: tl.constexpr = 0, TW: tl.constexpr = 16, TP: tl.constexpr = 16,
    LOG_RESCALE_MIN: tl.constexpr = -27.631021115928547,  # log(_RESCALE_MIN)
    RESCALE_PRECHECK: tl.constexpr = False,
):
    """State tile as ``[BV, KO, KI]`` (key index ``ko * KI + ki``): Triton gives the warp's threads
    to ``KI`` (4 floats each) and then to ``BV`` (the leading dim wins the tie), so with ``KI`` = 16/32
    each ``M k`` reduction is mostly in-thread (sum over ``KO``) plus log2(KI/4) shuffles per row,
    instead of 5 shuffle levels per row of the ``[BV, K]`` layout. ``KO = 1, KI = K`` is the plain
    ``[BV, K]`` tile.

    The state is kept scaled, ``M = s * Mt`` with a scalar ``s`` (the decay is one scalar per head
    and token): ``s <- e^g s`` and ``Mt += (v~ / s) k^T`` is one FMA per element per token instead
    of a multiply and an FMA; ``Mt`` is renormalised (``Mt *= s, s = 1``, a uniform branch) if
    ``s < RESCALE_MIN`` and multiplied by ``s`` when stored. ``RESCALE_PRECHECK``: that test runs only in programs
    where :func:`_rescale_needed` finds a prefix of their decays (pending, then window) below ``RESCALE_MIN``; the
    others run the loops without it: the same operations wherever the test would not fire. (The precheck sums the
    decays where the loop multiplies their exponentials, so within rounding of ``RESCALE_MIN`` a program may skip
    a renormalisation the test would have made: the same result within fp32 rounding, ``sc`` still ~1e-12.)

    ``PREFETCH``: token ``t+1``'s q/k/v/g/beta are loaded while token ``t`` computes (manual software
    pipelining: the per-token chain is otherwise load latency -> norms -> reductions -> update).
    ``PEND_PF``: the same for the pending factors of the deferred commit, ``PEND_PF`` factors ahead (0:
    each factor's loads wait for the fold of the one before; :data:`PENDING_PREFETCH`).
    """
    pdl_enter(PDL)
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_r = tl.program_id(2)
    G: tl.constexpr = HV // H
    i_h = i_hv // G

    bos = tl.load(cu_seqlens + i_r).to(tl.int64)
    eos = tl.load(cu_seqlens + i_r + 1).to(tl.int64)
    slot = tl.load(slots + i_r).to(tl.int64)

    o_kk = tl.arange(0, KO)[:, None] * KI + tl.arange(0, KI)[None, :]  # [KO, KI] key index
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_kk < K
    mv = o_v < V
    offs = o_v[:, None, None] * K + o_kk[None, :, :]  # [BV, KO, KI]
    mh = mv[:, None, None] & mk[None, :, :]

    p_s = state + (slot * HV + i_hv) * (V * K) + offs
    b_h = tl.load(p_s, mask=mh, other=0.0).to(tl.float32)
    sc = tl.full([], 1.0, dtype=tl.float32)

    # ---- the scaled tile's renormalisation test, where some prefix of the decays can need it ----
    # (a test per fold / token is if-converted into a predicated multiply per tile element: sm_90 SASS of the
    # verify_small config, Triton 3.6, 261 -> 179 instructions per pending factor and 692 -> 538 per token
    # without it)
    n_p = tl.full([], 0, dtype=tl.int32)
    base = tl.full([], 0, dtype=tl.int64)
    if HAS_PENDING:
        n_p = tl.minimum(tl.load(pending_len + i_r).to(tl.int32), Tmax)
        if RESCALE_PRECHECK:
            base = (slot * 2 + tl.load(read_bank + i_r).to(tl.int64)) * Tmax
    if RESCALE_PRECHECK:
        check = _rescale_needed(g, bank_g, sg, bos, eos, base, n_p, i_hv, HV, TW, TP, LOG_RESCALE_MIN)
    else:
        check = True  # (static: only the tested loops are compiled, with the loads of the kernel before it)

    # ---- deferred commit: fold the pending factors of bank read_bank, write the state once ----
    if HAS_PENDING:
        if n_p > 0:
            if not RESCALE_PRECHECK:
                base = (slot * 2 + tl.load(read_bank + i_r).to(tl.int64)) * Tmax
            if check:
                b_h, sc = _pend_fold(b_h, sc, bank_k, bank_v, bank_g, base, n_p, i_h, i_hv, o_kk, mk, o_v, mv,
                                     H, HV, K, V, RESCALE_MIN, PEND_PF, True)
            else:
                b_h, sc = _pend_fold(b_h, sc, bank_k, bank_v, bank_g, base, n_p, i_h, i_hv, o_kk, mk, o_v, mv,
                                     H, HV, K, V, RESCALE_MIN, PEND_PF, False)
            if not WRITE_FINAL:
                tl.store(p_s, b_h * sc, mask=mh)

    wbase = tl.full([], 0, dtype=tl.int64)
    if HAS_BANK:
        wb = tl.load(write_bank + i_r).to(tl.int64)
        wbase = (slot * 2 + wb) * Tmax

    # ---- the window, state tile on chip ----
    if check:
        b_h, sc = _window(b_h, sc, q, k, v, g, beta, o, bank_k, bank_v, bank_g, snap, wbase, scale, Tmax,
                          sq, sk, sv, sg, sb, bos, eos, i_v, i_h, i_hv, i_r, o_kk, mk, o_v, mv, offs, mh,
                          H, HV, K, V, G, HAS_BANK, L2NORM, SNAPSHOT, RESCALE_MIN, PREFETCH, True)
    else:
        b_h, sc = _window(b_h, sc, q, k, v, g, beta, o, bank_k, bank_v, bank_g, snap, wbase, scale, Tmax,
                          sq, sk, sv, sg, sb, bos, eos, i_v, i_h, i_hv, i_r, o_kk, mk, o_v, mv, offs, mh,
                          H, HV, K, V, G, HAS_BANK, L2NORM, SNAPSHOT, RESCALE_MIN, PREFETCH, False)

    if WRITE_FINAL:
        # re-read the slot so the compiler rebuilds the tile addresses here instead of keeping
        # 64-bit pointers for the whole tile live across the window; the write slot from out_slots
        slot2 = tl.load(out_slots + i_r).to(tl.int64)
        tl.store(state + (slot2 * HV + i_hv) * (V * K) + offs, b_h * sc, mask=mh)


def _rows_dense(x: torch.Tensor, ndim_inner: int) -> torch.Tensor:
    """``x`` itself when every dim but the first (token) dim is densely packed, else a copy."""
    expect = 1
    for d in range(x.dim() - 1, x.dim() - 1 - ndim_inner, -1):
        if x.shape[d] != 1 and x.stride(d) != expect:
            return x.contiguous()
        expect *= x.shape[d]
    return x


def _launch_chain(
    q, k, v, g, beta, scale, state, slots, cu_seqlens,
    bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
    write_final_state, use_qk_l2norm, snap=None, config=None, out_slots=None,
):
    N, H, K = k.shape
    HV, V = v.shape[-2:]
    assert HV % H == 0, "HV must be a multiple of H"
    assert state.shape[1:] == (HV, V, K) and state.dtype == torch.float32 and state.is_contiguous()
    # token-strided inputs are read in place (e.g. q/k/v column slices of one conv output, g/beta
    # of one gating output); only the head and feature dims must be dense
    q, k, v = (_rows_dense(x, 2) for x in (q, k, v))
    g, beta = (_rows_dense(x, 1) for x in (g, beta))
    R = cu_seqlens.numel() - 1
    assert slots.numel() >= R, f"slots ({slots.numel()}) must cover the {R} rows of cu_seqlens"
    # per-row index tensors are read with unit stride by the kernels (no-op when already dense)
    cu_seqlens, slots, write_bank, pending_len, read_bank, out_slots = (
        x.contiguous() if x is not None else None
        for x in (cu_seqlens, slots, write_bank, pending_len, read_bank, out_slots))
    if out_slots is not None:
        check_out_slots(out_slots, R, write_final_state, bank_k, write_bank, pending_len)
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
    cfg = config if config is not None else pick_config(R, HV, V, K, N / R)
    BV, nw = cfg[0], cfg[1]
    KI = cfg[2] if len(cfg) > 2 else 0
    PF = bool(cfg[3]) if len(cfg) > 3 else False
    PF = PF and N > 0
    grid = (triton.cdiv(V, BV), HV, R)
    args = (
        q, k, v, g, beta, o,
        state, slots, out_slots if out_slots is not None else slots, cu_seqlens,
        bank_k if bank_k is not None else dummy,
        bank_v if bank_v is not None else dummy,
        bank_g if bank_g is not None else dummy,
        write_bank if has_bank else slots,
        pending_len if has_pending else slots,
        read_bank if has_pending else slots,
        snap if snap is not None else dummy,
        float(scale), tmax, q.stride(0), k.stride(0), v.stride(0), g.stride(0), beta.stride(0),
    )
    on = _pdl.enabled(v)
    flags = dict(HAS_BANK=has_bank, HAS_PENDING=has_pending, WRITE_FINAL=bool(write_final_state),
                 L2NORM=bool(use_qk_l2norm), SNAPSHOT=snap is not None, PDL=on, **_pdl.launch_kw(on))
    if KI == 0:  # the plain [BV, K] kernel (kept for comparison in the sweep)
        _chain_verify_kernel_2d[grid](*args, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, **flags,
                                      num_warps=nw, num_stages=1)
    else:
        KI = min(KI, BK)
        # the decays _rescale_needed reads: the bank's (tmax) and the rows' windows (bounded by tmax with a bank or
        # snapshots; one token per row for AR; longer windows than TW take the renormalisation test)
        TP = max(2, triton.next_power_of_2(tmax))
        TW = TP if (has_bank or snap is not None) else (2 if N == R else 16)
        _chain_verify_kernel[grid](*args, H=H, HV=HV, K=K, V=V, BV=BV, KO=BK // KI, KI=KI, **flags,
                                   RESCALE_MIN=_RESCALE_MIN, PREFETCH=PF, PEND_PF=_pend_prefetch(has_pending, N, R, HV),
                                   TW=TW, TP=TP, LOG_RESCALE_MIN=_LOG_RESCALE_MIN,
                                   RESCALE_PRECHECK=_rescale_precheck(N, R, HV), num_warps=nw, num_stages=1)
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
    out_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton chain verify; same arguments, semantics and return as
    :func:`vllm_specla.ops.reference.chain_verify_ref` (``o [N, HV, V]`` float32, ``state`` and the
    write bank updated in place). Extra requirement: ``read_bank[r] != write_bank[r]`` for rows with
    ``pending_len[r] > 0`` (the double-buffer contract).

    ``out_slots`` (``[R]`` int, with ``write_final_state`` only, no factor banks or pending factors):
    row ``r`` reads ``state[slots[r]]`` and writes the state after its window to
    ``state[out_slots[r]]`` (the read slot is left as it was), in the same single pass: a draft step
    on a scratch copy without the copy. Out slots must be distinct and not read by any row of the
    launch. Raises ``ValueError`` otherwise (:func:`~vllm_specla.ops.reference.check_out_slots`)."""
    return _launch_chain(
        q, k, v, g, beta, scale, state, slots, cu_seqlens,
        bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
        write_final_state, use_qk_l2norm, out_slots=out_slots,
    )


def chain_verify_snapshots(q, k, v, g, beta, *, scale, state, slots, cu_seqlens, snap, use_qk_l2norm=True):
    """Baseline for benchmarks (vLLM-native style): like :func:`chain_verify` without factors, but
    writes the full state after every window token into ``snap [R, Tmax, HV, V, K]`` fp32."""
    return _launch_chain(
        q, k, v, g, beta, scale, state, slots, cu_seqlens,
        None, None, None, None, None, None, False, use_qk_l2norm, snap=snap,
    )


# ------------------------------------------------------------------------------------------------
# One-token step: the short conv (+ SiLU) and the recurrence in one launch
# ------------------------------------------------------------------------------------------------

# (BV, num_warps, KI) of _conv_chain_step_kernel when not None (benchmark sweeps, tests)
STEP_CONFIG_OVERRIDE: tuple[int, int, int] | None = None
# The default: a [4, K/KI, KI] state tile per one-warp program as the one-token chain kernel at batch 1-2
# ("ar_small"), with KI = K so the warp's 32 threads hold distinct key columns (4 V rows each): the q / k
# conv inputs (4 taps, 3 window rows, the new input, for 2 x K channels) are then not replicated over the
# threads, 8 floats per thread and vector at K = 256 instead of 32 with KI = 32. On an H100 the AR step with it was
# 0.9 % / 3.8 % slower (flame / map), (16, 4, 256) within noise (RESULTS.md "Session 35", s32b).
STEP_CONFIG: tuple[int, int, int] = (4, 1, 256)
# q / k window writers: one int32 counter per (row, key head), zero between launches (the last program of a
# (row, key head) to read the window writes it, then resets the counter). Allocated outside CUDA-graph capture.
_STEP_COUNTERS: dict = {}
_STEP_COUNTERS_OLD: list = []  # replaced buffers, kept alive: a CUDA graph captured before may still use them


def step_counters(device: torch.device, n: int) -> torch.Tensor | None:
    """The zeroed int32 counters of :func:`conv_chain_step` (at least ``n``, one per (row, key head)) on
    ``device``, allocated on first use (4096 or ``n``, whichever is larger); None when more are needed
    during CUDA-graph capture, where allocating them could hand a graph's private memory to later launches
    (the dispatcher then runs the two-launch form). Launches on one device share them: they must not run
    concurrently on two streams."""
    key = (device.type, device.index)
    buf = _STEP_COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        if buf is not None:
            _STEP_COUNTERS_OLD.append(buf)
        buf = torch.zeros(max(4096, n), dtype=torch.int32, device=device)
        _STEP_COUNTERS[key] = buf
    return buf


@triton.jit
def _conv_chain_step_kernel(
    x, conv_w, conv_state, g, beta, o,
    state, slots, out_slots, counters,
    scale, SX, sg, sb,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, KO: tl.constexpr, KI: tl.constexpr,
    WRITE: tl.constexpr, L2NORM: tl.constexpr, PDL: tl.constexpr = False,
):
    """One token per row: ``y = SiLU(conv4(window ++ x))`` for the program's q / k channels (its key head,
    all ``K``) and v channels (its ``BV`` slice), then the gated delta rule on the ``[BV, K]`` state tile,
    as ``_conv4_verify_kernel`` + ``_chain_verify_kernel_2d`` for windows of one token. Grid ``(V / BV, HV,
    rows)``. Every program of a (row, key head) computes the q / k conv (redundantly; the inputs are in
    L2). ``WRITE``: the state and the window after the token go to ``out_slots[r]``; the v channels' window
    rows by their one reader (the program), the q / k channels' by the last program of the (row, key head)
    to finish reading them (an acquire-release counter, reset by that program), after a barrier: no program
    can see a window row it did not read. The conv taps are model weights: loaded before the PDL wait."""
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_r = tl.program_id(2).to(tl.int64)
    G: tl.constexpr = HV // H
    C: tl.constexpr = 2 * H * K + HV * V
    i_h = i_hv // G

    o_kk = tl.arange(0, KO)[:, None] * KI + tl.arange(0, KI)[None, :]  # [KO, KI] key index
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_kk < K
    mv = o_v < V
    c_q = i_h * K + o_kk
    c_k = H * K + i_h * K + o_kk
    c_v = 2 * H * K + i_hv * V + o_v
    wq0 = tl.load(conv_w + c_q * 4, mask=mk, other=0.0)
    wq1 = tl.load(conv_w + c_q * 4 + 1, mask=mk, other=0.0)
    wq2 = tl.load(conv_w + c_q * 4 + 2, mask=mk, other=0.0)
    wq3 = tl.load(conv_w + c_q * 4 + 3, mask=mk, other=0.0)
    wk0 = tl.load(conv_w + c_k * 4, mask=mk, other=0.0)
    wk1 = tl.load(conv_w + c_k * 4 + 1, mask=mk, other=0.0)
    wk2 = tl.load(conv_w + c_k * 4 + 2, mask=mk, other=0.0)
    wk3 = tl.load(conv_w + c_k * 4 + 3, mask=mk, other=0.0)
    wv0 = tl.load(conv_w + c_v * 4, mask=mv, other=0.0)
    wv1 = tl.load(conv_w + c_v * 4 + 1, mask=mv, other=0.0)
    wv2 = tl.load(conv_w + c_v * 4 + 2, mask=mv, other=0.0)
    wv3 = tl.load(conv_w + c_v * 4 + 3, mask=mv, other=0.0)
    if PDL:  # (ops/pdl.py: nothing but model weights before the wait)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

    slot = tl.load(slots + i_r).to(tl.int64)
    p_cs = conv_state + slot * 3 * C
    p_x = x + i_r * SX
    p_s = state + (slot * HV + i_hv) * (V * K) + o_v[:, None, None] * K + o_kk[None, :, :]
    mh = mv[:, None, None] & mk[None, :, :]
    b_h = tl.load(p_s, mask=mh, other=0.0)
    xq = tl.load(p_x + c_q, mask=mk, other=0.0).to(tl.float32)
    xk = tl.load(p_x + c_k, mask=mk, other=0.0).to(tl.float32)
    xv = tl.load(p_x + c_v, mask=mv, other=0.0).to(tl.float32)
    aq = (wq0 * tl.load(p_cs + c_q, mask=mk, other=0.0).to(tl.float32)
          + wq1 * tl.load(p_cs + C + c_q, mask=mk, other=0.0).to(tl.float32)
          + wq2 * tl.load(p_cs + 2 * C + c_q, mask=mk, other=0.0).to(tl.float32) + wq3 * xq)
    ak = (wk0 * tl.load(p_cs + c_k, mask=mk, other=0.0).to(tl.float32)
          + wk1 * tl.load(p_cs + C + c_k, mask=mk, other=0.0).to(tl.float32)
          + wk2 * tl.load(p_cs + 2 * C + c_k, mask=mk, other=0.0).to(tl.float32) + wk3 * xk)
    v1 = tl.load(p_cs + C + c_v, mask=mv, other=0.0).to(tl.float32)
    v2 = tl.load(p_cs + 2 * C + c_v, mask=mv, other=0.0).to(tl.float32)
    av = wv0 * tl.load(p_cs + c_v, mask=mv, other=0.0).to(tl.float32) + wv1 * v1 + wv2 * v2 + wv3 * xv
    b_q = aq * tl.sigmoid(aq)
    b_k = ak * tl.sigmoid(ak)
    b_v = av * tl.sigmoid(av)
    b_g = tl.load(g + i_r * sg + i_hv).to(tl.float32)
    b_beta = tl.load(beta + i_r * sb + i_hv).to(tl.float32)

    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(tl.sum(b_q * b_q, 1), 0) + 1e-6)
        b_k = b_k * tl.rsqrt(tl.sum(tl.sum(b_k * b_k, 1), 0) + 1e-6)
    b_q = b_q * scale
    eg = tl.exp(b_g)
    hk = tl.sum(tl.sum(b_h * b_k[None, :, :], 2), 1)  # (M k): [BV]
    hq = tl.sum(tl.sum(b_h * b_q[None, :, :], 2), 1)
    b_vt = b_beta * (b_v - eg * hk)
    kq = tl.sum(tl.sum(b_k * b_q, 1), 0)
    tl.store(o + (i_r * HV + i_hv) * V + o_v, eg * hq + b_vt * kq, mask=mv)
    if WRITE:
        oslot = tl.load(out_slots + i_r).to(tl.int64)
        p_out = conv_state + oslot * 3 * C
        dt = conv_state.dtype.element_ty
        tl.debug_barrier()  # every thread has read the v window rows this program owns
        tl.store(p_out + c_v, v1.to(dt), mask=mv)
        tl.store(p_out + C + c_v, v2.to(dt), mask=mv)
        tl.store(p_out + 2 * C + c_v, xv.to(dt), mask=mv)
        b_h = b_h * eg + b_vt[:, None, None] * b_k[None, :, :]
        tl.store(state + (oslot * HV + i_hv) * (V * K) + o_v[:, None, None] * K + o_kk[None, :, :], b_h, mask=mh)
        # the q / k window: its G * V / BV readers count in; the last one shifts it (rows 1, 2 and the input,
        # re-read: nobody else writes them) and resets the counter for the next launch
        NR: tl.constexpr = G * ((V + BV - 1) // BV)
        tl.debug_barrier()
        p_cnt = counters + i_r * H + i_h
        seen = tl.atomic_add(p_cnt, 1, sem="acq_rel")
        if seen == NR - 1:
            q1 = tl.load(p_cs + C + c_q, mask=mk, other=0.0)
            q2 = tl.load(p_cs + 2 * C + c_q, mask=mk, other=0.0)
            k1 = tl.load(p_cs + C + c_k, mask=mk, other=0.0)
            k2 = tl.load(p_cs + 2 * C + c_k, mask=mk, other=0.0)
            xq2 = tl.load(p_x + c_q, mask=mk, other=0.0)
            xk2 = tl.load(p_x + c_k, mask=mk, other=0.0)
            tl.debug_barrier()  # (in place: the loads above before any store)
            tl.store(p_out + c_q, q1.to(dt), mask=mk)
            tl.store(p_out + C + c_q, q2.to(dt), mask=mk)
            tl.store(p_out + 2 * C + c_q, xq2.to(tl.float32).to(dt), mask=mk)
            tl.store(p_out + c_k, k1.to(dt), mask=mk)
            tl.store(p_out + C + c_k, k2.to(dt), mask=mk)
            tl.store(p_out + 2 * C + c_k, xk2.to(tl.float32).to(dt), mask=mk)
            tl.store(p_cnt, 0)


def conv_chain_step(
    x: torch.Tensor,
    conv_w: torch.Tensor,
    conv_state: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    state: torch.Tensor,
    slots: torch.Tensor,
    write: bool = True,
    out_slots: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """The short conv and the chain verify of one token per row in one launch (AR decode and the drafter's
    one-token passes at batch 1: one launch per layer fewer, and the conv's inputs load beside the state
    tile instead of one kernel earlier).

    Same result as :func:`conv_verify` (``W = 4``, no bank, no pending) followed by :func:`chain_verify` on
    ``y``'s q / k / v column slices with ``cu_seqlens = arange(R + 1)`` (``reference.conv_chain_step_ref``).

    Args:
        x: ``[R, C]`` conv inputs, one token per row (``C = 2 H K + HV V``: q | k | v channels; row stride
            free, unit channel stride; bf16 / fp16 / fp32).
        conv_w: ``[C, 4]`` float32 taps. conv_state: ``[S, 3, C]`` windows (fp32 or the model dtype),
            contiguous. g, beta: ``[R, HV]`` log-decay and beta (unit head stride).
        state: ``[S, HV, V, K]`` float32, contiguous. slots: ``[R]`` distinct read slots.
        write: store the state and window after the token (``"ar"``); False: only read them (``"ar_read"``).
        out_slots: ``[R]`` write slots (``write`` only; default ``slots``), as :func:`chain_verify`'s.
        counters: int32, at least ``R * H`` zeros (default :func:`step_counters`); left zero.
    Returns:
        ``o [R, HV, V]`` float32.
    Raises:
        ValueError: a channel count that is not ``2 H K + HV V`` for a whole ``H`` dividing ``HV``, a conv
            that is not 4 taps, or ``out_slots`` without ``write``.
    """
    R, C = x.shape
    H = conv_step_heads(C, state, write, out_slots)
    S, HV, V, K = state.shape
    if conv_w.shape != (C, 4) or conv_state.shape[1:] != (3, C):
        raise ValueError(f"conv_chain_step: conv_w must be [{C}, 4] and conv_state [S, 3, {C}] (a 4-tap conv), got "
                         f"{tuple(conv_w.shape)} and {tuple(conv_state.shape)}")
    assert state.dtype == torch.float32 and state.is_contiguous() and conv_state.is_contiguous()
    assert slots.numel() >= R, f"slots ({slots.numel()}) must cover the {R} rows"
    if out_slots is not None:
        check_out_slots(out_slots, R, write)
    x = x if x.stride(1) == 1 else x.contiguous()
    g, beta = (t if t.stride(1) == 1 else t.contiguous() for t in (g, beta))
    conv_w = conv_w.contiguous()
    slots = slots.contiguous()
    out_slots = slots if out_slots is None else out_slots.contiguous()
    o = torch.empty(R, HV, V, dtype=torch.float32, device=x.device)
    if R == 0:
        return o
    if write:
        counters = step_counters(x.device, R * H) if counters is None else counters
        if counters is None or counters.numel() < R * H:
            raise ValueError(f"conv_chain_step: {R * H} zeroed int32 counters needed (one per row and key head)")
    BV, nw, KI = STEP_CONFIG_OVERRIDE if STEP_CONFIG_OVERRIDE is not None else STEP_CONFIG
    BK = triton.next_power_of_2(K)
    BV = max(1, min(BV, triton.next_power_of_2(V)))
    KI = min(KI, BK)
    on = _pdl.enabled(x)
    _conv_chain_step_kernel[(triton.cdiv(V, BV), HV, R)](
        x, conv_w, conv_state, g, beta, o, state, slots, out_slots, counters if write else slots,
        float(scale), x.stride(0), g.stride(0), beta.stride(0),
        H=H, HV=HV, K=K, V=V, BV=BV, KO=BK // KI, KI=KI, WRITE=bool(write), L2NORM=bool(use_qk_l2norm),
        PDL=on, num_warps=nw, num_stages=1, **_pdl.launch_kw(on),
    )
    return o


# ------------------------------------------------------------------------------------------------
# Verify-window conv (depthwise causal conv + SiLU) with deferred conv commit
# ------------------------------------------------------------------------------------------------


@triton.jit
def _z_load_s(p_cs, p_bx, p_x, z, oc, m, n_p, C, SX, W1: tl.constexpr):
    """Rows ``z`` of Z = (conv window ``p_cs`` [W1 rows] ++ pending raw inputs ``p_bx`` [n_p rows]
    ++ the row's inputs ``p_x``, row stride ``SX``), float32; ``z``, ``oc`` and ``m`` share one
    (broadcast) shape."""
    in_h = z < W1
    in_p = (z >= W1) & (z < W1 + n_p)
    in_x = z >= W1 + n_p
    a = tl.load(p_cs + tl.where(in_h, z, 0) * C + oc, mask=m & in_h, other=0.0).to(tl.float32)
    b = tl.load(p_bx + tl.where(in_p, z - W1, 0) * C + oc, mask=m & in_p, other=0.0).to(tl.float32)
    c = tl.load(p_x + tl.where(in_x, z - W1 - n_p, 0) * SX + oc, mask=m & in_x, other=0.0).to(tl.float32)
    return tl.where(in_h, a, tl.where(in_p, b, c))


@triton.jit
def _z_load(p_cs, p_bx, p_x, z, oc, m, n_p, C, W1: tl.constexpr):
    """:func:`_z_load_s` with densely packed inputs (row stride ``C``)."""
    return _z_load_s(p_cs, p_bx, p_x, z, oc, m, n_p, C, C, W1)


@triton.jit
def _conv_verify_kernel(
    x, weight, y, cu_seqlens, conv_state, slots, out_slots,
    bank_x, write_bank, pending_len, read_bank,
    Tmax, C, SX,
    W: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr,
    HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr, WRITE_FINAL: tl.constexpr, OUT_SLOTS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    # One program per (channel tile, row). Everything is read from Z = window ++ pending ++ row
    # (pending raw inputs in fp32, as the reference) before the single in-place window store, which
    # follows a debug_barrier (bar.sync orders the CTA's global accesses).
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
    p_x = x + bos * SX
    n_p = tl.zeros([], dtype=tl.int64)
    p_bx = bank_x
    if HAS_PENDING:
        n_p = tl.minimum(tl.load(pending_len + i_r).to(tl.int64), Tmax)
        n_p = tl.maximum(n_p, 0)
        rb = tl.load(read_bank + i_r).to(tl.int64)
        p_bx = bank_x + (slot * 2 + rb) * Tmax * C
    if HAS_BANK:
        wb = tl.load(write_bank + i_r).to(tl.int64)

    for t in range(0, T):
        acc = tl.zeros([BC], dtype=tl.float32)
        for i in tl.static_range(W):
            z = n_p + t + i + 0 * o_c
            w = tl.load(weight + o_c * W + i, mask=mc, other=0.0).to(tl.float32)
            acc += w * _z_load_s(p_cs, p_bx, p_x, z, o_c, mc, n_p, C, SX, W1)
        tl.store(y + (bos + t) * C + o_c, acc * tl.sigmoid(acc), mask=mc)
        if HAS_BANK:
            if t < Tmax:
                xt = tl.load(p_x + t * SX + o_c, mask=mc, other=0.0).to(tl.float32)
                tl.store(bank_x + ((slot * 2 + wb) * Tmax + t) * C + o_c, xt, mask=mc)

    if WRITE_FINAL:
        new_start = n_p + T  # window after the row
    else:
        new_start = n_p  # window after the pending commit (a no-op when n_p == 0)
    do_store = new_start > 0
    if OUT_SLOTS:  # other write slots: stored even for an empty row
        do_store = new_start >= 0
    if do_store:
        z2 = (new_start + o_j)[:, None] + 0 * o_c[None, :]
        oc2 = o_c[None, :] + 0 * o_j[:, None]
        m2 = mj[:, None] & mc[None, :]
        val = _z_load_s(p_cs, p_bx, p_x, z2, oc2, m2, n_p, C, SX, W1)
        tl.debug_barrier()
        p_out = conv_state + tl.load(out_slots + i_r).to(tl.int64) * W1 * C
        tl.store(p_out + o_j[:, None] * C + o_c[None, :], val.to(conv_state.dtype.element_ty), mask=m2)


@triton.jit
def _z_head(p_cs, p_bx, z, oc, m, C, W1: tl.constexpr):
    """Row ``z < W1 + n_p`` of Z (scalar ``z``): the conv window ``p_cs`` or the pending raw inputs
    ``p_bx``, float32 ``[BC]``."""
    zz = z + 0 * oc
    in_h = zz < W1
    a = tl.load(p_cs + tl.where(in_h, zz, 0) * C + oc, mask=m & in_h, other=0.0).to(tl.float32)
    b = tl.load(p_bx + tl.where(in_h, 0, zz - W1) * C + oc, mask=m & (zz >= W1), other=0.0).to(tl.float32)
    return tl.where(in_h, a, b)


@triton.jit
def _x_row(p_x, t, T, SX, o_c, mc):
    """Input token ``t`` of the row (float32 ``[BC]``; zeros past the row's ``T`` tokens)."""
    return tl.load(p_x + t * SX + o_c, mask=mc & (t + 0 * o_c < T), other=0.0).to(tl.float32)


@triton.jit
def _conv4_out(y, p_bank, t, T, Tmax, xt, r0, r1, r2, w0, w1, w2, w3, o_c, mc, C, HAS_BANK: tl.constexpr):
    """Output token ``t`` (stored when ``t < T``: SiLU of the 4-tap conv over ``r0, r1, r2, xt``, and
    ``xt`` into the write bank); returns the rolling window after it (unchanged past the row)."""
    ok = t < T
    tt = t + 0 * o_c
    acc = w0 * r0 + w1 * r1 + w2 * r2 + w3 * xt
    tl.store(y + t * C + o_c, acc * tl.sigmoid(acc), mask=mc & (tt < T))
    if HAS_BANK:
        tl.store(p_bank + t * C + o_c, xt, mask=mc & (tt < T) & (tt < Tmax))
    return tl.where(ok, r1, r0), tl.where(ok, r2, r1), tl.where(ok, xt, r2)


@triton.jit
def _conv4_verify_kernel(
    x, weight, y, cu_seqlens, conv_state, slots, out_slots,
    bank_x, write_bank, pending_len, read_bank,
    Tmax, C, SX,
    BC: tl.constexpr, TB: tl.constexpr, HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr,
    WRITE_FINAL: tl.constexpr, OUT_SLOTS: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    # _conv_verify_kernel for W = 4 (every fla GDN checkpoint), one program per (channel tile, row).
    # Output t reads Z[n_p + t + i], i = 0..3, of Z = window (3 rows) ++ pending (n_p rows) ++ the
    # row's inputs; its last element is always input token t. The other three are a rolling window
    # in registers, first Z[n_p .. n_p + 2] (window / pending rows, loaded once), so a token costs
    # one input load instead of twelve masked loads. Tokens go in chunks of TB: the chunk's TB input
    # loads are issued before any of its stores (which, for all the compiler knows, may alias the
    # inputs), so TB loads are in flight per thread instead of one (the loop was latency-bound).
    # The window after the pending commit is the first rolling window; after the row (WRITE_FINAL)
    # the last one. Each thread stores the channels it loaded, so the in-place window store needs
    # no barrier.
    i_c = tl.program_id(0)
    i_r = tl.program_id(1)
    bos = tl.load(cu_seqlens + i_r).to(tl.int64)
    eos = tl.load(cu_seqlens + i_r + 1).to(tl.int64)
    T = eos - bos
    slot = tl.load(slots + i_r).to(tl.int64)
    o_c = i_c * BC + tl.arange(0, BC)
    mc = o_c < C
    p_cs = conv_state + slot * 3 * C
    p_x = x + bos * SX
    p_y = y + bos * C
    n_p = tl.zeros([], dtype=tl.int64)
    p_bx = bank_x
    if HAS_PENDING:
        n_p = tl.maximum(tl.minimum(tl.load(pending_len + i_r).to(tl.int64), Tmax), 0)
        rb = tl.load(read_bank + i_r).to(tl.int64)
        p_bx = bank_x + (slot * 2 + rb) * Tmax * C
    p_bw = bank_x
    if HAS_BANK:
        p_bw = bank_x + (slot * 2 + tl.load(write_bank + i_r).to(tl.int64)) * Tmax * C
    w0 = tl.load(weight + o_c * 4, mask=mc, other=0.0).to(tl.float32)
    w1 = tl.load(weight + o_c * 4 + 1, mask=mc, other=0.0).to(tl.float32)
    w2 = tl.load(weight + o_c * 4 + 2, mask=mc, other=0.0).to(tl.float32)
    w3 = tl.load(weight + o_c * 4 + 3, mask=mc, other=0.0).to(tl.float32)
    r0 = _z_head(p_cs, p_bx, n_p, o_c, mc, C, 3)
    r1 = _z_head(p_cs, p_bx, n_p + 1, o_c, mc, C, 3)
    r2 = _z_head(p_cs, p_bx, n_p + 2, o_c, mc, C, 3)
    s0, s1, s2 = r0, r1, r2
    for t0 in range(0, T, TB):
        x0 = _x_row(p_x, t0, T, SX, o_c, mc)
        if TB >= 2:
            x1 = _x_row(p_x, t0 + 1, T, SX, o_c, mc)
        if TB >= 4:
            x2 = _x_row(p_x, t0 + 2, T, SX, o_c, mc)
            x3 = _x_row(p_x, t0 + 3, T, SX, o_c, mc)
        if TB >= 8:
            x4 = _x_row(p_x, t0 + 4, T, SX, o_c, mc)
            x5 = _x_row(p_x, t0 + 5, T, SX, o_c, mc)
            x6 = _x_row(p_x, t0 + 6, T, SX, o_c, mc)
            x7 = _x_row(p_x, t0 + 7, T, SX, o_c, mc)
        r0, r1, r2 = _conv4_out(p_y, p_bw, t0, T, Tmax, x0, r0, r1, r2, w0, w1, w2, w3, o_c, mc, C, HAS_BANK)
        if TB >= 2:
            r0, r1, r2 = _conv4_out(p_y, p_bw, t0 + 1, T, Tmax, x1, r0, r1, r2, w0, w1, w2, w3, o_c, mc, C, HAS_BANK)
        if TB >= 4:
            r0, r1, r2 = _conv4_out(p_y, p_bw, t0 + 2, T, Tmax, x2, r0, r1, r2, w0, w1, w2, w3, o_c, mc, C, HAS_BANK)
            r0, r1, r2 = _conv4_out(p_y, p_bw, t0 + 3, T, Tmax, x3, r0, r1, r2, w0, w1, w2, w3, o_c, mc, C, HAS_BANK)
        if TB >= 8:
            r0, r1, r2 = _conv4_out(p_y, p_bw, t0 + 4, T, Tmax, x4, r0, r1, r2, w0, w1, w2, w3, o_c, mc, C, HAS_BANK)
            r0, r1, r2 = _conv4_out(p_y, p_bw, t0 + 5, T, Tmax, x5, r0, r1, r2, w0, w1, w2, w3, o_c, mc, C, HAS_BANK)
            r0, r1, r2 = _conv4_out(p_y, p_bw, t0 + 6, T, Tmax, x6, r0, r1, r2, w0, w1, w2, w3, o_c, mc, C, HAS_BANK)
            r0, r1, r2 = _conv4_out(p_y, p_bw, t0 + 7, T, Tmax, x7, r0, r1, r2, w0, w1, w2, w3, o_c, mc, C, HAS_BANK)
    if WRITE_FINAL:
        s0, s1, s2 = r0, r1, r2
        new_start = n_p + T
    else:
        new_start = n_p
    do_store = new_start > 0
    if OUT_SLOTS:  # other write slots: stored even for an empty row
        do_store = new_start >= 0
    if do_store:
        dt = conv_state.dtype.element_ty
        p_out = conv_state + tl.load(out_slots + i_r).to(tl.int64) * 3 * C
        tl.store(p_out + o_c, s0.to(dt), mask=mc)
        tl.store(p_out + C + o_c, s1.to(dt), mask=mc)
        tl.store(p_out + 2 * C + o_c, s2.to(dt), mask=mc)


def _conv4_config(R: int, C: int, N: int) -> tuple[int, int, int]:
    """``(BC, TB, num_warps)`` of :func:`_conv4_verify_kernel` for ``R`` rows, ``C`` channels and
    ``N`` tokens (any ``TB`` is correct: the chunk loop covers every window). Measured on the H200
    (``bench_conv.py``, C = 6144, benchmarks/conv_h200_s9b.json): 256-channel tiles of 4 warps are
    fastest at every batch (B = 64 verify 10.4 us against 14.0 us for the 1024-channel tiles used
    before, B = 256 AR 14.6 against 22.7 us); chunks of 4 tokens help while the grid is small (B = 8
    verify 4.8 against 5.9 us), cost time at B = 64 (11.2 against 10.4 us), where enough programs
    keep loads in flight, and are even at B = 256 (35.4 against 36.0 us)."""
    BC = min(256, triton.next_power_of_2(C))
    TB = 4 if N > R and R * triton.cdiv(C, BC) < 528 else 1
    return BC, TB, 4


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
    out_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton verify-window conv; same arguments, semantics and return as
    :func:`vllm_specla.ops.reference.conv_verify_ref` (``y [N, C]`` float32). ``out_slots``: as
    :func:`chain_verify` (with ``write_final_state`` and no bank: the window after the row goes to
    ``conv_state[out_slots[r]]``, the read slot is left as it was).

    The two factor banks of a slot ping-pong: a row's ``write_bank`` must differ from its
    ``read_bank`` (the runtime swaps them every step); the generic kernel (``W != 4``) reads the
    pending inputs after writing the new ones.

    Raises:
        ValueError: ``write_bank`` or ``pending_len`` given without ``bank_x``.
    """
    if bank_x is None and (write_bank is not None or pending_len is not None):
        raise ValueError("conv_verify: bank_x is required with write_bank or pending_len "
                         "(the factor bank of raw conv inputs, [slots, 2, Tmax, C] float32)")
    N, C = x.shape
    W = weight.shape[-1]
    assert conv_state.shape[1:] == (W - 1, C) and conv_state.is_contiguous()
    x = x if x.stride(1) == 1 else x.contiguous()  # row stride free (a column slice is read in place)
    weight = weight.contiguous()
    R = cu_seqlens.numel() - 1
    assert slots.numel() >= R, f"slots ({slots.numel()}) must cover the {R} rows of cu_seqlens"
    y = torch.empty(N, C, dtype=torch.float32, device=x.device)
    if R == 0:
        return y
    if out_slots is not None:
        check_out_slots(out_slots, R, write_final_state, bank_x, write_bank, pending_len)
        out_slots = out_slots.contiguous()
    has_out = out_slots is not None
    out_slots = out_slots if has_out else slots
    has_bank = write_bank is not None
    has_pending = pending_len is not None and read_bank is not None and bank_x is not None
    tmax = bank_x.shape[2] if bank_x is not None else 1
    if has_bank:
        _bounds_check(cu_seqlens, tmax)
    on = _pdl.enabled(x)
    if W == 4:  # rolling-window kernel
        BC, TB, nw = _conv4_config(R, C, N)
        _conv4_verify_kernel[(triton.cdiv(C, BC), R)](
            x, weight, y, cu_seqlens, conv_state, slots, out_slots,
            bank_x if bank_x is not None else y,
            write_bank if has_bank else slots,
            pending_len if has_pending else slots,
            read_bank if has_pending else slots,
            tmax, C, x.stride(0),
            BC=BC, TB=TB, HAS_BANK=has_bank, HAS_PENDING=has_pending, WRITE_FINAL=bool(write_final_state),
            OUT_SLOTS=has_out, PDL=on, num_warps=nw, **_pdl.launch_kw(on),
        )
        return y
    BC = min(1024, triton.next_power_of_2(C))
    BW = max(2, triton.next_power_of_2(W - 1))
    grid = (triton.cdiv(C, BC), R)
    _conv_verify_kernel[grid](
        x, weight, y, cu_seqlens, conv_state, slots, out_slots,
        bank_x if bank_x is not None else y,
        write_bank if has_bank else slots,
        pending_len if has_pending else slots,
        read_bank if has_pending else slots,
        tmax, C, x.stride(0),
        W=W, BW=BW, BC=BC, HAS_BANK=has_bank, HAS_PENDING=has_pending,
        WRITE_FINAL=bool(write_final_state), OUT_SLOTS=has_out, PDL=on, num_warps=4, **_pdl.launch_kw(on),
    )
    return y
