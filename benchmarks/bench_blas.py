#!/usr/bin/env python
"""The decode GEMMs under cuBLAS settings and the row GEMV (issue 6, "AR step at batch 1 <= 0.9 ms"), one GPU.

The AR step at batch 1 is GEMV-bound: its GEMMs alone took 1.07 ms of the 1.47 ms step at
2.48 TB/s against a weight-read floor of 0.61 ms (benchmarks/RESULTS.md, session 4), and the
session-10 profile shows cuBLASLt ``nvjet`` tiles with split-K plus ``splitKreduce_kernel``
launches. This script times the step's GEMMs in the shapes the runtime issues them
(``runtime/fused_model.py``: the in-projection and the gate|up projection, o_proj and down with
the residual added in place, the LM head), without their prologues (the norms / SwiGLU), on the
model's own distinct weights per layer (so they stream from HBM as in the real step), as one
CUDA graph per setting. Since session 11 the runtime runs one-row GEMMs on the row GEMV (with
the prologues fused, ``ops/fused.py``) and every other GEMM on cuBLAS with torch's defaults.
The settings:

  default      cuBLAS with torch's defaults (``x @ w.T``, ``residual.addmm_(x, w.T)``)
  cublas       ``torch.backends.cuda.preferred_blas_library("cublas")``
  cublaslt     ``torch.backends.cuda.preferred_blas_library("cublaslt")``
  no_reduced   ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False``
  w_x          (M = 1 only) ``w @ x.T`` (an [N, 1] result, the same memory as [1, N]): the
               GEMV orientation, N = 1
  rows:BN:BK:W not cuBLAS: ``ops/triton_fused.py`` ``gemv_rows`` (CUDA-core row GEMV,
               each weight chunk loaded once for all M <= 16 rows, the residual adds in place,
               programmatic dependent launch as ``ops/pdl.py`` has it) at config (BN, BK,
               num_warps); ``--rows-sweep`` adds a grid of them (M <= 2), ``--multi-sweep``
               another (M >= 2)
  rows-nopdl:...  the same without programmatic dependent launch
  skinny:W:U   not cuBLAS: the CUDA skinny GEMM (``csrc/cuda/skinny_gemm.cu``, ``ops/_cpp.py``
               ``skinny_gemm``; tensor-core MMAs with the weight as the A operand, M <= 16) at W
               warps per CTA and U k-chunks per load batch (0:0 = automatic), with programmatic
               dependent launch; ``--skinny-sweep`` adds a grid of them
  skinny-nopdl:W:U  the same without programmatic dependent launch
  skinny-pf:W:U:MB  skinny:W:U, each GEMM prefetching the first MB MiB of the next GEMM's weight
               into L2 (``skinny_gemm(prefetch=...)``; RESULTS.md session 17)

Prints ms per step of GEMMs, weight TB/s and the ratio to ``default`` per setting and M (token
rows: 1 = AR at batch 1, 5 = a K = 4 verify window at batch 1, 9 = K = 8), and writes JSON to
``--out``. Results are bitwise compared with ``default`` (``max_abs_diff``; split-K changes the
summation order, so small differences are expected and reported, not hidden). ``--dry-cpu`` runs
every setting's code path once on tiny CPU tensors (no timing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flags import check_out, parse_list  # noqa: E402

SETTINGS = ["default", "cublas", "cublaslt", "no_reduced", "w_x"]
# (BN, BK, num_warps) of the row GEMV; BK = 0: one tile per program (skipped where BN * next_pow2(K)
# > 32768 elements: the tile would spill)
ROWS_SWEEP = [(bn, bk, nw) for bn in (2, 4, 8, 16) for bk in (0, 1024) for nw in (4, 8)] + [(1, 0, 2), (1, 0, 4),
                                                                                           (2, 0, 2), (4, 512, 4)]
# (BN, BK, num_warps) for M >= 2 token rows (the verify windows at batch 1)
SKINNY_SWEEP = [(0, 0), (4, 4), (4, 8), (8, 4), (8, 8), (16, 4), (16, 8)]
MULTI_SWEEP = [(2, 1024, 4), (4, 512, 4), (4, 1024, 4), (4, 1024, 8), (8, 512, 8), (8, 1024, 8), (8, 1024, 4),
               (16, 512, 8), (16, 1024, 8)]


@contextlib.contextmanager
def setting(name: str):
    """Apply one setting for the block (capture happens inside it), then restore torch's state."""
    lib0 = torch.backends.cuda.preferred_blas_library() if torch.cuda.is_available() else None
    red0 = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    try:
        if name in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(name)
        if name == "no_reduced":
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        yield
    finally:
        if lib0 is not None:
            torch.backends.cuda.preferred_blas_library(lib0)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = red0


