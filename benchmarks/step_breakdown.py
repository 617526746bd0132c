#!/usr/bin/env python
"""Where the GPU time of one decode step goes, per phase and per kernel family (issue 6).

For each ``--shape``, ``--batches`` and mode (``ar``, ``specla`` at ``--k``, ``snapshot`` at
``--k``), the runtime of ``runtime/decode.py`` runs ``--steps`` steps *eagerly* under
``torch.profiler`` (CUDA activity) after a warm-up. Kernel durations are the same as inside the
CUDA graph that the timed benchmark replays; what eager mode adds is host time between launches,
which this script does not report. Two views, microseconds of device time per step:

* phases (approximate: only kernels that torch attributes to a ``record_function`` range, i.e.
  cuBLAS / aten kernels; Triton and csrc launches are not attributed, so phases undercount and
  the family sums are the reliable view): ``target`` (the target forward over the window),
  ``target-logits`` (LM head + argmax),
  ``drafter-absorb`` (the drafter's pass over the accepted pairs), ``drafter-speculate`` (scratch
  state copy + K - 1 drafter passes + LM heads), ``rest`` (acceptance, bookkeeping);
* kernel families by kernel name: ``gemm`` (cuBLAS / CUTLASS), ``recurrent`` (chain / tree verify,
  UT, recover, the CUDA csrc op), ``conv``, ``elementwise`` (fused RMSNorm, gating, SwiGLU), ``copy``
  and ``other``.

Prints two tables and writes JSON records to ``--out``. Random weights and the acceptance-controlled
drafter as in ``bench_e2e.py`` (alpha = ``--alpha``).

    python benchmarks/step_breakdown.py --shapes flame --batches 64 --k 4 --cuda-csrc --out $OUT/bd.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _flags import check_out, parse_list  # noqa: E402
from bench_e2e import SHAPES, add_kernel_flags, apply_kernel_flags, build, build_trained  # noqa: E402

from vllm_specla.runtime.decode import DecodeRuntime  # noqa: E402

FAMILIES = [
    ("recurrent", r"conv_chain_step|chain_verify|chain_ut|ut_prep|recover|tree_verify|hld_verify|snapshot"),
    ("conv", r"conv"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|sm90_|sm100_|splitk|gemv|cublas"),
    ("elementwise", r"rms_norm|gating|silu|elementwise|vectorized|reduce|argmax|index|gather|scatter|cat"),
    ("copy", r"copy|memcpy|memset|fill"),
]
PHASES = ("target", "target-logits", "drafter-absorb", "drafter-speculate")
DEV = "cuda"


def family(name: str) -> str:
    low = name.lower()
    for fam, pat in FAMILIES:
        if re.search(pat, low):
            return fam
    return "other"


def instrument(rt: DecodeRuntime) -> None:
    """Wrap the runtime's phase entry points in ``record_function`` ranges (this instance only).
    The drafter's LM heads (``tgt.logits`` inside ``_speculate``; ``_speculate_chain`` runs its own,
    with the drafter's final norm, and also the absorb pass's accepted row) count as drafting."""
    tgt, dr = rt.tgt, rt.dr
    hidden, logits = tgt.hidden, tgt.logits
    inside = [False]  # in _speculate

    def t_hidden(*a, **k):
        with record_function("target"):
            return hidden(*a, **k)

    def t_logits(*a, **k):
        if inside[0]:
            return logits(*a, **k)
        with record_function("target-logits"):
            return logits(*a, **k)

    tgt.hidden, tgt.logits = t_hidden, t_logits
    if dr is None:
        return
    d_hidden = dr.hidden

    def d_hidden_w(*a, **k):
        if a[3] != "commit":  # the K - 1 passes of the drafting: inside its range already
            return d_hidden(*a, **k)
        with record_function("drafter-absorb"):
            return d_hidden(*a, **k)

    def speculate_w(spec):
        def wrapped(*a, **k):
            inside[0] = True
            try:
                with record_function("drafter-speculate"):
                    return spec(*a, **k)
            finally:
                inside[0] = False

        return wrapped

    dr.hidden = d_hidden_w
    rt._speculate, rt._speculate_chain = speculate_w(rt._speculate), speculate_w(rt._speculate_chain)


def uninstrument(rt: DecodeRuntime) -> None:
    for obj in (rt.tgt, rt.dr, rt):
        if obj is not None:
            for attr in ("hidden", "logits", "_speculate", "_speculate_chain"):
                obj.__dict__.pop(attr, None)


@torch.no_grad()
def breakdown(rt: DecodeRuntime, prompts, steps: int) -> dict:
    rt.prefill(prompts)
    for _ in range(2):
        rt._step()
    sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)
    sync()
    instrument(rt)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            with record_function("step"):
                rt._step()
        sync()
    uninstrument(rt)
    fams: dict = defaultdict(float)
    kernels: dict = defaultdict(float)
    calls: dict = defaultdict(float)
    total = 0.0
    for ev in prof.key_averages():
        if ev.device_type != torch.autograd.DeviceType.CUDA or ev.key in PHASES + ("step",):
            continue  # (the ranges' GPU-side annotations are not kernels)
        us = ev.self_device_time_total / steps
        fams[family(ev.key)] += us
        kernels[ev.key[:90]] += us
        calls[ev.key[:90]] += ev.count / steps
        total += us
    phases: dict = defaultdict(float)
    for ev in prof.events():  # host-side ranges: device time of the kernels launched inside them
        if ev.name in PHASES + ("step",) and ev.device_type == torch.autograd.DeviceType.CPU:
            phases[ev.name] += (ev.device_time_total if DEV == "cuda" else ev.cpu_time_total) / steps
    phases = dict(phases)
    phases["rest"] = phases.get("step", 0.0) - sum(phases.get(p, 0.0) for p in PHASES)
    out = dict(total_us=total, families=dict(fams), phases=phases,
               top_kernels=dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:40]),
               calls_per_step={k: calls[k] for k in kernels})
    return out


def short_name(name: str) -> str:
    """A kernel's name without template arguments / parameter lists, at most 60 characters."""
    n = re.sub(r"<.*", "", re.sub(r"\(.*", "", name.replace("(anonymous namespace)", ""))).strip()
    n = n.split()[-1].split("::")[-1] if n else ""
    return n[:60] or name[:60]


