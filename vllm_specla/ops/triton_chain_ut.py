"""Triton chain and tree verify in the tensor-core UT (chunk) form (v5, docs/KERNELS.md).

Same contract as :func:`vllm_specla.ops.triton_chain.chain_verify` and its oracle
:func:`vllm_specla.ops.reference.chain_verify_ref` for verify windows of at most ``BT = 16``
tokens (and, for :func:`tree_verify_ut`, of
:func:`vllm_specla.ops.tree_reference.tree_verify_sequential_ref` for trees of at most 32 nodes,
in chunks of ``BT = 16`` or 32):
pending factors committed first (deferred commit, ALGORITHMS.md §6), the window verified from the
committed state, factors written to bank ``write_bank``, the state not written after the window.
Instead of the serial walk of ``triton_chain`` (two mat-vecs per token on the ``[BV, K]`` tile),
the window is one chunk of the gated delta rule in UT / WY form (ALGORITHMS.md §4; the algebra of
fla 0.6.0 ``fla/ops/gated_delta_rule/chunk.py`` and ``fla/ops/utils/solve_tril.py``;
``reference.chunk_gated_delta_rule_ref`` is its torch form): the state is touched by two
tensor-core products and the serial part runs on ``[BT, BT]`` matrices (``BT = 16``; 32 for trees
of 17-32 nodes).

Shapes and dtypes (``ops/__init__.py``)::

    q, k     [N, H, K]    fp32 / bf16 / fp16 (token stride free, head and feature dims dense)
    v        [N, HV, V]   fp32 / bf16 / fp16
    g, beta  [N, HV]      float (log decay g <= 0, write strength)
    state    [slots, HV, V, K] fp32, contiguous  ("[V, K]" form: M = S^T)
    bank_k   [slots, 2, Tmax, H, K] fp32; bank_v [slots, 2, Tmax, HV, V] fp32; bank_g [slots, 2, Tmax, HV] fp32
    slots, write_bank, read_bank, pending_len [R] int; cu_seqlens [R+1] int; parents [N] int (trees)
    returns o [N, HV, V] fp32

Per launch:

0. pending factors (``pending_len``, bank ``read_bank``) are committed either by
   :func:`vllm_specla.ops.triton_recover.recover` (one state read + write) before the launch, or
   folded into step 2's state pass (:data:`UT_FOLD`: each ``[BV, KC]`` chunk takes the closed form
   of DeltaConstruct as a ``[BV, P] x [P, KC]`` dot and is written back; two state passes instead of
   three). A first fold form (session 3, the serial flush inside the kernel) was 1.15-1.3x slower on
   the H200 (benchmarks/RESULTS.md "Session 3"); this one, on the H100 (session 38), took chain steps
   at B = 32 / 128 2-10 % less time and 16-node trees from B = 32 between 13.5 % less and 0.3 %
   more, and was slower in split launches, at 32-node chunks and for one B = 16 tree (the default
   folds only from 64 MiB of state, not split, 16-token chunks); untested on the H200;
1. ``_ut_prep_kernel``, one program per ``(value head, row)``: everything that does not touch the
   state. Norms and the Gram products ``K K^T``, ``Q K^T`` (tensor-core dots over ``KG``-column
   chunks of the raw q/k; the l2norm, eps 1e-6 as fla, and the q scale applied afterwards), the
   decays, ``A[t,u] = beta_t k^_t.k^_u e^{Γ_t-Γ_u}`` (``u`` before ``t`` on its path),
   ``Tinv = (I + A)^-1`` by forward substitution for chains, by blocks of doubling size (fla
   ``solve_tril``'s merge) for trees (:data:`UT_SOLVE`), ``W[t,u] = q^_t.k^_u
   e^{Γ_t-Γ_u}`` (``u`` on the path of ``t``, itself included) and ``e^{Γ_t}``, into a small fp32
   scratch with ``q^``/``k^``; the ``k^`` and ``g`` factors go to the write bank;
2. ``_chain_ut_kernel``, one program per ``(V-tile, value head, row)``, grid ``(cdiv(V, BV), HV,
   R)``: one pass over ``[BV, KC]`` chunks of the state (``num_stages`` prefetches the next),
   ``MK = M K^^T``, ``MQ = M Q^^T`` as ``[BV, KC] x [KC, BT]`` dots; then
   ``V~^T = beta (V^T - e^Γ MK) Tinv^T`` and ``O^T = e^Γ MQ + V~^T W^T``; ``v~`` to the write bank.
   Bank writers as ``triton_chain``: ``bank_v`` by every V-tile (its slice), ``bank_g`` and
   ``bank_k`` by the prep of the value head (``bank_k``: the first value head of each GVA group),
   one writer per element.

Split launch (:data:`UT_SPLIT`; trees at <= 64 (row, value head) pairs): the products ``M k``,
``M q`` of the raw q / k in ``_ut_products_kernel`` beside the prep (second CUDA stream), step 2 then loads and scales
them instead of forming them.

A chain is the tree whose mask is lower triangular; for a tree (``parents``: row-local parent
positions, ``-1`` for a root, topological) the prep builds the ancestor matrix and sums decays
along root paths, the V-tile kernel is the same. ``write_final_state`` (AR / commit windows, the
state written after the window) goes to the serial kernel.

Requirements (as ``triton_chain``): ``read_bank[r] != write_bank[r]`` for rows with
``pending_len[r] > 0`` (double buffer), rows on distinct slots, windows of at most ``BT`` tokens
(checked on the host, ``ValueError``; the check is skipped during CUDA-graph capture, where the
dispatcher guarantees it through the bank length).

Precision. The state and the oracle are fp32, so plain TF32 dots (~1e-3 relative) are not
acceptable: every ``tl.dot`` uses ``input_precision="tf32x3"`` by default (:data:`DOT_PRECISION`;
three TF32 tensor-core products of the hi/lo split, ~fp32: measured 2.4-3.0e-7 vs the reference on
the H200). ``"ieee"`` (fp32 FMA) is exact and slow, ``"tf32"`` / ``"bf16x3"`` fast and inexact;
benchmarks/bench_ut.py measures them. The ``[BT, BT]`` solve and the decays are plain fp32, and
decay differences are summed directly (``sum_{u<s<=t} g_s``), not taken as differences of
cumulative sums, which lose ~1e-4 absolute when ``Γ`` reaches -1600 under strong decay. Under
``TRITON_INTERPRET=1`` every dot is an fp32 numpy matmul.

Launches never read device data on the host except the optional window-length check, so they are
CUDA-graph capturable; configs come from shapes only (:func:`pick_config_ut`).
"""

