#!/usr/bin/env python
"""The verify-window conv (``triton_chain.conv_verify``, W = 4 kernel) alone: launch configs side by side.

Cases as the decode runtime launches them (issue 6), with both GDN-1.3B shapes' conv width
(C = 6144 channels: q | k | v, x a column slice of the fused in-projection output, bf16):

* ``verify``: a SpecLA / snapshot step's target layer: T = 1 + K tokens per row, factor bank write,
  pending raw inputs of the previous step (a random accepted prefix 1..T) read for the deferred
  conv commit;
* ``ar``: a decode / draft step: T = 1, the window after the token written (``write_final_state``).

Each config ``(BC, TB, num_warps)`` of :func:`vllm_specla.ops.triton_chain._conv4_config` is timed
in a CUDA graph over ``--layers`` launches on distinct tensors (so no layer reads another's data
from L2), median replay per launch in us, with the effective bandwidth of the bytes the launch must
move (x, y, bank write, pending rows, conv window read / write). ``TB = 1`` is the token loop of
session 8 (one input load in flight per thread); the ``default`` row is the config that the
heuristic picks. Prints a table per case and writes JSON to ``--out``.

    python benchmarks/bench_conv.py --batches 64,256 --out $OUT/conv.json
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
from _flags import check_out, parse_list  # noqa: E402

from vllm_specla.ops import triton_chain as tc  # noqa: E402

CONFIGS = [(bc, tb, nw) for bc in (256, 512, 1024) for tb in (1, 4, 8) for nw in (2, 4)]


def make_layers(mode: str, R: int, T: int, C: int, layers: int, dev: str, seed: int = 0):
    """Per-layer inputs of one case: ``(x, weight, cu, conv_state, slots, kw, bytes)``."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    N = R * T
    out = []
    for _ in range(layers):
        wide = torch.randn(N, C + 2064, device=dev, generator=gen).to(torch.bfloat16)  # + gate | a | b
        x = wide[:, :C]
        w = torch.randn(C, 4, device=dev, generator=gen).to(torch.bfloat16)
        cs = torch.randn(R, 3, C, device=dev, generator=gen)
        slots = torch.arange(R, device=dev)
        cu = torch.arange(R + 1, device=dev) * T
        nbytes = N * C * (2 + 4) + 2 * 3 * R * C * 4  # x, y, window read + write
        if mode == "verify":
            bank = torch.randn(R, 2, T, C, device=dev, generator=gen)
            pend = torch.randint(1, T + 1, (R,), device=dev, generator=gen)
            kw = dict(bank_x=bank, write_bank=torch.ones(R, dtype=torch.long, device=dev), pending_len=pend,
                      read_bank=torch.zeros(R, dtype=torch.long, device=dev))
            nbytes += N * C * 4 + int(pend.clamp(max=3).sum()) * C * 4  # bank write, pending rows
        else:
            kw = dict(write_final_state=True)
        out.append((x, w, cu, cs, slots, kw, nbytes))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--T", type=int, default=5, help="verify window (1 + K)")
    ap.add_argument("--C", type=int, default=6144)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--modes", default="verify,ar")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    modes = parse_list(ap, "--modes", args.modes, choices=["verify", "ar"])
    batches = parse_list(ap, "--batches", args.batches)
    if args.T < 1 or args.C < 1 or args.layers < 1:
        ap.error(f"--T, --C and --layers: each must be an int >= 1, got {args.T} / {args.C} / {args.layers}")
    check_out(ap, "--out", args.out)
    if not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times GPU kernels")
    dev = "cuda"
    default_cfg = tc._conv4_config
    recs = []
    for mode in modes:
        for R in batches:
            T = args.T if mode == "verify" else 1
            L = make_layers(mode, R, T, args.C, args.layers, dev)
            nbytes = sum(layer[-1] for layer in L) / len(L)
            dflt = default_cfg(R, args.C, R * T)
            rows = []
            for cfg in [dflt] + [c for c in CONFIGS if c != dflt]:
                tc._conv4_config = lambda *_a, cfg=cfg: cfg

                def body(L=L):
                    for x, w, cu, cs, slots, kw, _ in L:
                        tc.conv_verify(x, w, cu, cs, slots, **kw)

                us = bk.time_graph(body, len(L))
                rows.append(dict(mode=mode, batch=R, T=T, C=args.C, BC=cfg[0], TB=cfg[1], num_warps=cfg[2],
                                 default=cfg == dflt, us=us, bytes=nbytes, tb_s=nbytes / us / 1e6,
                                 gpu=torch.cuda.get_device_name()))
            tc._conv4_config = default_cfg
            base = min((r for r in rows if r["TB"] == 1), key=lambda r: r["us"])
            best = min(rows, key=lambda r: r["us"])
            d = rows[0]
            print(f"{mode:6s} B={R:<4d} T={T} C={args.C}: default (BC={d['BC']}, TB={d['TB']}, warps={d['num_warps']}) "
                  f"{d['us']:7.2f} us {d['tb_s']:.2f} TB/s | best TB=1 {base['us']:7.2f} us | best "
                  f"(BC={best['BC']}, TB={best['TB']}, warps={best['num_warps']}) {best['us']:7.2f} us {best['tb_s']:.2f} TB/s",
                  flush=True)
            recs += rows
            del L
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
