#!/usr/bin/env python
"""Deferred (fused) commit and SpecLA step vs replay, per chain-verify kernel (issue 5 targets).

For each kernel in ``--impls`` (``cuda``: the csrc CUDA op, ``_cpp.load_cuda()``; ``triton``: the
serial Triton kernel; ``ut``: the Triton UT kernel, whose pending path is recover + verify, or
the fold in its state pass where ``triton_chain_ut.UT_FOLD`` says: ``VLLM_SPECLA_UT_FOLD=0 / 1``) and
each head shape and batch, in one process and on the same inputs (bf16 q/k/v as the runtime feeds
them, fp32 state, Tmax = 8 banks: the longest window, as the runtime sizes them), microseconds per layer (CUDA graph of 21 launches, each layer
on its own state slots, as ``bench_kernels.py``):

* ``fused T/A``  one verify launch of a T-token window with A pending factors folded first
  (deferred commit: the state is written once);
* ``sep T/A``    ``triton_recover.recover`` of the A factors (``--recover-config``), then a verify without pending;
* ``step T``     ``fused T/T`` (the production SpecLA step at K = T - 1);
* ``replay T``   T launches of the T = 1 kernel with the state read and written each time (the
  system without factors), using the same kernel's AR path.

Ratios printed: fused vs sep (target >= 1.3x), step vs replay at T = 5 (target >= 4x).
Writes JSON records to ``--out``. Run with ``VLLM_SPECLA_CPP_JIT=1`` for ``cuda``.

    VLLM_SPECLA_CPP_JIT=1 python benchmarks/bench_commit_cuda.py --out commit.json   # H200: ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _flags import check_out, parse_list, parse_tuple  # noqa: E402
from graph_timing import graph_ms  # noqa: E402

from vllm_specla.ops import triton_chain as tc  # noqa: E402
from vllm_specla.ops import triton_recover as tr  # noqa: E402

SHAPES = {"6x256x512": (6, 256, 512), "8x256x256": (8, 256, 256)}
LAYERS = 21
CASES = [("fused", 5, 3), ("sep", 5, 3), ("fused", 8, 5), ("sep", 8, 5), ("step", 5, 5), ("replay", 5, 0)]


def _forced_ut(fn, nw):
    """``fn`` with the CUDA UT-form kernel forced (VLLM_SPECLA_CUDA_LAYOUT=ut, read by the binding at
    each call, i.e. at graph capture), with ``nw`` selecting: '' the automatic choice, '1' one warp
    per CTA (VLLM_SPECLA_CUDA_UT_NW), 'vN' build variant N = 1 .. 3 (VLLM_SPECLA_CUDA_UT_VAR), 'p0' / 'p1' /
    'p2' its phase 4 / 5 form forced (VLLM_SPECLA_CUDA_UT_P5=0: the previous phase 5, 1: without the
    batched products reduce, 2: with it), 'row' one TMA copy per state row (VLLM_SPECLA_CUDA_UT_ROWCOPY=1)."""
    def wrapped(*a, **kw):
        if kw.get("write_final_state"):  # replay launches (T = 1, state written): the automatic layout
            return fn(*a, **kw)
        os.environ["VLLM_SPECLA_CUDA_LAYOUT"] = "ut"
        if nw in ("p0", "p1", "p2"):
            os.environ["VLLM_SPECLA_CUDA_UT_P5"] = nw[1:]
        elif nw == "row":
            os.environ["VLLM_SPECLA_CUDA_UT_ROWCOPY"] = "1"
        elif nw.startswith("v"):
            os.environ["VLLM_SPECLA_CUDA_UT_VAR"] = nw[1:]
        elif nw:
            os.environ["VLLM_SPECLA_CUDA_UT_NW"] = nw
        try:
            return fn(*a, **kw)
        finally:
            os.environ.pop("VLLM_SPECLA_CUDA_LAYOUT", None)
            os.environ.pop("VLLM_SPECLA_CUDA_UT_NW", None)
            os.environ.pop("VLLM_SPECLA_CUDA_UT_VAR", None)
            os.environ.pop("VLLM_SPECLA_CUDA_UT_P5", None)
            os.environ.pop("VLLM_SPECLA_CUDA_UT_ROWCOPY", None)

    return wrapped


UT_FORCED = ("cuda_ut", "cuda_ut1", "cuda_utv1", "cuda_utv2", "cuda_utv3", "cuda_utp0", "cuda_utp1", "cuda_utp2",
             "cuda_utrow")
IMPLS = ("cuda", *UT_FORCED, "triton", "ut")


def kernels(names):
    out = {}
    for n in names:
        if n == "cuda":
            from vllm_specla.ops import _cpp  # noqa: PLC0415

            assert _cpp.load_cuda(), "CUDA build unavailable"
            out[n] = _cpp.chain_verify
        elif n in UT_FORCED:  # the UT-form
            # CUDA kernel forced (cuda_ut1: 1 warp per CTA; cuda_utvN: build variant N; cuda_utp0 / _utp1 / _utp2: phase 4 / 5 form; cuda_utrow: TMA copies per row)
            from vllm_specla.ops import _cpp  # noqa: PLC0415

            assert _cpp.load_cuda(), "CUDA build unavailable"
            out[n] = _forced_ut(_cpp.chain_verify, n[len("cuda_ut"):])
        elif n == "triton":
            out[n] = tc.chain_verify
        elif n == "ut":
            from vllm_specla.ops import triton_chain_ut as ut  # noqa: PLC0415

            out[n] = ut.chain_verify_ut
        else:
            raise ValueError(f"--impls: unknown kernel {n!r} (allowed: {', '.join(IMPLS)})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="32,128,256")
    ap.add_argument("--impls", default="cuda,triton")
    ap.add_argument("--replays", type=int, default=8, help="graph replays per timing (median of 5 timings)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--recover-config", default="",
                    help="BV/num_warps of the recover kernel in the sep rows (default: triton_chain.TUNED)")
    args = ap.parse_args()
    names = parse_list(ap, "--impls", args.impls, choices=IMPLS)
    batches = parse_list(ap, "--batches", args.batches)
    if args.replays < 1:
        ap.error(f"--replays: must be an int >= 1, got {args.replays}")
    check_out(ap, "--out", args.out)
    if args.recover_config:
        tc.TUNED["recover"] = parse_tuple(ap, "--recover-config", args.recover_config, 2, sep="/",
                                          what="BV/num_warps")
    if not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times GPU kernels")
    impls = kernels(names)
    dev = "cuda"
    recs = []
    for sname, (H, K, V) in SHAPES.items():
        for B in batches:
            S, Tm, Tx = LAYERS * B, 8, 8  # banks sized to the longest window (8), as the runtime does
            g = torch.Generator(device=dev).manual_seed(B)
            N = B * Tx
            q = torch.randn(N, H, K, device=dev, generator=g, dtype=torch.bfloat16)
            k = torch.randn(N, H, K, device=dev, generator=g, dtype=torch.bfloat16)
            v = torch.randn(N, H, V, device=dev, generator=g, dtype=torch.bfloat16)
            gg = -torch.rand(N, H, device=dev, generator=g)
            beta = torch.rand(N, H, device=dev, generator=g)
            state = torch.randn(S, H, V, K, device=dev, generator=g) * 0.1
            banks = dict(bank_k=torch.randn(S, 2, Tm, H, K, device=dev, generator=g) * 0.05,
                         bank_v=torch.randn(S, 2, Tm, H, V, device=dev, generator=g) * 0.05,
                         bank_g=-torch.rand(S, 2, Tm, H, device=dev, generator=g) * 0.1)
            slots = [torch.arange(B, device=dev) + l * B for l in range(LAYERS)]
            wb = torch.ones(B, dtype=torch.long, device=dev)
            rb = torch.zeros(B, dtype=torch.long, device=dev)
            cu1 = torch.arange(B + 1, device=dev, dtype=torch.int32)
            for iname, fn in impls.items():
                for kind, T, A in CASES:
                    qt, kt, vt, gt, bt = (x.view(B, Tx, *x.shape[1:])[:, :T].reshape(B * T, *x.shape[1:])
                                          for x in (q, k, v, gg, beta))
                    cu = cu1 * T
                    pend = torch.full((B,), A if kind != "step" else T, dtype=torch.long, device=dev)
                    kw = dict(scale=K ** -0.5, cu_seqlens=cu, write_bank=wb, **banks)

                    # (state / banks bound as defaults: the loop deletes them after the timing)
                    if kind in ("fused", "step"):
                        def body(state=state, banks=banks):
                            for s in slots:
                                fn(qt, kt, vt, gt, bt, state=state, slots=s, pending_len=pend, read_bank=rb, **kw)
                    elif kind == "sep":
                        def body(state=state, banks=banks):
                            for s in slots:
                                tr.recover(state, s, banks["bank_k"], banks["bank_v"], banks["bank_g"], rb, pend)
                                fn(qt, kt, vt, gt, bt, state=state, slots=s, **kw)
                    else:  # replay: T single-token launches, each reading and writing the state
                        per_tok = [tuple(x.view(B, Tx, *x.shape[1:])[:, t].contiguous() for x in (q, k, v, gg, beta))
                                   for t in range(T)]

                        def body(state=state):
                            for s in slots:
                                for t in range(T):
                                    fn(*per_tok[t], scale=K ** -0.5, state=state, slots=s, cu_seqlens=cu1,
                                       write_final_state=True)
                    us = 1e3 * graph_ms(body, replays=args.replays) / LAYERS
                    r = dict(shape=sname, B=B, impl=iname, kind=kind, T=T, A=A if kind != "step" else T,
                             us=round(us, 2), gpu=torch.cuda.get_device_name(),
                             recover_config=list(tc.TUNED["recover"]) if kind == "sep" else None)
                    recs.append(r)
                    print(json.dumps(r), flush=True)
            del state, banks
            torch.cuda.empty_cache()

    def get(sh, B, impl, kind, T, A):
        return next((r["us"] for r in recs if (r["shape"], r["B"], r["impl"], r["kind"], r["T"], r["A"])
                     == (sh, B, impl, kind, T, A)), None)

    def best_replay(sh, B):
        vals = [get(sh, B, i, "replay", 5, 0) for i in impls]
        return min(v for v in vals if v is not None)

    print("\nshape      B    impl      fused/sep T5A3  T8A5   step T5 vs replay T5 (own / fastest of the run)")
    for sh in SHAPES:
        for B in sorted({r["B"] for r in recs}):
            for impl in impls:
                f1, s1 = get(sh, B, impl, "fused", 5, 3), get(sh, B, impl, "sep", 5, 3)
                f2, s2 = get(sh, B, impl, "fused", 8, 5), get(sh, B, impl, "sep", 8, 5)
                st, rp = get(sh, B, impl, "step", 5, 5), get(sh, B, impl, "replay", 5, 0)
                br = best_replay(sh, B)
                print(f"{sh:10s} {B:<4} {impl:9s} {s1 / f1:5.2f}x        {s2 / f2:5.2f}x   "
                      f"{st:7.1f} vs {rp:7.1f} = {rp / st:4.2f}x / {br:7.1f} = {br / st:4.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