from __future__ import annotations

import os

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
BT = 16  # window-token chunk of chain windows (a verify window of <= 16 tokens is one chunk); dot K-dim >= 16
BT_TREE_MAX = 32  # trees of 17-32 nodes run with a 32-node chunk (tree_verify_ut, _pick_bt)
PREP_WARPS = 1  # warps of the per-(row, head) prep kernel at BT = 16 (its [BT, BT] work stays in one warp)
# ... in split launches (<= UT_SPLIT_MAX_PAIRS pairs: batch 1-8 trees), where the prep runs beside the products
# and its latency can be on the critical path: H100, 16-node trees with 3 pending, graph-timed in one call
# (benchmarks/tree_h100_s38a_w{default,2}.json, prep at 1 -> 2 warps): faster in 7 of 8 rows (B = 1: 21.2 -> 20.1 /
# 21.3 -> 20.0 us, 6x256x512 / 8x256x256; B = 2-8 -0.3 to -3.9 %), +0.4 % in the eighth (6x256x512 B = 8); 4
# warps did not help there (21.2 / 21.4 at B = 1), though they are the fastest prep alone (eager, 9.9 us). Rerun
# after the change (tree_h100_s38g_w{default,1}.json, binary and beam-4 trees, 2 vs 1 warp): B = 1 -4.2 to -6.2 %,
# B = 2 -1.1 to -1.9 %, B = 4 -0.5 to +0.1 %, B = 8 -1.1 to +0.6 %
PREP_WARPS_SPLIT = 2
PREP_WARPS_32 = 4  # at BT = 32 (each [32, 32] fp32 matrix is 32 registers per thread in one warp)
PREP_KG = 32  # key-dim chunk of its Gram dots (64 spills at 1 warp)
# How the prep kernel inverts I + A: "loop" (forward substitution, T - 2 dependent row passes) or
# "dot" (blocks of doubling size as fla's solve_tril merge, ceil(log2 T) - 1 levels of two dots);
# "auto" (the default) = dot for trees, loop for chains. Measured on the H200
# (benchmarks/solve_ab_h200_s10a.json, 6x256x512, prep us loop / dot): trees 16.8 / 15.4 (B = 8,
# 16 nodes), 35.3 / 23.3 (B = 8, 32 nodes), 49.3 / 35.8 (B = 32, 32 nodes), 146.8 / 104.1 (B = 128,
# 32 nodes); chains 11.2 / 13.0 (B = 8, T = 5), 16.7 / 19.4 (B = 128, T = 5), even at T = 16.
UT_SOLVE = os.environ.get("VLLM_SPECLA_UT_SOLVE", "auto")
# Split launch: at few (row, value head) pairs, where the prep and V-tile kernels are each
# latency-bound, the state products M k, M q run on the raw q / k (their l2norm scales applied
# afterwards) in a kernel of their own, concurrently with the prep on a second CUDA stream (after
# the pending commit); a combine kernel then finishes the window. Launches of at most
# UT_SPLIT_MAX_PAIRS pairs take it: "auto" (the default) for trees only (measured: B = 8 trees,
# 6x256x512, 16 nodes 35.0 -> 26.1 us, 32 nodes 59.2 -> 50.0, benchmarks/tree_h200_s10a_split*.json;
# chains at so few pairs go to the serial kernel), "1" for trees and chains, "0" never
# (VLLM_SPECLA_UT_SPLIT).
UT_SPLIT = os.environ.get("VLLM_SPECLA_UT_SPLIT", "auto")
UT_SPLIT_MAX_PAIRS = 64
# Deferred commit inside the verify's state pass: the pending factors are folded into each [BV, KC]
# chunk of the state as it is read (M' = e^{sum g} M + sum_u c_u v~_u k^_u^T, a [BV, P] x [P, KC]
# dot), the committed chunk is written back and the products use it: one state read and one write
# instead of the recover launch's read and write plus the verify's read. "1" always, "0" never (the
# recover kernel first), "auto" (the default) for launches that are not split (more than
# UT_SPLIT_MAX_PAIRS pairs, or chains), have 16-token chunks and read at least UT_FOLD_MIN_STATE_BYTES
# of state (VLLM_SPECLA_UT_FOLD). Measured on the H100 (RESULTS.md session 38; graph-timed, fold off ->
# on; benchmarks/commit_h100_s38{c,d}_fold*.json, tree_h100_s38{c,d}_fold*.json): chain steps (T = 5,
# 5 pending) at B = 32 / 128 were faster in both runs (147.5 -> 143.7-143.8 / 502.4 -> 491.1-491.2 us,
# 6x256x512; 116.0 -> 104.9-105.1 / 352.5-352.8 -> 340.5-340.6, 8x256x256); 16-node trees with 3 pending
# from B = 32 on moved by -13.5 to +0.3 % (B = 32: 157.6 -> 147.7 and 157.5 -> 158.0 in two runs, 127.1 ->
# 110.0 and 128.2 -> 116.0; B = 64: 287.3 -> 280.6, 215.3 -> 204.9; B = 128: 547.8 -> 537.3, 409.4 -> 394.7).
# Not folded, for what was measured there: B = 16 trees (87.0 -> 98.1 us on 6x256x512, 48 MiB of state;
# 65.4 -> 64.8 on 8x256x256, 32 MiB), split launches (B = 8 trees: 48.7 -> 56.9 / 37.0 -> 40.3 at 16
# nodes, 72.4 -> 77.3 / 55.9 -> 70.5 at 32; B = 1-4: -8.3 to +5.6 %) and 32-node chunks at B = 32
# (222.2 -> 230.9 / 172.6 -> 174.6). The threshold sits between the measured 48 and 64 MiB; that the
# loss at B = 16 comes from the state fitting the H100's 50 MB L2 (the saved pass is cheap there) is a
# guess, not measured.
UT_FOLD = os.environ.get("VLLM_SPECLA_UT_FOLD", "auto")
UT_FOLD_MIN_STATE_BYTES = 64 << 20
_UT_MODES = {"UT_SOLVE": ("loop", "dot", "auto"), "UT_SPLIT": ("0", "1", "auto"), "UT_FOLD": ("0", "1", "auto")}


