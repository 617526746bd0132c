"""A small driver for Nsight Compute: the CUDA skinny GEMM (automatic config, no PDL) and cuBLAS at
flame's in-projection (N 9232, K 2048) and down-projection (N 2048, K 5632), M token rows, three
times each (``h200_next_session.sh s16d`` profiles launches 3-12 with ``ncu --kernel-name ...``).
Needs CUDA and nvcc."""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ncu_gemm.py needs a CUDA GPU")
    from vllm_specla.ops import _cpp  # noqa: PLC0415

    if not _cpp.load_cuda_gemm():
        raise SystemExit("the CUDA skinny GEMM did not build (ops/_cpp.py load_cuda_gemm)")
    for n, k in ((9232, 2048), (2048, 5632)):
        x = torch.randn(args.m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            _cpp.skinny_gemm(x, w, pdl=False)
            x @ w.t()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
