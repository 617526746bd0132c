#!/usr/bin/env python
"""UT-form chain verify (``ops/triton_chain_ut.py``) vs the serial Triton kernel (``triton_chain``).

Same harness as ``benchmarks/bench_kernels.py`` (its ``Bench``, ``time_graph``, ``Clock`` and
``copy_bandwidth`` are imported): per configuration a CUDA graph holds one model's worth of
launches (``--layers`` 21, each layer on its own state slots), is replayed, and the median replay
divided by the layer count is **microseconds per layer**. fp32 state ``[slots, HV, V, K]``, random
inputs, q/k l2norm in kernel, Tmax = 16 banks, head shapes 6x256x512 and 8x256x256 (HV = H).

Kinds (per layer, B rows of T tokens), each for ``ser`` (triton_chain.chain_verify, its default
configs) and ``ut`` (triton_chain_ut.chain_verify_ut, its default configs after the sweep):
  verify   factors written, no pending, state read once and not written
  step     SpecLA step: T pending factors folded (state written once), then the window, factors out
  ar       T = 1, write_final_state, no banks (decode)
  fused    step with A pending factors (deferred commit)            (T, A) = (5, 3), (8, 5)
  sep      triton_recover.recover(A) + verify (separate commit)
  replay   T launches of the serial T = 1 kernel, each reading and writing the state (baseline)

Also: ``--sweep`` (default on) times UT tile configs (BV, num_warps, KC, num_stages) and dot
precisions at B = 128, T = 8 (verify) and installs the best config as ``TUNED_UT["large"]``;
an accuracy check (both kernels vs ``chain_verify_ref`` on the GPU, B = 4, T = 8, 5 pending).
Prints tables and the targets, writes all records as JSON to ``--out``.

    python benchmarks/bench_ut.py --out ut.json               # H200: < 4 minutes
    python benchmarks/bench_ut.py --dry-cpu --out ut_dry.json        # every code path once, CPU interpreter
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if "--dry-cpu" in sys.argv:  # must precede the first triton import
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import bench_kernels as bk  # noqa: E402
from _flags import parse_list, parse_tuple  # noqa: E402

from vllm_specla.ops import reference as ref  # noqa: E402
from vllm_specla.ops import triton_chain as tc  # noqa: E402
from vllm_specla.ops import triton_chain_ut as ut  # noqa: E402
from vllm_specla.ops import triton_recover as tr  # noqa: E402

SHAPES = {"6x256x512": (6, 6, 256, 512), "8x256x256": (8, 8, 256, 256)}
# (BV, num_warps, KC, num_stages)
SWEEP = [(64, 4, 32, 2), (64, 4, 16, 3), (64, 4, 16, 2), (32, 2, 32, 2), (32, 2, 16, 3), (16, 1, 32, 2),
         (128, 8, 16, 2)]
# the sweep also times the best config with these dot precisions (tf32 / bf16x3: speed reference
# only, not ~fp32; bf16x3 needs a Triton that has it)
SWEEP_PRECISIONS = ["ieee", "bf16x3", "tf32"]
PASSES = {"verify": 1, "step": 2, "fused": 2, "sep": 3, "ar": 2}


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def run_kind(bn: "bk.Bench", impl: str, kind: str, T: int, A: int = 0, config=None, precision=None) -> float:
    """Microseconds per layer of one kind for ``impl`` in ("ser", "ut", "base"): the serial kernel, the UT
    kernel, the per-token replay's one-token kernel."""
    (q, k, v, g, beta), cu, per_tok = bn.tokens(T)
    scale = bn.K ** -0.5
    L = bn.L
    pend = bn.full(A if A else T)
    acc = bn.full(A)
    banks = dict(bank_k=bn.bank_k, bank_v=bn.bank_v, bank_g=bn.bank_g, write_bank=bn.wb)

    def call(l, **kw):
        if impl == "ser":
            return tc.chain_verify(q, k, v, g, beta, scale=scale, state=bn.state, slots=bn.slots[l], cu_seqlens=cu,
                                   **kw)
        return ut._launch_ut(q, k, v, g, beta, scale, bn.state, bn.slots[l], cu,
                             kw.get("bank_k"), kw.get("bank_v"), kw.get("bank_g"), kw.get("write_bank"),
                             kw.get("pending_len"), kw.get("read_bank"), kw.get("write_final_state", False), True,
                             config=config, precision=precision)

    if kind == "verify":
        body = lambda: [call(l, **banks) for l in range(L)]  # noqa: E731
    elif kind in ("step", "fused"):
        body = lambda: [call(l, pending_len=pend, read_bank=bn.rb, **banks) for l in range(L)]  # noqa: E731
    elif kind == "ar":
        body = lambda: [call(l, write_final_state=True) for l in range(L)]  # noqa: E731
    elif kind == "sep":
        def body():
            for l in range(L):
                tr.recover(bn.state, bn.slots[l], bn.bank_k, bn.bank_v, bn.bank_g, bn.rb, acc)
                call(l, **banks)
    elif kind == "replay":
        cu1 = torch.arange(0, bn.B + 1, dtype=torch.int32, device=bn.dev)

        def body():
            for l in range(L):
                for t in range(T):
                    qt, kt, vt, gt, bt = per_tok[t]
                    tc.chain_verify(qt, kt, vt, gt, bt, scale=scale, state=bn.state, slots=bn.slots[l],
                                    cu_seqlens=cu1, write_final_state=True)
    else:
        raise ValueError(kind)
    return bk.time_graph(body, L, min_reps=3, max_reps=12, target_ms=60.0)