def _ut_mode(name: str) -> str:
    """The value of the module switch ``name`` (``UT_SOLVE`` / ``UT_SPLIT`` / ``UT_FOLD``), checked.

    Raises:
        ValueError: naming the ``VLLM_SPECLA_*`` variable and the allowed values."""
    val = str(globals()[name])
    if val not in _UT_MODES[name]:
        raise ValueError(f"VLLM_SPECLA_{name}={val!r}: allowed values are {', '.join(_UT_MODES[name])}")
    return val


def ut_forms(pairs: int, tree: bool) -> tuple[bool, bool]:
    """``(split, solve_dot)`` for a launch of ``pairs`` (row, value head) pairs: whether it takes the
    split launch (:data:`UT_SPLIT`, at most :data:`UT_SPLIT_MAX_PAIRS` pairs) and the prep's blocked
    log-depth inverse (:data:`UT_SOLVE`); ``tree``: the window is a draft tree (``parents`` given).
    Shape-only (CUDA-graph safe). Raises ``ValueError`` for a switch value outside the allowed ones."""
    split_mode, solve_mode = _ut_mode("UT_SPLIT"), _ut_mode("UT_SOLVE")
    split = (split_mode == "1" or (split_mode == "auto" and tree)) and pairs <= UT_SPLIT_MAX_PAIRS
    return split, solve_mode == "dot" or (solve_mode == "auto" and tree)


def ut_fold(split: bool, bt: int, state_bytes: int) -> bool:
    """Whether a UT launch with pending factors folds them in its state pass (:data:`UT_FOLD`) instead
    of launching the recover kernel first; ``split``: the launch takes the split form
    (:func:`ut_forms`), ``bt``: its window chunk (16 or 32), ``state_bytes``: the state its rows read
    (rows x HV x V x K x 4; "auto" folds from :data:`UT_FOLD_MIN_STATE_BYTES`). Shape-only (CUDA-graph
    safe). Raises ``ValueError`` for a switch value outside the allowed ones."""
    mode = _ut_mode("UT_FOLD")
    return mode == "1" or (mode == "auto" and not split and bt == BT and state_bytes >= UT_FOLD_MIN_STATE_BYTES)


# (BV, num_warps, KC, num_stages) of every UT launch. KC: key-dim chunk in which the [BV, K] state tile
# is streamed through registers (the tile is never whole in registers); num_stages > 1 lets Triton
# prefetch the next chunk. From the H200 sweep of benchmarks/bench_ut.py (ut_v5_h200.json; verify
# T = 8 at B = 128: 32/2/16/3 217 / 169 us for 6x256x512 / 8x256x256, 64/4/32/2 219 / 170, 64/4/16/2
# 271 / 197, 128/8/16/2 314 / 238). Launches of fewer than 4 x 132 programs took an unswept "small"
# config (32, 4, 16, 2) until session 37, which measured it on trees, the UT kernel's small-batch use
# (H100, bench_tree.py --pending 0, graph-timed, benchmarks/tree_h100_s37{d,e}_*.json): this config
# was as fast or faster in all 28 rows, 16 / 32 nodes at batch 1 / 2 / 4 on both GDN-1.3B head shapes
# and at batch 8 on 8x256x256 (whose 512 programs were under the threshold; 6x256x512's 768 had this
# config already), by 1-12 % at batch 1, 2-21 % at batch 2, 5-45 % at batch 4-8 (8x256x256 B = 8:
# 34.5 -> 23.9 us at 16 nodes, 71.2 -> 38.9 at 32; 6x256x512 B = 4: 30.1 -> 21.3 / 48.1 -> 33.7; B = 1:
# 22.3 -> 20.4 / 31.9 -> 31.5), so it is now the only one (the key "large" kept for bench_ut.py).
TUNED_UT: dict[str, tuple[int, int, int, int]] = {
    "large": (32, 2, 16, 3),
}


