"""The CUDA skinny GEMM (``csrc/cuda/skinny_gemm.cu``, ``ops/_cpp.py`` ``skinny_gemm``) against the
plain-torch GEMM on the same operands, and its dispatch from ``ops/fused.py``.

Skipped without CUDA or when the JIT build fails (no nvcc). Inputs are random normal (never zeros).
Tolerance, per element: the kernel accumulates in fp32 (in another order than the reference) and
rounds once to bf16 / fp16, so ``|out - ref| <= 2^-8 |ref| (bf16; 2^-11 for fp16) + 1e-5 (|x| @ |w|^T
[+ |residual|])``, where ``ref`` is the fp32 product of the same rounded operands: one rounding of
the output (the unit roundoff) plus an empirical allowance for fp32 summation-order differences
(~100x their typical size; not a worst-case bound).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from graph_timing import capture  # noqa: E402  (the benchmarks' warm-up + capture)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def gemm():
    """The op, built; ``fused.linear`` dispatches to it only while this module runs (the flag is
    restored after, so later test files keep their cuBLAS GEMMs whatever the order)."""
    from vllm_specla.ops import _cpp

    was = _cpp.GEMM_LOADED
    try:
        built = _cpp.load_cuda_gemm()
    except Exception as e:  # noqa: BLE001  (no nvcc / compiler on this machine)
        pytest.skip(f"the CUDA skinny GEMM did not build: {e}")
    if not built:
        pytest.skip("the CUDA skinny GEMM did not build")
    yield _cpp.skinny_gemm
    _cpp.GEMM_LOADED = was


def _check(out, x, w, res=None):
    ref = x.float() @ w.float().t()
    mag = x.float().abs() @ w.float().abs().t()
    if res is not None:
        ref, mag = ref + res.float(), mag + res.float().abs()
    ulp = 2.0**-8 if out.dtype == torch.bfloat16 else 2.0**-11
    err = (out.float() - ref).abs()
    bound = ulp * ref.abs() + 1e-5 * mag
    assert torch.isfinite(out.float()).all()
    assert bool((err <= bound).all()), f"max err {float(err.max()):.3g}, worst excess {float((err - bound).max()):.3g}"


def _rand(*shape, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device="cuda", dtype=dtype)


@pytest.mark.parametrize("M", [1, 2, 5, 7, 8, 9, 13, 16])
@pytest.mark.parametrize("N,K", [(37, 40), (2048, 2048), (9232, 2048), (2048, 5632), (100, 8)])
def test_matches_torch(gemm, M, N, K):
    """Automatic config, bf16, no residual: M up to two 8-token tiles, N not a multiple of 16 (the
    row clamp), K not a multiple of 32 (a chunk's tail lanes), the flame shapes."""
    x, w = _rand(M, K, dtype=torch.bfloat16, seed=M), _rand(N, K, dtype=torch.bfloat16, seed=N + K)
    _check(gemm(x, w), x, w)


@pytest.mark.parametrize("warps,unroll", [(0, 0), (4, 4), (4, 8), (8, 4), (8, 8), (16, 4), (16, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [3, 11])
def test_configs_dtypes(gemm, warps, unroll, dtype, M):
    """Every compiled (warps, unroll), both dtypes, and the automatic config (at 3 rows its two MMA
    chains, ``SPLIT``; at 11 the explicit (8, 8)); K = 5632 makes the 4-warp configs and the automatic
    one loop over several load batches, K = 72 leaves most warps of a 16-warp CTA without a chunk. Two
    calls give the same bits (the warps' partial sums are added in a fixed order)."""
    for N, K in [(300, 5632), (50, 72)]:
        x, w = _rand(M, K, dtype=dtype, seed=K), _rand(N, K, dtype=dtype, seed=N)
        y = gemm(x, w, warps=warps, unroll=unroll)
        _check(y, x, w)
        assert torch.equal(y, gemm(x, w, warps=warps, unroll=unroll))


def test_prefetch_changes_no_bits(gemm):
    """``prefetch=`` (an L2 prefetch of the next GEMM's weight by the last CTAs) leaves the result
    bit-identical, eager and inside a CUDA graph with PDL, for a grid larger than one wave (577
    tiles: only the last ~264 CTAs prefetch) and a small one, a prefetch size not dividing evenly
    between the CTAs, the whole tensor and the default size."""
    x = _rand(5, 2048, dtype=torch.bfloat16, seed=61)
    w, nxt = _rand(9232, 2048, dtype=torch.bfloat16, seed=62), _rand(2048, 5632, dtype=torch.bfloat16, seed=63)
    ref = gemm(x, w)
    for kw in (dict(prefetch=nxt), dict(prefetch=nxt, prefetch_bytes=16 * 1000003),
               dict(prefetch=nxt, prefetch_bytes=nxt.numel() * 2), dict(prefetch=nxt, prefetch_bytes=0),
               dict(prefetch=nxt, prefetch_bytes=16), dict(prefetch=nxt, prefetch_bytes=48)):  # < 16 B per CTA
        assert torch.equal(gemm(x, w, **kw), ref)
    small = _rand(37, 2048, dtype=torch.bfloat16, seed=64)
    assert torch.equal(gemm(x, small, prefetch=nxt), gemm(x, small))
    r = _rand(5, 2048, dtype=torch.bfloat16, seed=65)
    xd = _rand(5, 5632, dtype=torch.bfloat16, seed=66)

    def step():
        a = gemm(x, w, prefetch=nxt)
        return a, gemm(xd, nxt, r, out=r.clone(), prefetch=w)

    g, (a, b) = capture(step)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(a, ref) and torch.equal(b, gemm(xd, nxt, r))


@pytest.mark.parametrize("pdl", [False, True])
def test_residual_in_place_and_strided_x(gemm, pdl):
    """``out=residual`` adds in place (the decode step's o_proj / down); a separate residual is
    left untouched; ``x`` may be a row-strided view (a column slice of a wider buffer)."""
    M, N, K = 7, 2048, 3072
    big = _rand(M, K + 64, dtype=torch.bfloat16, seed=1)
    x = big[:, 64:]
    w = _rand(N, K, dtype=torch.bfloat16, seed=2)
    r = _rand(M, N, dtype=torch.bfloat16, seed=3)
    r0 = r.clone()
    y = gemm(x, w, r, pdl=pdl)
    assert torch.equal(r, r0)
    _check(y, x, w, r0)
    z = gemm(x, w, r, out=r, pdl=pdl)
    assert z.data_ptr() == r.data_ptr()
    assert torch.equal(z, y)  # the same math and order in place as into a new tensor


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [5, 12])
def test_strided_out_residual_and_bounds(gemm, dtype, M):
    """``out`` and the residual as row-strided views (rows wider than N) of buffers filled with a
    sentinel: the kernel writes exactly the ``[M, N]`` block (columns past N and the rows' padding
    keep the sentinel), reads the residual through its stride, in place and not; both 8-token tile
    counts and both dtypes with a residual."""
    N, K, pad = 37, 72, 11
    x, w = _rand(M, K, dtype=dtype, seed=21), _rand(N, K, dtype=dtype, seed=22)
    rbuf = _rand(M, N + pad, dtype=dtype, seed=23)
    r = rbuf[:, :N]
    obuf = torch.full((M, N + pad), 123.0, dtype=dtype, device="cuda")
    y = gemm(x, w, r, out=obuf[:, :N])
    _check(y, x, w, r)
    assert bool((obuf[:, N:] == 123.0).all())
    r0, pad0 = r.clone(), rbuf[:, N:].clone()
    z = gemm(x, w, r, out=r)  # in place through the stride
    assert torch.equal(z, y) and torch.equal(rbuf[:, N:], pad0)
    _check(r, x, w, r0)


@pytest.mark.parametrize("M", [5, 9, 16])
def test_graph_with_pdl_chain(gemm, M):
    """Inside a CUDA graph with programmatic dependent launch: RMSNorm (Triton) -> GEMM -> GEMM
    with the residual in place, replayed after the input changed, equals the eager calls."""
    from vllm_specla.ops import fused

    D, N = 2048, 4096  # (9 / 16 rows: two 8-token tiles)
    h = _rand(M, D, dtype=torch.bfloat16, seed=4)
    nw = torch.rand(D, device="cuda") + 0.5
    w1, w2 = _rand(N, D, dtype=torch.bfloat16, seed=5), _rand(D, N, dtype=torch.bfloat16, seed=6)

    def step():
        a = fused.rms_norm(h, nw, 1e-6, torch.bfloat16)
        b = gemm(a, w1)
        return gemm(b, w2, h, out=h.clone())

    g, out = capture(step)
    h.copy_(_rand(M, D, dtype=torch.bfloat16, seed=7))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, step())
    # the same chain launched without PDL (plain stream order) gives the same bits: PDL changes when
    # a kernel starts, not what it reads
    a = fused.rms_norm(h, nw, 1e-6, torch.bfloat16)
    ref = gemm(gemm(a, w1, pdl=False), w2, h, out=h.clone(), pdl=False)
    assert torch.equal(out, ref)


def test_fused_linear_dispatch(gemm, monkeypatch):
    """``fused.linear`` on 2..``SKINNY_MAX_M`` (8) bf16 rows runs the skinny GEMM once it is built (not
    cuBLAS), with the RMSNorm before it and the residual in place; the result is within the
    tolerance of the reference, and 9 rows or fp32 go to cuBLAS."""
    from vllm_specla.ops import _cpp, fused

    calls = []
    real = _cpp.skinny_gemm
    monkeypatch.setattr(_cpp, "skinny_gemm", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    D, N = 2048, 2048  # 8 MiB weights: above the row GEMV's small-weight rule (fused.GEMV_ROWS_SMALL_BYTES)
    nw = torch.rand(D, device="cuda") + 0.5
    w = _rand(N, D, dtype=torch.bfloat16, seed=8)
    wd = _rand(D, N, dtype=torch.bfloat16, seed=9)
    for M in (5, fused.SKINNY_MAX_M):
        x = _rand(M, D, dtype=torch.bfloat16, seed=M)
        y = fused.linear(x, w, nw, 1e-6)
        xn = fused.rms_norm(x, nw, 1e-6, torch.bfloat16)
        _check(y, xn, w)
        r = _rand(M, D, dtype=torch.bfloat16, seed=10)
        r0 = r.clone()
        z = fused.linear(y, wd, residual=r, residual_inplace=True)
        assert z.data_ptr() == r.data_ptr()
        _check(z, y, wd, r0)
    expect = [5, 5, fused.SKINNY_MAX_M, fused.SKINNY_MAX_M]
    assert calls == expect
    fused.linear(_rand(fused.SKINNY_MAX_M + 1, D, dtype=torch.bfloat16, seed=11), w)
    fused.linear(_rand(5, D, dtype=torch.float32, seed=12), w.float())
    assert calls == expect
    monkeypatch.setattr(fused, "USE_SKINNY_GEMM", False)
    fused.linear(_rand(5, D, dtype=torch.bfloat16, seed=13), w)
    assert calls == expect


def test_bad_input_errors(gemm):
    """Inputs outside the kernel's contract raise ``ValueError`` naming the argument and the
    allowed values, before the op runs."""
    w = _rand(64, 32, dtype=torch.bfloat16, seed=14)
    x = _rand(4, 32, dtype=torch.bfloat16, seed=19)
    with pytest.raises(ValueError, match="1..16 rows"):
        gemm(_rand(17, 32, dtype=torch.bfloat16, seed=15), w)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        gemm(_rand(4, 32, dtype=torch.float32, seed=16), w.float())
    with pytest.raises(ValueError, match="K % 8"):
        gemm(_rand(4, 36, dtype=torch.bfloat16, seed=17), _rand(64, 36, dtype=torch.bfloat16, seed=18))
    with pytest.raises(ValueError, match="residual must be"):
        gemm(x, w, _rand(4, 63, dtype=torch.bfloat16, seed=20))
    with pytest.raises(ValueError, match="warps, unroll"):
        gemm(x, w, warps=2, unroll=4)
    with pytest.raises(ValueError, match="CUDA"):
        gemm(x.cpu(), w.cpu())


@pytest.mark.parametrize("M", [1, 2, 5, 7, 8])
@pytest.mark.parametrize("N,K", [(37, 48), (2048, 2048), (9232, 2048), (2048, 5632)])
@pytest.mark.parametrize("warps,unroll", [(0, 0), (4, 4), (16, 4), (8, 8)])
def test_fp8_weights_match_reference(gemm, M, N, K, warps, unroll):
    """The float8 form (``_cpp.skinny_gemm_fp8``: e4m3 weights, float32 row scales, bf16 activations)
    against ``Fp8Weight.ref_linear`` (the activations rounded to bf16, float32 products and sums, the
    scale, one rounding): within one bf16 rounding plus the f16 activations' rounding (x * 2^-8 in f16
    keeps x's 8 bits exactly for |x| >= 2^-6; these are N(0, 1), so a few lose low bits) and float32
    summation order (1e-3 of the absolute products). Weights down to e4m3's subnormals; N not a multiple
    of 16 (the row clamp); K = 48 leaves most warps without a chunk; the flame drafter's shapes; the
    residual added in place; the same bits on a second call."""
    from vllm_specla.ops import _cpp, fused

    g = torch.Generator(device="cpu").manual_seed(M * 7 + N + K)
    wr = torch.randn(N, K, generator=g) * 0.05
    wr[:, :16] *= 1e-4  # e4m3 subnormals (below 2^-6 of the row's largest / 448)
    w8 = fused.quantize_fp8(wr.cuda(), torch.bfloat16)
    x = torch.randn(M, K, generator=g).cuda().to(torch.bfloat16)
    res = torch.randn(M, N, generator=g).cuda().to(torch.bfloat16)
    y = _cpp.skinny_gemm_fp8(x, w8.weight, w8.scale, warps=warps, unroll=unroll)
    ref = w8.ref_linear(x).float()
    mag = (x.float().abs() @ (w8.weight.float().abs() * w8.scale[:, None]).t())
    err = (y.float() - ref).abs()
    assert torch.isfinite(y.float()).all()
    assert bool((err <= 2.0**-7 * ref.abs() + 1e-3 * mag).all()), f"max err {float(err.max()):.3g}"
    assert torch.equal(y, _cpp.skinny_gemm_fp8(x, w8.weight, w8.scale, warps=warps, unroll=unroll))
    r2 = res.clone()
    z = _cpp.skinny_gemm_fp8(x, w8.weight, w8.scale, r2, out=r2, warps=warps, unroll=unroll)
    assert z is r2
    ref_r = w8.ref_linear(x, res).float()
    assert bool(((z.float() - ref_r).abs() <= 2.0**-7 * ref_r.abs() + 1e-3 * mag + 2.0**-8 * res.float().abs()).all())


def test_fp8_absorb_pass_through_the_runtime(gemm, monkeypatch):
    """``fused.USE_SKINNY_FP8`` with ``FP8_MAX_TOKENS = 8``: the float8 drafter's absorb pass (K + 1 = 5
    rows) runs on the skinny GEMM's float8 form inside the CUDA-graph step; the output stays lossless
    (AR's tokens) in bf16, on ``bench_e2e.py``'s tiny random shape (its target's LM head is its permuted
    embedding, so the greedy continuation is stable under bf16 differences; every dimension % 16 == 0)."""
    from bench_e2e import build

    from vllm_specla.ops import _cpp, fused
    from vllm_specla.runtime import fused_model
    from vllm_specla.runtime.decode import DecodeRuntime

    monkeypatch.setattr(fused, "USE_SKINNY_FP8", True)
    monkeypatch.setattr(fused_model, "FP8_MAX_TOKENS", 8)
    calls = []
    real = _cpp.skinny_gemm_fp8

    def spy(*a, **k):
        calls.append(a[0].shape[0])
        return real(*a, **k)

    monkeypatch.setattr(_cpp, "skinny_gemm_fp8", spy)
    cfg, tgt, dr = build("tiny", "cuda", torch.bfloat16)
    dr = dr.with_draft_weights("fp8")
    prompts = torch.randint(3, cfg.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3)).cuda()
    ar = DecodeRuntime(tgt, 1, "ar", output_capacity=64)
    ar.prefill(prompts)
    ar.run(40)
    rt = DecodeRuntime(tgt, 1, "specla", 4, dr, output_capacity=64)
    rt.capture()
    rt.prefill(prompts)
    for _ in range(8):
        rt.step()
    out, ref = rt.outputs()[0], ar.outputs()[0]
    assert 5 in calls and len(out) >= 9 and out == ref[: len(out)]
