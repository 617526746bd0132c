"""Skinny GEMM (decode) sweep: the Triton ``gemv`` of ops/triton_fused.py vs cuBLAS, one GPU.

For the flame 1B GEMM shapes (in-projection 9228x2048, o_proj 2048x3072, gate|up 11264x2048,
down 2048x5632, LM head 32000x2048; bf16) and M in {1, 9, 16} token rows, times each config of
``(BN, BK, num_warps, num_stages)`` and cuBLAS (``x @ w.T``) as a CUDA graph of 20 calls per shape
(median of 5), reports the summed time over the five shapes and weight TB/s, writes JSON to
``--out`` and prints the best config as the last line (``best BN,BK,W,S``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from graph_timing import graph_ms as _graph_ms  # noqa: E402

from vllm_specla.ops import triton_fused as tf  # noqa: E402

SHAPES = [(9228, 2048), (2048, 3072), (11264, 2048), (2048, 5632), (32000, 2048)]


def graph_ms(fn, reps=20):
    """Milliseconds per call, ``reps`` calls captured in one graph (weights partly L2-resident)."""
    return _graph_ms(fn, replays=1, calls_per_graph=reps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,9,16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for n, k in SHAPES]
    wbytes = sum(w.numel() * 2 for w in ws)
    configs = list(itertools.product((16, 32, 64), (128, 256, 512), (2, 4, 8), (2, 4)))
    recs = []
    for M in [int(m) for m in args.ms.split(",")]:
        xs = [torch.randn(M, k, device="cuda", dtype=torch.bfloat16) for _, k in SHAPES]
        t_cublas = sum(graph_ms(lambda x=x, w=w: x @ w.t()) for x, w in zip(xs, ws))
        recs.append(dict(M=M, impl="cublas", ms=t_cublas, TBps=wbytes / t_cublas / 1e9))
        print(json.dumps(recs[-1]), flush=True)
        for cfg in configs:
            tf.GEMV_CONFIG = cfg
            try:
                t = sum(graph_ms(lambda x=x, w=w: tf.gemv(x, w)) for x, w in zip(xs, ws))
            except Exception as e:  # noqa: BLE001 (e.g. out of shared memory)
                recs.append(dict(M=M, impl="triton", config=cfg, error=str(e)[:100]))
                continue
            recs.append(dict(M=M, impl="triton", config=cfg, ms=t, TBps=wbytes / t / 1e9))
    good = [r for r in recs if r["impl"] == "triton" and "ms" in r]
    # best config = lowest summed time over the M values
    tot = {}
    for r in good:
        tot.setdefault(tuple(r["config"]), []).append(r["ms"])
    nm = len(args.ms.split(","))
    best = min((c for c, v in tot.items() if len(v) == nm), key=lambda c: sum(tot[c]))
    for r in recs:
        if r["impl"] == "cublas" or tuple(r.get("config", ())) == best:
            print(json.dumps(r), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(records=recs, best=best, gpu=torch.cuda.get_device_name()), f, indent=1)
    print("best " + ",".join(map(str, best)))


if __name__ == "__main__":
    main()
