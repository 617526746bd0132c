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

Every GEMM goes through ``fused.linear``, so the dispatch picks the kernel. Modes: ``bf16`` (the model
weights: the row GEMV at one row; the CUDA skinny GEMM at 2-8 rows once built, ``--skinny-gemm``,
else cuBLAS), ``fp8`` (float8 weights on the row GEMV at any rows), ``fp8-skinny`` (float8 weights of
2-8 rows on the skinny GEMM's float8 form, ``fused.USE_SKINNY_FP8``; needs ``--skinny-gemm`` and
``--rows`` 2..8). ``--rows K + 1`` times an absorb pass (fc and the block, without the LM head).

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

from _flags import check_out, parse_list  # noqa: E402
from bench_e2e import SHAPES, build  # noqa: E402
from graph_timing import graph_ms  # noqa: E402

from vllm_specla.ops import _cpp, fused, triton_fused  # noqa: E402

MODES = ("bf16", "fp8", "fp8-skinny")


def drafter_weights(dr) -> list[tuple[str, torch.Tensor]]:
    """The drafter's one-row GEMM weights in a draft pass's order: ``fc``, the block's four, the LM head."""
    L = dr.stack.layers[0]
    head = dr.target.lm_head if dr.head is None else dr.head.weight
    return [("fc", dr.fc), ("in_proj", L.w_in), ("o_proj", L.w_o), ("gate_up", L.w_gu), ("down", L.w_down),
            ("lm_head", head)]


def bench_shape(shape: str, modes, rows: int, passes: int, replays: int) -> list[dict]:
    cfg, tgt, dr = build(shape, "cuda", torch.bfloat16)
    ws = drafter_weights(dr)
    if rows > 1:  # an absorb pass streams the block (and fc), not the LM head
        ws = ws[:-1]
    del tgt
    torch.cuda.empty_cache()
    w8s = [fused.quantize_fp8(w) for _, w in ws]
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(rows, w.shape[1], generator=g, device="cuda").to(torch.bfloat16) for _, w in ws]
    refs = [w8.ref_linear(x).float() for w8, x in zip(w8s, xs)]
    recs = []
    base = None
    for mode in modes:
        fp8 = mode != "bf16"
        fused.USE_SKINNY_FP8 = mode == "fp8-skinny"
        if mode == "fp8-skinny" and not (rows > 1 and fused._skinny_fp8_takes(xs[0], w8s[0], None)):
            print(f"{shape} {mode}: skipped (needs --rows 2..{fused.SKINNY_MAX_M} and the skinny GEMM built)")
            continue
        outs = [None] * len(ws)

        def one_pass():
            for i, (_, w) in enumerate(ws):
                outs[i] = fused.linear(xs[i], w8s[i] if fp8 else w)

        one_pass()
        torch.cuda.synchronize()
        rel = None
        if fp8:
            rel = max(float((o.float() - r).abs().max() / r.abs().max()) for o, r in zip(outs, refs))
        ms = graph_ms(one_pass, replays=replays, calls_per_graph=passes)
        nbytes = sum(w.numel() * (1 if fp8 else w.element_size()) + (w.shape[0] * 4 if fp8 else 0) for _, w in ws)
        rec = dict(bench="fp8_gemv", shape=shape, mode=mode, rows=rows, ms_per_pass=ms, weight_bytes=nbytes,
                   tbps=nbytes / ms / 1e9, rel_vs_ref=rel, passes=passes,
                   config={n: list(triton_fused.rows_config(w.shape[0], fp8, rows)) for n, w in ws},
                   skinny_built=bool(_cpp.GEMM_LOADED),
                   weights={n: list(w.shape) for n, w in ws}, gpu=torch.cuda.get_device_name())
        if mode == "bf16":
            base = ms
        recs.append(rec)
    fused.USE_SKINNY_FP8 = False
    for rec in recs:
        rec["vs_bf16"] = base / rec["ms_per_pass"] if base else None
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="flame,map")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--rows", type=int, default=1, help="token rows per GEMM (1: a draft pass; K + 1: an absorb "
                                                         "pass, without the LM head)")
    ap.add_argument("--skinny-gemm", action="store_true", help="build the CUDA skinny GEMM first (_cpp.load_cuda_gemm: "
                                                               "bf16 GEMMs of 2-8 rows, and the fp8-skinny mode)")
    ap.add_argument("--passes", type=int, default=8, help="drafter passes per CUDA graph")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--out", default=None, help="append one JSON line per row here")
    args = ap.parse_args()
    modes = parse_list(ap, "--modes", args.modes, choices=MODES)
    shapes = parse_list(ap, "--shapes", args.shapes, choices=list(SHAPES))
    if not 1 <= args.rows <= 16:
        ap.error(f"--rows: must be an int in 1..16, got {args.rows}")
    if args.passes < 1 or args.replays < 1:
        ap.error(f"--passes and --replays: each must be an int >= 1, got {args.passes} / {args.replays}")
    check_out(ap, "--out", args.out)
    if not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times GPU GEMVs (sm_89+ for float8)")
    if args.skinny_gemm and not _cpp.load_cuda_gemm():
        raise SystemExit("--skinny-gemm: the CUDA skinny GEMM did not build (ops/_cpp.py load_cuda_gemm)")
    print(f"{'shape':6} {'mode':10} {'ms/pass':>8} {'MB':>7} {'TB/s':>6} {'vs bf16':>7} {'rel':>9}")
    for shape in shapes:
        for rec in bench_shape(shape, modes, args.rows, args.passes, args.replays):
            rel = "" if rec["rel_vs_ref"] is None else f"{rec['rel_vs_ref']:.2e}"
            vs = "" if rec["vs_bf16"] is None else f"{rec['vs_bf16']:.3f}"
            print(f"{shape:6} {rec['mode']:10} {rec['ms_per_pass']:8.4f} {rec['weight_bytes'] / 1e6:7.1f} "
                  f"{rec['tbps']:6.2f} {vs:>7} {rel:>9}", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
