"""C++ CPU ops (``csrc/``) vs the plain-torch references, same run, same inputs.

Shapes: the embedded default model's GDN layer (hidden 512, 4 heads, head_dim 64, expand_v 2):
H = HV = 4, K = 64, V = 128, conv channels C = 2*H*K + HV*V = 1024, W = 4; one layer per call.
Verify window T = 1 + K_draft = 5 (K_draft = 4); batch (rows) 1, 8, 16 on as many state slots.

Ops (per call, one layer):
* ``chain_verify``      speculative verify: fold 3 pending factors (deferred commit) + window of T, factors out
* ``chain_verify_ar``   AR decode step: T = 1, write_final_state, no banks
* ``tree_verify``       sequential tree verify, random 5-node tree, 3 pending factors
* ``recover``           DeltaConstruct commit of A = 3 accepted factors
* ``conv_verify``       conv window with 3 pending raw inputs folded, factors out
* ``conv_commit``       conv window commit of A = 3

Timing: cpp and ref calls interleaved (so load changes on a shared machine hit both alike), median and
min per call after warm-up (``time.perf_counter``), torch's intra-op threads (``torch.get_num_threads()``,
``--threads`` to set). The 1-minute load average is recorded: on an oversubscribed machine the
medians of multi-threaded calls include OpenMP barrier stalls; the mins do not. Prints a table and writes ``benchmarks/cpu_ops.json``.

    python benchmarks/bench_cpu_ops.py [--batches 1 8 16] [--min-time 0.3] [--out benchmarks/cpu_ops.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time

import torch

from vllm_specla.ops import _cpp
from vllm_specla.ops.reference import chain_verify_ref, conv_commit_ref, conv_verify_ref, recover_ref
from vllm_specla.ops.tree_reference import tree_verify_sequential_ref

H, HV, K, V, W = 4, 4, 64, 128, 4
C = 2 * H * K + HV * V
K_DRAFT = 4
T = 1 + K_DRAFT
PENDING = 3


def make_inputs(B: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    N = B * T
    d = dict(
        q=torch.randn(N, H, K, generator=g), k=torch.randn(N, H, K, generator=g), v=torch.randn(N, HV, V, generator=g),
        g=-torch.rand(N, HV, generator=g) * 0.5 - 0.01, beta=torch.rand(N, HV, generator=g),
        state=torch.randn(B, HV, V, K, generator=g) * 0.1,
        bank_k=torch.nn.functional.normalize(torch.randn(B, 2, T, H, K, generator=g), dim=-1),
        bank_v=torch.randn(B, 2, T, HV, V, generator=g) * 0.1, bank_g=-torch.rand(B, 2, T, HV, generator=g) * 0.5,
        x=torch.randn(N, C, generator=g), weight=torch.randn(C, W, generator=g),
        conv=torch.randn(B, W - 1, C, generator=g), bank_x=torch.randn(B, 2, T, C, generator=g),
        slots=torch.arange(B), cu=torch.arange(B + 1) * T, cu1=torch.arange(B + 1),
        read=torch.zeros(B, dtype=torch.int64), write=torch.ones(B, dtype=torch.int64),
        pend=torch.full((B,), PENDING), acc=torch.full((B,), PENDING),
        parents=torch.tensor([p for _ in range(B) for p in [-1] + [rng.randint(0, t - 1) for t in range(1, T)]]),
    )
    return d


def op_calls(d: dict) -> dict:
    """name -> (cpp_fn, ref_fn), each a closure over fresh clones of the mutable tensors."""
    sc = K ** -0.5

    def verify_kw(st, bk, bv, bg):
        return dict(scale=sc, state=st, slots=d["slots"], cu_seqlens=d["cu"], bank_k=bk, bank_v=bv, bank_g=bg,
                    write_bank=d["write"], pending_len=d["pend"], read_bank=d["read"])

    qkv = (d["q"], d["k"], d["v"], d["g"], d["beta"])
    qkv1 = tuple(t[: d["slots"].numel()] for t in qkv)
    out = {}
    for impl, cv, tv, rec, convv, convc in (
        ("cpp", _cpp.chain_verify, _cpp.tree_verify, _cpp.recover, _cpp.conv_verify, _cpp.conv_commit),
        ("ref", chain_verify_ref, tree_verify_sequential_ref, recover_ref, conv_verify_ref, conv_commit_ref),
    ):
        m = [d["state"].clone(), d["bank_k"].clone(), d["bank_v"].clone(), d["bank_g"].clone()]
        conv, bx = d["conv"].clone(), d["bank_x"].clone()
        fns = {
            "chain_verify": lambda cv=cv, m=m: cv(*qkv, **verify_kw(*m)),
            "chain_verify_ar": lambda cv=cv, m=m: cv(*qkv1, scale=sc, state=m[0], slots=d["slots"],
                                                     cu_seqlens=d["cu1"], write_final_state=True),
            "tree_verify": lambda tv=tv, m=m: tv(*qkv, parents=d["parents"], **verify_kw(*m)),
            "recover": lambda rec=rec, m=m: rec(m[0], d["slots"], m[1], m[2], m[3], d["read"], d["acc"]),
            "conv_verify": lambda convv=convv, conv=conv, bx=bx: convv(
                d["x"], d["weight"], d["cu"], conv, d["slots"], bank_x=bx, write_bank=d["write"],
                pending_len=d["pend"], read_bank=d["read"]),
            "conv_commit": lambda convc=convc, conv=conv, bx=bx: convc(conv, d["slots"], bx, d["read"], d["acc"]),
        }
        for name, fn in fns.items():
            out.setdefault(name, {})[impl] = fn
    return out


def max_diff(d: dict) -> dict:
    """One call of each op from identical inputs: max |cpp - ref| over the outputs and mutated state."""
    res = {}
    calls_c, calls_r = op_calls(d), op_calls(d)
    for name in calls_c:
        a, b = calls_c[name]["cpp"](), calls_r[name]["ref"]()
        res[name] = float((a - b).abs().max()) if a is not None else 0.0
    return res


def bench_pair(fn_a, fn_b, min_time: float) -> tuple[dict, dict]:
    """Time two callables interleaved (a, b, a, b, ...) so that load changes hit both alike.

    Returns per-callable ``{"median": us, "min": us, "n": calls}``.
    """
    for _ in range(3):
        fn_a()
        fn_b()
    ta, tb = [], []
    t_end = time.perf_counter() + 2 * min_time
    while time.perf_counter() < t_end or len(ta) < 7:
        for fn, ts in ((fn_a, ta), (fn_b, tb)):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return tuple({"median": statistics.median(ts) * 1e6, "min": min(ts) * 1e6, "n": len(ts)} for ts in (ta, tb))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds of timed calls per op and impl")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_ops.json"),
                    help="write the JSON results here (overwritten; default: the committed benchmarks/cpu_ops.json, "
                         "which RESULTS.md quotes: give another path for a partial run)")
    args = ap.parse_args()
    if not _cpp.AVAILABLE:
        raise SystemExit(f"C++ ops not built: {_cpp.LOAD_ERROR}")
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    print(f"CPU: {cpu_name()}  ({os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}), "
          f"torch {torch.__version__}")
    print(f"shapes: H={H} HV={HV} K={K} V={V} C={C} W={W}; T={T} (K_draft={K_DRAFT}); pending/accepted={PENDING}")
    hdr = (f"{'op':<16} {'batch':>5} {'cpp us':>9} {'ref us':>9} {'speedup':>8} {'cpp min':>9} {'ref min':>9} "
           f"{'min spd':>8} {'max|diff|':>10}")
    print(hdr)
    print("-" * len(hdr))
    with torch.inference_mode():
        for B in args.batches:
            d = make_inputs(B)
            diffs = max_diff(d)
            calls = op_calls(d)
            for name, fns in calls.items():
                c, r = bench_pair(fns["cpp"], fns["ref"], args.min_time)
                rows.append(dict(op=name, batch=B, T=1 if name == "chain_verify_ar" else T,
                                 cpp_us=round(c["median"], 2), ref_us=round(r["median"], 2),
                                 speedup=round(r["median"] / c["median"], 2), cpp_min_us=round(c["min"], 2),
                                 ref_min_us=round(r["min"], 2), speedup_min=round(r["min"] / c["min"], 2),
                                 calls=c["n"], max_abs_diff=diffs[name]))
                print(f"{name:<16} {B:>5} {c['median']:>9.1f} {r['median']:>9.1f} {r['median'] / c['median']:>7.1f}x "
                      f"{c['min']:>9.1f} {r['min']:>9.1f} {r['min'] / c['min']:>7.1f}x {diffs[name]:>10.2e}")
    meta = dict(cpu=cpu_name(), logical_cores=os.cpu_count(), torch_threads=torch.get_num_threads(),
                torch=torch.__version__, shapes=dict(H=H, HV=HV, K=K, V=V, C=C, W=W, T=T, K_draft=K_DRAFT,
                                                     pending=PENDING, accepted=PENDING),
                timing="per call, microseconds: median and min over interleaved cpp/ref calls after 3 warm-up calls each",
                load_average=os.getloadavg())
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, results=rows), f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