def pick_config_ut(num_rows: int, HV: int, V: int, K: int, tokens_per_row: float = 1.0) -> tuple[int, int, int, int]:
    """``(BV, num_warps, KC, num_stages)`` for the UT kernel from shapes only (no host sync,
    CUDA-graph safe); ``(BV, num_warps)`` are the grid / CTA choice, ``KC, num_stages`` how the
    state tile is streamed.

    ``BV`` is the M dim of the state products (the per-(row, head) window work runs once, in the
    prep kernel). ``num_rows`` and ``tokens_per_row`` are unused: one config at every batch
    (:data:`TUNED_UT`; one chunk per verify window).
    """
    if CONFIG_OVERRIDE is not None:
        cfg = tuple(CONFIG_OVERRIDE)
        return (cfg + (64, 4, 16, 1)[len(cfg):])[:4]
    BK = max(16, triton.next_power_of_2(K))
    BV, nw, KC, ns = TUNED_UT["large"]
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
def _ut_prep_kernel(
    q, k, g, beta, slots, cu_seqlens, parents,
    bank_k, bank_g, write_bank,
    qk_s, mat_s, vec_s, sc_s,
    scale, Tmax, sq, sk, sg, sb,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, KG: tl.constexpr, BT: tl.constexpr,
    HAS_BANK: tl.constexpr, L2NORM: tl.constexpr, PREC: tl.constexpr, HAS_TREE: tl.constexpr,
    LOG2_BT: tl.constexpr, SOLVE_DOT: tl.constexpr, SPLIT: tl.constexpr,
):
    """Per ``(value head, row)``: everything of the window that does not touch the state.

    Writes ``q^`` (l2-normalised, times ``scale``) and ``k^`` (l2-normalised) of the key head to
    ``qk_s[r, h, 0/1, t, :]`` (rows ``t < T`` only, by the first value head of each GVA group);
    ``mat_s[r, hv, 0/1]`` (``[BT, BT]``): ``Tinv = (I + A)^-1``, ``W = tril_incl(Q^ K^^T ⊙ D)``;
    ``vec_s[r, hv, 0/1]``: ``e^{Γ_t}``,
    ``beta_t``; with ``SPLIT`` the l2norm scales ``rk_t``, ``rq_t`` (``rq`` times ``scale``) to
    ``sc_s[r, hv, 0/1]`` and no ``q^`` / ``k^`` scratch; with ``HAS_BANK`` the ``k^`` and ``g`` factors of the window to bank
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

    ssq = tl.zeros([BT], dtype=tl.float32)
    ssk = tl.zeros([BT], dtype=tl.float32)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
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
    # the ancestor matrix and the decay sums as [BT, BT] dots, not one pass per node (the session-3
    # form, 2-3 loops of T steps of [BT, BT] reductions, took 1.11-1.24x this prep's time for trees
    # on the H200, RESULTS.md session 8; the chain form uses the same dot, not timed alone); exact
    # (0 / 1 products) or sums of terms of one sign (no cancellation)
    if HAS_TREE:
        # ancestor-or-self matrix: the closure of I + P (P[t, parent(t)] = 1) by LOG2_BT squarings,
        # paths of up to 2^LOG2_BT >= BT - 1 edges (exact: 0 / 1 entries, fp32 FMA dots)
        b_par = tl.load(parents + bos + o_t, mask=mt, other=-1).to(tl.int32)
        anc = tl.where(m_e | (o_t[None, :] == b_par[:, None]), 1.0, 0.0)
        for _ in tl.static_range(LOG2_BT):
            anc = tl.minimum(tl.dot(anc, anc, input_precision="ieee"), 1.0)
        m_i = anc > 0.0
        m_s = m_i & (o_t[:, None] != o_t[None, :])
        # log D[t, u] = sum of g over path(t) \ path(u) (for u on the path of t: the nodes after u),
        # Γ_t = sum of g over path(t); both summed directly (terms of one sign: no cancellation)
        # [t, s]: g_s for s on path(t); g clamped for the products only (0 * -inf would be NaN;
        # e^-1e30 = e^-inf = 0, so a finite or -inf g gives the same decays)
        b_ga = anc * tl.maximum(b_g, -1e30)[None, :]
        b_S = tl.dot(b_ga, tl.trans(1.0 - anc), input_precision="ieee")
        eG = tl.exp(tl.sum(b_ga, 1))
    else:
        m_s = o_t[:, None] > o_t[None, :]  # strictly lower: u < t
        m_i = o_t[:, None] >= o_t[None, :]  # lower incl. the diagonal
        # Γ_t - Γ_u = sum_{u < s <= t} g_s summed directly, not as a difference of cumulative sums
        # (which loses ~1e-4 absolute when Γ reaches -1600 under strong decay): the tree form with
        # anc = the lower triangle
        b_low = tl.where(m_i, 1.0, 0.0)
        b_S = tl.dot(b_low * tl.maximum(b_g, -1e30)[None, :], tl.trans(1.0 - b_low), input_precision="ieee")
        eG = tl.exp(tl.cumsum(b_g, 0))
    b_D = tl.exp(tl.where(m_i, b_S, 0.0))
    b_A = tl.where(m_s, b_b[:, None] * b_kk * b_D, 0.0)
    b_W = tl.where(m_i, b_qk * b_D, 0.0)
    if SOLVE_DOT:
        # (I + A)^-1 by blocks of doubling size (the merge of fla solve_tril): N holds the inverses of
        # the s x s diagonal blocks of I + A; one level merges pairs of blocks,
        # N <- N - N A_off N (A_off: A's entries below the diagonal blocks inside each 2s block,
        # [[N11, 0], [-N22 A21 N11, N22]]). Levels while s < T (A is strictly lower: ancestors precede
        # their nodes), the first (s = 1, N = I) without dots: ceil(log2 T) - 1 levels of two fp32
        # FMA dots instead of T - 2 dependent row passes. As stable as the substitution (the Neumann
        # product prod (I + (-A)^(2^j)) has the same dot count but cancels catastrophically when A is
        # near the all-ones matrix: a deep chain of nearly parallel keys, review of session 9)
        r_t, c_t = o_t[:, None], o_t[None, :]
        b_Ti = tl.where(m_e, 1.0, 0.0) - tl.where((r_t // 2 == c_t // 2) & (r_t % 2 == 1) & (c_t % 2 == 0), b_A, 0.0)
        n_lv = T * 0
        for j in tl.static_range(1, LOG2_BT + 1):
            n_lv += ((1 << j) < T).to(n_lv.dtype)
        s_blk = T * 0 + 2
        for _ in range(n_lv):
            m_off = (r_t // (2 * s_blk) == c_t // (2 * s_blk)) & ((r_t // s_blk) % 2 == 1) & ((c_t // s_blk) % 2 == 0)
            b_Ao = tl.where(m_off, b_A, 0.0)
            b_Ti = b_Ti - tl.dot(tl.dot(b_Ti, b_Ao, input_precision="ieee"), b_Ti, input_precision="ieee")
            s_blk = s_blk * 2
    else:
        # N = (I + A)^-1 - I row by row: N_i = -A_i - sum_{j<i} A_ij N_j (fla solve_tril); rows 0, 1
        # of -A are already exact
        b_N = -b_A
        for i in range(2, T):
            b_a = -tl.sum(tl.where(o_t[:, None] == i, b_A, 0.0), 0)  # -A[i, :]
            b_a = b_a + tl.sum(b_a[:, None] * b_N, 0)
            b_N = tl.where(o_t[:, None] == i, b_a[None, :], b_N)
        b_Ti = b_N + tl.where(m_e, 1.0, 0.0)

    p_m = mat_s + (i_r * HV + i_hv) * (2 * BT * BT) + o_t[:, None] * BT + o_t[None, :]
    tl.store(p_m, b_Ti)
    tl.store(p_m + BT * BT, b_W)
    p_e = vec_s + (i_r * HV + i_hv) * (2 * BT) + o_t
    tl.store(p_e, eG)
    tl.store(p_e + BT, b_b)
    if SPLIT:  # the products ran on the raw q / k: their scales for the combine kernel
        p_sc = sc_s + (i_r * HV + i_hv) * (2 * BT) + o_t
        tl.store(p_sc, rk)
        tl.store(p_sc + BT, rq)
    k_writer = i_hv % G == 0
    if HAS_BANK:
        pw = (slot * 2 + tl.load(write_bank + i_r).to(tl.int64)) * Tmax + o_t  # [BT] bank positions
        mb = mt & (o_t < Tmax)
        tl.store(bank_g + pw * HV + i_hv, b_g, mask=mb)
    if SPLIT:
        k_writer = k_writer & HAS_BANK  # no q^ / k^ scratch: only the k^ factors to write
    if k_writer:  # q^, k^ rows t < T to the scratch (and k^ to the bank), second pass over K
        p_qk = qk_s + (i_r * H + i_h) * (2 * BT * K) + o_t[:, None] * K
        for c in range(0, BK // KG):
            o_kc = c * KG + o_g
            mkc = (o_kc < K)[None, :]
            mtc = mt[:, None] & mkc
            b_qc = tl.load(q + i_t[:, None] * sq + i_h * K + o_kc[None, :], mask=mtc, other=0.0).to(tl.float32)
            b_kc = tl.load(k + i_t[:, None] * sk + i_h * K + o_kc[None, :], mask=mtc, other=0.0).to(tl.float32)
            b_kc = b_kc * rk[:, None]
            if not SPLIT:
                tl.store(p_qk + o_kc[None, :], b_qc * rq[:, None], mask=mtc)
                tl.store(p_qk + BT * K + o_kc[None, :], b_kc, mask=mtc)
            if HAS_BANK:
                tl.store(bank_k + (pw[:, None] * H + i_h) * K + o_kc[None, :], b_kc, mask=mb[:, None] & mkc)


@triton.jit
def _fold_setup(bank_k, bank_v, bank_g, read_bank, pending_len, slot, i_r, i_hv, i_h, o_v, mv, Tmax,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BP: tl.constexpr):
    """The pending factors of row ``i_r`` (``n = min(pending_len[r], Tmax)`` of bank ``read_bank[r]``)
    for the fold of :func:`_state_products` (the closed form of DeltaConstruct, ALGORITHMS.md §2,
    ``reference.recover_ref``): ``M' = e^{sum_{u<n} g_u} M + sum_u c_u v~_u k^_u^T`` with
    ``c_u = exp(sum_{u<i<n} g_i)``. Returns ``(p_kp, mp, b_vp, eGp, keys_st)``: ``[BP, 1]`` pointers to
    key 0 of the pending ``k^`` rows and their mask ``u < n`` (``[BP]``), the tile's ``c_u v~_u``
    columns (``[BV, BP]`` fp32, zero for ``u >= n``), ``e^{sum g}`` (scalar) and the keys to store,
    ``K`` if ``n > 0`` else 0 (a row with nothing pending keeps its state unwritten, as the recover
    kernel does). Decay sums are summed directly over same-sign terms (no differences of cumulative
    sums)."""
    n = tl.minimum(tl.load(pending_len + i_r).to(tl.int32), Tmax)
    base = (slot * 2 + tl.load(read_bank + i_r).to(tl.int64)) * Tmax
    o_p = tl.arange(0, BP)
    mp = o_p < n
    b_gp = tl.load(bank_g + (base + o_p) * HV + i_hv, mask=mp, other=0.0)
    # [u, i]: g_i for u < i (< n: masked g are 0)
    tail = tl.sum(tl.where(o_p[None, :] > o_p[:, None], b_gp[None, :], 0.0), 1)
    eGp = tl.exp(tl.sum(b_gp, 0))
    b_vp = tl.load(bank_v + ((base + o_p[None, :]) * HV + i_hv) * V + o_v[:, None], mask=mv[:, None] & mp[None, :],
                   other=0.0)
    b_vp = b_vp * tl.where(mp, tl.exp(tail), 0.0)[None, :]
    p_kp = bank_k + ((base + o_p[:, None]) * H + i_h) * K
    return p_kp, mp, b_vp, eGp, tl.minimum(n, 1) * K


@triton.jit
def _state_products(p_st, p_kT, p_qT, mv, mt, K, KC: tl.constexpr, NKC: tl.constexpr, BV: tl.constexpr,
                    BT: tl.constexpr, PREC: tl.constexpr, FOLD: tl.constexpr = False, p_kp=None, mp=None,
                    b_vp=None, eGp=None, keys_st=None):
    """``(M k_t, M q_t)`` for the window rows ``t`` (``[BV, BT]`` fp32 each) in one pass over
    ``[BV, KC]`` chunks of the state tile (``p_st``: ``[BV, 1]`` row pointers), tensor-core dots;
    ``p_kT`` / ``p_qT``: ``[1, BT]`` pointers to key 0 of each row's k / q (unit key stride).
    ``FOLD``: each chunk first takes the pending factors (:func:`_fold_setup`'s ``p_kp, mp, b_vp, eGp,
    keys_st``), ``M' = eGp M + b_vp K_p`` (a ``[BV, BP] x [BP, KC]`` dot: ieee where ``PREC`` is, else
    tf32x3 whatever ``PREC`` says, since the committed state persists), is stored back where anything
    was pending (the committed state, written once) and the products use ``M'``: the deferred commit
    in the verify's own state pass instead of a recover launch's read and write."""
    o_c = tl.arange(0, KC)
    b_mk = tl.zeros([BV, BT], dtype=tl.float32)
    b_mq = tl.zeros([BV, BT], dtype=tl.float32)
    for kc in range(0, NKC):
        o_k = kc * KC + o_c
        mk = o_k < K
        mh = mv[:, None] & mk[None, :]
        b_h = tl.load(p_st + o_k[None, :], mask=mh, other=0.0)  # [BV, KC]
        if FOLD:
            b_kp = tl.load(p_kp + o_k[None, :], mask=mp[:, None] & mk[None, :], other=0.0)  # [BP, KC]
            if PREC == 0:
                b_h = b_h * eGp + _mm(b_vp, b_kp, 0)
            else:
                b_h = b_h * eGp + _mm(b_vp, b_kp, 1)
            tl.store(p_st + o_k[None, :], b_h, mask=mh & (o_k < keys_st)[None, :])
        mkt = mk[:, None] & mt[None, :]  # [KC, BT]: q / k loaded transposed (dot B operands)
        b_qT = tl.load(p_qT + o_k[:, None], mask=mkt, other=0.0).to(tl.float32)
        b_kT = tl.load(p_kT + o_k[:, None], mask=mkt, other=0.0).to(tl.float32)
        b_mk += _mm(b_h, b_kT, PREC)
        b_mq += _mm(b_h, b_qT, PREC)
    return b_mk, b_mq


@triton.jit
def _ut_vtile(cu_seqlens, slots, H: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
              BT: tl.constexpr):
    """The ``(V-tile, value head, row)`` program's indices, shared by :func:`_chain_ut_kernel` and
    :func:`_ut_products_kernel`: row ``i_r``, value head ``i_hv`` and its key head ``i_h`` (GVA), the
    row's state slot, the tile's value rows ``o_v`` (mask ``mv``), window positions ``o_t`` (mask
    ``mt``: ``t < T``, the window cut at ``BT``) and their token indices ``i_t``."""
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
    o_t = tl.arange(0, BT)
    mt = o_t < T
    return i_r, i_hv, i_h, slot, o_v, mv, o_t, mt, bos + o_t


@triton.jit
def _chain_ut_kernel(
    v, o,
    state, slots, cu_seqlens,
    bank_v, write_bank,
    qk_s, mat_s, vec_s, mm_s, sc_s,
    bank_k, bank_vr, bank_g, read_bank, pending_len,
    Tmax, sv,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    KC: tl.constexpr, NKC: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr,
    HAS_BANK: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr, FOLD: tl.constexpr, BP: tl.constexpr,
):
    """Per ``(V-tile, value head, row)``: the state part of the window (see the module docstring).
    ``SPLIT``: the products ``M k``, ``M q`` of the raw q / k come from ``mm_s``
    (:func:`_ut_products_kernel`) and are scaled here by the prep's l2norm scales (the combine kernel
    of the split launch)."""
    i_r, i_hv, i_h, slot, o_v, mv, o_t, mt, i_t = _ut_vtile(cu_seqlens, slots, H, HV, V, BV, BT)
    p_st = state + (slot * HV + i_hv) * (V * K) + o_v[:, None] * K  # [BV, 1] row pointers of the tile
    p_qk = qk_s + (i_r * H + i_h) * (2 * BT * K) + o_t[None, :] * K  # [1, BT]: q^ rows (k^ at + BT*K)

    if SPLIT:  # products of the raw q / k (_ut_products_kernel), scaled by the l2norm scales
        p_mm = mm_s + (i_r * HV + i_hv) * (2 * V * BT) + o_v[:, None] * BT + o_t[None, :]
        p_sc = sc_s + (i_r * HV + i_hv) * (2 * BT) + o_t
        mvt = mv[:, None] & (o_t[None, :] < BT)
        b_mk = tl.load(p_mm, mask=mvt, other=0.0) * tl.load(p_sc)[None, :]
        b_mq = tl.load(p_mm + V * BT, mask=mvt, other=0.0) * tl.load(p_sc + BT)[None, :]
    else:
        # ---- one pass over K-chunks of the slot's state M: M k^, M q^ (tensor cores); FOLD: the
        # pending factors folded into each chunk first, the committed state written back ----
        if FOLD:
            p_kp, mp, b_vp, eGp, keys_st = _fold_setup(bank_k, bank_vr, bank_g, read_bank, pending_len, slot, i_r,
                                                     i_hv, i_h, o_v, mv, Tmax, H, HV, K, V, BP)
            b_mk, b_mq = _state_products(p_st, p_qk + BT * K, p_qk, mv, mt, K, KC, NKC, BV, BT, PREC,
                                         True, p_kp, mp, b_vp, eGp, keys_st)
        else:
            b_mk, b_mq = _state_products(p_st, p_qk + BT * K, p_qk, mv, mt, K, KC, NKC, BV, BT, PREC)
    p_m = mat_s + (i_r * HV + i_hv) * (2 * BT * BT) + o_t[:, None] * BT + o_t[None, :]
    # ---- the window on [BV, BT] tiles (ALGORITHMS.md §4, chain mask) ----
    b_Ti = tl.load(p_m)
    b_W = tl.load(p_m + BT * BT)
    p_e = vec_s + (i_r * HV + i_hv) * (2 * BT) + o_t
    eG = tl.load(p_e)
    b_b = tl.load(p_e + BT)
    b_vT = tl.load(v + i_t[None, :] * sv + i_hv * V + o_v[:, None],
                   mask=mv[:, None] & mt[None, :], other=0.0).to(tl.float32)  # [BV, BT]
    b_r = b_b[None, :] * (b_vT - eG[None, :] * b_mk)  # beta (v - e^Γ M k^)
    b_x = _mm(b_r, tl.trans(b_Ti), PREC)  # V~^T = R Tinv^T
    b_o = eG[None, :] * b_mq + _mm(b_x, tl.trans(b_W), PREC)
    tl.store(o + (i_t[None, :] * HV + i_hv) * V + o_v[:, None], b_o, mask=mv[:, None] & mt[None, :])
    if HAS_BANK:
        mb = mt & (o_t < Tmax)
        pw = (slot * 2 + tl.load(write_bank + i_r).to(tl.int64)) * Tmax + o_t
        tl.store(bank_v + (pw[None, :] * HV + i_hv) * V + o_v[:, None], b_x, mask=mv[:, None] & mb[None, :])


@triton.jit
def _ut_products_kernel(
    q, k, state, slots, cu_seqlens, mm_s, sq, sk,
    bank_k, bank_v, bank_g, read_bank, pending_len, Tmax,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    KC: tl.constexpr, NKC: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
    FOLD: tl.constexpr, BP: tl.constexpr,
):
    """Per ``(V-tile, value head, row)`` of the split launch: ``M k_t`` and ``M q_t`` of the *raw*
    (not l2-normalised, unscaled) window rows ``t < T`` against the slot's state ``M`` (one pass over
    ``[BV, KC]`` chunks, tensor-core dots as :func:`_chain_ut_kernel`), to ``mm_s[r, hv, 0/1]``
    (``[V, BT]`` fp32; columns ``t >= T`` zero). Needs nothing of the prep kernel, so it runs beside it.
    ``FOLD``: the pending factors are folded into the state first (:func:`_state_products`)."""
    i_r, i_hv, i_h, slot, o_v, mv, o_t, mt, i_t = _ut_vtile(cu_seqlens, slots, H, HV, V, BV, BT)
    p_st = state + (slot * HV + i_hv) * (V * K) + o_v[:, None] * K
    p_kT, p_qT = k + i_t[None, :] * sk + i_h * K, q + i_t[None, :] * sq + i_h * K
    if FOLD:
        p_kp, mp, b_vp, eGp, keys_st = _fold_setup(bank_k, bank_v, bank_g, read_bank, pending_len, slot, i_r, i_hv,
                                                 i_h, o_v, mv, Tmax, H, HV, K, V, BP)
        b_mk, b_mq = _state_products(p_st, p_kT, p_qT, mv, mt, K, KC, NKC, BV, BT, PREC, True, p_kp, mp, b_vp, eGp,
                                     keys_st)
    else:
        b_mk, b_mq = _state_products(p_st, p_kT, p_qT, mv, mt, K, KC, NKC, BV, BT, PREC)
    p_mm = mm_s + (i_r * HV + i_hv) * (2 * V * BT) + o_v[:, None] * BT + o_t[None, :]
    m2 = mv[:, None] & (o_t[None, :] < BT)
    tl.store(p_mm, b_mk, mask=m2)
    tl.store(p_mm + V * BT, b_mq, mask=m2)


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One second stream per device for the split launch (created once: also usable inside a
    CUDA-graph capture, where the fork / join below become graph edges)."""
    key = torch.device(device).index
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device=device)
    return _SIDE_STREAMS[key]


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
                         "without write_final_state in this launch (chains: triton_chain.chain_verify; trees: "
                         "pass max_nodes <= 32, or the HLD / walk kernels)")


