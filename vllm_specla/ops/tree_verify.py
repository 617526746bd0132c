"""Public tree-verify ops: verify a draft tree (parent pointers, topological order) per request.

Topology format, factor positions and the torch references: :mod:`vllm_specla.ops.tree_reference`
(ALGORITHMS.md §4, §5). Dispatch of :func:`tree_verify`:

* a chain topology (every row ``[-1, 0, 1, ...]``) goes to :func:`~vllm_specla.ops.chain_verify.
  chain_verify` / :func:`~vllm_specla.ops.chain_verify.conv_verify` (state-resident chain kernel);
* CUDA tensors with Triton: one of two tree kernels, picked by :func:`pick_tree_kernel` (shapes
  only, no host sync): the heavy-light kernel (:mod:`vllm_specla.ops.triton_tree_hld`, chains with
  the state on chip, boundary states materialised in a scratch buffer) or the ancestor-walk kernel
  below (``_tree_verify_kernel``, root tile only, no scratch);
* CPU tensors: the C++ op ``torch.ops.vllm_specla.tree_verify`` when built (:mod:`~vllm_specla.ops.
  _cpp`; sequential per-node form, any tree or forest), else the torch UT reference.

:func:`tree_conv`: chain -> ``conv_verify``; CUDA -> the Triton tree conv below; CPU -> the torch
reference (there is no C++ tree conv op; a chain's conv goes to the C++ ``conv_verify``).

Triton tree verify, ancestor walk (``_tree_verify_kernel``), one program per ``(V-tile, value
head, row)``, like the chain kernel: the ``[BV, K]`` root-state tile (after the fused pending commit)
stays in registers and is never modified; node ``t``'s parent state is never materialised. It is
applied through the UT / DeltaConstruct identity
``M_p = e^{G_p} M_0 + sum_{u in path(p)} e^{G_p - G_u} v~_u k_u^T``:

    M_p k_t = e^{G_p} (M_0 k_t) + sum_u e^{G_p - G_u} (k_u . k_t) v~_u      (same for q_t)
    v~_t = beta_t (v_t - e^{g_t} M_p k_t),   o_t = e^{g_t} M_p q_t + (k_t . q_t) v~_t

with ``G`` the path-cumulative log decay and the ``v~_u`` of earlier nodes kept on chip
(``[BN, BV]`` registers). Per node: two mat-vecs on the state tile (as in a chain step) plus a walk up
its ancestors (depth x (K + BN*BV) work). No state write besides the pending commit.
"""

from __future__ import annotations

import torch

from vllm_specla.ops import _cpp
from vllm_specla.ops.tree_reference import (  # noqa: F401
    compact_path_factors,
    hld_max_chains_per_wave,
    is_chain,
    tree_conv_ref,
    tree_conv_sequential_ref,
    tree_verify_sequential_ref,
    tree_verify_ut_ref,
)

try:
    import triton
    import triton.language as tl

    from vllm_specla.ops.triton_chain import _z_load_s
    from vllm_specla.ops.triton_tree_hld import HLDPlan, hld_device_plan, hld_plan, tree_verify_hld  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover - CPU installs without triton
    HAS_TRITON = False


