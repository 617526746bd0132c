#!/usr/bin/env python
"""Prefill of one GDN layer's recurrence (``ops/prefill.py`` ``chunk_prefill``): fla's chunk kernel
against the plain-torch reference the vLLM path used before (``chunk_gated_delta_rule_ref``: a
Python loop over rows and 64-token chunks), side by side in one run.

Per case (head shape, R prompts of P tokens each, fp32 q/k/v as ``gdn_mix`` passes them, random
initial states): the median wall time of ``--iters`` calls after a warm-up, CUDA-synchronised
(eager: the reference launches hundreds of kernels and cannot be graph-captured with its host-side
row loop; fla's wrapper computes chunk indices on the host). Also the relative error of fla's
output against the reference. Prints a table and writes JSON to ``--out``.

Then the prompt's short conv, same cases, 4 taps over ``C = 2 H K + HV V`` channels, records with
``"op": "conv"``: the batched torch form (``causal_conv1d_prefill_batched``: all rows at once, no host
sync; checked equal bit for bit) against the per-row reference (``causal_conv1d_prefill_ref``: two
host syncs per row), and on CUDA our Triton verify-window conv (``causal_conv1d_prefill_triton``, the
CUDA default) and fla's Triton conv (the library baseline), with their max abs error against the
reference. ``--device cpu`` times only the batched form and the reference.

    python benchmarks/bench_prefill.py --rows 1,16,64 --lens 512,2048 --out $OUT/prefill.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _flags import check_out, parse_list  # noqa: E402

from vllm_specla.ops import prefill  # noqa: E402
from vllm_specla.ops.reference import causal_conv1d_prefill_ref, chunk_gated_delta_rule_ref  # noqa: E402

SHAPES = {"flame": (6, 6, 256, 512), "map": (8, 8, 256, 256)}  # (H, HV, K, V), GPU_BASELINE.md


def inputs(shape, R, P, dev, seed=0):
    H, HV, K, V = shape
    gen = torch.Generator(device=dev).manual_seed(seed)
    N = R * P
    q = torch.randn(N, H, K, device=dev, generator=gen)
    k = torch.randn(N, H, K, device=dev, generator=gen)
    v = torch.randn(N, HV, V, device=dev, generator=gen)
    g = -torch.rand(N, HV, device=dev, generator=gen) * 0.3 - 0.01
    beta = torch.rand(N, HV, device=dev, generator=gen) * 0.9 + 0.05
    cu = torch.arange(R + 1, device=dev) * P
    h0 = torch.randn(R, HV, V, K, device=dev, generator=gen) * 0.1
    return q, k, v, g, beta, K ** -0.5, cu, h0


def timed(fn, iters: int) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _fla_conv():
    try:
        from fla.modules.causal_conv1d import causal_conv1d  # noqa: PLC0415
    except Exception:
        return None
    return causal_conv1d


def fla_conv_prefill(x, weight, cu_seqlens, conv_state, slots, has_initial_state):
    """fla 0.6's Triton varlen conv (``fla/modules/causal_conv1d/ops.py``, SiLU fused) with our conv
    windows: ``[slots, W-1, C]`` histories as its ``[R, C, W]`` initial states (column 0 unused),
    the last ``W-1`` columns of its final states written back (session 42 shipped it briefly as the
    CUDA prompt conv; our Triton conv was faster in 11 of 12 cases, prefill_conv_h100_s42c.json)."""
    R, W = cu_seqlens.numel() - 1, weight.shape[-1]
    s = slots[:R]
    hist = conv_state.index_select(0, s).float()
    hist = torch.where(has_initial_state[:R, None, None], hist, torch.zeros_like(hist))
    h0 = hist.new_zeros(R, weight.shape[0], W)
    h0[:, :, 1:] = hist.transpose(1, 2)
    y, final = _fla_conv()(x.float().unsqueeze(0), weight.float(), None, None, initial_state=h0,
                           output_final_state=True, activation="silu", backend="triton", cu_seqlens=cu_seqlens.long())
    conv_state.index_copy_(0, s, final[:, :, 1:].transpose(1, 2).to(conv_state.dtype))
    return y[0].float()


def conv_rows(args, dev: str) -> list[dict]:
    """The prompt conv, batched against the per-row reference (one layer, 4 taps, random windows)."""
    out = []
    name_dev = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"\n{name_dev}: the prompt's short conv, one layer, median of {args.iters} calls")
    print("| shape | rows | tokens/row | channels | batched ms | per-row reference ms | speedup |")
    print("|---|---|---|---|---|---|---|")
    for name in args.shapes:
        H, HV, K, V = SHAPES[name]
        C = 2 * H * K + HV * V
        for R in args.rows:
            for P in args.lens:
                gen = torch.Generator(device=dev).manual_seed(R * 7 + P)
                x = torch.randn(R * P, C, device=dev, generator=gen)
                w = torch.randn(C, 4, device=dev, generator=gen)
                cu = torch.arange(R + 1, device=dev) * P
                conv = torch.randn(R, 3, C, device=dev, generator=gen)
                slots = torch.arange(R, device=dev)
                has_init = torch.arange(R, device=dev) % 2 == 0  # half the rows continue an earlier state
                c1, c2 = conv.clone(), conv.clone()
                same = torch.equal(prefill.causal_conv1d_prefill_batched(x, w, cu, c1, slots, has_init),
                                   causal_conv1d_prefill_ref(x, w, cu, c2, slots, has_init)) and torch.equal(c1, c2)
                t_new = timed(lambda: prefill.causal_conv1d_prefill_batched(x, w, cu, conv, slots, has_init),  # noqa: B023
                              args.iters)
                t_ref = timed(lambda: causal_conv1d_prefill_ref(x, w, cu, conv, slots, has_init),  # noqa: B023
                              args.iters)
                rec = dict(op="conv", shape=name, channels=C, rows=R, tokens_per_row=P, batched_ms=1e3 * t_new,
                           ref_ms=1e3 * t_ref, speedup=t_ref / t_new, bitwise_equal=same, device=name_dev)
                if dev == "cuda":  # our Triton verify-window conv on whole prompts (the CUDA default)
                    def tri(cs):
                        return prefill.causal_conv1d_prefill_triton(x, w, cu, cs, slots, has_init)  # noqa: B023

                    c3, c4 = conv.clone(), conv.clone()
                    y3 = tri(c3)
                    y4 = causal_conv1d_prefill_ref(x, w, cu, c4, slots, has_init)
                    err = max(float((y3 - y4).abs().max()), float((c3 - c4).abs().max()))
                    t_tri = timed(lambda: tri(conv), args.iters)  # noqa: B023
                    rec.update(triton_ms=1e3 * t_tri, triton_max_abs_err=err)
                    if _fla_conv() is not None:  # fla's Triton varlen conv, the library baseline
                        c3 = conv.clone()
                        y3 = fla_conv_prefill(x, w, cu, c3, slots, has_init)
                        err = max(float((y3 - y4).abs().max()), float((c3 - c4).abs().max()))
                        t_fla = timed(lambda: fla_conv_prefill(x, w, cu, conv, slots, has_init),  # noqa: B023
                                      args.iters)
                        rec.update(fla_ms=1e3 * t_fla, fla_max_abs_err=err, fla_speedup_vs_ref=t_ref / t_fla)
                out.append(rec)
                tri_s = f" triton {rec['triton_ms']:.3f} ms (err {rec['triton_max_abs_err']:.1e})" if "triton_ms" in rec else ""
                tri_s += f" fla {rec['fla_ms']:.3f} ms (err {rec['fla_max_abs_err']:.1e})" if "fla_ms" in rec else ""
                print(f"| {name} | {R} | {P} | {C} | {rec['batched_ms']:.3f} | {rec['ref_ms']:.3f} | "
                      f"{rec['speedup']:.1f}x{'' if same else ' (NOT EQUAL)'} |{tri_s}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="flame,map")
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--lens", default="512,2048")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--ref-max-tokens", type=int, default=64 * 2048,
                    help="skip the reference above this many tokens per call (it is slow)")
    ap.add_argument("--ops", default="chunk,conv", help="which ops to time: chunk (fla vs reference), conv")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: only the conv rows (fla needs CUDA)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.shapes = parse_list(ap, "--shapes", args.shapes, choices=list(SHAPES))
    args.rows, args.lens = parse_list(ap, "--rows", args.rows), parse_list(ap, "--lens", args.lens)
    ops = parse_list(ap, "--ops", args.ops, choices=["chunk", "conv"])
    if args.iters < 1:
        ap.error(f"--iters: must be an int >= 1, got {args.iters}")
    check_out(ap, "--out", args.out)
    if args.device == "cpu":
        return finish(args, conv_rows(args, "cpu"))
    if not torch.cuda.is_available():
        ap.error("no CUDA device: --device cuda times fla's chunk kernel (--device cpu: the conv rows only)")
    os.environ["VLLM_SPECLA_PREFILL"] = "auto"
    rows_out = [] if "chunk" in ops else None
    if rows_out is None:
        return finish(args, conv_rows(args, "cuda"))
    print(f"{torch.cuda.get_device_name()}, fp32 inputs, one layer's recurrence, median of {args.iters} calls")
    print("| shape | rows | tokens/row | fla ms | reference ms | speedup | rel err |")
    print("|---|---|---|---|---|---|---|")
    for name in args.shapes:
        for R in args.rows:
            for P in args.lens:
                a = inputs(SHAPES[name], R, P, "cuda")
                assert prefill.prefill_backend(a[0]) == "fla"
                t_fla = timed(lambda: prefill.chunk_prefill(*a), args.iters)  # noqa: B023
                rec = dict(shape=name, heads=SHAPES[name], rows=R, tokens_per_row=P, fla_ms=1e3 * t_fla,
                           ref_ms=None, speedup=None, rel_err=None, device=torch.cuda.get_device_name())
                if R * P <= args.ref_max_tokens:
                    t_ref = timed(lambda: chunk_gated_delta_rule_ref(*a[:7], initial_state=a[7]),  # noqa: B023
                                  max(1, args.iters // 2))
                    o, f = prefill.chunk_prefill(*a)
                    o_r, f_r = chunk_gated_delta_rule_ref(*a[:7], initial_state=a[7])
                    err = max(float((o - o_r).norm() / o_r.norm()), float((f - f_r).norm() / f_r.norm()))
                    rec.update(ref_ms=1e3 * t_ref, speedup=t_ref / t_fla, rel_err=err)
                rows_out.append(rec)
                ref = "-" if rec["ref_ms"] is None else f"{rec['ref_ms']:.2f}"
                sp = "-" if rec["speedup"] is None else f"{rec['speedup']:.1f}x"
                er = "-" if rec["rel_err"] is None else f"{rec['rel_err']:.1e}"
                print(f"| {name} | {R} | {P} | {rec['fla_ms']:.3f} | {ref} | {sp} | {er} |", flush=True)
    if "conv" in ops:
        rows_out += conv_rows(args, "cuda")
    return finish(args, rows_out)


def finish(args, rows_out: list[dict]) -> int:
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows_out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
