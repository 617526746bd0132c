#!/usr/bin/env python
"""Kernel benchmarks: SpecLA chain verify / recover vs fla and per-token baselines (one GPU).

Every number is microseconds per layer: a CUDA graph holds one model's worth of launches
(``--layers`` 21, each layer on its own state slots so state never sits in L2 between layers),
is replayed ``5..40`` times, and the median replay is divided by the layer count. State is fp32
``[slots, HV, V, K]``; inputs are random (never zeros); q/k l2norm in kernel everywhere.

Kinds (per layer, B rows of T tokens):
  verify      chain_verify, factors written, no pending, state read once, not written
  step        SpecLA step: chain_verify with T pending factors folded first (state written once),
              then the window with factors written (the deferred-commit step)
  ar          T = 1 decode: chain_verify with write_final_state, no banks (read + write state)
  fla         fla fused_recurrent_gated_delta_rule, T tokens, initial state read, final written
  replay      sequential per-token replay: T launches of the T = 1 kernel (read + write each)
  snap        per-token snapshots (vLLM native): one launch writing a full state per window token
  recover     DeltaConstruct commit of A accepted factors (read + write state once)
  replayA     A per-token replay launches (the alternative to recover)
  fused/sep   verify with A pending folded in (fused) vs recover(A) + verify (separate)

Writes ``--json`` (all records) and prints a table. ``--sweep`` first times a grid of
(BV, num_warps) tile configs and installs the best per regime (triton_chain.TUNED).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (_flags; runpy.run_path does not add it)
if __name__ == "__main__" and "--dry-cpu" in sys.argv:  # must precede the first triton import
    os.environ["TRITON_INTERPRET"] = "1"

from _flags import parse_list  # noqa: E402
from vllm_specla.ops import triton_chain as tc  # noqa: E402
from vllm_specla.ops import triton_recover as tr  # noqa: E402
from vllm_specla.ops import tree_verify as tv  # noqa: E402

SHAPES = {"6x256x512": (6, 6, 256, 512), "8x256x256": (8, 8, 256, 256)}
DEV = "cuda"
DRY = False  # --dry-cpu: run every code path once on the CPU (TRITON_INTERPRET=1), tiny shapes
# (BV, num_warps, KI, prefetch); KI = 0 is the plain [BV, K] kernel (triton_chain docs)
SWEEP = [(8, 1, 0, 0), (8, 1, 256, 0), (8, 1, 32, 0), (8, 1, 32, 1), (4, 1, 32, 1), (8, 1, 16, 1),
         (4, 1, 16, 1), (16, 2, 32, 1), (32, 4, 32, 1)]

try:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_fused
except Exception as e:  # noqa: BLE001
    print("fla unavailable:", e)
    fla_fused = None


class Clock:
    def __init__(self, budget_s: float):
        self.t0 = time.time()
        self.budget = budget_s

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)


def time_graph(body, layers: int, min_reps=5, max_reps=25, target_ms=150.0) -> float:
    """Capture ``body()`` (one model's launches) in a CUDA graph; median replay / layers, in us."""
    if DRY:
        t0 = time.time()
        body()
        return (time.time() - t0) / layers * 1e6
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()  # compile + warm-up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    g.replay()
    e1.record()
    e1.synchronize()
    est = e0.elapsed_time(e1)
    reps = int(min(max_reps, max(min_reps, target_ms / max(est, 1e-3))))
    ts = []
    for _ in range(reps):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    del g
    return statistics.median(ts) / layers * 1e3


class Bench:
    """State, banks and inputs for one head shape and batch, ``layers`` layers of slots."""

    def __init__(self, shape, B, layers, Tmax=16, seed=0):
        H, HV, K, V = shape
        self.H, self.HV, self.K, self.V, self.B, self.L, self.Tmax = H, HV, K, V, B, layers, Tmax
        dev = DEV
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.dev = dev
        S = layers * B
        self.state = torch.randn(S, HV, V, K, device=dev, generator=gen).mul_(0.05)
        self.bank_k = torch.nn.functional.normalize(torch.randn(S, 2, Tmax, H, K, device=dev, generator=gen), dim=-1)
        self.bank_v = torch.randn(S, 2, Tmax, HV, V, device=dev, generator=gen).mul_(0.05)
        self.bank_g = -torch.rand(S, 2, Tmax, HV, device=dev, generator=gen).mul_(0.3)
        self.slots = [torch.arange(l * B, (l + 1) * B, device=dev) for l in range(layers)]
        self.rb = torch.zeros(B, dtype=torch.int64, device=dev)
        self.wb = torch.ones(B, dtype=torch.int64, device=dev)
        self.gen = gen
        self.inputs = {}

    def tokens(self, T):
        if T not in self.inputs:
            N = self.B * T
            H, HV, K, V, gen = self.H, self.HV, self.K, self.V, self.gen
            q = torch.randn(N, H, K, device=DEV, generator=gen)
            k = torch.randn(N, H, K, device=DEV, generator=gen)
            v = torch.randn(N, HV, V, device=DEV, generator=gen)
            g = -torch.rand(N, HV, device=DEV, generator=gen).mul_(0.5).add_(0.01)
            beta = torch.rand(N, HV, device=DEV, generator=gen)
            cu = torch.arange(0, N + 1, T, dtype=torch.int32, device=DEV)
            per_tok = [tuple(x.view(self.B, T, *x.shape[1:])[:, t].contiguous() for x in (q, k, v, g, beta))
                       for t in range(T)]
            self.inputs[T] = ((q, k, v, g, beta), cu, per_tok)
        return self.inputs[T]

    @property
    def state_bytes(self):
        return self.B * self.HV * self.V * self.K * 4

    def full(self, n):
        return torch.full((self.B,), n, dtype=torch.int64, device=DEV)


def run_kind(bn: Bench, kind: str, T: int, A: int = 0, config=None) -> float:
    (q, k, v, g, beta), cu, per_tok = bn.tokens(T)
    cu1 = torch.arange(0, bn.B + 1, dtype=torch.int32, device=DEV)
    scale = bn.K ** -0.5
    L = bn.L
    pend = bn.full(A if A else T)
    acc = bn.full(A)

    def chain(l, **extra):
        return tc._launch_chain(q, k, v, g, beta, scale, bn.state, bn.slots[l], cu,
                                extra.get("bank_k"), extra.get("bank_v"), extra.get("bank_g"),
                                extra.get("write_bank"), extra.get("pending_len"), extra.get("read_bank"),
                                extra.get("final", False), True, config=config)

    banks = dict(bank_k=bn.bank_k, bank_v=bn.bank_v, bank_g=bn.bank_g, write_bank=bn.wb)
    if kind == "verify":
        body = lambda: [chain(l, **banks) for l in range(L)]  # noqa: E731
    elif kind in ("step", "fused"):
        body = lambda: [chain(l, pending_len=pend, read_bank=bn.rb, **banks) for l in range(L)]  # noqa: E731
    elif kind == "ar":
        body = lambda: [chain(l, final=True) for l in range(L)]  # noqa: E731
    elif kind == "sep":
        def body():
            for l in range(L):
                tr.recover(bn.state, bn.slots[l], bn.bank_k, bn.bank_v, bn.bank_g, bn.rb, acc)
                chain(l, **banks)
    elif kind == "recover":  # (config: the recover kernel's (BV, num_warps))
        body = lambda: [tr.recover(bn.state, bn.slots[l], bn.bank_k, bn.bank_v, bn.bank_g, bn.rb, acc,  # noqa: E731
                                   config=config) for l in range(L)]
    elif kind in ("replay", "replayA"):
        n = T if kind == "replay" else A

        def body():
            for l in range(L):
                for t in range(n):
                    qt, kt, vt, gt, bt = per_tok[t % T]
                    tc._launch_chain(qt, kt, vt, gt, bt, scale, bn.state, bn.slots[l], cu1,
                                     None, None, None, None, None, None, True, True, config=config)
    elif kind == "fla":
        if fla_fused is None:
            return float("nan")
        B = bn.B
        q4, k4, v4 = (x.view(B, T, *x.shape[1:]) for x in (q, k, v))
        g3, b3 = g.view(B, T, -1), beta.view(B, T, -1)

        def body():
            for l in range(L):
                fla_fused(q4, k4, v4, g=g3, beta=b3, scale=scale, initial_state=bn.state[l * B:(l + 1) * B],
                          output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True)
    elif kind == "snap":
        size = bn.state_bytes * T
        nbuf = max(1, min(L, math.ceil(256e6 / size)))
        snaps = [torch.empty(bn.B, T, bn.HV, bn.V, bn.K, device=DEV) for _ in range(nbuf)]

        def body():
            for l in range(L):
                tc._launch_chain(q, k, v, g, beta, scale, bn.state, bn.slots[l], cu,
                                 None, None, None, None, None, None, False, True, snap=snaps[l % nbuf], config=config)
    elif kind == "tree":
        # binary-ish tree of T nodes (parent of t = (t-1)//2), factors written, T pending folded
        par_row = [-1] + [(t - 1) // 2 for t in range(1, T)]
        parents = torch.tensor(par_row * bn.B, device=DEV)
        body = lambda: [tv.tree_verify(q, k, v, g, beta, scale=scale, state=bn.state, slots=bn.slots[l],  # noqa: E731
                                       cu_seqlens=cu, parents=parents, chain=False, bank_k=bn.bank_k,
                                       bank_v=bn.bank_v, bank_g=bn.bank_g, write_bank=bn.wb,
                                       pending_len=pend, read_bank=bn.rb) for l in range(L)]
    else:
        raise ValueError(kind)
    us = time_graph(body, L)
    if kind == "snap":
        del snaps
    return us


def state_passes(kind: str, T: int, A: int) -> float:
    """State-sized passes through HBM (reads + writes) a kind needs by design."""
    return {"verify": 1, "step": 2, "fused": 2, "ar": 2, "fla": 2, "replay": 2 * T, "snap": 1 + T,
            "recover": 2, "replayA": 2 * A, "sep": 3, "tree": 2}[kind]


def copy_bandwidth() -> float:
    if DRY:
        return float("nan")
    n = 1 << 30  # 4 GiB fp32
    a = torch.randn(n, device=DEV)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(10):
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    bw = 2 * n * 4 / (statistics.median(ts) * 1e-3) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return bw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None, help="write the records here (default: benchmarks/kernels_h200.json on "
                                                 "a GPU; --dry-cpu writes nothing unless given)")
    ap.add_argument("--layers", type=int, default=21)
    ap.add_argument("--batches", default="128,256,32,8,1")
    ap.add_argument("--Ts", default="1,2,3,5,8,9")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--recover-configs", default="",
                    help="comma-separated BV/num_warps recover configs: time recover (A = 3, 5, 8) at each, "
                         "beside A replay launches, at --batches x --shapes first (records carry the config)")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--dry-cpu", action="store_true")
    args = ap.parse_args()
    if args.layers < 1 or args.budget_s <= 0:
        ap.error(f"--layers must be >= 1 and --budget-s > 0, got {args.layers} and {args.budget_s}")
    shapes = parse_list(ap, "--shapes", args.shapes, choices=list(SHAPES))
    batches = parse_list(ap, "--batches", args.batches)
    Ts = parse_list(ap, "--Ts", args.Ts, allow_empty=True)  # "": the sweeps only
    rconfigs = []
    for c in (s for s in args.recover_configs.split(",") if s.strip()):
        cfg = c.strip().split("/")
        if len(cfg) != 2 or not all(x.isdigit() and int(x) > 0 and int(x) & (int(x) - 1) == 0 for x in cfg):
            ap.error(f"--recover-configs: expected BV/num_warps pairs of powers of two such as 8/2, got {c!r}")
        rconfigs.append(tuple(int(x) for x in cfg))
    if not args.dry_cpu and not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times GPU kernels; on a CPU, --dry-cpu runs every path once")
    global DEV, DRY, SWEEP
    if args.dry_cpu:
        DEV, DRY = "cpu", True
        SHAPES["6x256x512"] = (2, 4, 32, 48)
        SHAPES["8x256x256"] = (1, 3, 16, 20)
        SWEEP = [SWEEP[0], (4, 1, 16, 1)]
        args.layers, batches, Ts, args.budget_s = 1, [2], [1, 5], 1e9  # every path once
        print("dry run: CPU interpreter, tiny shapes (2, 4, 32, 48) / (1, 3, 16, 20); times meaningless")
    elif args.json is None:
        args.json = "benchmarks/kernels_h200.json"
    import warnings  # noqa: PLC0415

    warnings.filterwarnings("ignore")
    clock = Clock(args.budget_s)
    L = args.layers
    out = {"gpu": torch.cuda.get_device_name() if not DRY else "cpu-dry", "torch": torch.__version__, "layers": L, "records": [],
           "sweep": [], "tuned": None}
    import triton  # noqa: PLC0415

    out["triton"] = triton.__version__
    out["copy_TBps"] = copy_bandwidth()
    print(f"GPU {out['gpu']}  triton {out['triton']}  device copy {out['copy_TBps']:.2f} TB/s", flush=True)

    def save():
        if args.json is None:
            return
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)

    def rec(shape_name, bn, kind, T, A, us, config=None):
        tb = state_passes(kind, T, A) * bn.state_bytes / (us * 1e-6) / 1e12 if us == us else float("nan")
        r = dict(shape=shape_name, B=bn.B, T=T, A=A, kind=kind, us=round(us, 2), state_TBps=round(tb, 3),
                 config=list(config) if config else None)
        out["records"].append(r)
        return r

    # ---------------- tile-config sweep ----------------
    if args.sweep:
        best = {}
        for sname in shapes:
            for B, size in ((128 if not DRY else 12, "large"), (1, "small")):
                bn = Bench(SHAPES[sname], B, L)
                for regime, kind, T in (("ar", "ar", 1), ("verify", "verify", 8)):
                    res = []
                    for cfg in SWEEP:
                        try:
                            us = run_kind(bn, kind, T, config=cfg)
                        except Exception as e:  # noqa: BLE001
                            print("sweep fail", sname, B, kind, cfg, repr(e)[:200], flush=True)
                            continue
                        res.append((us, cfg))
                        out["sweep"].append(dict(shape=sname, B=B, kind=kind, T=T, config=list(cfg), us=round(us, 2)))
                    print(f"sweep {sname} B={B} {kind} T={T}: " +
                          " ".join(f"{'/'.join(map(str, c))}:{u:.1f}" for u, c in res), flush=True)
                    key = f"{regime}_{size}"
                    fastest = min(u for u, _ in res)
                    for u, c in res:  # sum of normalised times over shapes
                        best.setdefault(key, {}).setdefault(c, 0.0)
                        best[key][c] += u / fastest
                del bn
                torch.cuda.empty_cache()
        tuned = {k: min(v.items(), key=lambda kv: kv[1])[0] for k, v in best.items()}
        tc.TUNED.update(tuned)
        out["tuned"] = {k: list(v) for k, v in tc.TUNED.items()}
        print("tuned:", out["tuned"], flush=True)
        save()
    else:
        out["tuned"] = {k: list(v) for k, v in tc.TUNED.items()}

    # ---------------- recover configs ----------------
    for B in batches if rconfigs else []:
        for sname in shapes:
            bn = Bench(SHAPES[sname], B, L)
            line = []
            for A in (3, 5, 8):
                ra = run_kind(bn, "replayA", 1, A=A)
                rec(sname, bn, "replayA", 1, A, ra)
                for cfg in rconfigs:
                    us = run_kind(bn, "recover", 1, A=A, config=cfg)
                    rec(sname, bn, "recover", 1, A, us, config=cfg)
                    line.append(f"A{A} {'/'.join(map(str, cfg))}:{us:.2f} ({ra / us:.2f}x)")
            print(f"recover {sname} B={B}: " + " ".join(line), flush=True)
            save()
            del bn
            torch.cuda.empty_cache()

    # ---------------- main table + targets ----------------
    for B in batches if Ts else []:  # (--Ts "": the sweeps only)
        for sname in shapes:
            if clock.left() < 20:
                print("budget exhausted; stopping", flush=True)
                break
            bn = Bench(SHAPES[sname], B, L)
            line = []
            for T in Ts:
                kinds = ["ar", "fla", "replay"] if T == 1 else ["verify", "step", "fla", "replay", "snap"]
                for kind in kinds:
                    if clock.left() < 10:
                        break
                    try:
                        us = run_kind(bn, kind, T)
                    except Exception as e:  # noqa: BLE001
                        print("fail", sname, B, T, kind, repr(e)[:300], flush=True)
                        continue
                    rec(sname, bn, kind, T, 0, us)
                    line.append(f"{kind}{T}={us:.1f}")
            # recover and fused deferred commit
            for kind, T, A in (("recover", 1, 5), ("replayA", 1, 5), ("fused", 5, 3), ("sep", 5, 3),
                               ("fused", 8, 5), ("sep", 8, 5), ("tree", 8, 3), ("verify", 16, 0),
                               ("tree", 16, 3)):
                if clock.left() < 10 or (kind == "tree" and B > 128) or (B < 32 and kind not in ("recover", "replayA")):
                    continue
                try:
                    us = run_kind(bn, kind, T, A=A)
                except Exception as e:  # noqa: BLE001
                    print("fail", sname, B, kind, T, A, repr(e)[:300], flush=True)
                    continue
                rec(sname, bn, kind, T, A, us)
                line.append(f"{kind}{T}/{A}={us:.1f}")
            print(f"[{clock.left():.0f}s left] {sname} B={B}: " + " ".join(line), flush=True)
            save()
            del bn
            torch.cuda.empty_cache()
    save()
    summarize(out)