def make_step(weights, head, M: int, D: int, form: str, device, dtype):
    """The step's GEMMs over ``weights`` ([(w_in, w_o, w_gu, w_down)] per layer) and ``head``, on
    fixed input buffers (graph-safe); returns (fn, outputs) where outputs are the tensors the
    step writes (compared across settings)."""
    gen = torch.Generator(device="cpu").manual_seed(M)
    xs = [torch.randn(M, w.shape[1], generator=gen).to(device=device, dtype=dtype)
          for w in (weights[0][0], weights[0][1], weights[0][2], weights[0][3])]
    h0 = torch.randn(M, D, generator=gen).to(device=device, dtype=dtype)
    res = torch.empty_like(h0)
    outs = {}

    rows = form.startswith("rows")  # the row GEMV, not cuBLAS
    if rows:
        import functools  # noqa: PLC0415

        from vllm_specla.ops import triton_fused as tf  # noqa: PLC0415

        kind, *cfg = form.split(":")
        cfg = tuple(int(v) for v in cfg)
        gemv = functools.partial(tf.gemv_rows, pdl=False) if kind == "rows-nopdl" else tf.gemv_rows

    skinny = form.startswith("skinny")
    if skinny:
        import functools  # noqa: PLC0415

        from vllm_specla.ops import _cpp  # noqa: PLC0415

        kind, wv, uv, *mb = form.split(":")
        sg = functools.partial(_cpp.skinny_gemm, warps=int(wv), unroll=int(uv), pdl=kind != "skinny-nopdl")
        pf_bytes = int(mb[0]) << 20 if mb else 0
        # the chain's weights in launch order: each GEMM prefetches the next one's (skinny-pf)
        order = [w for ws in weights for w in ws] + [head]
        nxt = {id(a): b for a, b in zip(order, order[1:] + order[:1])}  # (the head: the next replay's first)

        def pf(w):
            if not pf_bytes:
                return {}
            n = nxt[id(w)]
            return dict(prefetch=n, prefetch_bytes=min(pf_bytes, n.numel() * n.element_size()) // 16 * 16)

    def fn():
        res.copy_(h0)
        for w_in, w_o, w_gu, w_down in weights:
            if skinny:
                outs["p"] = sg(xs[0], w_in, **pf(w_in))
                sg(xs[1], w_o, res, out=res, **pf(w_o))
                outs["gu"] = sg(xs[2], w_gu, **pf(w_gu))
                sg(xs[3], w_down, res, out=res, **pf(w_down))
            elif rows:
                outs["p"] = gemv(xs[0], w_in, config=cfg)
                gemv(xs[1], w_o, residual=res, out=res, config=cfg)
                outs["gu"] = gemv(xs[2], w_gu, config=cfg)
                gemv(xs[3], w_down, residual=res, out=res, config=cfg)
            elif form == "w_x":  # [N, 1] results (M = 1): the same memory as [1, N]
                outs["p"] = w_in @ xs[0].t()
                res.view(D, 1).addmm_(w_o, xs[1].t())
                outs["gu"] = w_gu @ xs[2].t()
                res.view(D, 1).addmm_(w_down, xs[3].t())
            else:
                outs["p"] = xs[0] @ w_in.t()
                res.addmm_(xs[1], w_o.t())
                outs["gu"] = xs[2] @ w_gu.t()
                res.addmm_(xs[3], w_down.t())
        if skinny:
            outs["logits"] = sg(res, head, **pf(head))
        elif rows:
            outs["logits"] = gemv(res, head, config=cfg)
        else:
            outs["logits"] = (head @ res.t()).t() if form == "w_x" else res @ head.t()

    return fn, outs, res


def check_settings(settings: list[str]) -> None:
    """Raise ``SystemExit`` naming the first malformed setting (checked before the ~1 minute build):
    names of :data:`SETTINGS`, ``rows:BN:BK:W`` / ``rows-nopdl:BN:BK:W``, ``skinny:W:U`` /
    ``skinny-nopdl:W:U`` (W, U one of the op's configs) and ``skinny-pf:W:U:MB``."""
    from vllm_specla.ops import _cpp as _cpp_mod  # noqa: PLC0415

    for n in settings:
        kind, _, cfg = n.partition(":")
        if n in SETTINGS:
            continue
        if kind in ("rows", "rows-nopdl"):
            try:
                rc = tuple(int(v) for v in cfg.split(":"))
            except ValueError:
                rc = ()
            if len(rc) != 3 or rc[0] < 1 or rc[1] < 0 or rc[2] < 1:
                raise SystemExit(f"setting {n!r}: row-GEMV settings are rows:BN:BK:W / rows-nopdl:BN:BK:W with "
                                 f"integers BN >= 1, BK >= 0 (0: one tile), W >= 1 warps")
            continue
        if kind not in ("skinny", "skinny-nopdl", "skinny-pf"):
            raise SystemExit(f"setting {n!r}: not one of {', '.join(SETTINGS)}, rows:BN:BK:W, rows-nopdl:BN:BK:W, "
                             f"skinny:W:U, skinny-nopdl:W:U, skinny-pf:W:U:MB")
        if kind in ("skinny", "skinny-nopdl", "skinny-pf"):
            try:
                wu = tuple(int(v) for v in cfg.split(":"))
            except ValueError:
                wu = ()
            if kind == "skinny-pf" and (len(wu) != 3 or wu[2] < 1):
                raise SystemExit(f"setting {n!r}: skinny-pf settings are skinny-pf:W:U:MB (MB >= 1: MiB of the next "
                                 f"GEMM's weight prefetched into L2)")
            if kind == "skinny-pf":
                wu = wu[:2]
            if wu not in _cpp_mod._SKINNY_CONFIGS:
                raise SystemExit(f"setting {n!r}: skinny settings are skinny:W:U / skinny-nopdl:W:U / skinny-pf:W:U:MB "
                                 f"with W in 4 / 8 / 16 and U in 4 / 8 (or 0:0, automatic)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="flame,map")
    ap.add_argument("--ms", default="1,5,9")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--rows-sweep", action="store_true", help="add the ROWS_SWEEP row-GEMV configs (M <= 2)")
    ap.add_argument("--multi-sweep", action="store_true", help="add the MULTI_SWEEP row-GEMV configs (M >= 2)")
    ap.add_argument("--skinny-sweep", action="store_true", help="add the SKINNY_SWEEP skinny-GEMM configs (M <= 16)")
    ap.add_argument("--layers", type=int, default=None, help="use only the first N layers (default: all)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-cpu", action="store_true", help="every setting's code path once on tiny CPU tensors")
    args = ap.parse_args()
    settings = parse_list(ap, "--settings", args.settings, kind=str)  # (names: check_settings below)
    shapes = parse_list(ap, "--shapes", args.shapes, choices=["flame", "map", "tiny"])  # (bench_e2e.SHAPES)
    m_rows = parse_list(ap, "--ms", args.ms)  # (not `ms`: the loop below times into that name)
    if args.layers is not None and args.layers < 1:
        ap.error(f"--layers: must be an int >= 1, got {args.layers}")
    check_out(ap, "--out", args.out)
    if not args.dry_cpu and not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times GPU GEMMs; on a CPU, --dry-cpu runs every setting once")
    if args.rows_sweep:
        settings += [f"rows:{bn}:{bk}:{nw}" for bn, bk, nw in ROWS_SWEEP]
    if args.multi_sweep:
        settings += [f"rows:{bn}:{bk}:{nw}" for bn, bk, nw in MULTI_SWEEP if f"rows:{bn}:{bk}:{nw}" not in settings]
    if args.skinny_sweep:
        settings += [f"skinny:{w}:{u}" for w, u in SKINNY_SWEEP if f"skinny:{w}:{u}" not in settings]
    dev = "cpu" if args.dry_cpu else "cuda"
    from vllm_specla.ops import _cpp as _cpp_mod  # noqa: PLC0415

    check_settings(settings)
    if any(n.startswith("skinny") for n in settings):
        if args.dry_cpu:
            settings = [n for n in settings if not n.startswith("skinny")]
            print("skinny settings skipped (a CUDA kernel)")
        else:
            if not _cpp_mod.load_cuda_gemm():
                raise SystemExit("the CUDA skinny GEMM did not build (ops/_cpp.py load_cuda_gemm)")
    dtype = torch.float32 if args.dry_cpu else torch.bfloat16
    recs = []
    for shape in shapes:
        # the runtime's own weights (bench_e2e.build: random bf16 at the shape's config), so the shapes,
        # the in-projection's padding and the layer count are the real step's
        from bench_e2e import build  # noqa: PLC0415

        _, tgt, dr = build("tiny" if args.dry_cpu else shape, dev, dtype)
        del dr
        weights = [(Ly.w_in, Ly.w_o, Ly.w_gu, Ly.w_down) for Ly in tgt.stack.layers]
        if args.layers:
            weights = weights[: args.layers]
        L = len(weights)
        head = tgt.lm_head
        D = head.shape[1]
        wbytes = sum(w.numel() * w.element_size() for ws in weights for w in ws) + head.numel() * head.element_size()
        for M in m_rows:
            base = None
            for name in settings:
                if name == "w_x" and M != 1:
                    continue
                if name.startswith("rows"):
                    if args.dry_cpu and os.environ.get("TRITON_INTERPRET") != "1":
                        print(f"{name}: skipped (a Triton kernel: on the CPU it needs TRITON_INTERPRET=1)")
                        continue
                    bn, bk = (int(v) for v in name.split(":")[1:3])
                    kmax = max(w.shape[1] for w in weights[0])
                    if M > 16 or (bk == 0 and bn * (1 << (kmax - 1).bit_length()) > 32768):
                        continue
                if name.startswith("skinny") and M > 16:
                    continue
                with setting(name if not args.dry_cpu or name not in ("cublas", "cublaslt") else "default"):
                    form = name if name == "w_x" or name.startswith(("rows", "skinny")) else "std"
                    fn, outs, res = make_step(weights, head, M, D, form, dev, dtype)
                    if args.dry_cpu:
                        fn()
                        ms = float("nan")
                    else:
                        from graph_timing import graph_ms  # noqa: PLC0415

                        ms = graph_ms(fn, replays=10)
                        fn()
                        torch.cuda.synchronize()
                got = {k: v.float().reshape(-1).clone() for k, v in outs.items()}
                got["residual"] = res.float().reshape(-1).clone()
                if base is None:
                    base = (ms, got)
                diff = max(float((got[k] - base[1][k]).abs().max()) for k in got)
                rec = dict(shape=shape, M=M, setting=name, layers=L, ms=ms, weight_bytes=wbytes,
                           TBps=wbytes / (ms * 1e-3) / 1e12 if ms == ms else None,
                           vs_default=ms / base[0] if base[0] == base[0] else None, max_abs_diff_vs_default=diff,
                           gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                           torch=torch.__version__)
                recs.append(rec)
                tb = f"{rec['TBps']:.2f} TB/s" if rec["TBps"] else "-"
                vs = f"{rec['vs_default']:.3f}x" if rec["vs_default"] else "-"
                print(f"{shape:6s} M={M:<2} {name:14s} {ms:8.3f} ms  {tb:>10s}  vs default {vs:>7s}  "
                      f"max|diff| {diff:.2e}", flush=True)
                if args.out:  # after every record: a call that hits its time limit keeps what it measured
                    with open(args.out, "w") as f:
                        json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
