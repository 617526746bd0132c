"""Heavy-light (chain-decomposed) tree verify in Triton (ALGORITHMS.md §5).

Same contract as :func:`vllm_specla.ops.tree_reference.tree_verify_sequential_ref` (outputs per
node, factors ``k^, v~, g`` at every node's own window position in bank ``write_bank``, pending
factors folded into ``state[slot]`` which is written once, the tree's node states never written to
``state``). Schedule and oracle: :class:`~vllm_specla.ops.tree_reference.HLDRow`,
:func:`~vllm_specla.ops.tree_reference.tree_verify_hld_ref`.

**Schedule (device side).** ``_hld_schedule_kernel``, one program per row, builds the row's
heavy-light schedule in registers from ``parents`` (``BN`` lanes, ``BN`` = the next power of two of
the longest window): subtree sizes (one reverse pass), heavy children (ties -> earliest), chain
heads, waves, boundary nodes (nodes with light children) and their scratch slots, and the chain
heads sorted by (wave, node), packed as :func:`~vllm_specla.ops.tree_reference.hld_layout`. It
reads only device tensors and its grid depends on shapes only, so it runs inside a CUDA graph with
no host sync; O(T * BN) lane operations per row, negligible next to the verify. Every layer of a
step verifies the same tree: build the schedule once per step (:func:`hld_device_plan`, device,
no sync) and pass it as ``plan`` to each layer's call; without ``plan`` each call builds it. A
host-built schedule (:func:`hld_plan`, once per static tree shape, a host sync) makes the wave
count, the per-wave grid and the scratch size exact instead of bounds.

**Verify.** ``_hld_verify_kernel``, one program per ``(V-tile, value head, row x chain lane)``, like
the chain kernel: the ``[BV, K]`` state tile stays in registers along a chain (one chain step per
node: two mat-vecs and a rank-1 update, no ancestor walk); a chain starts from ``S_0`` (the tile
after the fused pending fold, for the wave-0 chain; ``state[slot]`` for the other roots of a
forest) or from its head's parent's materialised state in ``scratch [R, NB, HV, V, K]`` fp32; the
state after a boundary node is stored to its scratch slot. Two launch modes, chosen by
:func:`hld_parallelism` (shapes only):

* ``P > 1`` chain lanes per row (small batches, where ``rows x heads x V-tiles`` programs leave
  the GPU idle): one launch per wave (a fixed count, :func:`~vllm_specla.ops.tree_reference.
  hld_max_chains_per_wave` of the longest window), chains of a wave in parallel over
  ``min(P, bound_w)`` lanes per row (a lane loops if a wave has more chains); the launch boundary
  orders the boundary writes of wave ``w`` before their reads in wave ``w + 1``;
* ``P = 1`` (large batches, the grid is full anyway): one launch, each program walks its row's
  chains wave by wave; a ``tl.debug_barrier()`` orders its own scratch stores before the loads.

Factor-bank writers as the chain kernel (one writer per element); the pending fold reads the other
bank, so ``read_bank != write_bank`` is required when ``pending_len > 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vllm_specla.ops.tree_reference import hld_layout, hld_max_chains_per_wave, hld_pack, hld_schedule_ref

# Chain lanes per row: P = 1 (single launch) when the (row, value head, V-tile) programs reach
# HLD_TARGET_PROGRAMS, else up to HLD_MAX_PARALLEL lanes so that ~HLD_TARGET_PROGRAMS programs
# run. First guesses, measured on the H200 (benchmarks/RESULTS.md, tree_h200.json) but not swept
# (bench_tree.py --sweep-parallel).
HLD_TARGET_PROGRAMS = 2048
HLD_MAX_PARALLEL = 8
_BIG = tl.constexpr(1 << 30)  # jit code may only read constexpr globals


@triton.jit
def _hld_schedule_kernel(parents, cu_seqlens, sched, LS, BN: tl.constexpr, NW: tl.constexpr, BW: tl.constexpr):
    i_r = tl.program_id(0)
    bos = tl.load(cu_seqlens + i_r).to(tl.int32)
    eos = tl.load(cu_seqlens + i_r + 1).to(tl.int32)
    T = tl.minimum(eos - bos, BN)
    o_n = tl.arange(0, BN)
    mn = o_n < T
    # subtree sizes: children after parents, so one reverse pass
    size = tl.where(mn, 1, 0)
    for i in range(0, T):
        t = T - 1 - i
        p = tl.load(parents + bos + t).to(tl.int32)  # scalar load (cheaper than a lane reduction)
        s = tl.sum(tl.where(o_n == t, size, 0))
        size = size + tl.where(o_n == p, s, 0)
    # heavy child per node and heavy root, vectorised: key = size * BN + (BN - 1 - c) is largest
    # for the largest subtree, ties -> the earliest child
    par = tl.load(parents + bos + o_n, mask=mn, other=-2).to(tl.int32)  # -2: padding lanes
    key = size * BN + (BN - 1 - o_n)
    kmax = tl.max(tl.where(par[None, :] == o_n[:, None], key[None, :], 0), 1)  # [u]: over children c
    heavy = tl.where(kmax > 0, BN - 1 - kmax % BN, -1)
    rmax = tl.max(tl.where(par == -1, key, 0), 0)
    hroot = tl.where(rmax > 0, BN - 1 - rmax % BN, -1)
    # chain heads (roots and light children) and boundary nodes (with a light child), vectorised
    is_root = par == -1
    hpar = tl.sum(tl.where(o_n[None, :] == par[:, None], heavy[None, :], 0), 1)  # [t]: heavy[par[t]]
    light = tl.where(is_root, o_n != hroot, hpar != o_n) & mn
    is_head = (is_root | light) & mn
    bnd = tl.max(tl.where((par[None, :] == o_n[:, None]) & light[None, :], 1, 0), 1)  # [u]
    # wave = light edges on the root path (a forest's other roots count as light): one forward pass
    wave = tl.zeros([BN], dtype=tl.int32)
    for t in range(0, T):
        p = tl.load(parents + bos + t).to(tl.int32)
        wp = tl.sum(tl.where(o_n == p, wave, 0))  # 0 for a root
        wave = tl.where(o_n == t, wp + light.to(tl.int32), wave)
    bslot = tl.where(bnd > 0, tl.cumsum(bnd, 0) - 1, -1)
    hkey = tl.where(is_head, wave * BN + o_n, _BIG)  # heads sorted by (wave, node)
    srt = tl.sort(hkey, 0)
    heads = tl.where(srt < _BIG, srt % BN, -1)
    o_w = tl.arange(0, BW)
    woff = tl.sum(tl.where(is_head[:, None] & (wave[:, None] < o_w[None, :]), 1, 0), 0)
    base = sched + i_r.to(tl.int64) * LS
    tl.store(base + o_n, heavy)
    tl.store(base + BN + o_n, bslot)
    tl.store(base + 2 * BN + o_n, heads)
    tl.store(base + 3 * BN + o_w, woff, mask=o_w < NW + 1)
    tl.store(base + 3 * BN + NW + 1, tl.sum(bnd))


@triton.jit
def _hld_verify_kernel(
    q, k, v, g, beta, o, parents, sched, scratch,
    state, slots, cu_seqlens,
    bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
    scale, Tmax, w_lo, w_hi, PW, NB, LS, sq, sk, sv, sg, sbeta,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr,
    HAS_BANK: tl.constexpr, HAS_PENDING: tl.constexpr, L2NORM: tl.constexpr,
    FIRST: tl.constexpr, SYNC: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_rc = tl.program_id(2)
    i_r = i_rc // PW
    i_c = i_rc % PW
    G: tl.constexpr = HV // H
    i_h = i_hv // G
    bos = tl.load(cu_seqlens + i_r).to(tl.int64)
    slot = tl.load(slots + i_r).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_k < K
    mv = o_v < V
    mh = mv[:, None] & mk[None, :]
    o_tile = o_v[:, None] * K + o_k[None, :]
    p_s = state + (slot * HV + i_hv) * (V * K) + o_tile
    sb = sched + i_r.to(tl.int64) * LS
    p_scr = scratch + (i_r.to(tl.int64) * NB * HV + i_hv) * (V * K) + o_tile  # + bslot * HV * V * K

    b_h = tl.zeros([BV, BK], dtype=tl.float32)
    if FIRST:
        if i_c == 0:  # the wave-0 chain's program: S_0 = state after the pending fold, written once
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

    for w in range(w_lo, w_hi):
        c0 = tl.load(sb + 3 * BN + w)
        c1 = tl.load(sb + 3 * BN + w + 1)
        for j in range(c0 + i_c, c1, PW):
            hd = tl.load(sb + 2 * BN + j)
            if w > 0:  # start from the head's parent's state (the wave-0 chain keeps b_h = S_0)
                par = tl.load(parents + bos + hd).to(tl.int32)
                if SYNC:
                    tl.debug_barrier()  # this program's own scratch / state stores before the load
                if par >= 0:
                    bs = tl.minimum(tl.load(sb + BN + par).to(tl.int64), NB - 1)  # clamp: never OOB
                    b_h = tl.load(p_scr + bs * (HV * V * K), mask=mh, other=0.0)
                else:  # another root of a forest: the committed state
                    b_h = tl.load(p_s, mask=mh, other=0.0)
            u = hd
            while u >= 0:
                i_t = bos + u
                b_q = tl.load(q + i_t * sq + i_h * K + o_k, mask=mk, other=0.0).to(tl.float32)
                b_k = tl.load(k + i_t * sk + i_h * K + o_k, mask=mk, other=0.0).to(tl.float32)
                b_v = tl.load(v + i_t * sv + i_hv * V + o_v, mask=mv, other=0.0).to(tl.float32)
                b_g = tl.load(g + i_t * sg + i_hv).to(tl.float32)
                b_beta = tl.load(beta + i_t * sbeta + i_hv).to(tl.float32)
                if L2NORM:
                    b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6)
                    b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
                b_q = b_q * scale
                eg = tl.exp(b_g)
                hk = tl.sum(b_h * b_k[None, :], 1)
                hq = tl.sum(b_h * b_q[None, :], 1)
                b_vt = b_beta * (b_v - eg * hk)
                b_o = eg * hq + b_vt * tl.sum(b_k * b_q)
                b_h = b_h * eg + b_vt[:, None] * b_k[None, :]
                tl.store(o + (i_t * HV + i_hv) * V + o_v, b_o, mask=mv)
                if HAS_BANK:
                    if u < Tmax:
                        tl.store(bank_v + ((wbase + u) * HV + i_hv) * V + o_v, b_vt, mask=mv)
                        if i_v == 0:
                            tl.store(bank_g + (wbase + u) * HV + i_hv, b_g)
                            if i_hv % G == 0:
                                tl.store(bank_k + ((wbase + u) * H + i_h) * K + o_k, b_k, mask=mk)
                bs_u = tl.load(sb + BN + u).to(tl.int64)
                if bs_u >= 0:  # a boundary node: materialise its state for its light children
                    tl.store(p_scr + tl.minimum(bs_u, NB - 1) * (HV * V * K), b_h, mask=mh)
                u = tl.load(sb + u)


@dataclass
class HLDPlan:
    """A heavy-light schedule: ``sched [R, LS]`` int32 on the device, the wave count, chains per wave
    (max over rows) and scratch slots per row. ``host``: built on the host from the tree
    (:func:`hld_plan`: all counts exact); else by :func:`hld_device_plan` (counts are bounds)."""

    sched: torch.Tensor
    BN: int
    NW: int
    wave_max: list[int]
    NB: int
    nmax: int
    host: bool = True


def _bn(nmax: int) -> int:
    return max(2, triton.next_power_of_2(max(1, nmax)))


def hld_plan(parents, cu_seqlens, *, max_nodes: int | None = None, device=None) -> HLDPlan:
    """Build the schedule on the host once per tree shape (a host sync if ``parents`` is on the
    GPU; do it outside the hot path / graph and reuse the plan while the shape is unchanged)."""
    rows = hld_schedule_ref(parents, cu_seqlens)
    nmax = max([len(r.heavy) for r in rows] + [1, max_nodes or 1])
    BN = _bn(nmax)
    NW = max([r.num_waves for r in rows] + [1])
    wave_max = [max([r.chains_per_wave()[w] if w < r.num_waves else 0 for r in rows] + [0]) for w in range(NW)]
    NB = max([len(r.boundary) for r in rows] + [0])
    dev = device if device is not None else (parents.device if isinstance(parents, torch.Tensor) else "cpu")
    return HLDPlan(hld_pack(rows, BN, NW).to(dev), BN, NW, wave_max, NB, nmax)


def hld_device_schedule(parents: torch.Tensor, cu_seqlens: torch.Tensor, nmax: int) -> torch.Tensor:
    """The packed schedule (:func:`~vllm_specla.ops.tree_reference.hld_layout`, ``BN = _bn(nmax)``,
    ``NW = len(hld_max_chains_per_wave(nmax))``) computed on the device. No host sync."""
    BN = _bn(nmax)
    NW = len(hld_max_chains_per_wave(nmax))
    LS = hld_layout(BN, NW)["LS"]
    R = cu_seqlens.numel() - 1
    sched = torch.empty(R, LS, dtype=torch.int32, device=parents.device)
    if R:
        _hld_schedule_kernel[(R,)](parents.contiguous(), cu_seqlens, sched, LS, BN=BN, NW=NW,
                                   BW=triton.next_power_of_2(NW + 1), num_warps=1)
    return sched


def hld_device_plan(parents: torch.Tensor, cu_seqlens: torch.Tensor, nmax: int) -> HLDPlan:
    """A plan from the device schedule (bounds for waves, grids and scratch; no host sync): build it
    once per step and pass it to every layer's verify (all layers verify the same tree)."""
    bounds = hld_max_chains_per_wave(nmax)
    return HLDPlan(hld_device_schedule(parents, cu_seqlens, nmax), _bn(nmax), len(bounds), bounds,
                   hld_scratch_slots(nmax), nmax, host=False)