def accuracy(shape, B=4, T=8, A=5):
    """Both kernels vs chain_verify_ref (fp32) on the device, every dot precision of the UT kernel."""
    H, HV, K, V = shape
    dev = bk.DEV
    gen = torch.Generator(device="cpu").manual_seed(1)
    rn = lambda *s: torch.randn(*s, generator=gen).to(dev)  # noqa: E731
    ru = lambda *s: torch.rand(*s, generator=gen).to(dev)  # noqa: E731
    N, S, Tmax = B * T, B + 2, 16
    q, k, v = rn(N, H, K), rn(N, H, K), rn(N, HV, V)
    g, beta = -(ru(N, HV) * 0.5 + 0.01), ru(N, HV) * 0.9 + 0.05
    state = rn(S, HV, V, K) * 0.1
    banks = [torch.nn.functional.normalize(rn(S, 2, Tmax, H, K), dim=-1), rn(S, 2, Tmax, HV, V) * 0.1,
             -ru(S, 2, Tmax, HV) * 0.3]
    slots = torch.arange(B, device=dev) + 1
    cu = torch.arange(0, N + 1, T, dtype=torch.int32, device=dev)
    rb = torch.zeros(B, dtype=torch.int64, device=dev)
    kw = dict(scale=K ** -0.5, slots=slots, cu_seqlens=cu, write_bank=1 - rb, read_bank=rb,
              pending_len=torch.full((B,), A, device=dev))
    out = {}
    for final in (False, True):
        s0, b0 = state.clone(), [b.clone() for b in banks]
        o0 = ref.chain_verify_ref(q, k, v, g, beta, state=s0, bank_k=b0[0], bank_v=b0[1], bank_g=b0[2],
                                  write_final_state=final, **kw)
        runs = [("ser", None), ("ut", "tf32x3")] + ([("ut", "ieee")] if not final else [])
        for impl, prec in runs:
            s1, b1 = state.clone(), [b.clone() for b in banks]
            try:
                if impl == "ser":
                    o1 = tc.chain_verify(q, k, v, g, beta, state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2],
                                         write_final_state=final, **kw)
                else:
                    old = ut.DOT_PRECISION
                    ut.DOT_PRECISION = prec
                    try:
                        o1 = ut.chain_verify_ut(q, k, v, g, beta, state=s1, bank_k=b1[0], bank_v=b1[1],
                                                bank_g=b1[2], write_final_state=final, **kw)
                    finally:
                        ut.DOT_PRECISION = old
            except Exception as e:  # noqa: BLE001
                out[f"{impl}-{prec}-final{int(final)}"] = {"error": repr(e)[:200]}
                continue
            out[f"{impl}-{prec}-final{int(final)}"] = {"o": rel(o1, o0), "state": rel(s1, s0),
                                                      "bank_k": rel(b1[0], b0[0]), "bank_v": rel(b1[1], b0[1])}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the records here (default: benchmarks/ut_h200.json on a GPU; "
                                                "--dry-cpu writes nothing unless given)")
    ap.add_argument("--layers", type=int, default=21)
    ap.add_argument("--batches", default="128,256,32,8,1")
    ap.add_argument("--Ts", default="1,2,3,5,8,9,16")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--replay-Ts", default="5,8", help="window lengths with the per-token replay baseline")
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop starting new measurements after this")
    ap.add_argument("--dry-cpu", action="store_true")
    ap.add_argument("--impls", default="ser,ut", help="kernels of the main table: ser (serial), ut (UT)")
    ap.add_argument("--ut-configs", default="", metavar="BV/WARPS/KC/STAGES,...",
                    help="also time the UT kernel at these configs (impl names ut:BV/WARPS/KC/STAGES)")
    ap.add_argument("--ser-configs", default="", metavar="BV/WARPS/KI/PREFETCH,...",
                    help="also time the serial kernel at these configs (impl names ser:BV/WARPS/KI/PREFETCH; "
                    "triton_chain.CONFIG_OVERRIDE, which in the sep kind also sets the recover kernel's tile)")
    ap.add_argument("--kinds", default="ar,verify,step,fused,sep,replay", help="kinds of the main table")
    ap.add_argument("--no-accuracy", action="store_true")
    args = ap.parse_args()
    kinds_on = set(parse_list(ap, "--kinds", args.kinds, choices=["ar", "verify", "step", "fused", "sep", "replay"]))
    impls = [(i, None) for i in parse_list(ap, "--impls", args.impls, choices=["ser", "ut"], allow_empty=True)]
    impls += [(f"ut:{c.strip()}", parse_tuple(ap, "--ut-configs", c.strip(), 4, sep="/", what="BV/WARPS/KC/STAGES"))
              for c in args.ut_configs.split(",") if c.strip()]
    impls += [(f"ser:{c.strip()}", parse_tuple(ap, "--ser-configs", c.strip(), 4, lo=(1, 1, 0, 0), sep="/",
                                               what="BV/WARPS/KI/PREFETCH"))
              for c in args.ser_configs.split(",") if c.strip()]
    if not impls:
        ap.error("--impls / --ut-configs / --ser-configs: give at least one kernel to time")
    shapes = parse_list(ap, "--shapes", args.shapes, choices=list(SHAPES))
    batches, Ts = parse_list(ap, "--batches", args.batches), parse_list(ap, "--Ts", args.Ts)
    replay_Ts = set(parse_list(ap, "--replay-Ts", args.replay_Ts, allow_empty=True))
    if args.layers < 1 or args.budget_s <= 0:
        ap.error(f"--layers must be >= 1 and --budget-s > 0, got {args.layers} and {args.budget_s}")
    if not args.dry_cpu and not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times GPU kernels; on a CPU, --dry-cpu runs every path once")
    global SWEEP
    if args.dry_cpu:
        bk.DEV, bk.DRY = "cpu", True
        SHAPES["6x256x512"] = (2, 4, 32, 48)
        SHAPES["8x256x256"] = (1, 3, 16, 20)
        SWEEP = [SWEEP[0], (16, 4, 16, 2)]
        args.layers = 1
        batches, Ts, replay_Ts = [2], [1, 5], {5}
        args.budget_s = 1e9  # every path once, however slow the interpreter is
        print("dry run: CPU interpreter, shape names stand for (2, 4, 32, 48) and (1, 3, 16, 20); times meaningless")
    import warnings  # noqa: PLC0415

    warnings.filterwarnings("ignore")
    import triton  # noqa: PLC0415

    clock = bk.Clock(args.budget_s)
    L = args.layers
    out = {"gpu": torch.cuda.get_device_name() if not bk.DRY else "cpu-dry", "torch": torch.__version__,
           "triton": triton.__version__, "layers": L, "records": [], "sweep": [], "accuracy": {},
           "dot_precision": ut.DOT_PRECISION}
    out["copy_TBps"] = bk.copy_bandwidth()
    print(f"GPU {out['gpu']}  triton {out['triton']}  device copy {out['copy_TBps']:.2f} TB/s", flush=True)

    if args.out is None and not args.dry_cpu:
        args.out = "benchmarks/ut_h200.json"

    def save():
        if args.out is None:
            return
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)

    def rec(sname, bn, impl, kind, T, A, us, config=None):
        passes = 2 * T if kind == "replay" else PASSES[kind]
        tb = passes * bn.state_bytes / (us * 1e-6) / 1e12 if us == us else float("nan")
        r = dict(shape=sname, B=bn.B, T=T, A=A, impl=impl, kind=kind, us=round(us, 2), state_TBps=round(tb, 3),
                 config=list(config) if config else None)
        out["records"].append(r)
        return r

    def measure(sname, bn, impl, kind, T, A=0, **kw):
        if clock.left() < 5:
            return None
        try:
            us = run_kind(bn, impl, kind, T, A, **kw)
        except Exception as e:  # noqa: BLE001
            print(f"fail {sname} B={bn.B} {impl} {kind} T={T} A={A}: {repr(e)[:300]}", flush=True)
            return None
        return rec(sname, bn, impl, kind, T, A, us, kw.get("config"))

    # ---------------- accuracy (device) ----------------
    for sname in shapes if not args.no_accuracy else []:
        out["accuracy"][sname] = accuracy(SHAPES[sname])
        worst = {key: max(v.values()) if "error" not in v else v["error"] for key, v in out["accuracy"][sname].items()}
        print(f"accuracy {sname} (max norm-wise rel. error of o/state/bank_k/bank_v vs chain_verify_ref): "
              + ", ".join(f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}" for k, v in worst.items()), flush=True)
    save()

    # ---------------- UT config / precision sweep at B = 128, T = 8 ----------------
    if not args.no_sweep:
        score = {}
        Bs = 128 if not bk.DRY else 2
        for sname in shapes:
            bn = bk.Bench(SHAPES[sname], Bs, L)
            res = []
            for cfg in SWEEP:
                # score = verify T = 8 + SpecLA step T = 5 (5 pending), the production kind
                r = measure(sname, bn, "ut", "verify", 8, config=cfg)
                r2 = measure(sname, bn, "ut", "step", 5, config=cfg) if r else None
                if r and r2:
                    out["sweep"].append(dict(shape=sname, B=Bs, T=8, kind="verify", config=list(cfg),
                                             precision=ut.DOT_PRECISION, us=r["us"]))
                    out["sweep"].append(dict(shape=sname, B=Bs, T=5, kind="step", config=list(cfg),
                                             precision=ut.DOT_PRECISION, us=r2["us"]))
                    res.append((r["us"] + r2["us"], cfg))
                for x in (r, r2):
                    if x:
                        out["records"].remove(x)
            if res:
                fastest = min(u for u, _ in res)
                for u, c in res:
                    score[c] = score.get(c, 0.0) + u / fastest
                best = min(res)[1]
                for prec in SWEEP_PRECISIONS:
                    if bk.DRY and prec == "bf16x3":
                        continue  # not in the interpreter
                    r = measure(sname, bn, "ut", "verify", 8, config=best, precision=prec)
                    if r:
                        out["records"].remove(r)
                        out["sweep"].append(dict(shape=sname, B=Bs, T=8, kind="verify", config=list(best),
                                                 precision=prec, us=r["us"]))
                print(f"sweep {sname} B={Bs} verify T=8 + step T=5 (tf32x3): "
                      + " ".join(f"{'/'.join(map(str, c))}:{u:.1f}" for u, c in res)
                      + " | at best config: " + " ".join(f"{s['precision']}:{s['us']:.1f}" for s in out["sweep"]
                                                         if s["shape"] == sname and s["precision"] != "tf32x3"),
                      flush=True)
            del bn
            if not bk.DRY:
                torch.cuda.empty_cache()
        if score:
            best = min(score.items(), key=lambda kv: kv[1])[0]
            ut.TUNED_UT["large"] = tuple(best)
            print("UT large config installed:", best, flush=True)
        save()
    out["tuned_ut"] = {k: list(v) for k, v in ut.TUNED_UT.items()}

    # ---------------- main table ----------------

    def measure_impl(sname, bn, impl, kind, T, A=0):
        base, cfg = impl.split(":")[0], next(c for i, c in impls if i == impl)
        if base == "ser" and cfg:  # the serial kernel takes its config from CONFIG_OVERRIDE (read at launch)
            tc.CONFIG_OVERRIDE = cfg
            try:
                r = measure(sname, bn, base, kind, T, A)
            finally:
                tc.CONFIG_OVERRIDE = None
        else:
            r = measure(sname, bn, base, kind, T, A, **({"config": cfg} if cfg else {}))
        if r:
            r["impl"] = impl
            r["config"] = list(cfg) if cfg else None
        return r
    for B in batches:
        for sname in shapes:
            if clock.left() < 10:
                print("budget exhausted; stopping", flush=True)
                break
            bn = bk.Bench(SHAPES[sname], B, L)
            line = []
            for T in Ts:
                kinds = ["ar", "verify"] if T == 1 else ["verify", "step"]
                for kind in (k for k in kinds if k in kinds_on):
                    for impl, _ in impls:
                        r = measure_impl(sname, bn, impl, kind, T)
                        if r:
                            line.append(f"{kind}{T}:{impl}={r['us']:.1f}")
                if T in replay_Ts and "replay" in kinds_on:
                    r = measure(sname, bn, "base", "replay", T)
                    if r:
                        line.append(f"replay{T}={r['us']:.1f}")
            for T, A in ((5, 3), (8, 5)):
                if T not in Ts and not bk.DRY:
                    continue
                for kind in (k for k in ("fused", "sep") if k in kinds_on):
                    for impl, _ in impls:
                        r = measure_impl(sname, bn, impl, kind, T, A)
                        if r:
                            line.append(f"{kind}{T}/{A}:{impl}={r['us']:.1f}")
            print(f"[{clock.left():.0f}s left] {sname} B={B}: " + " ".join(line), flush=True)
            save()
            del bn
            if not bk.DRY:
                torch.cuda.empty_cache()
    save()
    summarize(out)
    if args.out is not None:
        print(f"wrote {args.out}", flush=True)


def summarize(out):
    recs = out["records"]

    def get(shape, B, impl, kind, T, A=0):
        for r in recs:
            if (r["shape"], r["B"], r["impl"], r["kind"], r["T"], r["A"]) == (shape, B, impl, kind, T, A):
                return r
        return None

    def cell(r):
        return f"{r['us']:8.1f} ({r['state_TBps']:.2f})" if r else " " * 15

    def ratio(a, b):
        return f"{a['us'] / b['us']:5.2f}x" if a and b else "   -  "

    print("\n== us per layer (state TB/s); x = serial / UT ==")
    for s in sorted({r["shape"] for r in recs}):
        print(f"-- {s}")
        print("B    T  | verify ser      verify UT       x      | step ser        step UT         x      "
              "| replay          replay/step ser UT")
        for B in sorted({r["B"] for r in recs if r["shape"] == s}):
            for T in sorted({r["T"] for r in recs if r["shape"] == s and r["kind"] in ("verify", "ar")}):
                kind = "verify"
                vs, vu = get(s, B, "ser", kind, T), get(s, B, "ut", kind, T)
                ss, su = get(s, B, "ser", "step", T), get(s, B, "ut", "step", T)
                rp = get(s, B, "base", "replay", T)
                print(f"{B:<4} {T:<2} | {cell(vs)} {cell(vu)} {ratio(vs, vu)} | {cell(ss)} {cell(su)} {ratio(ss, su)} "
                      f"| {cell(rp)} {ratio(rp, ss)} {ratio(rp, su)}")
            a_s, a_u = get(s, B, "ser", "ar", 1), get(s, B, "ut", "ar", 1)
            if a_s or a_u:
                print(f"{B:<4} AR | {cell(a_s)} {cell(a_u)} {ratio(a_s, a_u)}")
    print("\n== targets ==")
    for s in sorted({r["shape"] for r in recs}):
        v_s, v_u = get(s, 128, "ser", "verify", 8), get(s, 128, "ut", "verify", 8)
        if v_u:
            print(f"{s} B=128 T=8 verify: UT {v_u['us']:.1f} us vs serial {v_s['us'] if v_s else float('nan'):.1f} us "
                  f"(target <= 300 us for 6x256x512; one state pass ~94 us)")
        for B in (32, 128, 256):
            rp = get(s, B, "base", "replay", 5)
            for impl in ("ser", "ut"):
                st = get(s, B, impl, "step", 5)
                if st and rp:
                    print(f"{s} B={B}: SpecLA step T=5 [{impl}] {st['us']:.1f} us vs replay {rp['us']:.1f} us: "
                          f"{rp['us'] / st['us']:.2f}x (target >= 4x)")
            for T, A in ((5, 3), (8, 5)):
                for impl in ("ser", "ut"):
                    fu, se = get(s, B, impl, "fused", T, A), get(s, B, impl, "sep", T, A)
                    if fu and se:
                        print(f"{s} B={B}: fused T={T} A={A} [{impl}] {fu['us']:.1f} us vs recover+verify "
                              f"{se['us']:.1f} us: {se['us'] / fu['us']:.2f}x (target >= 1.3x)")


if __name__ == "__main__":
    main()
