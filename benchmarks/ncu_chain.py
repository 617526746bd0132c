"""A small driver for Nsight Compute: one chain-verify window at batch 1 (default 6x256x512 heads, 8 tokens,
bf16 q / k / v, factors recorded, no pending), run three times by each of the CUDA op (its automatic layout, or
``VLLM_SPECLA_CUDA_LAYOUT`` etc. from the environment) and the Triton serial kernel, each on its own copy of the
state (``h200_next_session.sh s18d`` profiles them with ``ncu --kernel-name regex:chain_verify``). ``--ar``: one
token per row with the state written back and no factor banks instead (an AR decode step, as
``bench_csrc_cuda.py``'s "ar" rows; ``--T`` is then ignored). Needs CUDA and nvcc (``VLLM_SPECLA_CPP_JIT=1``)."""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flags import parse_tuple  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="6,256,512", help="H,K,V (HV = H)")
    ap.add_argument("--T", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ar", action="store_true", help="an AR step (T = 1, write_final_state, no banks)")
    args = ap.parse_args()
    if args.batch < 1 or args.T < 1:
        ap.error(f"--batch and --T: each must be an int >= 1, got {args.batch} / {args.T}")
    H, K, V = parse_tuple(ap, "--heads", args.heads, 3, what="H,K,V")
    if not torch.cuda.is_available():
        ap.error("no CUDA device: this script runs the chain kernels for Nsight Compute")
    from vllm_specla.ops import _cpp  # noqa: PLC0415
    from vllm_specla.ops import triton_chain as tc  # noqa: PLC0415

    if not _cpp.load_cuda():
        raise SystemExit("the CUDA chain verify did not build (ops/_cpp.py load_cuda)")
    B, T, dev = args.batch, 1 if args.ar else args.T, "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    N = B * T
    q, k = (torch.randn(N, H, K, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(N, H, V, device=dev, generator=g, dtype=torch.bfloat16)
    gg, beta = -torch.rand(N, H, device=dev, generator=g), torch.rand(N, H, device=dev, generator=g)
    state = torch.randn(B, H, V, K, device=dev, generator=g) * 0.1
    banks = dict(bank_k=torch.zeros(B, 2, T, H, K, device=dev), bank_v=torch.zeros(B, 2, T, H, V, device=dev),
                 bank_g=torch.zeros(B, 2, T, H, device=dev))
    kw = dict(scale=K ** -0.5, slots=torch.arange(B, device=dev), cu_seqlens=torch.arange(B + 1, device=dev) * T)
    if args.ar:
        kw.update(write_final_state=True)
    else:
        kw.update(write_bank=torch.ones(B, dtype=torch.long, device=dev), **banks)
    for fn in (_cpp.chain_verify, tc.chain_verify):
        for _ in range(3):
            fn(q, k, v, gg, beta, state=state.clone(), **kw)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