if HAS_TRITON:

    @triton.jit
    def _tree_verify_kernel(
        q, k, v, g, beta, o, parents,
        state, slots, cu_seqlens,
        bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
        scale, Tmax, sq, sk, sv, sg, sb,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr,
        HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr, L2NORM: tl.constexpr,
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
        o_n = tl.arange(0, BN)
        mk = o_k < K
        mv = o_v < V
        mh = mv[:, None] & mk[None, :]
        p_s = state + (slot * HV + i_hv) * (V * K) + o_v[:, None] * K + o_k[None, :]
        b_h = tl.load(p_s, mask=mh, other=0.0)

        if HAS_PENDING:
            n_p = tl.minimum(tl.load(pending_len + i_r).to(tl.int32), Tmax)
            if n_p > 0:
                rb = tl.load(read_bank + i_r).to(tl.int64)
                base = (slot * 2 + rb) * Tmax
                for u in range(0, n_p):
                    b_pk = tl.load(bank_k + ((base + u) * H + i_h) * K + o_k, mask=mk, other=0.0)
                    b_pv = tl.load(bank_v + ((base + u) * HV + i_hv) * V + o_v, mask=mv, other=0.0)
                    b_pg = tl.load(bank_g + (base + u) * HV + i_hv)
                    b_h = b_h * tl.exp(b_pg) + b_pv[:, None] * b_pk[None, :]
                tl.store(p_s, b_h, mask=mh)

        if HAS_BANK:
            wb = tl.load(write_bank + i_r).to(tl.int64)
            wbase = (slot * 2 + wb) * Tmax

        b_vt_all = tl.zeros([BN, BV], dtype=tl.float32)  # v~ of the nodes seen so far
        b_G = tl.zeros([BN], dtype=tl.float32)  # path-cumulative log decay per node
        for t in range(0, eos - bos):
            i_t = bos + t
            b_q = tl.load(q + i_t * sq + i_h * K + o_k, mask=mk, other=0.0).to(tl.float32)
            b_k = tl.load(k + i_t * sk + i_h * K + o_k, mask=mk, other=0.0).to(tl.float32)
            b_v = tl.load(v + i_t * sv + i_hv * V + o_v, mask=mv, other=0.0).to(tl.float32)
            b_g = tl.load(g + i_t * sg + i_hv).to(tl.float32)
            b_beta = tl.load(beta + i_t * sb + i_hv).to(tl.float32)
            par = tl.load(parents + i_t).to(tl.int64)
            if L2NORM:
                b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6)
                b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
            b_q = b_q * scale
            Gp = tl.sum(tl.where(o_n == par, b_G, 0.0))  # 0 for a root
            egp = tl.exp(Gp)
            acc_k = egp * tl.sum(b_h * b_k[None, :], 1)
            acc_q = egp * tl.sum(b_h * b_q[None, :], 1)
            u = par
            while u >= 0:
                b_ku = tl.load(k + (bos + u) * sk + i_h * K + o_k, mask=mk, other=0.0).to(tl.float32)
                if L2NORM:
                    b_ku = b_ku * tl.rsqrt(tl.sum(b_ku * b_ku) + 1e-6)
                sel = o_n == u
                w = tl.exp(Gp - tl.sum(tl.where(sel, b_G, 0.0)))
                b_vu = tl.sum(tl.where(sel[:, None], b_vt_all, 0.0), 0)
                acc_k += (w * tl.sum(b_ku * b_k)) * b_vu
                acc_q += (w * tl.sum(b_ku * b_q)) * b_vu
                u = tl.load(parents + bos + u).to(tl.int64)
            eg = tl.exp(b_g)
            b_vt = b_beta * (b_v - eg * acc_k)
            b_o = eg * acc_q + tl.sum(b_k * b_q) * b_vt
            tl.store(o + (i_t * HV + i_hv) * V + o_v, b_o, mask=mv)
            b_vt_all = tl.where((o_n == t)[:, None], b_vt[None, :], b_vt_all)
            b_G = tl.where(o_n == t, Gp + b_g, b_G)
            if HAS_BANK:
                tl.store(bank_v + ((wbase + t) * HV + i_hv) * V + o_v, b_vt, mask=mv)
                if i_v == 0:
                    tl.store(bank_g + (wbase + t) * HV + i_hv, b_g)
                    if i_hv % G == 0:
                        tl.store(bank_k + ((wbase + t) * H + i_h) * K + o_k, b_k, mask=mk)

    @triton.jit
    def _tree_conv_kernel(
        x, weight, y, parents, cu_seqlens, conv_state, slots,
        bank_x, write_bank, pending_len, read_bank,
        Tmax, C, SX,
        W: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, BN: tl.constexpr,
        HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr,
    ):
        # One program per (channel tile, row); the row's nodes in chunks of BN, each chunk as
        # [BN, BC] tiles: step j = 0..W-1 of every node's ancestor walk at once (the j-th node up
        # its path, or the committed window above the root), so a chunk costs W - 1 dependent loads
        # of the parents vector and W independent tile loads, not one dependent load per node and
        # step (the per-node loop: ~27 us per launch at batch 1, RESULTS.md session 10). History
        # above the root = rows n_p .. n_p+W-2 of (window ++ pending raw inputs), read in fp32
        # before the single in-place store of the committed window (after a barrier). x: row
        # stride SX (a column slice of the in-projection is read in place).
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
        o_n = tl.arange(0, BN)
        p_cs = conv_state + slot * W1 * C
        n_p = tl.zeros([], dtype=tl.int64)
        p_bx = bank_x
        if HAS_PENDING:
            n_p = tl.maximum(tl.minimum(tl.load(pending_len + i_r).to(tl.int64), Tmax), 0)
            rb = tl.load(read_bank + i_r).to(tl.int64)
            p_bx = bank_x + (slot * 2 + rb) * Tmax * C
        p_bw = bank_x
        if HAS_BANK:
            p_bw = bank_x + (slot * 2 + tl.load(write_bank + i_r).to(tl.int64)) * Tmax * C
        for n0 in range(0, T, BN):
            nodes = n0 + o_n
            mn = nodes < T
            acc = tl.zeros([BN, BC], dtype=tl.float32)
            x_self = tl.zeros([BN, BC], dtype=tl.float32)
            cur = tl.where(mn, nodes, -1)  # current ancestor (window position), -1 once above the root
            hpos = (W1 - 1) + 0 * nodes  # next committed-window row to use above the root
            for j in tl.static_range(W):
                in_t = cur >= 0
                m_x = (mn & in_t)[:, None] & mc[None, :]
                bx = tl.load(x + (bos + tl.where(in_t, cur, 0))[:, None] * SX + o_c[None, :], mask=m_x,
                             other=0.0).to(tl.float32)
                z2 = (n_p + hpos)[:, None] + 0 * o_c[None, :]
                # history rows only (z2 < W1 + n_p): the x branch of Z is never taken here
                bh = _z_load_s(p_cs, p_bx, x, z2, o_c[None, :] + 0 * z2, (mn & ~in_t)[:, None] & mc[None, :], n_p, C,
                               SX, W1)
                w = tl.load(weight + o_c * W + (W - 1 - j), mask=mc, other=0.0).to(tl.float32)
                acc += w[None, :] * tl.where(in_t[:, None], bx, bh)
                if j == 0:
                    x_self = bx
                if j < W - 1:
                    nxt = tl.load(parents + bos + tl.where(in_t, cur, 0), mask=mn & in_t, other=-1).to(cur.dtype)
                    hpos = tl.where(in_t, hpos, hpos - 1)
                    cur = tl.where(in_t, nxt, -1)
            m_o = mn[:, None] & mc[None, :]
            tl.store(y + (bos + nodes)[:, None] * C + o_c[None, :], acc * tl.sigmoid(acc), mask=m_o)
            if HAS_BANK:
                tl.store(p_bw + nodes[:, None] * C + o_c[None, :], x_self, mask=m_o & (nodes < Tmax)[:, None])
        if n_p > 0:
            z2 = (n_p + o_j)[:, None] + 0 * o_c[None, :]
            oc2 = o_c[None, :] + 0 * o_j[:, None]
            m2 = mj[:, None] & mc[None, :]
            val = _z_load_s(p_cs, p_bx, x, z2, oc2, m2, n_p, C, SX, W1)  # z2 < W1 + n_p: window / pending
            tl.debug_barrier()
            tl.store(p_cs + o_j[:, None] * C + o_c[None, :], val.to(conv_state.dtype.element_ty), mask=m2)