def hld_parallelism(num_rows: int, HV: int, n_vtiles: int) -> int:
    """Chain lanes per row (module doc). Shapes only (no sync)."""
    base = max(1, num_rows * HV * n_vtiles)
    if base >= HLD_TARGET_PROGRAMS:
        return 1
    return max(1, min(HLD_MAX_PARALLEL, HLD_TARGET_PROGRAMS // base))


def hld_scratch_slots(nmax: int) -> int:
    """Boundary nodes a row of ``nmax`` nodes can have: each has a heavy and a light child, all
    distinct, so at most ``(nmax - 1) // 2``."""
    return max(0, (nmax - 1) // 2)


def tree_verify_hld(
    q, k, v, g, beta, *, scale, state, slots, cu_seqlens, parents,
    bank_k=None, bank_v=None, bank_g=None, write_bank=None, pending_len=None, read_bank=None,
    use_qk_l2norm=True, max_nodes: int | None = None, plan: HLDPlan | None = None,
    parallel: int | None = None, scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """Heavy-light Triton tree verify (module doc); arguments and result as
    :func:`vllm_specla.ops.tree_verify.tree_verify`.

    Extra: ``plan`` (a host-built :class:`HLDPlan`, skips the schedule kernel and makes the grids
    exact), ``parallel`` (chain lanes per row, default :func:`hld_parallelism`), ``scratch`` (a
    preallocated ``[>= R * NB * HV * V * K]`` fp32 boundary buffer; allocated per call otherwise).
    """
    from vllm_specla.ops.triton_chain import _bounds_check, pick_config  # noqa: PLC0415

    N, H, K = k.shape
    HV, V = v.shape[-2:]
    assert HV % H == 0, "HV must be a multiple of H"
    assert state.shape[1:] == (HV, V, K) and state.dtype == torch.float32 and state.is_contiguous()
    from vllm_specla.ops.triton_chain import _rows_dense  # noqa: PLC0415

    assert g.shape == beta.shape == (N, HV), f"g / beta must be [N, HV] = [{N}, {HV}], got {tuple(g.shape)}"
    # token-strided inputs are read in place (q / k / v: column slices of the conv output)
    q, k, v = (_rows_dense(x, 2) for x in (q, k, v))
    g, beta = (_rows_dense(x, 1) for x in (g, beta))
    parents = parents.contiguous()
    R = cu_seqlens.numel() - 1
    o = torch.empty(N, HV, V, dtype=torch.float32, device=v.device)
    if R == 0:
        return o
    has_bank = write_bank is not None
    has_pending = pending_len is not None and read_bank is not None and bank_k is not None
    tmax = bank_k.shape[2] if bank_k is not None else 1
    if plan is not None:
        nmax, BN, NW, NB = plan.nmax, plan.BN, plan.NW, plan.NB
        bounds = plan.wave_max
        sched = plan.sched
    else:
        if has_bank:
            nmax = tmax if max_nodes is None else max_nodes
        else:
            from vllm_specla.ops.tree_verify import _max_nodes  # noqa: PLC0415

            nmax = max_nodes if max_nodes is not None else _max_nodes(cu_seqlens)
        BN = _bn(nmax)
        bounds = hld_max_chains_per_wave(nmax)
        NW = len(bounds)
        NB = hld_scratch_slots(nmax)
        sched = None
    # one host check (skipped under CUDA-graph capture): windows fit the schedule's lanes and the banks
    _bounds_check(cu_seqlens, min(nmax, tmax) if has_bank else nmax)
    if sched is None:
        sched = hld_device_schedule(parents, cu_seqlens, nmax)
    LS = sched.shape[1]
    BK = triton.next_power_of_2(K)
    BV, nw = pick_config(R, HV, V, K, N / R)[:2]
    n_vt = triton.cdiv(V, BV)
    P = parallel if parallel is not None else hld_parallelism(R, HV, n_vt)
    NBa = max(1, NB)
    if NB == 0:
        scratch = o  # never touched
    elif scratch is None:
        scratch = torch.empty(R * NBa * HV * V * K, dtype=torch.float32, device=v.device)
    else:
        assert scratch.numel() >= R * NBa * HV * V * K and scratch.dtype == torch.float32
    args = (q, k, v, g, beta, o, parents, sched, scratch, state, slots, cu_seqlens,
            bank_k if bank_k is not None else o, bank_v if bank_v is not None else o,
            bank_g if bank_g is not None else o,
            write_bank if has_bank else slots, pending_len if has_pending else slots,
            read_bank if has_pending else slots, float(scale), tmax)
    strides = (q.stride(0), k.stride(0), v.stride(0), g.stride(0), beta.stride(0))
    meta = dict(H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, BN=BN, HAS_BANK=has_bank, HAS_PENDING=has_pending,
                L2NORM=bool(use_qk_l2norm), num_warps=nw, num_stages=1)
    if P <= 1:
        _hld_verify_kernel[(n_vt, HV, R)](*args, 0, NW, 1, NBa, LS, *strides, FIRST=True, SYNC=True, **meta)
    else:
        for w in range(NW):
            pw = max(1, min(P, bounds[w]))
            _hld_verify_kernel[(n_vt, HV, R * pw)](*args, w, w + 1, pw, NBa, LS, *strides, FIRST=(w == 0),
                                                   SYNC=False, **meta)
    return o
