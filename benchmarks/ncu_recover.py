"""A small driver for Nsight Compute: the recover kernel (DeltaConstruct, ``triton_recover.recover`` at its default
config) beside the one-token Triton chain kernel that issue 5's replay baseline launches, on the same state: per
layer one recover of ``--A`` factors, then ``--A`` one-token launches (bench_kernels.py's ``recover`` / ``replayA``
rows, run eagerly here, ``--layers`` layers, the whole sequence ``--reps`` times). Profile it with
``ncu --kernel-name regex:"_recover_kernel|_chain_verify" ...`` (``h200_next_session.sh s48c``). Needs CUDA."""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="8x256x256", help="a bench_kernels.py SHAPES key")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--A", type=int, default=5, help="accepted factors per row (1..16)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ncu_recover.py needs a CUDA GPU")
    if not 1 <= args.A <= 16 or args.batch < 1 or args.layers < 1 or args.reps < 1:
        raise SystemExit("--A must be 1..16; --batch, --layers and --reps >= 1")
    import bench_kernels as bk  # noqa: PLC0415

    from vllm_specla.ops import triton_chain as tc  # noqa: PLC0415
    from vllm_specla.ops import triton_recover as tr  # noqa: PLC0415

    bk.DEV = "cuda"
    bn = bk.Bench(bk.SHAPES[args.shape], args.batch, args.layers)
    _, _, per_tok = bn.tokens(args.A)
    cu1 = torch.arange(0, bn.B + 1, dtype=torch.int32, device="cuda")
    acc = bn.full(args.A)
    for _ in range(args.reps):
        for l in range(bn.L):
            tr.recover(bn.state, bn.slots[l], bn.bank_k, bn.bank_v, bn.bank_g, bn.rb, acc)
            for t in range(args.A):
                qt, kt, vt, gt, bt = per_tok[t]
                tc._launch_chain(qt, kt, vt, gt, bt, bn.K ** -0.5, bn.state, bn.slots[l], cu1,
                                 None, None, None, None, None, None, True, True)
    torch.cuda.synchronize()
    print(f"ran {args.reps} x {bn.L} layers of recover(A = {args.A}) + {args.A} one-token launches, "
          f"{args.shape} batch {args.batch}; recover config {tc.TUNED['recover']}, one-token config "
          f"{tc.pick_config(bn.B, bn.HV, bn.V, bn.K)}")


if __name__ == "__main__":
    main()