def summarize(out):
    recs = out["records"]

    def get(shape, B, kind, T, A=0):  # (the default config's record: sweeps' records carry theirs)
        for r in recs:
            if (r["shape"] == shape and r["B"] == B and r["kind"] == kind and r["T"] == T and r["A"] == A
                    and r.get("config") is None):
                return r
        return None

    print("\n== us per layer (state TB/s) ==")
    shapes = sorted({r["shape"] for r in recs})
    for s in shapes:
        Bs = sorted({r["B"] for r in recs if r["shape"] == s})
        Ts = sorted({r["T"] for r in recs if r["shape"] == s and r["kind"] in ("fla", "ar")})
        print(f"-- {s}")
        print("B    T  | ar/verify      step          fla           replay        snap")
        for B in Bs:
            for T in Ts:
                cells = []
                for kind in (("ar",) if T == 1 else ("verify",)) + ("step", "fla", "replay", "snap"):
                    r = get(s, B, kind, T)
                    cells.append(f"{r['us']:8.1f} ({r['state_TBps']:.2f})" if r else " " * 15)
                print(f"{B:<4} {T:<2} | " + " ".join(cells))
    print("\n== targets ==")
    for s in shapes:
        for B in (32, 128, 256):
            st, rp = get(s, B, "step", 5), get(s, B, "replay", 5)
            if st and rp:
                print(f"{s} B={B}: SpecLA step T=5 {st['us']:.1f} us vs replay {rp['us']:.1f} us: "
                      f"{rp['us'] / st['us']:.2f}x (target >= 4x)")
            rc, ra = get(s, B, "recover", 1, 5), get(s, B, "replayA", 1, 5)
            if rc and ra:
                print(f"{s} B={B}: recover(5) {rc['us']:.1f} us vs 5 replay launches {ra['us']:.1f} us: "
                      f"{ra['us'] / rc['us']:.2f}x (target >= 4.5x)")
            for T, A in ((5, 3), (8, 5)):
                fu, se = get(s, B, "fused", T, A), get(s, B, "sep", T, A)
                if fu and se:
                    print(f"{s} B={B}: fused deferred commit T={T} A={A} {fu['us']:.1f} us vs recover+verify "
                          f"{se['us']:.1f} us: {se['us'] / fu['us']:.2f}x (target >= 1.3x)")
        for B in (128, 256):
            ar, fl = get(s, B, "ar", 1), get(s, B, "fla", 1)
            if ar:
                print(f"{s} B={B}: AR T=1 {ar['us']:.1f} us = {ar['state_TBps']:.2f} TB/s (target >= 3.5; copy "
                      f"{out.get('copy_TBps', 0):.2f})" + (f"; fla {fl['us']:.1f} us = {fl['state_TBps']:.2f} TB/s" if fl else ""))
        v = get(s, 128, "verify", 8)
        st = get(s, 128, "step", 8)
        if v:
            print(f"{s} B=128 T=8: verify {v['us']:.1f} us, step (8 pending fused) {st['us'] if st else float('nan'):.1f} us "
                  f"(target <= 300 us for 6x256x512)")


if __name__ == "__main__":
    main()