@torch.no_grad()
def graph_timeline(rt: DecodeRuntime, prompts, replays: int) -> dict:
    """The step as the benchmark runs it: captured as one CUDA graph (``rt.capture()``), ``replays`` replays
    under ``torch.profiler``; each kernel node's start / end on the device. With programmatic dependent launch a
    kernel starts before its predecessor ends (its pre-wait part, then ``griddepcontrol.wait``), so durations
    overlap; the *increment* of kernel i, ``end_i - end_{i-1}``, is what it adds to the step's span (the
    increments sum to the span). Returns per-family and per-kernel-name increments (us per step), the median
    replay's span, and that replay's kernel list (name, start, end, relative to its first kernel's start)."""
    rt.capture()
    rt.prefill(prompts)
    for _ in range(3):
        rt.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            rt.step()
        torch.cuda.synchronize()
    evs = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name.lower()
                  and "memset" not in e.name.lower()), key=lambda t: t[0])
    return timeline_stats(evs, replays)


def timeline_stats(evs: list[tuple[float, float, str]], replays: int) -> dict:
    """:func:`graph_timeline`'s numbers from the device events ``(start_us, end_us, kernel name)`` of
    ``replays`` replays, sorted by start (every replay the same kernels). A kernel's increment is
    ``max(0, end - latest end so far)``: overlapped work adds nothing, a gap counts toward the kernel after it."""
    if not evs or len(evs) % replays:
        return dict(graph_error=f"{len(evs)} kernel events for {replays} replays (graph kernels not traced?)")
    n = len(evs) // replays
    reps = [evs[i * n : (i + 1) * n] for i in range(replays)]
    spans = [max(e[1] for e in r) - r[0][0] for r in reps]
    med = sorted(range(replays), key=lambda i: spans[i])[replays // 2]
    fams: dict = defaultdict(float)
    incs: dict = defaultdict(float)
    calls: dict = defaultdict(int)
    for r in reps:
        prev_end = r[0][0]
        for _st, en, name in r:
            inc = max(0.0, en - prev_end)
            prev_end = max(prev_end, en)
            fams[family(name)] += inc / replays
            incs[short_name(name)] += inc / replays
            calls[short_name(name)] += 1
    r = reps[med]
    t0 = r[0][0]
    return dict(graph_span_us=spans[med], graph_span_us_mean=sum(spans) / replays, graph_span_us_all=spans,
                graph_kernels=n, graph_families=dict(fams),
                graph_increments=dict(sorted(incs.items(), key=lambda kv: -kv[1])),
                graph_calls={k: v / replays for k, v in calls.items()},
                graph_timeline=[(short_name(nm), round(st - t0, 2), round(en - t0, 2)) for st, en, nm in r])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="flame", help="flame / map / tiny (random weights, the acceptance-controlled "
                    "drafter), or trained (the embedded pair, real acceptance; prompts from --prompts)")
    ap.add_argument("--prompts", default=None, help="JSON list of token lists for --shapes trained (cut to the shortest)")
    ap.add_argument("--batches", default="64")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.8)
    ap.add_argument("--modes", default="ar,specla,snapshot")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tree-width", type=int, default=1,
                    help="W >= 2: the specla mode verifies draft trees of W branches of depth --k (as bench_e2e)")
    csrc = ap.add_mutually_exclusive_group()
    csrc.add_argument("--cuda-csrc", action="store_true", help="require the CUDA csrc chain verify (the default where it "
                      "builds: ops/_cpp.py load_cuda_kernels; as bench_e2e)")
    csrc.add_argument("--no-cuda-csrc", action="store_true", help="the Triton chain kernels only (as bench_e2e)")
    ap.add_argument("--draft-weights", default="model", choices=["model", "fp8"],
                    help="the drafter's one-token passes on the model weights or float8 (up to "
                         "fused_model.FP8_MAX_BATCH rows; as bench_e2e)")
    add_kernel_flags(ap)  # --gemv-rows, --rows-max-m, --gating-epilogue, --pdl (as bench_e2e)
    ap.add_argument("--graph", type=int, default=0, metavar="REPLAYS",
                    help="also time the step captured as a CUDA graph (as bench_e2e.py runs it) over REPLAYS profiled "
                         "replays: per-kernel increments of the step's span (graph_timeline); CUDA only")
    ap.add_argument("--top", type=int, default=12, help="kernels printed per record (the JSON keeps 40)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-cpu", action="store_true", help="tiny shape on the CPU: the code path once (no device times)")
    args = ap.parse_args()
    shapes = parse_list(ap, "--shapes", args.shapes, choices=[*SHAPES, "trained"])
    batches = parse_list(ap, "--batches", args.batches)
    modes = parse_list(ap, "--modes", args.modes, choices=["ar", "specla", "snapshot"])
    for flag, v in (("--k", args.k), ("--steps", args.steps), ("--tree-width", args.tree_width), ("--top", args.top)):
        if v < 1:
            ap.error(f"{flag}: must be an int >= 1, got {v}")
    if args.graph < 0 or not 0 <= args.alpha <= 1:  # (also a NaN alpha)
        ap.error(f"--graph must be >= 0 and --alpha in [0, 1], got {args.graph} / {args.alpha}")
    check_out(ap, "--out", args.out)
    global DEV
    if args.dry_cpu:
        DEV, batches, args.steps = "cpu", [2], 2
        shapes = ["trained" if shapes == ["trained"] else "tiny"]
    elif not torch.cuda.is_available():
        ap.error("no CUDA device: this profiles GPU steps; on a CPU, --dry-cpu runs the code path once")
    from vllm_specla.ops import _cpp, chain_verify as _cv  # noqa: PLC0415

    if DEV == "cuda":
        from vllm_specla.ops import fused as _fused  # noqa: PLC0415

        if args.no_cuda_csrc:  # (switched off before the build: load_cuda_kernels skips it)
            _cv.USE_CUDA_CSRC = False
        if getattr(args, "skinny_gemm", None) == "off":
            _fused.USE_SKINNY_GEMM = False
        _cpp.load_cuda_kernels()  # (what DecodeRuntime does)
        if args.cuda_csrc and not _cpp.CUDA_LOADED:
            try:
                _cpp._ensure_cpu_extension()
                _cpp.load_cuda()
            except Exception as e:  # noqa: BLE001
                raise SystemExit(f"--cuda-csrc: the CUDA csrc chain verify did not build: {e}") from None
    args.cuda_csrc = DEV == "cuda" and _cv.USE_CUDA_CSRC and _cpp.CUDA_LOADED  # (what the records say)
    rows = apply_kernel_flags(args, DEV)
    recs = []
    for shape in shapes:
        trained = shape == "trained"  # the embedded pair, fp32, real acceptance (no trace, no alpha)
        if trained:
            tgt, dr = build_trained(DEV)
            cfg = tgt.config
        else:
            cfg, tgt, dr = build(shape, DEV, torch.bfloat16 if DEV == "cuda" else torch.float32)
        if dr is not None and args.draft_weights != "model":
            dr = dr.with_draft_weights(args.draft_weights)
        for B in batches:
            prompts = torch.randint(3, cfg.vocab_size, (B, 16), generator=torch.Generator().manual_seed(B))
            if trained and args.prompts:
                with open(args.prompts) as f:
                    ps = json.load(f)
                n = min(len(p) for p in ps)
                prompts = torch.tensor([ps[i % len(ps)][:n] for i in range(B)])
            L = 64 * (args.k + 1)
            ar = DecodeRuntime(tgt, B, "ar", output_capacity=L, use_cuda_graphs=False)
            ar.prefill(prompts)
            ar.run(L - 8)
            trace = torch.stack([torch.tensor(o[: L - 4]) for o in ar.outputs()]).to(DEV)
            for mode in modes:
                if mode == "ar":
                    rt = ar
                else:
                    rt = DecodeRuntime(tgt, B, mode, args.k, dr, output_capacity=L, alpha=None if trained else args.alpha,
                                       trace=None if trained else trace, use_cuda_graphs=False, tree_width=args.tree_width if mode == "specla" else 1)
                r = breakdown(rt, prompts, args.steps)
                if args.graph and DEV == "cuda":
                    g_rt = DecodeRuntime(tgt, B, "ar", output_capacity=L) if mode == "ar" else DecodeRuntime(
                        tgt, B, mode, args.k, dr, output_capacity=L, alpha=None if trained else args.alpha,
                        trace=None if trained else trace, tree_width=args.tree_width if mode == "specla" else 1)
                    r.update(graph_timeline(g_rt, prompts, args.graph))
                    del g_rt
                W = args.tree_width if mode == "specla" else 1
                rec = dict(shape=shape, batch=B, mode=mode, K=0 if mode == "ar" else args.k,
                           alpha=None if trained else args.alpha, tree_width=W, draft_weights=args.draft_weights,
                           cuda_csrc=args.cuda_csrc, gemv_rows=rows, gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu", **r)
                recs.append(rec)
                ph = " ".join(f"{p}={r['phases'].get(p, 0.0):.0f}" for p in PHASES)
                fm = " ".join(f"{f}={v:.0f}" for f, v in sorted(r["families"].items(), key=lambda kv: -kv[1]))
                print(f"{shape} B={B} {mode:8s} K={rec['K']} W={W} device {r['total_us']:.0f} us/step | {ph} | {fm}",
                      flush=True)
                for kname, us in list(r["top_kernels"].items())[: args.top]:
                    print(f"    {us:8.1f} us {r['calls_per_step'][kname]:5.1f}x  {kname}")
                if "graph_span_us" in r:
                    gf = " ".join(f"{f}={v:.0f}" for f, v in sorted(r["graph_families"].items(), key=lambda kv: -kv[1]))
                    print(f"  graph: span {r['graph_span_us']:.1f} us/step (median; mean {r['graph_span_us_mean']:.1f}, "
                          f"which the mean increments below sum to), {r['graph_kernels']} kernels | increments: {gf}")
                    for kname, us in list(r["graph_increments"].items())[: args.top]:
                        print(f"    {us:8.1f} us {r['graph_calls'][kname]:5.1f}x  {kname}")
                elif "graph_error" in r:
                    print("  graph:", r["graph_error"])
                if rt is not ar:
                    del rt
            del ar
            if DEV == "cuda":
                torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
