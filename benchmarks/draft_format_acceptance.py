#!/usr/bin/env python
"""What narrower draft-pass weight formats cost in acceptance, on the embedded trained pair (CPU, fp32).

The drafter's one-token passes (every draft pass, and the absorb pass's GEMMs on the accepted rows: the
weights ``FusedEagle(draft_weights="fp8")`` reads as float8) get weights quantized to a format and
dequantized back (fake quantization: the values a kernel of that format would multiply), so the
acceptance measured here is the format's, whatever kernel later streams it. The runtime reads float8 only
in passes of at most ``fused_model.FP8_MAX_BATCH`` rows (a speed rule); this script lifts that limit for its
batch, so every pass runs the format. Formats:

* ``model``: the model weights (fp32 here).
* ``fp8``: per-output-row e4m3 (``fused.quantize_fp8``; the shipped float8 draft passes).
* ``int4-gG``: symmetric 4-bit integers in ``[-8, 7]``, one scale (``amax / 7``) per group of ``G``
  consecutive input columns of each output row (W4A16 with group scales, as GPTQ / AWQ kernels store them).
* ``int4-row``: the same with one scale per output row.

Every run is checked lossless against AR (greedy output must not change: verification decides). Prints a table
and appends JSON lines to ``--out``. Usage (``.devdata/mtbench_tiny.json`` from ``make_prompts.py``)::

    .venv/bin/python benchmarks/draft_format_acceptance.py --prompts .devdata/mtbench_tiny.json \\
        --formats model,fp8,int4-g128,int4-g32,int4-row --ks 4,6 --out benchmarks/acceptance_formats_cpu.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flags import check_out, parse_list  # noqa: E402


def fake_int4(w: torch.Tensor, group: int) -> torch.Tensor:
    """``w [N, K]`` -> its symmetric int4 values times their scales (fp32 ``[N, K]``): groups of ``group``
    columns (0: the whole row), scale ``amax / 7`` (1 for an all-zero group), ``round(w / scale)`` clamped
    to ``[-8, 7]``. Raises ValueError when ``group`` does not divide ``K``."""
    N, K = w.shape
    g = K if group == 0 else group
    if K % g:
        raise ValueError(f"int4 group {group} must divide the input width {K}")
    wg = w.float().reshape(N, K // g, g)
    s = wg.abs().amax(-1, keepdim=True) / 7
    s = torch.where(s > 0, s, torch.ones_like(s))
    return ((wg / s).round().clamp(-8, 7) * s).reshape(N, K)


FORMATS = ("model", "fp8", "int4-row", "int4-gG")  # (the module docstring's list; G: an int >= 1)


def int4_group(fmt: str) -> int | None:
    """G of an ``int4-gG`` format name (an int >= 1), else None."""
    g = fmt[6:] if fmt.startswith("int4-g") else ""
    return int(g) if g.isascii() and g.isdigit() and int(g) >= 1 else None


def draft_input_widths() -> list[int]:
    """The input widths (columns) of the weights :func:`with_format` quantizes, from the embedded drafter's
    config (no weights loaded): hidden (the block's input projection and gate/up, the draft head), 2 x hidden
    (fc), the value width (o_proj) and the MLP width (down_proj). An ``int4-gG`` group must divide each."""
    from vllm_specla.models.config import GatedDeltaNetConfig  # noqa: PLC0415

    with open(os.path.join(REPO, "models", "specla-gdn-tiny", "drafter", "config.json")) as f:
        cfg = GatedDeltaNetConfig(**{k: v for k, v in json.load(f).items() if k != "model_type"})
    return sorted({cfg.hidden_size, 2 * cfg.hidden_size, cfg.value_dim, cfg.mlp_intermediate_size})


def quantizer(fmt: str):
    """The fake quantization of ``fmt`` (``w [N, K]`` -> dequantized fp32 ``[N, K]``)."""
    from vllm_specla.ops import fused  # noqa: PLC0415

    if fmt == "fp8":
        return lambda w: fused.quantize_fp8(w).dequantize().to(w.dtype)
    if fmt == "int4-row":
        return lambda w: fake_int4(w, 0).to(w.dtype)
    if int4_group(fmt) is not None:
        return lambda w: fake_int4(w, int4_group(fmt)).to(w.dtype)
    raise ValueError(f"format must be one of {', '.join(FORMATS)} (G an int >= 1), got {fmt!r}")


def with_format(dr, fmt: str):
    """A copy of FusedEagle ``dr`` whose draft-pass weights (fc, the four block GEMMs, the draft head) are
    ``fmt``'s fake-quantized values; its multi-token passes keep the model weights."""
    if fmt == "model":
        return dr
    q = quantizer(fmt)
    new = dr.with_draft_weights("fp8")  # (the passes that read stack8 / fc8 / head8 are the draft passes)
    new = copy.copy(new)
    new.stack8 = copy.copy(dr.stack)
    new.stack8.layers = []
    for L in dr.stack.layers:
        L2 = copy.copy(L)
        L2.w_in, L2.w_o, L2.w_gu, L2.w_down = (q(w) for w in (L.w_in, L.w_o, L.w_gu, L.w_down))
        new.stack8.layers.append(L2)
    new.fc8 = q(dr.fc)
    new.head8 = q(dr.target.lm_head if dr.head is None else dr.head.weight)
    new.draft_weights = fmt
    return new


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", required=True, help="JSON list of token lists (make_prompts.py)")
    ap.add_argument("--formats", default="model,fp8,int4-g128,int4-g32,int4-row",
                    help=f"comma-separated, from: {', '.join(FORMATS)} (G an int >= 1 dividing the draft passes' "
                         "input widths)")
    ap.add_argument("--ks", default="4,6", help="comma-separated draft lengths, each an int >= 1")
    ap.add_argument("--batch", type=int, default=80)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--out", default=None, help="append JSON lines here")
    args = ap.parse_args()
    # (checked before the models load: each used to fail deep in the runtime, or after the build)
    ks = parse_list(ap, "--ks", args.ks)
    for flag, v in (("--batch", args.batch), ("--steps", args.steps)):
        if v < 1:
            ap.error(f"{flag}: must be an int >= 1, got {v}")
    check_out(ap, "--out", args.out)
    fmts = args.formats.split(",")
    widths = draft_input_widths()
    bad = [f for f in fmts if f not in ("model", "fp8", "int4-row")
           and (int4_group(f) is None or any(w % int4_group(f) for w in widths))]
    if bad:
        ap.error(f"--formats: each must be one of {', '.join(FORMATS)} (G an int >= 1 dividing the draft passes' "
                 f"input widths {', '.join(map(str, widths))}), got {', '.join(map(repr, bad))}")
    from bench_e2e import agree_rows, build_trained, read_prompts  # noqa: PLC0415

    all_prompts = read_prompts(ap, args.prompts)

    from vllm_specla.runtime.decode import DecodeRuntime  # noqa: PLC0415

    from vllm_specla.runtime import fused_model  # noqa: PLC0415

    # (the float8 batch limit is a speed rule of the CUDA row GEMV: here every pass must read the format)
    fused_model.FP8_MAX_BATCH = max(fused_model.FP8_MAX_BATCH, args.batch)
    torch.manual_seed(0)
    tgt, dr = build_trained("cpu")
    B, steps = args.batch, args.steps
    prompts = [all_prompts[i % len(all_prompts)] for i in range(B)]
    drs = {fmt: with_format(dr, fmt) for fmt in fmts}
    cap = steps * (max(ks) + 1) + 16
    ar = DecodeRuntime(tgt, B, "ar", output_capacity=cap)
    ar.prefill(prompts)
    ar.run(steps * (max(ks) + 1))
    ar_out = ar.outputs()
    print(f"{'format':>10} {'K':>3} {'tau':>7} {'vs model':>9} lossless")
    for K in ks:
        base_tau = None
        for fmt in fmts:
            rt = DecodeRuntime(tgt, B, "specla", K, drs[fmt], output_capacity=cap)
            rt.prefill(prompts)
            r = rt.run(steps)
            ok = agree_rows(rt.outputs(), ar_out)
            tau = r.mean_acceptance_length
            base_tau = tau if fmt == "model" else base_tau
            rel = f"{100 * (tau / base_tau - 1):+.1f} %" if base_tau else ""
            print(f"{fmt:>10} {K:>3} {tau:7.3f} {rel:>9} {ok}/{B}")
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(dict(shape="specla-gdn-tiny (trained pair)", gpu="cpu", dtype="fp32", batch=B,
                                            steps=steps, prompts=os.path.basename(args.prompts), K=K, format=fmt,
                                            tau=tau, lossless_rows=f"{ok}/{B}")) + "\n")


if __name__ == "__main__":
    main()
