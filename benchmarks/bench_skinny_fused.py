"""The skinny GEMM's fused forms against their unfused kernel chains, per GEMM of a GDN block's
verify window (``ops/fused.py`` with ``SKINNY_FUSED`` on / off), inside CUDA graphs.

Each form runs as a chain of ``--layers`` calls on distinct weights (one block stack's worth, so the
weights stream from HBM as in a step), captured in one graph; prints us per call and writes JSON:

  rms      fused.linear(x, w, norm_weight)            (the MLP's gate|up projection)
  rms+g    fused.linear_gating(x, w_in, norm_weight)  (the in-projection and the GDN gating)
  gated    fused.gated_norm_linear(o, gate, ...)      (the out-projection, float32 o)
  silu     fused.silu_mul_linear(gu, w_down, h)       (the down-projection, the residual in place)
  plain    _cpp.skinny_gemm(x, w) without a prologue  (the bare GEMM of the rms form's shape)

Usage: python benchmarks/bench_skinny_fused.py [--shapes flame,map] [--rows 5,7] [--out FILE].
Needs CUDA and nvcc (``_cpp.load_cuda_gemm``). RESULTS.md, session 24.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_timing import graph_ms  # noqa: E402

# (hidden, key heads, key dim, value heads, value dim, MLP intermediate): GPU_BASELINE.md
SHAPES = {"flame": (2048, 6, 256, 6, 512, 5632), "map": (2048, 8, 256, 8, 256, 5632)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="flame,map")
    ap.add_argument("--rows", default="5,7")
    ap.add_argument("--layers", type=int, default=21)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for s in args.shapes.split(","):
        if s not in SHAPES:
            raise SystemExit(f"--shapes: each must be one of {sorted(SHAPES)}, got {s!r}")
    from vllm_specla.ops import _cpp, fused  # noqa: PLC0415

    if not torch.cuda.is_available() or not _cpp.load_cuda_gemm():
        raise SystemExit("needs CUDA and the skinny GEMM (nvcc)")
    dev, bf = "cuda", torch.bfloat16
    recs = []
    for shape in args.shapes.split(","):
        D, H, Kd, HV, V, I = SHAPES[shape]
        C, G = 2 * H * Kd + HV * V, HV * V
        n_in = C + G + 2 * HV
        n_in += -n_in % 8
        L = args.layers

        def w(n, k):
            return [torch.randn(n, k, device=dev).to(bf) * 0.02 for _ in range(L)]

        w_in, w_gu, w_o, w_dn = w(n_in, D), w(2 * I, D), w(D, G), w(D, I)
        nw, onw = torch.rand(D, device=dev) + 0.5, torch.rand(V, device=dev) + 0.5
        A_log, dt_bias = torch.rand(HV, device=dev), torch.randn(HV, device=dev)
        for M in (int(m) for m in args.rows.split(",")):
            x = torch.randn(M, D, device=dev).to(bf)
            o = torch.randn(M, HV, V, device=dev)
            p = torch.randn(M, n_in, device=dev).to(bf)
            gu = torch.randn(M, 2 * I, device=dev).to(bf)
            h = torch.randn(M, D, device=dev).to(bf)
            forms = {
                "rms": lambda: [fused.linear(x, w_gu[i], nw, 1e-6) for i in range(L)],
                "rms+g": lambda: [fused.linear_gating(x, w_in[i], nw, 1e-6, C + G, A_log, dt_bias) for i in range(L)],
                "gated": lambda: [fused.gated_norm_linear(o, p[:, C:C + G], onw, 1e-6, "swish", w_o[i], residual=h,
                                                          residual_inplace=True) for i in range(L)],
                "silu": lambda: [fused.silu_mul_linear(gu, w_dn[i], residual=h, residual_inplace=True) for i in range(L)],
            }
            for name, fn in forms.items():
                us = {}
                for on in (True, False):
                    fused.SKINNY_FUSED = on
                    us[on] = 1e3 * graph_ms(fn, replays=5) / L
                fused.SKINNY_FUSED = True
                rec = dict(shape=shape, M=M, form=name, fused_us=round(us[True], 2), unfused_us=round(us[False], 2),
                           ratio=round(us[True] / us[False], 3))
                recs.append(rec)
                print(json.dumps(rec))
            xb = x
            plain = 1e3 * graph_ms(lambda: [_cpp.skinny_gemm(xb, w_gu[i]) for i in range(L)], replays=5) / L
            rec = dict(shape=shape, M=M, form="plain", fused_us=round(plain, 2))
            recs.append(rec)
            print(json.dumps(rec))
    print(f"{'shape':6} {'M':>2} {'form':6} {'fused us':>9} {'unfused us':>10} {'ratio':>6}")
    for r in recs:
        print(f"{r['shape']:6} {r['M']:>2} {r['form']:6} {r['fused_us']:>9} {r.get('unfused_us', ''):>10} "
              f"{r.get('ratio', ''):>6}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), records=recs), f, indent=1)


if __name__ == "__main__":
    main()
