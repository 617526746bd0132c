#!/usr/bin/env python3
"""Oracle check (issue 2): our plain-torch GDN vs fla's ``GatedDeltaNetForCausalLM`` on a checkpoint.

Loads ``--ckpt`` with :func:`vllm_specla.models.gdn.load_fla_checkpoint` (reference path, fp32)
and with fla 0.6.0 (fp32 weights; fla's Triton forward kernels), runs both on the first ``--n``
sequences of the checkpoint's ``heldout_val.json`` and writes max / relative logit error, top-1
agreement and NLL of each to ``--out`` (JSON). Needs a CUDA GPU with fla installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--device", default="cuda", help="cuda (fla's Triton kernels; the default) or cpu (torch "
                    "stand-ins for fla's ops: plumbing only)")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU here (this check compares with fla's Triton kernels); "
                 "--device cpu runs it on torch stand-ins")
    from train_target import load_model, maybe_shim  # noqa: PLC0415

    maybe_shim("fla", args.device)  # CPU: torch stand-ins for fla's Triton ops (plumbing only)
    from vllm_specla.models.gdn import load_fla_checkpoint  # noqa: PLC0415

    res: dict = {"ckpt": args.ckpt}

    def dump():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)

    held = json.load(open(os.path.join(args.ckpt, "heldout_val.json")))["ids"][: args.n]
    ids = torch.tensor(held, device=args.device)
    ours = load_fla_checkpoint(args.ckpt, torch.float32, args.device)
    with torch.no_grad():
        lo = ours.forward_sequence(ids).float()
    nll = lambda lg: float(F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), ids[:, 1:].reshape(-1)))  # noqa: E731
    res.update(shape=list(ids.shape), nll_ours_fp32=nll(lo))
    dump()
    fla_m = load_model("fla", args.ckpt, args.device)
    for mode in ("fp32", "bf16_autocast"):
        t = time.time()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode != "fp32"):
            lf = fla_m(input_ids=ids, use_cache=False).logits.float()
        err = lo - lf
        res[mode] = {"max_abs_err": float(err.abs().max()), "rel_err": float(err.norm() / lf.norm()),
                     "max_abs_logit": float(lf.abs().max()),
                     "top1_agree": float((lo.argmax(-1) == lf.argmax(-1)).float().mean()),
                     "nll_fla": nll(lf), "seconds_incl_autotune": time.time() - t}
        dump()
        print(f"[oracle] {mode}: {res[mode]}", flush=True)
    return res


if __name__ == "__main__":
    main()
