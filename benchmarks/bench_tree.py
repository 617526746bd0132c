#!/usr/bin/env python
"""Tree-verify benchmark (one GPU): heavy-light kernel vs ancestor-walk kernel vs per-node replay.

Every number is microseconds per layer: a CUDA graph holds ``L`` layers of launches (each layer on
its own state slots; ``L`` from 2 to 21 so that ``L x B`` states exceed the L2), is replayed a few
times, and the median replay is divided by ``L`` (``bench_kernels.time_graph``). State fp32
``[slots, HV, V, K]``, random inputs, q/k l2norm in kernel, factors written, ``--pending`` (default
3) pending factors folded per row first (a deferred-commit step); ``--pending 0`` times the tree
verify alone (no pending arguments at all), which is what per-node replay does.

Trees of N = 8, 16, 32 nodes (parent pointers, topological order), B identical trees per batch:
  binary       parent(t) = (t - 1) // 2
  beam4        top-4 beam-like: 4 chains from the root (nodes interleaved level by level)
  chain_heavy  a spine of ceil(3N/4) nodes, the other nodes single leaves spread along it
  fork2/fork4  the decode runtime's trees: the root and 2 / 4 branches of depth (N - 1) / W

Kinds (per layer):
  hld       heavy-light Triton kernel, schedule built on the device once per step (shared by the
            layers, ``hld_device_plan``; its cost is the ``sched`` column, per step), default
            chain-lane rule (``hld_parallelism``)
  hld_plan  the same with a host-built exact plan (static tree shape: exact waves/grids/scratch)
  walk      ancestor-walk Triton tree kernel (``tree_verify_triton``)
  ut        tensor-core UT-form tree verify (``triton_chain_ut.tree_verify_ut``; <= 32 nodes)
  replay    sequential per-node replay: N launches, node t reads its parent's materialised state
            and writes its own (2 state passes per node; no pending fold, no factors)
  chain     reference: the chain kernel on a chain of N nodes (same B)

Prints one table per head shape and writes ``--out`` JSON (records + the dispatch rule's pick per
config, for tuning ``tree_verify.pick_tree_kernel``). ``--dry-cpu`` runs every code path once on
tiny shapes on the CPU (``TRITON_INTERPRET=1``) and checks outputs against the torch reference.
Issue target: tree verify >= 8x faster than per-node replay at 16+ nodes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__" and "--dry-cpu" in sys.argv:  # must precede the first triton import
    os.environ["TRITON_INTERPRET"] = "1"

import bench_kernels as bk  # noqa: E402  (time_graph, Clock)
from _flags import parse_list  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from vllm_specla.ops import tree_reference as tref  # noqa: E402
from vllm_specla.ops import tree_verify as tv  # noqa: E402
from vllm_specla.ops import triton_chain as tc  # noqa: E402
from vllm_specla.ops import triton_tree_hld as th  # noqa: E402

SHAPES = {"6x256x512": (6, 6, 256, 512), "8x256x256": (8, 8, 256, 256)}
DEV = "cuda"
DRY = False
PENDING = 3
DRY_NODES = [6]  # --dry-cpu's tree size


# ------------------------------------------------------------------------------------------------
# trees
# ------------------------------------------------------------------------------------------------


def tree_binary(n):
    return [-1] + [(t - 1) // 2 for t in range(1, n)]


def tree_beam4(n, width=4):
    par, tails = [-1], [0] * width
    for t in range(1, n):
        b = (t - 1) % width
        par.append(tails[b])
        tails[b] = t
    return par


def tree_chain_heavy(n):
    m = max(1, math.ceil(3 * n / 4))
    s = n - m
    at = {(i + 1) * m // (s + 1) for i in range(s)} if s else set()
    par, prev = [], -1
    for i in range(m):
        par.append(prev)
        prev = len(par) - 1
        if i in at and len(par) < n:
            par.append(prev)  # a leaf on spine node i
    while len(par) < n:
        par.append(0)
    return par[:n]


def tree_fork(n, width):
    """The decode runtime's draft tree: the root and ``width`` branches of depth ceil((n - 1) / width),
    branch-major (branch j, depth i at position 1 + j * depth + i - 1; the last branch may be shorter)."""
    depth = -(-(n - 1) // width)
    par = [-1]
    for _ in range(width):
        for i in range(depth):
            if len(par) < n:
                par.append(0 if i == 0 else len(par) - 1)
    return par


TREES = {"binary": tree_binary, "beam4": tree_beam4, "chain_heavy": tree_chain_heavy,
         "fork2": lambda n: tree_fork(n, 2), "fork4": lambda n: tree_fork(n, 4)}


def tree_stats(par):
    row = tref.HLDRow(par)
    depth = [0] * len(par)
    for t, p in enumerate(par):
        depth[t] = depth[p] + 1 if p >= 0 else 1
    return dict(chains=len(row.chains), waves=row.num_waves, serial_depth=row.serial_depth,
                boundaries=len(row.boundary), height=max(depth))


# ------------------------------------------------------------------------------------------------
# per-node replay baseline: one launch per node, parent's state in, node's state out
# ------------------------------------------------------------------------------------------------


@triton.jit
def _node_step_kernel(q, k, v, g, beta, o, src_state, src_slots, dst_state, dst_slots, scale,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr):
    # one gated-delta step per row r (token r of the node's [B, ...] inputs):
    # dst_state[dst_slots[r]] = step(src_state[src_slots[r]]); o[r] = output
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_r = tl.program_id(2)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_k < K
    mv = o_v < V
    mh = mv[:, None] & mk[None, :]
    tile = i_hv * (V * K) + o_v[:, None] * K + o_k[None, :]
    s_in = tl.load(src_slots + i_r).to(tl.int64)
    b_h = tl.load(src_state + s_in * (HV * V * K) + tile, mask=mh, other=0.0)
    b_q = tl.load(q + (i_r * H + i_h) * K + o_k, mask=mk, other=0.0).to(tl.float32)
    b_k = tl.load(k + (i_r * H + i_h) * K + o_k, mask=mk, other=0.0).to(tl.float32)
    b_v = tl.load(v + (i_r * HV + i_hv) * V + o_v, mask=mv, other=0.0).to(tl.float32)
    b_g = tl.load(g + i_r * HV + i_hv).to(tl.float32)
    b_beta = tl.load(beta + i_r * HV + i_hv).to(tl.float32)
    b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6) * scale
    b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
    b_h = b_h * tl.exp(b_g)
    b_vt = b_beta * (b_v - tl.sum(b_h * b_k[None, :], 1))
    b_h = b_h + b_vt[:, None] * b_k[None, :]
    tl.store(o + (i_r * HV + i_hv) * V + o_v, tl.sum(b_h * b_q[None, :], 1), mask=mv)
    s_out = tl.load(dst_slots + i_r).to(tl.int64)
    tl.store(dst_state + s_out * (HV * V * K) + tile, b_h, mask=mh)


def node_step(q, k, v, g, beta, o, src_state, src_slots, dst_state, dst_slots, scale):
    B, H, K = k.shape
    HV, V = v.shape[-2:]
    BV = 8 if not DRY else 16
    _node_step_kernel[(triton.cdiv(V, BV), HV, B)](q, k, v, g, beta, o, src_state, src_slots, dst_state, dst_slots,
                                                    float(scale), H=H, HV=HV, K=K, V=V,
                                                    BK=triton.next_power_of_2(K), BV=BV, num_warps=1, num_stages=1)


# ------------------------------------------------------------------------------------------------
# one (shape, B) setup and the timed bodies
# ------------------------------------------------------------------------------------------------


class Setup:
    def __init__(self, shape, B, nmax, layers, seed=0):
        H, HV, K, V = shape
        self.H, self.HV, self.K, self.V, self.B, self.L, self.Tmax = H, HV, K, V, B, layers, nmax
        gen = torch.Generator(device=DEV).manual_seed(seed)
        S = layers * B
        self.state = torch.randn(S, HV, V, K, device=DEV, generator=gen).mul_(0.05)
        self.bank_k = torch.nn.functional.normalize(torch.randn(S, 2, nmax, H, K, device=DEV, generator=gen), dim=-1)
        self.bank_v = torch.randn(S, 2, nmax, HV, V, device=DEV, generator=gen).mul_(0.05)
        self.bank_g = -torch.rand(S, 2, nmax, HV, device=DEV, generator=gen).mul_(0.3)
        self.slots = [torch.arange(l * B, (l + 1) * B, device=DEV) for l in range(layers)]
        self.rb = torch.zeros(B, dtype=torch.int64, device=DEV)
        self.wb = torch.ones(B, dtype=torch.int64, device=DEV)
        self.pend = torch.full((B,), PENDING, dtype=torch.int64, device=DEV)
        self.gen = gen
        self.scale = K ** -0.5
        # boundary scratch (bound for nmax) and per-node replay states, allocated once
        self.scratch = torch.empty(max(1, B * th.hld_scratch_slots(nmax) * HV * V * K), device=DEV)
        self.pool = torch.empty(B * nmax, HV, V, K, device=DEV)

    def tokens(self, n):
        B, H, HV, K, V, gen = self.B, self.H, self.HV, self.K, self.V, self.gen
        N = B * n
        q = torch.randn(N, H, K, device=DEV, generator=gen)
        k = torch.randn(N, H, K, device=DEV, generator=gen)
        v = torch.randn(N, HV, V, device=DEV, generator=gen)
        g = -torch.rand(N, HV, device=DEV, generator=gen).mul_(0.5).add_(0.01)
        beta = torch.rand(N, HV, device=DEV, generator=gen)
        cu = torch.arange(0, N + 1, n, dtype=torch.int32, device=DEV)
        per_node = [tuple(x.view(B, n, *x.shape[1:])[:, t].contiguous() for x in (q, k, v, g, beta))
                    for t in range(n)]
        return (q, k, v, g, beta), cu, per_node

    def banks(self):
        pend = dict(pending_len=self.pend, read_bank=self.rb) if PENDING else {}
        return dict(bank_k=self.bank_k, bank_v=self.bank_v, bank_g=self.bank_g, write_bank=self.wb, **pend)

    @property
    def state_bytes(self):
        return self.B * self.HV * self.V * self.K * 4


def make_body(st: Setup, kind: str, par_row, inputs, cu, per_node, parallel=None, state=None, banks=None,
              layers=None, o_nodes=None):
    """The launches of one step for ``layers`` layers (default all): a closure for time_graph."""
    q, k, v, g, beta = inputs
    n = len(par_row)
    B = st.B
    L = st.L if layers is None else layers
    state = st.state if state is None else state
    banks = st.banks() if banks is None else banks
    parents = torch.tensor(par_row * B, dtype=torch.int32, device=DEV)
    kw = dict(scale=st.scale, cu_seqlens=cu, parents=parents, **banks)
    outs = []
    if kind == "hld":
        def body():
            plan = th.hld_device_plan(parents, cu, n)  # once per step, shared by the layers
            for l in range(L):
                outs.append(th.tree_verify_hld(q, k, v, g, beta, state=state, slots=st.slots[l], plan=plan,
                                               parallel=parallel, scratch=st.scratch, **kw))
    elif kind == "hld_plan":
        plan = th.hld_plan(parents.cpu(), cu.cpu(), device=DEV)

        def body():
            for l in range(L):
                outs.append(th.tree_verify_hld(q, k, v, g, beta, state=state, slots=st.slots[l], plan=plan,
                                               parallel=parallel, scratch=st.scratch, **kw))
    elif kind == "walk":
        def body():
            for l in range(L):
                outs.append(tv.tree_verify_triton(q, k, v, g, beta, state=state, slots=st.slots[l], **kw))
    elif kind == "ut":  # tensor-core UT form (trees of <= 32 nodes, chunk BT = 16 / 32 by n; pending via recover first)
        from vllm_specla.ops import triton_chain_ut as ut  # noqa: PLC0415

        def body():
            for l in range(L):
                outs.append(ut.tree_verify_ut(q, k, v, g, beta, state=state, slots=st.slots[l], max_nodes=n, **kw))
    elif kind == "sched":  # per step, not per layer
        def body():
            th.hld_device_schedule(parents, cu, n)
    elif kind == "chain":
        ckw = {a: b for a, b in kw.items() if a != "parents"}

        def body():
            for l in range(L):
                outs.append(tc.chain_verify(q, k, v, g, beta, state=state, slots=st.slots[l], **ckw))
    elif kind == "replay":
        node_slot = [torch.arange(B, device=DEV) * n + t for t in range(n)]
        o_nodes = o_nodes if o_nodes is not None else torch.empty(n, B, st.HV, st.V, device=DEV)

        def body():
            for l in range(L):
                for t in range(n):
                    qt, kt, vt, gt, bt = per_node[t]
                    p = par_row[t]
                    src, src_slots = (state, st.slots[l]) if p < 0 else (st.pool, node_slot[p])
                    node_step(qt, kt, vt, gt, bt, o_nodes[t], src, src_slots, st.pool, node_slot[t], st.scale)
            outs.append(o_nodes)
    else:
        raise ValueError(kind)
    body.outs = outs
    return body


def check(st: Setup, par_row, inputs, cu, per_node, parallel=None) -> dict:
    """Max per-node relative error of every kernel vs the torch reference (layer 0 rows, fresh
    copies of state and banks; replay without pending, as it is timed)."""
    n, B = len(par_row), st.B
    parents = torch.tensor(par_row * B, dtype=torch.int32)
    sl = st.slots[0]
    cpu = [x.cpu() for x in inputs]
    errs = {}

    def fresh():
        pend = dict(pending_len=st.pend, read_bank=st.rb) if PENDING else {}
        return st.state.clone(), dict(bank_k=st.bank_k.clone(), bank_v=st.bank_v.clone(), bank_g=st.bank_g.clone(),
                                      write_bank=st.wb, **pend)

    def ref(pending):
        s = st.state[sl].cpu()
        kw = dict(bank_k=st.bank_k[sl].cpu(), bank_v=st.bank_v[sl].cpu(), bank_g=st.bank_g[sl].cpu(),
                  write_bank=st.wb.cpu())
        if pending:
            kw.update(pending_len=st.pend.cpu(), read_bank=st.rb.cpu())
        o = tref.tree_verify_ref(*cpu, scale=st.scale, state=s, slots=torch.arange(B), cu_seqlens=cu.cpu(),
                                 parents=parents, **kw)
        return o, s

    def err(a, b):
        a, b = a.double().cpu(), b.double()
        return max(float((a[i] - b[i]).norm() / b[i].norm().clamp_min(1e-30)) for i in range(a.shape[0]))

    o_ref, s_ref = ref(PENDING > 0)
    for kind in ("hld", "hld_plan", "walk") + (("ut",) if n <= 32 else ()) + (
            ("chain",) if par_row == list(range(-1, n - 1)) else ()):
        s, banks = fresh()
        body = make_body(st, kind, par_row, inputs, cu, per_node, state=s, banks=banks, layers=1, parallel=parallel)
        body()
        errs[kind] = max(err(body.outs[0], o_ref), float((s[sl].cpu() - s_ref).norm() / s_ref.norm()))
    o_np, _ = ref(False)
    body = make_body(st, "replay", par_row, inputs, cu, per_node, layers=1)
    body()
    o_rep = body.outs[0].transpose(0, 1).reshape(B * n, st.HV, st.V)
    errs["replay"] = err(o_rep, o_np)
    return errs


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------


def layers_for(state_bytes_per_layer: int) -> int:
    if DRY:
        return 1
    return int(min(21, max(2, math.ceil(256e6 / state_bytes_per_layer))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the records here (default: benchmarks/tree_h200.json on a GPU; "
                                                "--dry-cpu writes nothing unless given)")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--nodes", default="8,16,32")
    ap.add_argument("--trees", default=",".join(TREES))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop starting new configs after this")
    ap.add_argument("--sweep-parallel", action="store_true",
                    help="also time hld_plan with 1/2/4/8 chain lanes at B <= 8 (tuning hld_parallelism)")
    ap.add_argument("--pending", type=int, default=3,
                    help="pending factors folded per row before the tree (0: tree verify alone, as replay)")
    ap.add_argument("--dry-cpu", action="store_true", help="tiny shapes, TRITON_INTERPRET=1, every path once")
    ap.add_argument("--ut-config", default=None, metavar="BV/WARPS/KC/STAGES",
                    help="force the UT kernels' config (triton_chain_ut.CONFIG_OVERRIDE), e.g. 32/2/16/3; "
                         "default: pick_config_ut's choice by shape")
    ap.add_argument("--prep-warps", type=int, default=None, metavar="W",
                    help="force the UT prep kernel's warps at both chunks and in both launch forms "
                         "(triton_chain_ut.PREP_WARPS, PREP_WARPS_SPLIT, PREP_WARPS_32); default: the module's values")
    args = ap.parse_args()
    if args.budget_s <= 0:
        ap.error(f"--budget-s must be > 0, got {args.budget_s}")
    shapes = parse_list(ap, "--shapes", args.shapes, choices=list(SHAPES))
    batches = parse_list(ap, "--batches", args.batches)
    nodes = parse_list(ap, "--nodes", args.nodes, lo=2)
    trees = parse_list(ap, "--trees", args.trees, choices=list(TREES))
    nmax = max(DRY_NODES if args.dry_cpu else nodes)  # (the factor banks hold nmax factors)
    if not 0 <= args.pending <= nmax:
        ap.error(f"--pending: allowed 0 .. {nmax} (the factor banks' length: the largest tree of --nodes"
                 f"{', 6 with --dry-cpu' if args.dry_cpu else ''}), got {args.pending}")
    if not args.dry_cpu and not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times GPU kernels; on a CPU, --dry-cpu runs every path once")
    if args.prep_warps is not None:
        if args.prep_warps not in (1, 2, 4, 8):
            ap.error(f"--prep-warps: allowed values are 1, 2, 4, 8, got {args.prep_warps}")
        from vllm_specla.ops import triton_chain_ut as ut  # noqa: PLC0415

        ut.PREP_WARPS = ut.PREP_WARPS_SPLIT = ut.PREP_WARPS_32 = args.prep_warps
    if args.ut_config:
        try:
            cfg = tuple(int(x) for x in args.ut_config.split("/"))
            if len(cfg) != 4 or min(cfg) < 1:
                raise ValueError
        except ValueError:
            ap.error(f"--ut-config: expected four positive integers BV/WARPS/KC/STAGES, got {args.ut_config!r}")
        from vllm_specla.ops import triton_chain_ut as ut  # noqa: PLC0415

        ut.CONFIG_OVERRIDE = cfg
    global DEV, DRY, PENDING
    PENDING = args.pending
    if args.dry_cpu:
        if os.environ.get("TRITON_INTERPRET") != "1":  # main() called from another script
            sys.exit("--dry-cpu needs TRITON_INTERPRET=1 in the environment (set before triton is imported)")
        DEV, DRY = "cpu", True
        bk.DEV, bk.DRY = "cpu", True
        SHAPES.clear()
        SHAPES.update({"2x4x32x48": (2, 4, 32, 48), "1x3x16x20": (1, 3, 16, 20)})
        shapes, nodes = list(SHAPES), DRY_NODES
        args.budget_s = 1e9
    import warnings  # noqa: PLC0415

    warnings.filterwarnings("ignore")
    clock = bk.Clock(args.budget_s)
    out = dict(gpu=torch.cuda.get_device_name() if not DRY else "cpu-dry", torch=torch.__version__,
               triton=triton.__version__, pending=PENDING, ut_config=args.ut_config, prep_warps=args.prep_warps,
               records=[], checks=[], skipped=[],
               rule=dict(TREE_KERNEL=tv.TREE_KERNEL, HLD_MIN_NODES=tv.HLD_MIN_NODES,
                         HLD_MAX_SCRATCH_BYTES=tv.HLD_MAX_SCRATCH_BYTES,
                         HLD_TARGET_PROGRAMS=th.HLD_TARGET_PROGRAMS, HLD_MAX_PARALLEL=th.HLD_MAX_PARALLEL))
    print(f"device {out['gpu']}  torch {out['torch']}  triton {out['triton']}", flush=True)

    if args.out is None and not args.dry_cpu:
        args.out = "benchmarks/tree_h200.json"

    def save():
        if args.out is None:
            return
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)

    def timed(body, L):
        return bk.time_graph(body, L, min_reps=3, max_reps=10, target_ms=40.0)

    nmax = max(nodes)
    sweep_p = (1, 2, 4, 8)
    for i_s, sname in enumerate(shapes):
        shape = SHAPES[sname]
        H, HV, K, V = shape
        parallel = None
        if DRY:  # every path once: first shape B=1, 3 trees, default lanes (one launch per wave) +
            # a lane sweep; second shape B=2, one tree, P=1 (single launch)
            batches, trees = ([1], list(TREES)) if i_s == 0 else ([2], ["binary"])
            parallel = None if i_s == 0 else 1
            args.sweep_parallel, sweep_p = i_s == 0, (1, 2)
        for B in batches:
            if clock.left() < 5:
                out["skipped"].append(dict(shape=sname, B=B))
                continue
            L = layers_for(B * HV * V * K * 4)
            st = Setup(shape, B, nmax, L)
            for n in nodes:
                inputs, cu, per_node = st.tokens(n)
                # reference: a chain of n nodes, and the schedule kernel (per step)
                for kind in ("chain", "sched"):
                    body = make_body(st, kind, list(range(-1, n - 1)) if kind == "chain" else TREES[trees[0]](n),
                                     inputs, cu, per_node)
                    us = timed(body, L if kind == "chain" else 1)
                    out["records"].append(dict(shape=sname, B=B, N=n, tree="chain" if kind == "chain" else trees[0],
                                               kind=kind, us=round(us, 2), layers=L))
                for tname in trees:
                    if clock.left() < 5:
                        out["skipped"].append(dict(shape=sname, B=B, N=n, tree=tname))
                        continue
                    par = TREES[tname](n)
                    stats = tree_stats(par)
                    if B == batches[0] or DRY:
                        errs = check(st, par, inputs, cu, per_node, parallel)
                        out["checks"].append(dict(shape=sname, B=B, N=n, tree=tname, **errs))
                        bad = {a: e for a, e in errs.items() if not e < 1e-4}
                        if bad:
                            print(f"CHECK FAILED {sname} B={B} {tname} N={n}: {bad}", flush=True)
                    pick = tv.pick_tree_kernel(B, HV, V, K, n)
                    row = {}
                    for kind in ("hld", "hld_plan", "walk", "replay") + (("ut",) if n <= 32 else ()):
                        try:
                            us = timed(make_body(st, kind, par, inputs, cu, per_node, parallel=parallel), L)
                        except Exception as e:  # noqa: BLE001
                            print("fail", sname, B, tname, n, kind, repr(e)[:300], flush=True)
                            continue
                        row[kind] = us
                        rec = dict(shape=sname, B=B, N=n, tree=tname, kind=kind, us=round(us, 2), layers=L,
                                   rule_pick=pick, **stats)
                        if kind.startswith("hld"):
                            rec["parallel"] = parallel or th.hld_parallelism(
                                B, HV, triton.cdiv(V, tc.pick_config(B, HV, V, K, n)[0]))
                        out["records"].append(rec)
                    if args.sweep_parallel and B <= 8 and (not DRY or tname == trees[0]):
                        for P in sweep_p:
                            us = timed(make_body(st, "hld_plan", par, inputs, cu, per_node, parallel=P), L)
                            out["records"].append(dict(shape=sname, B=B, N=n, tree=tname, kind=f"hld_plan_P{P}",
                                                       us=round(us, 2), layers=L, **stats))
                    best = min(row.get("hld", 1e30), row.get("hld_plan", 1e30), row.get("walk", 1e30),
                               row.get("ut", 1e30))
                    print(f"[{time.time() - clock.t0:4.0f}s] {sname} B={B:<3} N={n:<2} {tname:<11} "
                          + " ".join(f"{a}={b:.1f}" for a, b in row.items())
                          + (f"  replay/best={row['replay'] / best:.1f}x" if "replay" in row else ""), flush=True)
                save()
            del st
            if not DRY:
                torch.cuda.empty_cache()
    save()
    summarize(out)


def summarize(out):
    recs = out["records"]

    def get(**key):
        for r in recs:
            if all(r.get(a) == b for a, b in key.items()):
                return r
        return None

    print(f"\n== tree verify, us per layer (B rows of the same N-node tree; {PENDING} pending folded) ==")
    print("columns: chains/waves/serial depth/boundaries | chain(N) | hld  hld_plan  walk  ut | replay | "
          "replay/best  hld/walk  rule")
    for s in sorted({r["shape"] for r in recs}):
        print(f"-- {s}")
        for B in sorted({r["B"] for r in recs if r["shape"] == s}):
            for n in sorted({r["N"] for r in recs if r["shape"] == s and r["B"] == B}):
                ch = get(shape=s, B=B, N=n, kind="chain")
                sc = get(shape=s, B=B, N=n, kind="sched")
                for t in TREES:
                    rs = {k: get(shape=s, B=B, N=n, tree=t, kind=k) for k in ("hld", "hld_plan", "walk", "ut", "replay")}
                    if not any(rs.values()):
                        continue
                    r0 = next(r for r in rs.values() if r)
                    us = {k: (r["us"] if r else float("nan")) for k, r in rs.items()}
                    best = min(x for x in (us["hld"], us["hld_plan"], us["walk"], us["ut"]) if x == x)
                    print(f"B={B:<3} N={n:<2} {t:<11} {r0['chains']:>2}/{r0['waves']}/{r0['serial_depth']:>2}/"
                          f"{r0['boundaries']:>2} | {ch['us'] if ch else float('nan'):8.1f} | {us['hld']:8.1f} "
                          f"{us['hld_plan']:8.1f} {us['walk']:8.1f} {us['ut']:8.1f} | {us['replay']:9.1f} | {us['replay'] / best:6.1f}x "
                          f"{us['hld'] / us['walk']:6.2f}  {r0['rule_pick']}"
                          + (f"   (schedule kernel {sc['us']:.1f} us/step)" if sc and t == "binary" else ""))
    print("\n== target: tree verify >= 8x faster than per-node replay at 16+ nodes (best of hld/hld_plan/walk/ut) ==")
    worst = None
    for r in recs:
        if r["kind"] != "replay" or r["N"] < 16:
            continue
        tk = [get(shape=r["shape"], B=r["B"], N=r["N"], tree=r["tree"], kind=k) for k in ("hld", "hld_plan", "walk", "ut")]
        tk = [x["us"] for x in tk if x]
        if tk:
            ratio = r["us"] / min(tk)
            if worst is None or ratio < worst[0]:
                worst = (ratio, r)
    if worst:
        r = worst[1]
        print(f"worst ratio {worst[0]:.1f}x at {r['shape']} B={r['B']} N={r['N']} {r['tree']}")
    if out["checks"]:
        mx = {}
        for c in out["checks"]:
            for k, v in c.items():
                if k in ("hld", "hld_plan", "walk", "ut", "replay", "chain"):
                    mx[k] = max(mx.get(k, 0.0), v)
        print("max per-node relative error vs tree_verify_ref:", {k: f"{v:.1e}" for k, v in mx.items()})
    if out["skipped"]:
        print(f"budget: skipped {len(out['skipped'])} configs: {out['skipped'][:6]}...")


if __name__ == "__main__":
    main()