def _max_nodes(cu_seqlens: torch.Tensor) -> int:
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    return int(lens.max()) if lens.numel() else 1


def tree_verify_triton(
    q, k, v, g, beta, *, scale, state, slots, cu_seqlens, parents,
    bank_k=None, bank_v=None, bank_g=None, write_bank=None, pending_len=None, read_bank=None,
    use_qk_l2norm=True, max_nodes: int | None = None,
) -> torch.Tensor:
    """Triton tree verify (module doc); arguments as :func:`tree_verify`."""
    from vllm_specla.ops.triton_chain import _bounds_check, _rows_dense, pick_config  # noqa: PLC0415

    N, H, K = k.shape
    HV, V = v.shape[-2:]
    assert g.shape == beta.shape == (N, HV), f"g / beta must be [N, HV] = [{N}, {HV}], got {tuple(g.shape)}"
    q, k, v = (_rows_dense(x, 2) for x in (q, k, v))  # token-strided inputs are read in place
    g, beta = (_rows_dense(x, 1) for x in (g, beta))
    R = cu_seqlens.numel() - 1
    o = torch.empty(N, HV, V, dtype=torch.float32, device=v.device)
    if R == 0:
        return o
    has_bank = write_bank is not None
    has_pending = pending_len is not None and read_bank is not None and bank_k is not None
    tmax = bank_k.shape[2] if bank_k is not None else 1
    if has_bank:
        _bounds_check(cu_seqlens, tmax)
        nmax = tmax if max_nodes is None else max_nodes
    else:
        nmax = max_nodes if max_nodes is not None else _max_nodes(cu_seqlens)
    BN = max(2, triton.next_power_of_2(nmax))
    BK = triton.next_power_of_2(K)
    BV, nw = pick_config(R, HV, V, K, N / R)[:2]
    grid = (triton.cdiv(V, BV), HV, R)
    _tree_verify_kernel[grid](
        q, k, v, g, beta, o, parents.contiguous(),
        state, slots, cu_seqlens,
        bank_k if bank_k is not None else o, bank_v if bank_v is not None else o,
        bank_g if bank_g is not None else o,
        write_bank if has_bank else slots, pending_len if has_pending else slots,
        read_bank if has_pending else slots,
        float(scale), tmax, q.stride(0), k.stride(0), v.stride(0), g.stride(0), beta.stride(0),
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, BN=BN,
        HAS_BANK=has_bank, HAS_PENDING=has_pending, L2NORM=bool(use_qk_l2norm),
        num_warps=nw, num_stages=1,
    )
    return o


