"""The register mapping of the CUDA skinny GEMM (``csrc/cuda/skinny_gemm.cu``), emulated on the CPU.

Each lane (``g = lane // 4``, ``t = lane % 4``) loads 8 contiguous k of weight rows ``g`` and
``g + 8`` and of token ``g`` per 32-wide chunk, and hands words ``2j`` / ``2j + 1`` of those loads
to MMA ``j`` of the chunk as A = {Wg.w[2j], Wg8.w[2j], Wg.w[2j+1], Wg8.w[2j+1]} and
B = {X.w[2j], X.w[2j+1]}. The emulator rebuilds each MMA's A (16 x 16) and B (16 x 8) from the
lanes' registers with the PTX ISA's fragment tables for ``mma.m16n8k16`` (.bf16 / .f16: a0..a7 at
rows g / g+8, cols 2t+(0,1) / 2t+8+(0,1); b0..b3 at rows 2t+(0,1) / 2t+8+(0,1), col g; two elements
per 32-bit register, the lower one first) and sums the products; the result must be ``W @ X^T``
(float64, exact up to rounding, 1e-12). The kernel itself is tested on the GPU
(``tests/test_skinny_gemm_gpu.py``); this pins the mapping its comment describes.
"""

from __future__ import annotations

import torch


def _emulate(W: torch.Tensor, X: torch.Tensor, a_words=(0, 0, 1, 1), b_words=(0, 1)) -> torch.Tensor:
    """``W [16, K]``, ``X [8, K]`` (K % 32 == 0) through the kernel's per-lane loads and the PTX
    fragment layout; ``a_words`` / ``b_words``: word offsets (added to ``2j``) of the A / B registers
    (the kernel's are the defaults)."""
    C = torch.zeros(16, 8, dtype=torch.float64)
    for k0 in range(0, W.shape[1], 32):
        for j in range(2):
            A = torch.full((16, 16), float("nan"), dtype=torch.float64)
            B = torch.full((16, 8), float("nan"), dtype=torch.float64)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                wg, wg8, xg = (m[r, k0 + 8 * t : k0 + 8 * t + 8] for m, r in ((W, g), (W, g + 8), (X, g)))

                def word(v, i):  # 32-bit register i of a 16-byte load: elements 2i, 2i + 1
                    return v[2 * i : 2 * i + 2]

                regs = [word(wg, 2 * j + a_words[0]), word(wg8, 2 * j + a_words[1]), word(wg, 2 * j + a_words[2]),
                        word(wg8, 2 * j + a_words[3])]
                A[g, 2 * t : 2 * t + 2] = regs[0]  # a0, a1
                A[g + 8, 2 * t : 2 * t + 2] = regs[1]  # a2, a3
                A[g, 2 * t + 8 : 2 * t + 10] = regs[2]  # a4, a5
                A[g + 8, 2 * t + 8 : 2 * t + 10] = regs[3]  # a6, a7
                B[2 * t : 2 * t + 2, g] = word(xg, 2 * j + b_words[0])  # b0, b1
                B[2 * t + 8 : 2 * t + 10, g] = word(xg, 2 * j + b_words[1])  # b2, b3
            assert not (A.isnan().any() or B.isnan().any())  # every fragment element is set
            C += A @ B
    return C


def test_fragment_mapping_is_the_product():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(16, 96, generator=g, dtype=torch.float64)
    X = torch.randn(8, 96, generator=g, dtype=torch.float64)
    torch.testing.assert_close(_emulate(W, X), W @ X.T, rtol=0, atol=1e-12)


def test_a_wrong_mapping_is_caught():
    """The emulation is sensitive to the mapping: A's second k half taken from the wrong word, or B's
    halves swapped, gives a different matrix."""
    g = torch.Generator().manual_seed(1)
    W = torch.randn(16, 64, generator=g, dtype=torch.float64)
    X = torch.randn(8, 64, generator=g, dtype=torch.float64)
    ref = W @ X.T
    for kw in (dict(a_words=(0, 0, 0, 1)), dict(b_words=(1, 0))):
        assert (_emulate(W, X, **kw) - ref).abs().max() > 1e-3
