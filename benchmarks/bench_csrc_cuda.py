"""CUDA (csrc/cuda, JIT) vs Triton chain verify on one GPU (issue 9).

Same inputs for both: the CUDA ``torch.ops.vllm_specla.chain_verify`` (v3: state tile in
registers, V tiled, fused deferred commit, one batched warp reduction per token;
``_cpp.load_cuda()``) and the Triton serial kernel
(``ops/triton_chain.py``) and UT kernel (``ops/triton_chain_ut.py``). Per configuration a CUDA
graph of 21 launches (each on its own state slots, as bench_kernels.py), replayed 10 times,
median of 5 -> microseconds per launch. Kinds: ``verify`` (factors written, no pending, no state
write), ``step`` (T pending folded + window), ``ar`` (T = 1, state written). Also checks that the
CUDA result equals Triton's (relative error). ``--bv 0,4,8`` also times the CUDA kernel with 4 /
8 value rows per warp forced (``VLLM_SPECLA_CUDA_BV``; 0 = its automatic choice, key ``cuda``),
``--regcap 1,0`` with and without its register caps (``VLLM_SPECLA_CUDA_REGCAP=0``: ``_nocap``),
``--layout auto,rowgroup,rowgroup8,rs`` with its warp layout forced (``VLLM_SPECLA_CUDA_LAYOUT``:
``rs`` v3's reduce-scatter, ``rowgroup`` the small-batch row-group kernel with 32 / BV lanes per
row, ``rowgroup8`` / ``rowgroup16`` / ``rowgroup32`` with 8 / 16 / 32 lanes per row, ``ut`` the UT-form
kernel of ``chain_verify_ut.cu`` (``ut1``: 1 warp per CTA forced; ``utv1`` .. ``utv3``:
its build variant forced, ``VLLM_SPECLA_CUDA_UT_VAR``; ``utp0`` / ``utp1`` / ``utp2``: its phase 4 / 5
form forced, ``VLLM_SPECLA_CUDA_UT_P5=0`` the previous phase 5, ``1`` v~ in registers, ``2`` plus the
batched products reduce (``ut``: 1 or 2 by the shuffle count);
``utrow``: one TMA copy per state row, ``VLLM_SPECLA_CUDA_UT_ROWCOPY=1``; ``sb`` the small-batch lean
kernel; its ``sb0`` / ``sb1`` / ``sbXY`` forms of sessions 18-20 were removed after session 20); key
suffix ``_<layout>``, none for ``auto``). ``--pdl 1,0`` also times the CUDA launches without programmatic
dependent launch (``VLLM_SPECLA_PDL=0``, suffix ``_nopdl``; Triton's serial kernel is then also timed without it,
``triton_nopdl``). ``--rg-ar 2,3`` times the CUDA one-token AR bodies ``VLLM_SPECLA_CUDA_RG_AR`` = 2, 3 side by side
(suffix ``_ar<X>``).
Prints a table, writes JSON to ``--out``.
Run with ``VLLM_SPECLA_CPP_JIT=1`` (JIT-builds the CPU op schemas, then the CUDA kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (_flags; runpy.run_path does not add it)

from _flags import check_out, parse_list  # noqa: E402
from graph_timing import graph_ms  # noqa: E402

from vllm_specla.ops import _cpp  # noqa: E402
from vllm_specla.ops import pdl as _pdl  # noqa: E402
from vllm_specla.ops import triton_chain as tc  # noqa: E402

SHAPES = {"6x256x512": (6, 256, 512), "8x256x256": (8, 256, 256)}
LAYERS = 21


def graph_us(fn, reps=10):
    """Microseconds per launch: one call of ``fn`` is LAYERS launches."""
    return 1e3 * graph_ms(fn, replays=reps) / LAYERS


def _with_env(bv, cap, layout="auto", pdl=True, rg_ar=None):
    """``_cpp.chain_verify`` with ``bv`` value rows per warp forced (0: automatic), the register
    caps on (``cap``) or off, the warp layout forced (``layout``: auto, rowgroup, rowgroup8, rs) and the
    one-token AR body chosen (``rg_ar``: VLLM_SPECLA_CUDA_RG_AR, None = the binding's default).
    The binding reads VLLM_SPECLA_CUDA_BV / VLLM_SPECLA_CUDA_REGCAP / VLLM_SPECLA_CUDA_LAYOUT at
    each call, i.e. at graph capture for the timed graphs."""
    env = {"VLLM_SPECLA_CUDA_BV": str(bv) if bv else None, "VLLM_SPECLA_CUDA_REGCAP": None if cap else "0",
           "VLLM_SPECLA_CUDA_LAYOUT": None if layout == "auto" else "ut" if layout.startswith("ut") else
           "sb" if layout.startswith("sb") else layout,
           "VLLM_SPECLA_PDL": None if pdl else "0", "VLLM_SPECLA_CUDA_RG_AR": rg_ar,
           "VLLM_SPECLA_CUDA_UT_NW": "1" if layout == "ut1" else None,
           "VLLM_SPECLA_CUDA_UT_VAR": layout[3:] if layout.startswith("utv") else None,
           "VLLM_SPECLA_CUDA_UT_P5": layout[3:] if layout in ("utp0", "utp1", "utp2") else None,
           "VLLM_SPECLA_CUDA_UT_ROWCOPY": "1" if layout == "utrow" else None}

    def fn(*a, **kw):
        for key, val in env.items():
            if val is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = val
        try:
            return _cpp.chain_verify(*a, **kw)
        finally:
            for key in env:
                os.environ.pop(key, None)

    return fn


def _triton_nopdl(*a, **kw):
    """The Triton chain kernel launched without programmatic dependent launch (``ops/pdl.py``'s ENABLED off for
    the call, i.e. at graph capture): the baseline of the ``_nopdl`` CUDA columns."""
    was = _pdl.ENABLED
    _pdl.ENABLED = False
    try:
        return tc.chain_verify(*a, **kw)
    finally:
        _pdl.ENABLED = was


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--Ts", default="1,5,8")
    ap.add_argument("--bv", default="0", help="CUDA value rows per warp to time: 0 (automatic), 4, 8")
    ap.add_argument("--regcap", default="1", help="CUDA register caps to time: 1 (on, default), 0 (off)")
    ap.add_argument("--layout", default="auto",
                    help="CUDA warp layouts to time: auto, rowgroup, rowgroup8, rowgroup16, rowgroup32, rs, "
                         "ut (the UT-form kernel; ut1: 1 warp per CTA; utv1 .. utv3: its build variant; utp0 / utp1 / utp2: its phase 4 / 5 form; utrow: TMA copies per row) "
                         "(VLLM_SPECLA_CUDA_LAYOUT, VLLM_SPECLA_CUDA_UT_NW, VLLM_SPECLA_CUDA_UT_VAR, "
                         "VLLM_SPECLA_CUDA_UT_P5, VLLM_SPECLA_CUDA_UT_ROWCOPY)")
    ap.add_argument("--pdl", default="1", help="CUDA launches to time: 1 (programmatic dependent launch where "
                    "built for sm_90+, the default), 0 (plain launches, VLLM_SPECLA_PDL=0: key suffix _nopdl)")
    ap.add_argument("--rg-ar", default="", help="one-token AR bodies to time (VLLM_SPECLA_CUDA_RG_AR values, "
                    "key suffix _ar<X>): empty (default) = the binding's default only. 1 and 2 launch the same "
                    "kernels, and 2 (or 4 where it takes 2) sets their shared-memory carveout for the process: "
                    "time 1 in a run without them")
    ap.add_argument("--bank-t", type=int, default=-1,
                    help="factor-bank window length Tmax: 0 = each configuration's own T (as the runtime sizes "
                         "its banks, K + 1; the CUDA UT kernel's window bound follows it), default: max(8, largest T)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    layouts = parse_list(ap, "--layout", args.layout, choices=(
        "auto", "rowgroup", "rowgroup8", "rowgroup16", "rowgroup32", "rs", "sb", "ut", "ut1", "utv1", "utv2", "utv3",
        "utp0", "utp1", "utp2", "utrow"))
    pdls = parse_list(ap, "--pdl", args.pdl, choices=("0", "1"))
    ars = parse_list(ap, "--rg-ar", args.rg_ar, choices=("0", "1", "2", "3", "4"), allow_empty=True) or [None]
    bvs = [int(b) for b in parse_list(ap, "--bv", args.bv, choices=("0", "4", "8"))]
    caps = [int(c) for c in parse_list(ap, "--regcap", args.regcap, choices=("0", "1"))]
    batches, Ts = parse_list(ap, "--batches", args.batches), parse_list(ap, "--Ts", args.Ts)
    if args.bank_t < -1 or 0 < args.bank_t < max(Ts):
        ap.error(f"--bank-t: -1 (max(8, largest T)), 0 (each T) or an int >= the largest --Ts ({max(Ts)}), "
                 f"got {args.bank_t}")
    check_out(ap, "--out", args.out)
    variants = [(b, c, lay, x == "1", a) for b in bvs for c in caps for lay in layouts for x in pdls for a in ars]
    if not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times the CUDA chain verify")
    assert _cpp.load_cuda(), "CUDA build unavailable"
    try:
        from vllm_specla.ops import triton_chain_ut as ut  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        ut = None
    dev = "cuda"
    recs = []
    for sname, (H, K, V) in SHAPES.items():
        for B in batches:
            for T in Ts:
                for kind in (("ar",) if T == 1 else ("verify", "step")):
                    # factor banks of Tmax = --bank-t tokens (default: the longest window of the run;
                    # 0: this T, as the runtime sizes them, K + 1); the CUDA UT kernel's window bound
                    # and shared memory follow Tmax
                    S = LAYERS * B
                    Tm = T if args.bank_t == 0 else args.bank_t if args.bank_t > 0 else max(8, max(Ts))
                    g = torch.Generator(device=dev).manual_seed(B * 100 + T)
                    N = B * T
                    q = torch.randn(N, H, K, device=dev, generator=g, dtype=torch.bfloat16)
                    k = torch.randn(N, H, K, device=dev, generator=g, dtype=torch.bfloat16)
                    v = torch.randn(N, H, V, device=dev, generator=g, dtype=torch.bfloat16)
                    gg = -torch.rand(N, H, device=dev, generator=g)
                    beta = torch.rand(N, H, device=dev, generator=g)
                    state = torch.randn(S, H, V, K, device=dev, generator=g) * 0.1
                    bk = torch.randn(S, 2, Tm, H, K, device=dev, generator=g) * 0.05
                    bv = torch.randn(S, 2, Tm, H, V, device=dev, generator=g) * 0.05
                    bg = -torch.rand(S, 2, Tm, H, device=dev, generator=g) * 0.1
                    cu = torch.arange(B + 1, device=dev) * T
                    slots = [torch.arange(B, device=dev) + l * B for l in range(LAYERS)]
                    kw = dict(scale=K ** -0.5, cu_seqlens=cu)
                    if kind == "ar":
                        kw.update(write_final_state=True)
                    else:
                        kw.update(bank_k=bk, bank_v=bv, bank_g=bg, write_bank=torch.ones(B, dtype=torch.long, device=dev))
                        if kind == "step":
                            kw.update(pending_len=torch.full((B,), T, device=dev, dtype=torch.long),
                                      read_bank=torch.zeros(B, dtype=torch.long, device=dev))
                    impls = {"cuda" + ("" if lay == "auto" else f"_{lay}") + (f"_bv{bv}" if bv else "") +
                             ("" if cap else "_nocap") + ("" if pdl else "_nopdl") + (f"_ar{a}" if a else ""):
                             _with_env(bv, cap, lay, pdl, a) for bv, cap, lay, pdl, a in variants}
                    impls["triton"] = tc.chain_verify
                    if "0" in pdls:
                        impls["triton_nopdl"] = _triton_nopdl
                    if ut is not None and kind != "ar":
                        impls["triton_ut"] = ut.chain_verify_ut
                    r = dict(shape=sname, batch=B, T=T, kind=kind, bank_T=Tm, gpu=torch.cuda.get_device_name())
                    outs = {}
                    for name, fn in impls.items():  # results first, from the same untouched inputs
                        try:
                            outs[name] = fn(q, k, v, gg, beta, state=state.clone(), slots=slots[0],
                                            **{a: (b.clone() if a.startswith("bank") else b) for a, b in kw.items()})
                        except Exception as e:  # noqa: BLE001
                            r[f"{name}_error"] = str(e)[:200]
                    for name, fn in impls.items():
                        try:
                            r[f"{name}_us"] = graph_us(lambda fn=fn, state=state: [
                                fn(q, k, v, gg, beta, state=state, slots=s, **kw) for s in slots])
                        except Exception as e:  # noqa: BLE001
                            r[f"{name}_error"] = str(e)[:200]
                    ref = outs["triton"]
                    for name in [n for n in impls if n.startswith("cuda")]:
                        if name in outs:
                            r[f"{name}_vs_triton_rel_err"] = float((outs[name] - ref).norm() / ref.norm())
                        if f"{name}_us" in r and "triton_us" in r:
                            r[f"{name}_over_triton"] = r[f"{name}_us"] / r["triton_us"]
                        if "_nopdl" in name and f"{name}_us" in r and "triton_nopdl_us" in r:
                            r[f"{name}_over_triton_nopdl"] = r[f"{name}_us"] / r["triton_nopdl_us"]
                    recs.append(r)
                    print(json.dumps(r), flush=True)
                    del state, bk, bv, bg
                    torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(recs, f, indent=1)
    print_table(recs)


def print_table(recs) -> None:
    """Microseconds per launch, one row per configuration, one column per kernel (first seen order)."""
    names = []
    for r in recs:
        names += [k[:-3] for k in r if k.endswith("_us") and k[:-3] not in names]
    print("\nshape      B    T  kind    " + " ".join(f"{n:>12s}" for n in names))
    for r in recs:
        cells = " ".join(f"{r[n + '_us']:12.1f}" if n + "_us" in r else f"{'-':>12s}" for n in names)
        print(f"{r['shape']:10s} {r['batch']:<4d} {r['T']:<2d} {r['kind']:7s} {cells}")


if __name__ == "__main__":
    main()
