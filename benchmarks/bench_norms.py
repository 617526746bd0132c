#!/usr/bin/env python
"""The runtime's two norm kernels alone (``ops/triton_fused.py``): launch configs side by side.

* ``gated``: :func:`~vllm_specla.ops.triton_fused.gated_rms_norm` after the recurrent kernel
  (``o [N, HV, V]`` fp32, bf16 gate and output), configs ``(BH value heads per program, num_warps)``;
* ``rms``: :func:`~vllm_specla.ops.triton_fused.rms_norm` before the in-projection / MLP GEMMs
  (``[N, D]`` bf16), configs ``num_warps``.

Token rows ``N`` as the runtime launches them (e.g. 320 = batch 64 x T = 5 verify, 64 = an AR or
draft step at batch 64). Each config is timed in a CUDA graph over ``--layers`` launches on distinct
tensors, median replay per launch in us, with the effective bandwidth of the bytes moved. The
``default`` row is what the heuristic picks. Prints a line per case, writes JSON to ``--out``.

    python benchmarks/bench_norms.py --rows 64,320,1280 --out $OUT/norms.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_kernels as bk  # noqa: E402  (time_graph)
from _flags import check_out, parse_list, parse_tuple  # noqa: E402

from vllm_specla.ops import triton_fused as tf  # noqa: E402

GATED = [(bh, nw) for bh in (1, 2, 4, 8) for nw in (1, 2, 4, 8)]
RMS = [1, 2, 4, 8, 16]


def _report(kind, shape, rows):
    d, best = rows[0], min(rows, key=lambda r: r["us"])
    print(f"{kind:5s} {shape:10s} N={d['N']:<5d} default {d['cfg']} {d['us']:6.2f} us {d['tb_s']:.2f} TB/s | "
          f"best {best['cfg']} {best['us']:6.2f} us {best['tb_s']:.2f} TB/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="64,320,1280")
    ap.add_argument("--heads", default="8x256,6x512", help="HV x V of the gated norm")
    ap.add_argument("--D", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    row_counts = parse_list(ap, "--rows", args.rows)
    heads = [parse_tuple(ap, "--heads", h, 2, sep="x", what="HV x V") for h in parse_list(ap, "--heads", args.heads,
                                                                                       kind=str)]
    if args.D < 1 or args.layers < 1:
        ap.error(f"--D and --layers: each must be an int >= 1, got {args.D} / {args.layers}")
    check_out(ap, "--out", args.out)
    if not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times GPU kernels")
    dev, bf = "cuda", torch.bfloat16
    gpu = torch.cuda.get_device_name()
    recs = []
    g_default, r_default = tf._gated_norm_config, tf._rms_norm_warps
    for N in row_counts:
        for HV, V in heads:
            L = [(torch.randn(N, HV, V, device=dev), torch.randn(N, HV * V + 32, device=dev).to(bf)[:, 32:],
                  torch.rand(V, device=dev) + 0.5) for _ in range(args.layers)]
            nbytes = N * HV * V * (4 + 2 + 2)
            dflt = g_default(N, HV, V)
            rows = []
            for cfg in [dflt] + [c for c in GATED if c != dflt]:
                tf._gated_norm_config = lambda *_a, cfg=cfg: cfg

                def body(L=L):
                    for o, gate, w in L:
                        tf.gated_rms_norm(o, gate, w, 1e-5, "swish", bf)

                us = bk.time_graph(body, len(L))
                rows.append(dict(kind="gated", N=N, HV=HV, V=V, cfg=cfg, default=cfg == dflt, us=us,
                                 tb_s=nbytes / us / 1e6, gpu=gpu))
            tf._gated_norm_config = g_default
            _report("gated", f"{HV}x{V}", rows)
            recs += rows
        D = args.D
        L = [(torch.randn(N, D + 64, device=dev).to(bf)[:, 64:], torch.rand(D, device=dev) + 0.5)
             for _ in range(args.layers)]
        dflt = r_default(N, triton_pow2(D))
        rows = []
        for nw in [dflt] + [w for w in RMS if w != dflt]:
            tf._rms_norm_warps = lambda *_a, nw=nw: nw

            def body(L=L):
                for x, w in L:
                    tf.rms_norm(x, w, 1e-6, bf)

            us = bk.time_graph(body, len(L))
            rows.append(dict(kind="rms", N=N, D=D, cfg=nw, default=nw == dflt, us=us, tb_s=N * D * 4 / us / 1e6, gpu=gpu))
        tf._rms_norm_warps = r_default
        _report("rms", f"D={D}", rows)
        recs += rows
    if args.out:
        with open(args.out, "w") as f:
            json.dump(recs, f, indent=1)


def triton_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


if __name__ == "__main__":
    main()
