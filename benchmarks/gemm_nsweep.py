"""One GEMM's time against its output size N: the CUDA skinny GEMM (``ops/_cpp.py`` ``skinny_gemm``,
automatic config, no PDL) and cuBLAS (``x @ w.T``), bf16, M token rows, fixed K.

Each point is the median per-GEMM time of 20 GEMMs on 20 different weights in one CUDA graph (so no
weight stays in L2), N = 16 x tiles. A line through the points past the first wave separates the
stream rate (the slope: TB/s) from a fixed cost per GEMM (the intercept; RESULTS.md session 16,
s16g: 3.96 TB/s + 3.6 us for the skinny GEMM). Prints a table and the fit, writes JSON to ``--out``.
Needs CUDA and nvcc (the skinny GEMM's JIT build).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flags import check_out, parse_list  # noqa: E402
from graph_timing import graph_ms  # noqa: E402

TILES = (132, 200, 264, 265, 330, 396, 450, 528, 529, 577, 660, 792, 793)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=5, help="token rows (2..8: the skinny GEMM's dispatch scope)")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--tiles", default=",".join(map(str, TILES)), help="N / 16 values")
    ap.add_argument("--per-graph", type=int, default=20, help="GEMMs (on distinct weights) per timed graph")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tiles_list = parse_list(ap, "--tiles", args.tiles)
    if args.m < 1 or args.k < 1 or args.per_graph < 1:
        ap.error(f"--m, --k and --per-graph: each must be an int >= 1, got {args.m} / {args.k} / {args.per_graph}")
    check_out(ap, "--out", args.out)
    if not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times the CUDA skinny GEMM")
    from vllm_specla.ops import _cpp  # noqa: PLC0415

    if not _cpp.load_cuda_gemm():
        raise SystemExit("the CUDA skinny GEMM did not build (ops/_cpp.py load_cuda_gemm)")
    M, K, n = args.m, args.k, args.per_graph
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    recs = []
    for tiles in tiles_list:
        N = 16 * tiles
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
        sk = graph_ms(lambda ws=ws: [_cpp.skinny_gemm(x, w, pdl=False) for w in ws]) / n
        cb = graph_ms(lambda ws=ws: [x @ w.t() for w in ws]) / n
        r = dict(tiles=tiles, N=N, K=K, M=M, skinny_us=1e3 * sk, cublas_us=1e3 * cb, skinny_TBps=N * K * 2 / sk / 1e9,
                 cublas_TBps=N * K * 2 / cb / 1e9, gpu=torch.cuda.get_device_name(), torch=torch.__version__)
        recs.append(r)
        print(f"tiles {tiles:4d} N {N:6d}  skinny {r['skinny_us']:7.2f} us {r['skinny_TBps']:.2f} TB/s  "
              f"cuBLAS {r['cublas_us']:7.2f} us {r['cublas_TBps']:.2f} TB/s", flush=True)
        del ws
    wave = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    past = [r for r in recs if r["tiles"] > wave]
    if len(past) >= 2:
        t = np.array([r["tiles"] for r in past], dtype=float)
        for name in ("skinny", "cublas"):
            slope, icpt = np.polyfit(t, np.array([r[f"{name}_us"] for r in past]), 1)
            print(f"{name}: {slope * 1e3:.1f} ns per tile ({16 * K * 2 / (slope * 1e-6) / 1e12:.2f} TB/s) + "
                  f"{icpt:.2f} us per GEMM (fit over {len(past)} points past {wave} tiles)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
