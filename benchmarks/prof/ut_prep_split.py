"""Device time per kernel of the UT tree verify (``triton_chain_ut.tree_verify_ut``): the per-(row,
head) prep kernel vs the V-tile kernel (other: the split launch's products kernel, the rest), binary trees,
6x256x512 heads (``--shape``), no pending factors (as
``bench_tree.py --pending 0``). ``torch.profiler`` over eager calls (each kernel's own device time;
no launch gaps), mean over ``--reps`` calls. (Session 8 ran it as an A/B of two prep forms, s8e;
the slower "loop" form was removed afterwards.)

    python benchmarks/prof/ut_prep_split.py --batches 8,32 --nodes 16,32 --out prep_split.json

``--solve-ab``: instead, the prep kernel's two forms of ``(I + A)^-1`` (``UT_SOLVE`` "loop" /
"dot", session 9) side by side in one process: binary trees of ``--nodes`` and chain windows of
``--chain-Ts`` tokens (``chain_verify_ut``), prep / V-tile us per form and the norm-wise difference
of the outputs between the forms.

``--sweep``: instead, with the default prep form, each V-tile config of ``--configs``
(``BV/num_warps/KC/num_stages``, through ``CONFIG_OVERRIDE``) and each prep warp count of
``--prep-warps`` (``PREP_WARPS`` / ``PREP_WARPS_32``) and each dot precision of ``--precisions``
(``DOT_PRECISION``), one at a time against the defaults.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

sys.path.insert(0, ".")
from vllm_specla.ops import triton_chain_ut as ut  # noqa: E402


SHAPES = {"6x256x512": (6, 6, 256, 512), "8x256x256": (8, 8, 256, 256)}  # (H, HV, K, V), as bench_tree.py


def case(B: int, n: int, H=6, HV=6, K=256, V=512, dev="cuda"):
    N = B * n
    gen = torch.Generator(device=dev).manual_seed(0)
    rn = lambda *s: torch.randn(*s, device=dev, generator=gen)  # noqa: E731
    q, k, v = rn(N, H, K).bfloat16(), rn(N, H, K).bfloat16(), rn(N, HV, V).bfloat16()
    g = -torch.rand(N, HV, device=dev, generator=gen) * 0.5
    beta = torch.rand(N, HV, device=dev, generator=gen)
    par = torch.tensor([-1] + [(t - 1) // 2 for t in range(1, n)], device=dev).repeat(B)
    banks = dict(bank_k=torch.nn.functional.normalize(rn(B, 2, n, H, K), dim=-1), bank_v=rn(B, 2, n, HV, V),
                 bank_g=-torch.rand(B, 2, n, HV, device=dev, generator=gen), write_bank=torch.ones(B, dtype=torch.long,
                                                                                                  device=dev))
    kw = dict(scale=K ** -0.5, state=rn(B, HV, V, K) * 0.1, slots=torch.arange(B, device=dev),
              cu_seqlens=torch.arange(0, N + 1, n, dtype=torch.int32, device=dev), parents=par, **banks)
    return (q, k, v, g, beta), kw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--nodes", default="16,32")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--configs", default="16/1/16/2,16/2/16/2,16/4/16/2,32/2/16/3,32/4/16/2,32/2/32/2,64/4/16/2")
    ap.add_argument("--prep-warps", default="1,2,4,8")
    ap.add_argument("--precisions", default="", help="--sweep: also each tl.dot input precision of this list "
                    "(triton_chain_ut.DOT_PRECISION: ieee, tf32x3, tf32, bf16x3), e.g. tf32,ieee")
    ap.add_argument("--solve-ab", action="store_true")
    ap.add_argument("--chain-Ts", default="5,8,16")
    ap.add_argument("--shape", default="6x256x512", choices=sorted(SHAPES), help="head shape H x K x V (HV = H)")
    a = ap.parse_args()
    if a.sweep:
        return sweep(a)
    if a.solve_ab:
        return solve_ab(a)
    recs = []
    print(f"{'B':>4} {'N':>3} {'prep us':>8} {'V-tile us':>9} {'other us':>8}")
    for B in map(int, a.batches.split(",")):
        for n in map(int, a.nodes.split(",")):
            x, kw = case(B, n, *SHAPES[a.shape])
            t = profile(x, kw, a.reps)
            recs.append(dict(shape=a.shape, B=B, N=n, prep_us=t["prep"], vtile_us=t["vtile"], other_us=t["other"],
                             gpu=torch.cuda.get_device_name()))
            print(f"{B:4d} {n:3d} {t['prep']:8.1f} {t['vtile']:9.1f} {t['other']:8.1f}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(recs, f, indent=1)


def profile(x, kw, reps, fn=None):
    """Mean device us per call of (prep, V-tile, other) kernels of ``fn`` (tree_verify_ut)."""
    fn = fn or ut.tree_verify_ut
    for _ in range(3):
        fn(*x, **kw)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn(*x, **kw)
        torch.cuda.synchronize()
    t = {"prep": 0.0, "vtile": 0.0, "other": 0.0}
    for e in prof.key_averages():
        us = (e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total) / reps
        t["prep" if "_ut_prep_kernel" in e.key else "vtile" if "_chain_ut_kernel" in e.key else "other"] += us
    return t


def solve_ab(a):
    recs = []
    print(f"{'B':>4} {'kind':>5} {'N':>3} {'prep loop':>9} {'prep dot':>9} {'V-tile':>7} {'rel diff':>9}")
    form0 = ut.UT_SOLVE
    for B in map(int, a.batches.split(",")):
        for kind, ns in (("tree", a.nodes), ("chain", a.chain_Ts)):
            for n in map(int, ns.split(",")):
                x, kw = case(B, n, *SHAPES[a.shape])
                fn = ut.tree_verify_ut
                if kind == "chain":
                    kw = {k: v for k, v in kw.items() if k != "parents"}
                    fn = ut.chain_verify_ut
                t, o = {}, {}
                for form in ("loop", "dot"):
                    ut.UT_SOLVE = form
                    t[form] = profile(x, kw, a.reps, fn)
                    o[form] = fn(*x, **kw)
                ut.UT_SOLVE = form0
                diff = float((o["dot"] - o["loop"]).norm() / o["loop"].norm())
                recs.append(dict(B=B, kind=kind, N=n, prep_loop_us=t["loop"]["prep"], prep_dot_us=t["dot"]["prep"],
                                 vtile_loop_us=t["loop"]["vtile"], vtile_dot_us=t["dot"]["vtile"], rel_diff=diff,
                                 gpu=torch.cuda.get_device_name()))
                print(f"{B:4d} {kind:>5} {n:3d} {t['loop']['prep']:9.1f} {t['dot']['prep']:9.1f} "
                      f"{t['dot']['vtile']:7.1f} {diff:9.1e}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(recs, f, indent=1)


def sweep(a):
    recs = []
    print(f"{'B':>4} {'N':>3} {'what':>16} {'prep us':>8} {'V-tile us':>9} {'other us':>8}")
    w16, wsp, w32, prec0 = ut.PREP_WARPS, ut.PREP_WARPS_SPLIT, ut.PREP_WARPS_32, ut.DOT_PRECISION
    for p in filter(None, a.precisions.split(",")):
        if p not in ut._PREC_CODE:
            sys.exit(f"--precisions: {p!r} is not one of {', '.join(ut._PREC_CODE)}")
    for B in map(int, a.batches.split(",")):
        for n in map(int, a.nodes.split(",")):
            x, kw = case(B, n, *SHAPES[a.shape])
            ref = ut.tree_verify_ut(*x, **kw)
            for what in ["default"] + [f"cfg {c}" for c in a.configs.split(",")] + [
                    f"prep_warps {w}" for w in filter(None, a.prep_warps.split(","))] + [
                    f"prec {p}" for p in filter(None, a.precisions.split(","))]:
                ut.CONFIG_OVERRIDE, ut.PREP_WARPS, ut.PREP_WARPS_SPLIT, ut.PREP_WARPS_32, ut.DOT_PRECISION = (
                    None, w16, wsp, w32, prec0)
                if what.startswith("cfg"):
                    ut.CONFIG_OVERRIDE = tuple(int(v) for v in what.split()[1].split("/"))
                elif what.startswith("prep_warps"):
                    ut.PREP_WARPS = ut.PREP_WARPS_SPLIT = ut.PREP_WARPS_32 = int(what.split()[1])
                elif what.startswith("prec"):
                    ut.DOT_PRECISION = what.split()[1]
                try:
                    t = profile(x, kw, a.reps)
                    err = float((ut.tree_verify_ut(*x, **kw) - ref).norm() / ref.norm())
                except Exception as e:  # noqa: BLE001
                    print(f"{B:4d} {n:3d} {what:>16} failed: {repr(e)[:200]}", flush=True)
                    continue
                recs.append(dict(shape=a.shape, B=B, N=n, what=what, prep_us=t["prep"], vtile_us=t["vtile"],
                                 other_us=t["other"], rel_vs_default=err,
                                 gpu=torch.cuda.get_device_name()))
                print(f"{B:4d} {n:3d} {what:>16} {t['prep']:8.1f} {t['vtile']:9.1f} {t['other']:8.1f}   (rel {err:.1e})",
                      flush=True)
    ut.CONFIG_OVERRIDE, ut.PREP_WARPS, ut.PREP_WARPS_SPLIT, ut.PREP_WARPS_32, ut.DOT_PRECISION = (
        None, w16, wsp, w32, prec0)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
