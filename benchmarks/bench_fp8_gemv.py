#!/usr/bin/env python
"""The drafter's one-token passes on float8 weights against bf16 (issue 6), one GPU.

Session 27 (benchmarks/RESULTS.md) put the drafter's one-token passes on per-row float8 e4m3 weights
(``FusedEagle(draft_weights="fp8")``, W8A16 through ``ops/triton_fused.py`` ``gemv_rows(w_scale=)``)
and found them moving ~2.4 TB/s of float8 bytes end to end against the bf16 row GEMV's ~3.36 TB/s.
This script times the drafter's own one-row GEMMs (``fc``, the block's in-projection / ``o_proj`` /
gate|up / ``down_proj``, the LM head; built as ``bench_e2e.py`` builds them, random weights at the
shape) on bf16 and on float8 weights, each as one CUDA graph of ``--passes`` passes over the six
weights (a pass reads far more than the L2, so the weights stream from HBM).

Session 28 also timed four ways of widening e4m3 to float32 here (Triton's conversions, integer bit
moves in Triton, the same in PTX byte permutes, half and half): Triton's conversions were fastest
(RESULTS.md "Session 28"; commit 3bafdc5 keeps the others).

Prints ms per pass, weight bytes per pass (float8: the weights and their float32 row scales), TB/s
and the ratio to bf16; checks the float8 outputs against ``Fp8Weight.ref_linear`` (``rel``: max
|diff| / max |ref|) and appends JSON lines to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_e2e import build  # noqa: E402
from graph_timing import graph_ms  # noqa: E402

from vllm_specla.ops import fused, triton_fused  # noqa: E402

MODES = ("bf16", "fp8")


def drafter_weights(dr) -> list[tuple[str, torch.Tensor]]:
    """The drafter's one-row GEMM weights in a draft pass's order: ``fc``, the block's four, the LM head."""
    L = dr.stack.layers[0]
    head = dr.target.lm_head if dr.head is None else dr.head.weight
    return [("fc", dr.fc), ("in_proj", L.w_in), ("o_proj", L.w_o), ("gate_up", L.w_gu), ("down", L.w_down),
            ("lm_head", head)]


def bench_shape(shape: str, modes, passes: int, replays: int) -> list[dict]:
    cfg, tgt, dr = build(shape, "cuda", torch.bfloat16)
    ws = drafter_weights(dr)
    del tgt
    torch.cuda.empty_cache()
    w8s = [fused.quantize_fp8(w) for _, w in ws]
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(1, w.shape[1], generator=g, device="cuda").to(torch.bfloat16) for _, w in ws]
    outs = [torch.empty(1, w.shape[0], device="cuda", dtype=torch.bfloat16) for _, w in ws]
    refs = [w8.ref_linear(x).float() for w8, x in zip(w8s, xs)]
    recs = []
    base = None
    for mode in modes:
        fp8 = mode == "fp8"

        def one_pass():
            for i, (_, w) in enumerate(ws):
                if fp8:
                    triton_fused.gemv_rows(xs[i], w8s[i].weight, w_scale=w8s[i].scale, out=outs[i])
                else:
                    triton_fused.gemv_rows(xs[i], w, out=outs[i])

        one_pass()
        torch.cuda.synchronize()
        rel = None
        if fp8:
            rel = max(float((o.float() - r).abs().max() / r.abs().max()) for o, r in zip(outs, refs))
        ms = graph_ms(one_pass, replays=replays, calls_per_graph=passes)
        nbytes = sum(w.numel() * (1 if fp8 else w.element_size()) + (w.shape[0] * 4 if fp8 else 0) for _, w in ws)
        rec = dict(bench="fp8_gemv", shape=shape, mode=mode, ms_per_pass=ms, weight_bytes=nbytes,
                   tbps=nbytes / ms / 1e9, rel_vs_ref=rel, passes=passes,
                   config=list(triton_fused.GEMV_ROWS_FP8_CONFIG if fp8 else triton_fused.GEMV_ROWS_CONFIG),
                   weights={n: list(w.shape) for n, w in ws}, gpu=torch.cuda.get_device_name())
        if mode == "bf16":
            base = ms
        recs.append(rec)
    for rec in recs:
        rec["vs_bf16"] = base / rec["ms_per_pass"] if base else None
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="flame,map")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--passes", type=int, default=8, help="drafter passes per CUDA graph")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--out", default=None, help="append one JSON line per row here")
    args = ap.parse_args()
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"--modes: unknown {bad}; allowed: {', '.join(MODES)}")
    if not torch.cuda.is_available():
        raise SystemExit("bench_fp8_gemv.py needs a CUDA GPU (sm_89+ for float8)")
    print(f"{'shape':6} {'mode':5} {'ms/pass':>8} {'MB':>7} {'TB/s':>6} {'vs bf16':>7} {'rel':>9}")
    for shape in args.shapes.split(","):
        for rec in bench_shape(shape, modes, args.passes, args.replays):
            rel = "" if rec["rel_vs_ref"] is None else f"{rec['rel_vs_ref']:.2e}"
            vs = "" if rec["vs_bf16"] is None else f"{rec['vs_bf16']:.3f}"
            print(f"{shape:6} {rec['mode']:5} {rec['ms_per_pass']:8.4f} {rec['weight_bytes'] / 1e6:7.1f} "
                  f"{rec['tbps']:6.2f} {vs:>7} {rel:>9}", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