def tree_conv_triton(x, weight, cu_seqlens, parents, conv_state, slots, *, bank_x=None, write_bank=None,
                     pending_len=None, read_bank=None, max_nodes: int | None = None) -> torch.Tensor:
    """Triton tree conv; arguments as :func:`tree_conv` (``x`` may be token-strided: a column
    slice of the in-projection is read in place). ``max_nodes``: a bound on the nodes per row that
    sizes the kernel's node chunk (default: the factor bank's length, else 16; no host read, so the
    launch stays CUDA-graph capturable); longer rows are still done, in several chunks.

    Raises:
        ValueError: ``write_bank`` / ``pending_len`` given without ``bank_x`` (as ``conv_verify``)."""
    from vllm_specla.ops.triton_chain import _bounds_check, _rows_dense  # noqa: PLC0415

    if bank_x is None and (write_bank is not None or pending_len is not None):
        raise ValueError("tree_conv: bank_x is required with write_bank or pending_len "
                         "(the factor bank of raw conv inputs, [slots, 2, Tmax, C] float32)")
    N, C = x.shape
    W = weight.shape[-1]
    x, weight = _rows_dense(x, 1), weight.contiguous()
    R = cu_seqlens.numel() - 1
    y = torch.empty(N, C, dtype=torch.float32, device=x.device)
    if R == 0:
        return y
    has_bank = write_bank is not None
    has_pending = pending_len is not None and read_bank is not None and bank_x is not None
    tmax = bank_x.shape[2] if bank_x is not None else 1
    if has_bank:
        _bounds_check(cu_seqlens, tmax)
    if max_nodes is None:
        max_nodes = tmax if has_bank else 16
    BN, BC = tree_conv_config(R, C, max_nodes)
    BW = max(2, triton.next_power_of_2(W - 1))
    _tree_conv_kernel[(triton.cdiv(C, BC), R)](
        x, weight, y, parents.contiguous(), cu_seqlens, conv_state, slots,
        bank_x if bank_x is not None else y, write_bank if has_bank else slots,
        pending_len if has_pending else slots, read_bank if has_pending else slots,
        tmax, C, x.stride(0), W=W, BW=BW, BC=BC, BN=BN, HAS_BANK=has_bank, HAS_PENDING=has_pending,
        num_warps=4,
    )
    return y


