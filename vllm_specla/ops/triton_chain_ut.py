"""Triton chain verify in the tensor-core UT (chunk) form ("v3", docs/KERNELS.md).

Same contract as :func:`vllm_specla.ops.triton_chain.chain_verify` and its oracle
:func:`vllm_specla.ops.reference.chain_verify_ref`: pending factors folded first (deferred commit,
ALGORITHMS.md §6), the window verified from the state kept on chip (§3), factors written to bank
``write_bank``, the state written once. What changes is how the window is computed: instead of a
serial walk with two mat-vecs per token on the ``[BV, K]`` tile (``triton_chain``), the window is
one chunk of the gated delta rule in UT / WY form (ALGORITHMS.md §4 with a chain mask, the same
algebra as fla 0.6.0 ``fla/ops/gated_delta_rule/chunk.py`` + ``fla/ops/utils/solve_tril.py``;
``reference.chunk_gated_delta_rule_ref`` is its torch form), so the state tile is touched by a few
``tl.dot`` products and the serial part of the window runs on ``[BT, BT]`` matrices only.

Shapes and dtypes (``ops/__init__.py``)::

    q, k     [N, H, K]    fp32 / bf16 / fp16 (token stride free, head and feature dims dense)
    v        [N, HV, V]   fp32 / bf16 / fp16
    g, beta  [N, HV]      float (log decay g <= 0, write strength)
    state    [slots, HV, V, K] fp32, contiguous, updated in place  ("[V, K]" form: M = S^T)
    bank_k   [slots, 2, Tmax, H, K] fp32; bank_v [slots, 2, Tmax, HV, V] fp32; bank_g [slots, 2, Tmax, HV] fp32
    slots, write_bank, read_bank, pending_len [R] int; cu_seqlens [R+1] int
    returns o [N, HV, V] fp32

One program per ``(V-tile, value head, row)``, grid ``(cdiv(V, BV), HV, R)``; ``BT = BP = 16``
(token chunk, pending chunk). The ``[BV, K]`` state tile is never whole in registers: it is
streamed in ``[BV, KC]`` column chunks (``KC`` = 16..64, ``num_stages`` > 1 prefetches the next
chunk), which keeps the kernel at ~130-230 registers without spills (sm_90 compiles). Per program:

1. Gram part (raw q/k, 16-column chunks): ``KK = K K^T``, ``QK = Q K^T`` (``[16, 16]``) and the
   squared norms; the l2norm (eps 1e-6, as ``triton_chain``/fla) and the q scale are applied to
   the products afterwards (``k^ = rk k``, ``q^ = rq q``);
2. pass 1 over the state chunks: load ``M[:, c]``; HAS_PENDING: fold the row's
   ``P = pending_len[r]`` factors of bank ``read_bank[r]`` as one rank-16 ``tl.dot`` update per 16
   factors, ``M = e^{G_P} M + (Pv ⊙ e^{G_P - G_u}) @ Pk[:, c]``, and store the chunk (the folded
   state is written once; not when ``write_final_state``); accumulate ``MK = M @ K^T``,
   ``MQ = M @ Q^T`` (``[BV, KC] x [KC, 16]``);
3. the window (ALGORITHMS.md §4, chain mask): ``A[t,u] = beta_t KK^[t,u] e^{Γ_t-Γ_u}`` (u < t,
   ``Γ`` = cumsum of the window's g; the differences ``Γ_t-Γ_u`` are summed directly, see
   below); ``Tinv = (I + A)^{-1}`` by forward substitution on the 16x16 tile (fla ``solve_tril``);
   ``V~^T = R @ Tinv^T`` with ``R = beta ⊙ (V^T - e^Γ ⊙ MK^)``;
   ``O^T = e^Γ ⊙ MQ^ + V~^T @ (tril_incl ⊙ QK^ ⊙ e^{Γ_t-Γ_u})^T``; factors ``(k^, v~, g)`` to
   bank ``write_bank[r]`` positions ``0..T-1`` (``< Tmax``) with the writer rules of
   ``triton_chain``: ``bank_v`` by every V-tile (its slice), ``bank_g`` by V-tile 0, ``bank_k`` by
   V-tile 0 of the first value head of each GVA group -- one writer per element;
4. ``write_final_state``: pass 2 over the state chunks re-reads the slot (still the pre-pending
   state, mostly from L2), folds the pending factors again and stores
   ``M_T = e^{Γ_T} M + (V~^T ⊙ e^{Γ_T-Γ}) @ K^[:, c]`` (rank-16 ``tl.dot``) once. Rows longer than
   16 tokens run as several chunks through the slot (``write_final_state`` only; without it the
   launcher rejects windows > 16, which a verify window never is with Tmax = 16).

Requirements (as ``triton_chain``): ``read_bank[r] != write_bank[r]`` for rows with
``pending_len[r] > 0`` (double buffer), rows on distinct slots.

Precision. The state is fp32 and the oracle is fp32, so plain TF32 dots (10-bit mantissa, ~1e-3
relative) are not acceptable. Every ``tl.dot`` uses ``input_precision="tf32x3"`` by default
(:data:`DOT_PRECISION`): each operand is split into a TF32 high part and a TF32 remainder and
three tensor-core products are summed in fp32 (hi*hi + hi*lo + lo*hi), ~fp32 accuracy (expected
norm-wise error ~1e-6 vs the fp32 reference). ``"ieee"`` (fp32 FMA, no tensor cores) is the exact
alternative, ``"tf32"`` the fast inexact one, ``"bf16x3"`` (split bf16, in newer Tritons) a
faster, less precise one; benchmarks/bench_ut.py measures them. The ``[BT, BT]`` solve and the
decay factors are plain fp32. Decay differences are summed directly (``sum_{u<s<=t} g_s``), not
taken as differences of cumulative sums: under strong decay (g = -100) the cumulative sums reach
-1600 and their difference loses ~1e-4 absolute, i.e. ~1e-4 relative error in ``e^{Γ_t-Γ_u}``
(measured 2-5e-5 state error before the change, ~1e-7 after, like the serial reference).
Under ``TRITON_INTERPRET=1`` every dot is an fp32 numpy matmul.

Sources: ALGORITHMS.md §3 (chain verify), §4 (UT form, chain = tree with a chain mask), §6
(deferred commit); fla 0.6.0 ``chunk_gated_delta_rule`` (``fla/ops/gated_delta_rule/chunk.py``,
``wy_fast.py``, ``fla/ops/utils/solve_tril.py``) for the WY/UT algebra and the 16x16 solve;
``reference.chunk_gated_delta_rule_ref`` is the torch form of the same algebra.

The launcher never reads device data on the host except the optional window-length checks (the
pattern of ``triton_chain._bounds_check``: skipped during CUDA-graph capture or with
``triton_chain.CHECK_BOUNDS = False``), so launches are graph-capturable; configs come from shapes
only (:func:`pick_config_ut`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_specla.ops import triton_chain as _tc
from vllm_specla.ops import triton_recover as _tr
from vllm_specla.ops.triton_chain import _rows_dense

# (BV, num_warps, KC, num_stages) forced for every launch when not None (tests, benchmark sweeps).
CONFIG_OVERRIDE: tuple[int, ...] | None = None
# Input precision of every tl.dot: "tf32x3" (default, ~fp32), "ieee" (fp32 FMA), "tf32", "bf16x3".
DOT_PRECISION = "tf32x3"
_PREC_CODE = {"ieee": 0, "tf32x3": 1, "tf32": 2, "bf16x3": 3}
BT = 16  # window-token chunk (a verify window of <= 16 tokens is one chunk); dot K-dim >= 16
# Pending factors (deferred commit): False = the recover kernel commits them first and the UT kernel
# verifies from the committed state (3 state passes); True = folded inside the UT kernel on the CUDA
# cores while the tensor-core products read the pre-pending state (2 passes). Measured on the H200
# (benchmarks/RESULTS.md, ut_v5_h200.json) the fused form is 1.15-1.3x slower (its per-chunk fold
# loop costs more than the extra pass), so it is off; tests run both.
FUSE_PENDING = False
PREP_WARPS = 1  # warps of the per-(row, head) prep kernel (its [BT, BT] work stays in one warp)
PREP_KG = 32  # key-dim chunk of its Gram dots (64 spills at 1 warp)

# (BV, num_warps, KC, num_stages) by regime. KC: key-dim chunk in which the [BV, K] state tile is
# streamed through registers (the tile is never whole in registers); num_stages > 1 lets Triton
# prefetch the next chunk. "large": from the H200 sweep of benchmarks/bench_ut.py (ut_v5_h200.json;
# verify T = 8 at B = 128: 32/2/16/3 217 / 169 us for 6x256x512 / 8x256x256, 64/4/32/2 219 / 170,
# 64/4/16/2 271 / 197, 128/8/16/2 314 / 238); "small" (fewer than LARGE_PROGRAMS programs at the
# large BV: batch 1-2, where the dispatcher uses the serial kernel anyway) unswept.
TUNED_UT: dict[str, tuple[int, int, int, int]] = {
    "large": (32, 2, 16, 3),
    "small": (32, 4, 16, 2),
}
LARGE_PROGRAMS = 4 * 132


def pick_config_ut(num_rows: int, HV: int, V: int, K: int, tokens_per_row: float = 1.0) -> tuple[int, int, int, int]:
    """``(BV, num_warps, KC, num_stages)`` for the UT kernel from shapes only (no host sync,
    CUDA-graph safe); ``(BV, num_warps)`` are the grid / CTA choice, ``KC, num_stages`` how the
    state tile is streamed.

    Bigger ``BV`` amortises the per-program q/k loads, the two ``16 x 16 x K`` Gram products and
    the ``16 x 16`` solve (identical in every V-tile of a (row, head)) over more state rows and is
    the M dim of the state products (64 per warpgroup for Hopper wgmma); smaller ``BV`` gives more
    programs at small batch. ``tokens_per_row`` is unused (one chunk per verify window).
    """
    if CONFIG_OVERRIDE is not None:
        cfg = tuple(CONFIG_OVERRIDE)
        return (cfg + (64, 4, 16, 1)[len(cfg):])[:4]
    BK = max(16, triton.next_power_of_2(K))
    large = TUNED_UT["large"]
    progs = num_rows * HV * triton.cdiv(V, large[0])
    BV, nw, KC, ns = large if progs >= LARGE_PROGRAMS else TUNED_UT["small"]
    BV = max(16, min(BV, triton.next_power_of_2(V)))
    KC = min(KC, BK)
    return BV, nw, KC, ns


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    if PREC == 0:
        r = tl.dot(a, b, input_precision="ieee")
    elif PREC == 1:
        r = tl.dot(a, b, input_precision="tf32x3")
    elif PREC == 2:
        r = tl.dot(a, b, input_precision="tf32")
    else:
        r = tl.dot(a, b, input_precision="bf16x3")
    return r


@triton.jit
def _suffix_sum(x, o):
    """``s[u] = sum_{w > u} x[w]``, summed directly (not as ``cumsum[-1] - cumsum[u]``: cumulative log
    decays reach -1600 under strong decay, and their difference would lose ~1e-4 absolute)."""
    return tl.sum(tl.where(o[None, :] > o[:, None], x[None, :], 0.0), 1)


@triton.jit
def _pending_vw(bank_v, bank_g, p_base, p0, n_p, i_hv, o_v, mv, o_p, HV: tl.constexpr, V: tl.constexpr):
    """Pending factors ``p0 .. p0+BP-1``: ``[BV, BP]`` columns ``v~_u e^{G_last - G_u}`` and ``e^{G_last}``
    (``G`` the cumulative decay inside the chunk; positions ``>= n_p`` contribute nothing)."""
    mp = (p0 + o_p) < n_p
    pos = p_base + p0 + o_p
    b_pv = tl.load(bank_v + (pos[None, :] * HV + i_hv) * V + o_v[:, None], mask=mv[:, None] & mp[None, :], other=0.0)
    b_pg = tl.load(bank_g + pos * HV + i_hv, mask=mp, other=0.0)
    g_last = tl.sum(b_pg, 0)
    w = tl.where(mp, tl.exp(_suffix_sum(b_pg, o_p)), 0.0)
    return b_pv * w[None, :], tl.exp(g_last)


@triton.jit
def _ut_prep_kernel(
    q, k, g, beta, slots, cu_seqlens, parents,
    bank_k, bank_g, write_bank, pending_len, read_bank,
    qk_s, mat_s, vec_s,
    scale, Tmax, sq, sk, sg, sb,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, KG: tl.constexpr, BT: tl.constexpr,
    HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr, L2NORM: tl.constexpr, PREC: tl.constexpr,
    HAS_TREE: tl.constexpr,
):
    """Per ``(value head, row)``: everything of the window that does not touch the state.

    Writes ``q^`` (l2-normalised, times ``scale``) and ``k^`` (l2-normalised) of the key head to
    ``qk_s[r, h, 0/1, t, :]`` (rows ``t < T`` only, by the first value head of each GVA group);
    ``mat_s[r, hv, 0..3]`` (``[BT, BT]``): ``Tinv = (I + A)^-1``, ``W = tril_incl(Q^ K^^T ⊙ D)`` and,
    with pending factors, ``Gpk[u, t] = k_u . k^_t``, ``Gpq[u, t] = k_u . q^_t`` (``k_u`` the pending
    keys of bank ``read_bank[r]``, ``u < pending_len[r] <= BT``); ``vec_s[r, hv, 0/1]``: ``e^{Γ_t}``,
    ``beta_t``; with ``HAS_BANK`` the ``k^`` and ``g`` factors of the window to bank
    ``write_bank[r]`` (one writer per element). Padded tokens (``t >= T``) have ``g = beta = 0``,
    zero rows of ``A`` and ``W``, identity rows of ``Tinv``. ``HAS_TREE``: the window is a draft tree
    (``parents``: row-local parent positions, ``-1`` for a root, topological); ``A`` and ``W`` are
    masked to ancestors (``anc[t, u]``: ``u`` on the root path of ``t``), ``Γ_t`` is the decay
    summed along the root path of ``t`` and the decay between ``u`` and ``t`` is summed over the
    nodes of the path of ``t`` not on the path of ``u`` (ALGORITHMS.md §4: a chain is the tree
    whose mask is lower triangular). The products run as tensor-core dots
    (``PREC``, tf32x3 by default) on ``[BT, KG]`` column chunks of the raw q/k; the l2norm scales
    are applied to the products afterwards.
    """
    i_hv = tl.program_id(0)
    i_r = tl.program_id(1)
    G: tl.constexpr = HV // H
    i_h = i_hv // G

    bos = tl.load(cu_seqlens + i_r).to(tl.int64)
    eos = tl.load(cu_seqlens + i_r + 1).to(tl.int64)
    T = tl.minimum(eos - bos, BT)
    o_t = tl.arange(0, BT)
    o_g = tl.arange(0, KG)
    mt = o_t < T
    i_t = bos + o_t
    slot = tl.load(slots + i_r).to(tl.int64)
    if HAS_PENDING:
        n_p = tl.maximum(tl.minimum(tl.minimum(tl.load(pending_len + i_r).to(tl.int32), Tmax), BT), 0)
        p_pos = (slot * 2 + tl.load(read_bank + i_r).to(tl.int64)) * Tmax + o_t  # [BP = BT] pending positions
        m_pu = o_t < n_p

    ssq = tl.zeros([BT], dtype=tl.float32)
    ssk = tl.zeros([BT], dtype=tl.float32)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    b_pk = tl.zeros([BT, BT], dtype=tl.float32)
    b_pq = tl.zeros([BT, BT], dtype=tl.float32)
    for c in range(0, BK // KG):
        o_kc = c * KG + o_g
        mkc = (o_kc < K)[None, :]
        mtc = mt[:, None] & mkc
        b_qc = tl.load(q + i_t[:, None] * sq + i_h * K + o_kc[None, :], mask=mtc, other=0.0).to(tl.float32)
        b_kc = tl.load(k + i_t[:, None] * sk + i_h * K + o_kc[None, :], mask=mtc, other=0.0).to(tl.float32)
        ssq += tl.sum(b_qc * b_qc, 1)
        ssk += tl.sum(b_kc * b_kc, 1)
        b_kcT = tl.trans(b_kc)
        b_kk += _mm(b_kc, b_kcT, PREC)
        b_qk += _mm(b_qc, b_kcT, PREC)
        if HAS_PENDING:
            b_uc = tl.load(bank_k + (p_pos[:, None] * H + i_h) * K + o_kc[None, :], mask=m_pu[:, None] & mkc,
                           other=0.0)  # pending keys (already normalised) [BT, KG]
            b_pk += _mm(b_uc, b_kcT, PREC)
            b_pq += _mm(b_uc, tl.trans(b_qc), PREC)
    if L2NORM:
        rk = tl.rsqrt(ssk + 1e-6)
        rq = tl.rsqrt(ssq + 1e-6) * scale
    else:
        rk = tl.full([BT], 1.0, dtype=tl.float32)
        rq = tl.full([BT], 1.0, dtype=tl.float32) * scale
    b_kk = b_kk * rk[:, None] * rk[None, :]
    b_qk = b_qk * rq[:, None] * rk[None, :]

    b_g = tl.load(g + i_t * sg + i_hv, mask=mt, other=0.0).to(tl.float32)
    b_b = tl.load(beta + i_t * sb + i_hv, mask=mt, other=0.0).to(tl.float32)
    m_e = o_t[:, None] == o_t[None, :]
    if HAS_TREE:
        # ancestor-or-self matrix, row by row in topological order: anc[t] = anc[parent(t)] | {t}
        anc = tl.where(m_e, 1.0, 0.0)
        for t in range(1, T):
            p_t = tl.load(parents + bos + t).to(tl.int32)  # < t, or -1 (a root: nothing to add)
            row_p = tl.sum(tl.where(o_t[:, None] == p_t, anc, 0.0), 0)
            anc = tl.where(o_t[:, None] == t, tl.maximum(anc, row_p[None, :]), anc)
        m_i = anc > 0.0
        m_s = m_i & (o_t[:, None] != o_t[None, :])
        # log D[t, u] = sum of g over path(t) \ path(u) (for u on the path of t: the nodes after u),
        # Γ_t = sum of g over path(t); both summed directly, node by node
        b_S = tl.zeros([BT, BT], dtype=tl.float32)
        b_G = tl.zeros([BT], dtype=tl.float32)
        for s in range(0, T):
            g_s = tl.load(g + (bos + s) * sg + i_hv).to(tl.float32)
            on = tl.sum(tl.where(o_t[None, :] == s, anc, 0.0), 1)  # 1 where s is on path(t)
            b_S += tl.where((on[:, None] > 0.0) & (on[None, :] == 0.0), g_s, 0.0)
            b_G += tl.where(on > 0.0, g_s, 0.0)
        eG = tl.exp(b_G)
    else:
        m_s = o_t[:, None] > o_t[None, :]  # strictly lower: u < t
        m_i = o_t[:, None] >= o_t[None, :]  # lower incl. the diagonal
        # Γ_t - Γ_u = sum_{u < s <= t} g_s summed directly, not as a difference of cumulative sums
        # (which loses ~1e-4 absolute when Γ reaches -1600 under strong decay)
        b_S = tl.zeros([BT, BT], dtype=tl.float32)
        for s in range(1, T):
            g_s = tl.load(g + (bos + s) * sg + i_hv).to(tl.float32)
            b_S += tl.where((o_t[None, :] < s) & (o_t[:, None] >= s), g_s, 0.0)
        eG = tl.exp(tl.cumsum(b_g, 0))
    b_D = tl.exp(tl.where(m_i, b_S, 0.0))
    b_A = tl.where(m_s, b_b[:, None] * b_kk * b_D, 0.0)
    b_W = tl.where(m_i, b_qk * b_D, 0.0)
    # N = (I + A)^-1 - I row by row: N_i = -A_i - sum_{j<i} A_ij N_j (fla solve_tril); rows 0, 1
    # of -A are already exact
    b_N = -b_A
    for i in range(2, T):
        b_a = -tl.sum(tl.where(o_t[:, None] == i, b_A, 0.0), 0)  # -A[i, :]
        b_a = b_a + tl.sum(b_a[:, None] * b_N, 0)
        b_N = tl.where(o_t[:, None] == i, b_a[None, :], b_N)
    b_Ti = b_N + tl.where(m_e, 1.0, 0.0)

    p_m = mat_s + (i_r * HV + i_hv) * (4 * BT * BT) + o_t[:, None] * BT + o_t[None, :]
    tl.store(p_m, b_Ti)
    tl.store(p_m + BT * BT, b_W)
    if HAS_PENDING:
        tl.store(p_m + 2 * BT * BT, b_pk * rk[None, :])
        tl.store(p_m + 3 * BT * BT, b_pq * rq[None, :])
    p_e = vec_s + (i_r * HV + i_hv) * (2 * BT) + o_t
    tl.store(p_e, eG)
    tl.store(p_e + BT, b_b)
    k_writer = i_hv % G == 0
    if HAS_BANK:
        pw = (slot * 2 + tl.load(write_bank + i_r).to(tl.int64)) * Tmax + o_t  # [BT] bank positions
        mb = mt & (o_t < Tmax)
        tl.store(bank_g + pw * HV + i_hv, b_g, mask=mb)
    if k_writer:  # q^, k^ rows t < T to the scratch (and k^ to the bank), second pass over K
        p_qk = qk_s + (i_r * H + i_h) * (2 * BT * K) + o_t[:, None] * K
        for c in range(0, BK // KG):
            o_kc = c * KG + o_g
            mkc = (o_kc < K)[None, :]
            mtc = mt[:, None] & mkc
            b_qc = tl.load(q + i_t[:, None] * sq + i_h * K + o_kc[None, :], mask=mtc, other=0.0).to(tl.float32)
            b_kc = tl.load(k + i_t[:, None] * sk + i_h * K + o_kc[None, :], mask=mtc, other=0.0).to(tl.float32)
            b_kc = b_kc * rk[:, None]
            tl.store(p_qk + o_kc[None, :], b_qc * rq[:, None], mask=mtc)
            tl.store(p_qk + BT * K + o_kc[None, :], b_kc, mask=mtc)
            if HAS_BANK:
                tl.store(bank_k + (pw[:, None] * H + i_h) * K + o_kc[None, :], b_kc, mask=mb[:, None] & mkc)


@triton.jit
def _chain_ut_kernel(
    v, o,
    state, slots, cu_seqlens,
    bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
    qk_s, mat_s, vec_s,
    Tmax, sv,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    KC: tl.constexpr, NKC: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr,
    HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr, PREC: tl.constexpr,
):
    """Per ``(V-tile, value head, row)``: the state part of the window (see the module docstring)."""
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_r = tl.program_id(2)
    G: tl.constexpr = HV // H
    i_h = i_hv // G

    bos = tl.load(cu_seqlens + i_r).to(tl.int64)
    eos = tl.load(cu_seqlens + i_r + 1).to(tl.int64)
    slot = tl.load(slots + i_r).to(tl.int64)
    T = tl.minimum(eos - bos, BT)

    o_v = i_v * BV + tl.arange(0, BV)
    mv = o_v < V
    o_c = tl.arange(0, KC)  # key index inside a K-chunk of the state
    o_t = tl.arange(0, BT)
    mt = o_t < T
    i_t = bos + o_t  # [BT] token index
    p_st = state + (slot * HV + i_hv) * (V * K) + o_v[:, None] * K  # [BV, 1] row pointers of the tile
    p_qk = qk_s + (i_r * H + i_h) * (2 * BT * K) + o_t[None, :] * K  # [1, BT]: q^ rows (k^ at + BT*K)

    n_p = tl.zeros([], dtype=tl.int32)
    if HAS_PENDING:
        n_p = tl.maximum(tl.minimum(tl.minimum(tl.load(pending_len + i_r).to(tl.int32), Tmax), BT), 0)
        p_base = (slot * 2 + tl.load(read_bank + i_r).to(tl.int64)) * Tmax

    # ---- one pass over K-chunks of the slot's state M (pre-pending): M k^, M q^ (tensor cores);
    # the pending factors are folded on the CUDA cores (the reference's serial order) and the
    # committed state is stored once; the products see them through Gpk / Gpq below ----
    b_mk = tl.zeros([BV, BT], dtype=tl.float32)
    b_mq = tl.zeros([BV, BT], dtype=tl.float32)
    for kc in range(0, NKC):
        o_k = kc * KC + o_c
        mk = o_k < K
        mh = mv[:, None] & mk[None, :]
        b_h = tl.load(p_st + o_k[None, :], mask=mh, other=0.0)  # [BV, KC]
        mkt = mk[:, None] & mt[None, :]  # [KC, BT]: q^/k^ loaded transposed (dot B operands)
        b_qT = tl.load(p_qk + o_k[:, None], mask=mkt, other=0.0)
        b_kT = tl.load(p_qk + BT * K + o_k[:, None], mask=mkt, other=0.0)
        b_mk += _mm(b_h, b_kT, PREC)
        b_mq += _mm(b_h, b_qT, PREC)
        if HAS_PENDING:
            if n_p > 0:
                for u in range(0, n_p):
                    b_uk = tl.load(bank_k + ((p_base + u) * H + i_h) * K + o_k, mask=mk, other=0.0)
                    b_uv = tl.load(bank_v + ((p_base + u) * HV + i_hv) * V + o_v, mask=mv, other=0.0)
                    b_ug = tl.load(bank_g + (p_base + u) * HV + i_hv)
                    b_h = b_h * tl.exp(b_ug) + b_uv[:, None] * b_uk[None, :]
                tl.store(p_st + o_k[None, :], b_h, mask=mh)

    p_m = mat_s + (i_r * HV + i_hv) * (4 * BT * BT) + o_t[:, None] * BT + o_t[None, :]
    if HAS_PENDING:
        # M0 = e^{G_P} M + sum_u e^{G_P - G_u} v~_u k_u^T, so M0 k^ = e^{G_P} M k^ + Pvw Gpk (and q^)
        pvw, pe = _pending_vw(bank_v, bank_g, p_base, 0, n_p, i_hv, o_v, mv, o_t, HV, V)
        b_mk = b_mk * pe + _mm(pvw, tl.load(p_m + 2 * BT * BT), PREC)
        b_mq = b_mq * pe + _mm(pvw, tl.load(p_m + 3 * BT * BT), PREC)

    # ---- the window on [BV, BT] tiles (ALGORITHMS.md §4, chain mask) ----
    b_Ti = tl.load(p_m)
    b_W = tl.load(p_m + BT * BT)
    p_e = vec_s + (i_r * HV + i_hv) * (2 * BT) + o_t
    eG = tl.load(p_e)
    b_b = tl.load(p_e + BT)
    b_vT = tl.load(v + i_t[None, :] * sv + i_hv * V + o_v[:, None],
                   mask=mv[:, None] & mt[None, :], other=0.0).to(tl.float32)  # [BV, BT]
    b_r = b_b[None, :] * (b_vT - eG[None, :] * b_mk)  # beta (v - e^Γ M0 k^)
    b_x = _mm(b_r, tl.trans(b_Ti), PREC)  # V~^T = R Tinv^T
    b_o = eG[None, :] * b_mq + _mm(b_x, tl.trans(b_W), PREC)
    tl.store(o + (i_t[None, :] * HV + i_hv) * V + o_v[:, None], b_o, mask=mv[:, None] & mt[None, :])
    if HAS_BANK:
        mb = mt & (o_t < Tmax)
        pw = (slot * 2 + tl.load(write_bank + i_r).to(tl.int64)) * Tmax + o_t
        tl.store(bank_v + (pw[None, :] * HV + i_hv) * V + o_v[:, None], b_x, mask=mv[:, None] & mb[None, :])


def _check_windows(cu_seqlens: torch.Tensor, tmax: int | None, chunk: int | None) -> None:
    """Host-side window-length checks (``ValueError``), the pattern of ``triton_chain._bounds_check``:
    reads ``cu_seqlens`` (a sync when it is on the GPU), so skipped during CUDA-graph capture and
    when ``triton_chain.CHECK_BOUNDS`` is False. ``tmax``: the factor bank's length;
    ``chunk``: the longest window this kernel verifies without ``write_final_state``."""
    if (tmax is None and chunk is None) or not _tc.CHECK_BOUNDS:
        return
    if cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    if not lens.numel():
        return
    longest = int(lens.max())
    if tmax is not None and longest > tmax:
        raise ValueError(f"window of {longest} tokens exceeds the factor bank (Tmax={tmax})")
    if chunk is not None and longest > chunk:
        raise ValueError(f"window of {longest} tokens: the UT kernel verifies at most {chunk} tokens per row "
                         "without write_final_state (use triton_chain.chain_verify)")


def _launch_ut(
    q, k, v, g, beta, scale, state, slots, cu_seqlens,
    bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
    write_final_state, use_qk_l2norm, config=None, precision=None, parents=None,
):
    if write_final_state:
        assert parents is None, "a draft tree never writes its node states"
        # AR / commit windows: one state write after the window, the serial kernel's job (the UT
        # form is for verify windows, whose state is not written after the window)
        return _tc.chain_verify(q, k, v, g, beta, scale=scale, state=state, slots=slots, cu_seqlens=cu_seqlens,
                                bank_k=bank_k, bank_v=bank_v, bank_g=bank_g, write_bank=write_bank,
                                pending_len=pending_len, read_bank=read_bank, write_final_state=True,
                                use_qk_l2norm=use_qk_l2norm)
    N, H, K = k.shape
    HV, V = v.shape[-2:]
    assert HV % H == 0, "HV must be a multiple of H"
    assert state.shape[1:] == (HV, V, K) and state.dtype == torch.float32 and state.is_contiguous()
    q, k, v = (_rows_dense(x, 2) for x in (q, k, v))
    g, beta = (_rows_dense(x, 1) for x in (g, beta))
    R = cu_seqlens.numel() - 1
    assert slots.numel() >= R, f"slots ({slots.numel()}) must cover the {R} rows of cu_seqlens"
    # per-row index tensors are read with unit stride; only the first R entries are rows
    cu_seqlens, slots, write_bank, pending_len, read_bank, parents = (
        x.contiguous() if x is not None else None
        for x in (cu_seqlens, slots, write_bank, pending_len, read_bank, parents))
    o = torch.empty(N, HV, V, dtype=torch.float32, device=v.device)
    if R == 0:
        return o
    has_bank = write_bank is not None
    has_pending = pending_len is not None and read_bank is not None and bank_k is not None
    tmax = bank_k.shape[2] if bank_k is not None else 1
    if has_bank:
        assert bank_k.is_contiguous() and bank_v.is_contiguous() and bank_g.is_contiguous()
    _check_windows(cu_seqlens, tmax if has_bank else None, BT)
    dummy = o
    BK = max(16, triton.next_power_of_2(K))
    BV, nw, KC, ns = tuple(config) if config is not None else pick_config_ut(R, HV, V, K, N / R)
    KC = min(KC, BK)
    prec = _PREC_CODE[precision or DOT_PRECISION]
    if has_pending and (not FUSE_PENDING or tmax > BT):
        # separate commit (the default, faster here, see FUSE_PENDING) or more pending factors than
        # one [BT, BT] pending Gram holds: commit them with the recover kernel, verify without pending
        _tr.recover(state, slots[:R], bank_k, bank_v, bank_g, read_bank[:R], pending_len[:R])
        has_pending = False
    # per-(row, head) scratch of the prep kernel (fp32): q^/k^ rows, Tinv/W/Gpk/Gpq, e^Γ/beta
    qk_s = torch.empty(R, H, 2, BT, K, dtype=torch.float32, device=v.device)
    mat_s = torch.empty(R, HV, 4, BT, BT, dtype=torch.float32, device=v.device)
    vec_s = torch.empty(R, HV, 2, BT, dtype=torch.float32, device=v.device)
    bk_, bv_, bg_ = (x if x is not None else dummy for x in (bank_k, bank_v, bank_g))
    wb_ = write_bank if has_bank else slots
    pl_ = pending_len if has_pending else slots
    rb_ = read_bank if has_pending else slots
    _ut_prep_kernel[(HV, R)](
        q, k, g, beta, slots, cu_seqlens, parents if parents is not None else slots,
        bk_, bg_, wb_, pl_, rb_,
        qk_s, mat_s, vec_s,
        float(scale), tmax, q.stride(0), k.stride(0), g.stride(0), beta.stride(0),
        H=H, HV=HV, K=K, BK=BK, KG=min(PREP_KG, BK), BT=BT, HAS_BANK=has_bank, HAS_PENDING=has_pending,
        L2NORM=bool(use_qk_l2norm), PREC=prec, HAS_TREE=parents is not None,
        num_warps=PREP_WARPS,
    )
    _chain_ut_kernel[(triton.cdiv(V, BV), HV, R)](
        v, o,
        state, slots, cu_seqlens,
        bk_, bv_, bg_, wb_, pl_, rb_,
        qk_s, mat_s, vec_s,
        tmax, v.stride(0),
        H=H, HV=HV, K=K, V=V, KC=KC, NKC=BK // KC, BV=BV, BT=BT,
        HAS_BANK=has_bank, HAS_PENDING=has_pending, PREC=prec,
        num_warps=nw, num_stages=ns,
    )
    return o


def chain_verify_ut(
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
    """UT-form Triton chain verify; same arguments, semantics and return as
    :func:`vllm_specla.ops.reference.chain_verify_ref` and
    :func:`vllm_specla.ops.triton_chain.chain_verify` (``o [N, HV, V]`` float32; ``state`` and the
    write bank updated in place). Extra requirement: ``read_bank[r] != write_bank[r]`` for rows with
    ``pending_len[r] > 0``. Windows of any length run (chunks of 16); factors are written for
    positions ``< Tmax`` and longer windows raise ``ValueError`` like the reference (host check,
    skipped during CUDA-graph capture or with ``triton_chain.CHECK_BOUNDS = False``)."""
    return _launch_ut(
        q, k, v, g, beta, scale, state, slots, cu_seqlens,
        bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
        write_final_state, use_qk_l2norm,
    )


def tree_verify_ut(
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
    parents: torch.Tensor,
    bank_k: torch.Tensor | None = None,
    bank_v: torch.Tensor | None = None,
    bank_g: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """UT-form Triton tree verify of draft trees of at most 16 nodes per row: the same two kernels as
    :func:`chain_verify_ut` with the window's ``[16, 16]`` matrices masked to ancestors (ALGORITHMS.md
    §4), so a tree costs what a chain of the same node count costs (one state pass plus tensor-core
    products). Same arguments, semantics and return as
    :func:`vllm_specla.ops.tree_reference.tree_verify_sequential_ref` (``parents [N]``: row-local
    parent positions, ``-1`` for a root, topological; ``o [N, HV, V]`` float32; factors per node to
    the write bank at node positions; the node states are never written, ``state[slot]`` changes
    only by the pending commit). Raises ``ValueError`` for a row of more than 16 nodes (host check,
    skipped during CUDA-graph capture)."""
    return _launch_ut(
        q, k, v, g, beta, scale, state, slots, cu_seqlens,
        bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
        False, use_qk_l2norm, parents=parents,
    )