def _pick_bt(max_nodes: int | None) -> int:
    """Window chunk ``BT`` for windows of at most ``max_nodes`` tokens / nodes (None: 16, the chain
    form's chunk): 16 up to 16, else :data:`BT_TREE_MAX` (32). Shapes only (no host sync).

    Raises:
        ValueError: ``max_nodes`` above 32 (the UT kernels verify at most 32 nodes per row).
    """
    if max_nodes is None or max_nodes <= BT:
        return BT
    if max_nodes <= BT_TREE_MAX:
        return BT_TREE_MAX
    raise ValueError(f"max_nodes={max_nodes}: the UT kernels verify at most {BT_TREE_MAX} nodes per row")


def _launch_ut(
    q, k, v, g, beta, scale, state, slots, cu_seqlens,
    bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
    write_final_state, use_qk_l2norm, config=None, precision=None, parents=None, max_nodes=None,
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
    bt = _pick_bt(max_nodes)
    _check_windows(cu_seqlens, tmax if has_bank else None, bt)
    dummy = o
    BK = max(16, triton.next_power_of_2(K))
    BV, nw, KC, ns = tuple(config) if config is not None else pick_config_ut(R, HV, V, K, N / R)
    KC = min(KC, BK)
    prec = _PREC_CODE[precision or DOT_PRECISION]
    split, solve_dot = ut_forms(R * HV, parents is not None)
    # per-(row, head) scratch of the prep kernel (fp32): q^/k^ rows (not in the split launch),
    # Tinv/W, e^Γ/beta; in the split launch the l2norm scales of k / q (sc_s) and the products (mm_s)
    qk_s = dummy if split else torch.empty(R, H, 2, bt, K, dtype=torch.float32, device=v.device)
    mat_s = torch.empty(R, HV, 2, bt, bt, dtype=torch.float32, device=v.device)
    vec_s = torch.empty(R, HV, 2, bt, dtype=torch.float32, device=v.device)
    sc_s = torch.empty(R, HV, 2, bt, dtype=torch.float32, device=v.device) if split else dummy
    mm_s = torch.empty(R, HV, 2, V, bt, dtype=torch.float32, device=v.device) if split else dummy
    wb_ = write_bank if has_bank else slots
    grid = (triton.cdiv(V, BV), HV, R)

    def prep():
        _ut_prep_kernel[(HV, R)](
            q, k, g, beta, slots, cu_seqlens, parents if parents is not None else slots,
            bank_k if has_bank else dummy, bank_g if has_bank else dummy, wb_,
            qk_s, mat_s, vec_s, sc_s,
            float(scale), tmax, q.stride(0), k.stride(0), g.stride(0), beta.stride(0),
            H=H, HV=HV, K=K, BK=BK, KG=min(PREP_KG, BK), BT=bt, HAS_BANK=has_bank,
            L2NORM=bool(use_qk_l2norm), PREC=prec, HAS_TREE=parents is not None,
            LOG2_BT=bt.bit_length() - 1, SOLVE_DOT=solve_dot,
            SPLIT=split, num_warps=PREP_WARPS_32 if bt != BT else PREP_WARPS_SPLIT if split else PREP_WARPS,
        )

    side = _side_stream(v.device) if split and v.device.type == "cuda" else None
    if side is not None:  # the prep beside the pending commit and the products (fork)
        side.wait_stream(torch.cuda.current_stream(v.device))
        with torch.cuda.stream(side):
            prep()
    fold = has_pending and ut_fold(split, bt, R * HV * V * K * 4)
    BP = max(16, triton.next_power_of_2(tmax))
    fold_args = (bank_k, bank_v, bank_g, read_bank, pending_len) if fold else (dummy, dummy, dummy, slots, slots)
    if has_pending and not fold:  # deferred commit of the pending factors: the recover kernel, then verify
        _tr.recover(state, slots[:R], bank_k, bank_v, bank_g, read_bank[:R], pending_len[:R])
    if not split:
        prep()
    else:
        _ut_products_kernel[grid](
            q, k, state, slots, cu_seqlens, mm_s, q.stride(0), k.stride(0), *fold_args, tmax,
            H=H, HV=HV, K=K, V=V, KC=KC, NKC=BK // KC, BV=BV, BT=bt, PREC=prec, FOLD=fold, BP=BP,
            num_warps=nw, num_stages=ns,
        )
        if side is None:
            prep()  # no second stream (the CPU interpreter): one after the other
        else:
            torch.cuda.current_stream(v.device).wait_stream(side)  # join
    _chain_ut_kernel[grid](
        v, o,
        state, slots, cu_seqlens,
        bank_v if has_bank else dummy, wb_,
        qk_s, mat_s, vec_s, mm_s, sc_s,
        *fold_args,
        tmax, v.stride(0),
        H=H, HV=HV, K=K, V=V, KC=KC, NKC=BK // KC, BV=BV, BT=bt,
        HAS_BANK=has_bank, PREC=prec, SPLIT=split, FOLD=fold and not split, BP=BP,
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
    ``pending_len[r] > 0``. Windows of at most 16 tokens (``write_final_state`` windows of any
    length go to the serial kernel); factors are written for
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
    max_nodes: int | None = None,
) -> torch.Tensor:
    """UT-form Triton tree verify of draft trees of at most 32 nodes per row: the same two kernels as
    :func:`chain_verify_ut` with the window's ``[BT, BT]`` matrices masked to ancestors (ALGORITHMS.md
    §4), so a tree costs what a chain of the same node count costs (one state pass plus tensor-core
    products). Same arguments, semantics and return as
    :func:`vllm_specla.ops.tree_reference.tree_verify_sequential_ref` (``parents [N]``: row-local
    parent positions, ``-1`` for a root, topological; ``o [N, HV, V]`` float32; factors per node to
    the write bank at node positions; the node states are never written, ``state[slot]`` changes
    only by the pending commit).

    ``max_nodes``: the longest tree of the launch (shapes only; default: the factor bank's length
    ``bank_k.shape[2]``, at most 32, when factors are written, else 16). Trees of up to 16 nodes run with
    ``BT = 16`` chunks, of 17-32 nodes with ``BT = 32`` (:func:`_pick_bt`).

    Raises:
        ValueError: ``max_nodes`` above 32, or a row longer than the chunk or the bank (host check,
            skipped during CUDA-graph capture: there the bound must come from ``max_nodes`` or a bank
            of at most 32 positions).
    """
    if max_nodes is None and write_bank is not None and bank_k is not None:
        max_nodes = min(bank_k.shape[2], BT_TREE_MAX)
    return _launch_ut(
        q, k, v, g, beta, scale, state, slots, cu_seqlens,
        bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
        False, use_qk_l2norm, parents=parents, max_nodes=max_nodes,
    )