def tree_conv_config(num_rows: int, C: int, max_nodes: int) -> tuple[int, int]:
    """``(BN, BC)`` of the Triton tree conv: a node chunk of ``next_pow2(max_nodes)`` (2..32) and
    channel tiles of at most 4096 // BN (an fp32 [BN, BC] tile is <= 32 registers per thread at 4
    warps), 256 channels where that gives >= 264 programs (2 per SM), else 128 (a latency-bound
    small batch gets more programs). Shapes only (CUDA-graph safe). First choice, not swept."""
    BN = min(32, max(2, triton.next_power_of_2(max(1, int(max_nodes)))))
    BC = 256 if num_rows * triton.cdiv(C, 256) >= 264 else 128
    return BN, min(BC, max(32, 4096 // BN), triton.next_power_of_2(C))


# Tree-kernel choice on CUDA for non-chain batches: "auto" applies pick_tree_kernel's rule,
# "ut" / "hld" / "walk" force one kernel (benchmarks, tests).
TREE_KERNEL = "auto"
# The tensor-core UT form (triton_chain_ut.tree_verify_ut: one state pass + [BT, BT] work per
# (row, head), BT = 16, or 32 for trees of 17-32 nodes) for windows of <= UT_TREE_MAX_NODES nodes at
# >= UT_TREE_MIN_ROWS rows, and at fewer rows for windows of >= UT_TREE_SMALL_BATCH_MIN_NODES nodes
# when no host-built heavy-light plan is given. Measured on the H200 (benchmarks/tree_h200_s10d.json,
# B = 1-8, 3 pending factors, both GDN-1.3B head shapes): at 1-4 rows UT's time is flat in the node
# count (33-51 us at BT = 32, the split launch) while the serial kernels grow with it: at 32 nodes
# UT took 0.28-0.96x the time of the kernel this rule picked before (the heavy-light kernel with its
# device-built schedule, or the walk) in all 18 rows; at 9-17 nodes the serial kernels were as fast
# or faster (UT 0.90-1.87x the best of them). With a host plan (a static tree: the decode runtime's
# root + W branches) the heavy-light kernel is cheaper on those few-wave trees (8x256x256, B = 1, 4
# branches: 25.6 vs 33.3 us at 32 nodes, 17.6 vs 32.9 at 17), so planned trees keep it. The
# threshold was 25 nodes until session 37, whose UT config (triton_chain_ut.TUNED_UT: the small-batch
# launches had taken a slower one) made UT faster at 16 nodes too, at 1-4 rows, on both head shapes,
# than the heavy-light kernel with its device-built schedule and than the walk (H100, binary and
# beam-4 trees; no pending, benchmarks/tree_h100_s37e_*.json: UT 20.0-21.3 us against 21.8-74.7 and
# 27.6-44.1; 3 pending, tree_h100_s37h.json: UT 21.0-30.1 against 24.0-82.1 and 29.9-49.4); a
# host-planned heavy-light kernel stayed faster on map's 4-chain tree at batch 1 (18.0 vs 21.2 us with
# 3 pending). nmax is a bound (a factor bank's length), so smaller trees in a 16-position bank take UT
# too: at 8 / 12 actual nodes with 3 pending (tree_h100_s37h.json, 24 rows at 1-4 rows), against what
# the old rule picked for that bound (the heavy-light kernel with its device-built schedule; the walk
# for flame's heads at 4 rows), UT was faster in 17 rows (up to 2x) and 3-24 % slower in 7, mostly
# 8-node trees (the worst: map's heads, batch 1, an 8-node beam-4 tree, 20.7 vs 16.8 us). At 8 nodes
# the walk was the fastest kernel in 11 of the 12 rows (a host-planned heavy-light kernel in the 12th).
UT_TREE_MAX_NODES = 32
UT_TREE_MIN_ROWS = 8
UT_TREE_SMALL_BATCH_MIN_NODES = 16
# pick_tree_kernel's thresholds. First guesses from the design, NOT measured yet (tune with
# benchmarks/bench_tree.py on the GPU):
HLD_MIN_NODES = 8  # shorter windows: ancestor walk (its walks are short; HLD adds launches/scratch)
HLD_MAX_SCRATCH_BYTES = 64 << 20  # boundary scratch above this (~L2): ancestor walk


def pick_tree_kernel(num_rows: int, HV: int, V: int, K: int, nmax: int, scratch_slots: int | None = None,
                     host_plan: bool = False) -> str:
    """``"ut"``, ``"hld"`` or ``"walk"`` for a non-chain CUDA batch (:data:`TREE_KERNEL` ``"auto"``).

    Shapes only (no host sync, CUDA-graph safe). Rule: the UT kernel for windows of at most
    :data:`UT_TREE_MAX_NODES` nodes at :data:`UT_TREE_MIN_ROWS` rows or more, or of
    :data:`UT_TREE_SMALL_BATCH_MIN_NODES` to :data:`UT_TREE_MAX_NODES` nodes at any number of rows
    unless ``host_plan`` (a host-built heavy-light plan, :func:`~vllm_specla.ops.triton_tree_hld.
    hld_plan`, is given); else the heavy-light kernel when windows can hold
    at least :data:`HLD_MIN_NODES` nodes and its boundary scratch, ``num_rows x scratch_slots``
    states (``scratch_slots`` defaults to the bound ``(nmax - 1) // 2``; exact with a host plan),
    fits :data:`HLD_MAX_SCRATCH_BYTES`; else the ancestor walk. Reasoning: per node the HLD kernel
    does one chain step (the ancestor walk adds a depth-long walk over K-vectors), but every
    boundary costs a state-sized store and load, cheap while the scratch stays in L2 (small
    batches) and a full HBM pass each at large batch, where the walk's single state read wins.
    ``nmax`` is a bound on the nodes per row (``max_nodes``, the plan's, else the factor bank's
    length), not the batch's actual count: with a bank of 16-32 positions and no ``max_nodes`` a
    smaller tree at batch 1-7 goes to UT too.
    """
    if TREE_KERNEL in ("ut", "hld", "walk"):
        return TREE_KERNEL
    if nmax <= UT_TREE_MAX_NODES and (num_rows >= UT_TREE_MIN_ROWS
                                      or (nmax >= UT_TREE_SMALL_BATCH_MIN_NODES and not host_plan)):
        return "ut"
    if nmax < HLD_MIN_NODES:
        return "walk"
    slots = (max(0, (nmax - 1) // 2)) if scratch_slots is None else scratch_slots
    return "hld" if num_rows * slots * HV * V * K * 4 <= HLD_MAX_SCRATCH_BYTES else "walk"


def tree_verify(
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
    chain: bool | None = None,
    max_nodes: int | None = None,
    hld_plan: "HLDPlan | None" = None,
    tree_kernel: str | None = None,
) -> torch.Tensor:
    """Verify a draft tree per row; outputs per node, factors per node, pending commit fused.

    Args:
        q, k ``[N, H, K]``; v ``[N, HV, V]``; g, beta ``[N, HV]``; state, slots, cu_seqlens, banks,
        write_bank, pending_len, read_bank: as :func:`~vllm_specla.ops.reference.chain_verify_ref`.
        parents: ``[N]`` int, parent position within the row, ``-1`` for a root, topological.
        chain: topology hint; ``None`` inspects ``parents`` (a host sync if it lives on the GPU —
            pass the step plan's flag in the hot path). ``True`` sends the batch to chain verify.
        max_nodes: longest window (default: ``bank_k.shape[2]`` when banks are given, else read
            from ``cu_seqlens`` on the host); it also sets the UT kernel's chunk (16 or 32 nodes).
        hld_plan: a heavy-light schedule for the CUDA HLD kernel, shared by the step's layers:
            :func:`~vllm_specla.ops.triton_tree_hld.hld_device_plan` (device, no sync, once per
            step) or :func:`~vllm_specla.ops.triton_tree_hld.hld_plan` (host, exact grids, once per
            static tree shape); without it each call builds the schedule on the device (no sync).
        tree_kernel: ``"ut"`` / ``"hld"`` / ``"walk"`` forces the CUDA tree kernel (default
            :func:`pick_tree_kernel`).
    Returns:
        ``o [N, HV, V]`` float32. The tree's node states are never written; ``state[slot]`` changes
        only by the pending commit.
    """
    kw = dict(scale=scale, state=state, slots=slots, cu_seqlens=cu_seqlens, bank_k=bank_k, bank_v=bank_v,
              bank_g=bank_g, write_bank=write_bank, pending_len=pending_len, read_bank=read_bank,
              use_qk_l2norm=use_qk_l2norm)
    if chain is None:
        chain = is_chain(parents, cu_seqlens)
    if chain:
        from vllm_specla.ops.chain_verify import chain_verify  # noqa: PLC0415

        return chain_verify(q, k, v, g, beta, write_final_state=False, **kw)
    if q.is_cuda and HAS_TRITON:
        which = tree_kernel
        # the longest tree: from the arguments (shapes only), else the bank bounds it, else read on
        # the host (a sync, as for the kernel choice)
        known = hld_plan.nmax if hld_plan is not None else max_nodes
        if known is None and write_bank is None and (which is None or which == "ut"):
            known = _max_nodes(cu_seqlens)
        if which is None:
            nmax = known if known is not None else bank_k.shape[2]
            slots_ = hld_plan.NB if hld_plan is not None else None
            which = pick_tree_kernel(cu_seqlens.numel() - 1, v.shape[-2], v.shape[-1], k.shape[-1], nmax, slots_,
                                     host_plan=hld_plan is not None and hld_plan.host)
        if which == "ut":
            from vllm_specla.ops.triton_chain_ut import tree_verify_ut  # noqa: PLC0415

            return tree_verify_ut(q, k, v, g, beta, parents=parents, max_nodes=known, **kw)
        if which == "hld":
            return tree_verify_hld(q, k, v, g, beta, parents=parents, max_nodes=max_nodes, plan=hld_plan, **kw)
        return tree_verify_triton(q, k, v, g, beta, parents=parents, max_nodes=max_nodes, **kw)
    if _cpp.use("tree_verify", q, state):
        return _cpp.tree_verify(q, k, v, g, beta, parents=parents, **kw)
    return tree_verify_ut_ref(q, k, v, g, beta, parents=parents, **kw)


def tree_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    parents: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    *,
    bank_x: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
    chain: bool | None = None,
) -> torch.Tensor:
    """Tree conv (node ``t`` sees only its ancestors, then the committed window); see
    :func:`~vllm_specla.ops.tree_reference.tree_conv_ref`. A chain goes to ``conv_verify``
    (without advancing the window). Returns ``y [N, C]`` float32."""
    kw = dict(bank_x=bank_x, write_bank=write_bank, pending_len=pending_len, read_bank=read_bank)
    if chain is None:
        chain = is_chain(parents, cu_seqlens)
    if chain:
        from vllm_specla.ops.chain_verify import conv_verify  # noqa: PLC0415

        return conv_verify(x, weight, cu_seqlens, conv_state, slots, write_final_state=False, **kw)
    if x.is_cuda and HAS_TRITON:
        return tree_conv_triton(x, weight, cu_seqlens, parents, conv_state, slots, **kw)
    return tree_conv_ref(x, weight, cu_seqlens, parents, conv_state, slots, **kw)
