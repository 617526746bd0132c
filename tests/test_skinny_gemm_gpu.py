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


@pytest.mark.parametrize("warps,unroll", [(4, 4), (4, 8), (8, 4), (8, 8), (16, 4), (16, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [3, 11])
def test_configs_dtypes(gemm, warps, unroll, dtype, M):
    """Every compiled (warps, unroll), both dtypes; K = 5632 makes the 4-warp configs loop over
    several load batches, K = 72 leaves most warps of a 16-warp CTA without a chunk. Two calls give
    the same bits (the warps' partial sums are added in a fixed order)."""
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


def test_graph_with_pdl_chain(gemm):
    """Inside a CUDA graph with programmatic dependent launch: RMSNorm (Triton) -> GEMM -> GEMM
    with the residual in place, replayed after the input changed, equals the eager calls."""
    from vllm_specla.ops import fused

    M, D, N = 5, 2048, 4096
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


# ---- the fused forms (prologue= / gating=): the row GEMV's RMSNorm / SwiGLU / gated RMSNorm prologues and GDN
# gating epilogue on the skinny GEMM (RESULTS.md session 24). The reference rounds the activation once, as the
# kernel does, but its row statistics are summed in another order and its exponentials are exact: an activation
# element lying within a few fp32 ulps of a rounding boundary may round the other way in the kernel (about
# 2^-15 of them; each moves an output by at most 2^-8 |a_k w_nk|). The bound allows three such flips per output
# on top of _check's.


def _check_fused(out, a, w, res=None, flips=3):
    ref = a.float() @ w.float().t()
    mag = a.float().abs() @ w.float().abs().t()
    if res is not None:
        ref, mag = ref + res.float(), mag + res.float().abs()
    ulp = 2.0**-8 if out.dtype == torch.bfloat16 else 2.0**-11
    amax = a.float().abs().amax(1, keepdim=True)
    wmax = w.float().abs().amax(1)[None, :]
    bound = ulp * ref.abs() + 1e-5 * mag + flips * 2.0**-8 * amax * wmax
    err = (out.float() - ref).abs()
    assert torch.isfinite(out.float()).all()
    assert bool((err <= bound).all()), f"max err {float(err.max()):.3g}, worst excess {float((err - bound).max()):.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 2, 5, 7, 8])
@pytest.mark.parametrize("res", [False, True])
def test_fused_rms_norm(gemm, dtype, M, res):
    """RMSNorm prologue (``norm_weight [K]`` float32) on the flame in-projection shape and a small odd
    one (N not a multiple of 16, K = 40: one chunk's tail), with and without the residual; bit-stable."""
    from vllm_specla.ops import fused

    for N, K in [(9232, 2048), (37, 40)]:
        x, w = _rand(M, K, dtype=dtype, seed=M + K) * 3.0, _rand(N, K, dtype=dtype, seed=N)
        nw = torch.rand(K, device="cuda") + 0.5
        r = _rand(M, N, dtype=dtype, seed=7) if res else None
        y = gemm(x, w, r, prologue="rms_norm", norm_weight=nw, eps=1e-6)
        a = fused.rms_norm_ref(x, nw, 1e-6, dtype)
        _check_fused(y, a, w, r)
        assert torch.equal(y, gemm(x, w, r, prologue="rms_norm", norm_weight=nw, eps=1e-6))


@pytest.mark.parametrize("M", [2, 5, 8])
@pytest.mark.parametrize("res", [False, True])
def test_fused_silu_mul(gemm, M, res):
    """SwiGLU prologue: ``x [M, 2K]`` (flame's down-projection K = 5632, and K = 48), in place on the residual."""
    from vllm_specla.ops import fused

    for N, K in [(2048, 5632), (40, 48)]:
        x, w = _rand(M, 2 * K, dtype=torch.bfloat16, seed=K) * 2.0, _rand(N, K, dtype=torch.bfloat16, seed=N)
        r = _rand(M, N, dtype=torch.bfloat16, seed=3) if res else None
        r0 = r.clone() if res else None
        y = gemm(x, w, r, out=r, prologue="silu_mul")
        if res:
            assert y.data_ptr() == r.data_ptr()
        _check_fused(y, fused.silu_mul_ref(x), w, r0)


@pytest.mark.parametrize("HV,V", [(6, 512), (8, 256), (3, 128), (2, 1024)])
@pytest.mark.parametrize("gate_act", ["sigmoid", "silu", None])
@pytest.mark.parametrize("M", [2, 7])
def test_fused_gated_rms_norm(gemm, HV, V, gate_act, M):
    """Gated RMSNorm prologue on float32 ``o`` (the chain verify's output) in heads of V columns, with a
    sigmoid / silu gate read through a column slice of a wider buffer (the in-projection's), or none;
    the residual in place."""
    from vllm_specla.ops import fused

    K, N = HV * V, 2048
    o = torch.randn(M, HV, V, device="cuda") * 0.3
    nw = torch.rand(V, device="cuda") + 0.5
    buf = _rand(M, K + 64, dtype=torch.bfloat16, seed=9)
    gate = buf[:, 64:] if gate_act else None
    w = _rand(N, K, dtype=torch.bfloat16, seed=10)
    r = _rand(M, N, dtype=torch.bfloat16, seed=11)
    r0 = r.clone()
    y = gemm(o.reshape(M, K), w, r, out=r, prologue="gated_rms_norm", norm_weight=nw, eps=1e-5, gate=gate,
             head_dim=V, gate_act=gate_act or "silu")
    a = fused.gated_rms_norm_ref(o, gate, nw, 1e-5, gate_act or "silu", torch.bfloat16)
    _check_fused(y, a, w, r0)


@pytest.mark.parametrize("neg", [False, True])
@pytest.mark.parametrize("M", [2, 7])
def test_fused_gating_epilogue(gemm, neg, M):
    """The GDN gating of the output's ``a | b`` columns (flame's in-projection: 6 heads at 9216) into
    ``gb``: equal to the reference gating of the kernel's own rounded outputs (rtol 1e-5: exp / log
    differ from torch's in the last bits), and the GEMM output equal to the form without gating."""
    from vllm_specla.ops import fused

    N, K, HV = 9232, 2048, 6
    a0 = N - 16 - 2 * HV
    x, w = _rand(M, K, dtype=torch.bfloat16, seed=M), _rand(N, K, dtype=torch.bfloat16, seed=12) * 0.05
    nw = torch.rand(K, device="cuda") + 0.5
    A_log, dt_bias = torch.rand(HV, device="cuda") * 2 - 1, torch.randn(HV, device="cuda")
    gb = torch.full((M, 2 * HV), float("nan"), device="cuda")
    y = gemm(x, w, prologue="rms_norm", norm_weight=nw, gating=(gb, a0, A_log, dt_bias, neg))
    assert torch.equal(y, gemm(x, w, prologue="rms_norm", norm_weight=nw))
    g, beta = fused.gdn_gating_masked_ref(y[:, a0:a0 + HV], y[:, a0 + HV:a0 + 2 * HV], A_log, dt_bias, neg)
    torch.testing.assert_close(gb[:, :HV], g, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gb[:, HV:], beta, rtol=1e-5, atol=1e-6)


def test_fused_routes_and_graph(gemm, monkeypatch):
    """One GDN block's verify-window GEMMs through ``ops/fused.py`` at flame's shapes (7 rows): each takes
    the fused form (counted), agrees with the unfused kernels (``SKINNY_FUSED`` off) within the fused
    tolerance, and the chain captured in a CUDA graph (programmatic dependent launch) and replayed after
    the input changed gives the eager chain's bits."""
    from vllm_specla.ops import _cpp, fused

    prologues = []
    real = _cpp.skinny_gemm
    monkeypatch.setattr(_cpp, "skinny_gemm",
                        lambda *a, **k: prologues.append(k.get("prologue") and k["prologue"] + ("+g" if k.get("gating") else ""))
                        or real(*a, **k))
    M, D, HV, V, I = 7, 2048, 6, 512, 5632
    C, G = 2 * HV * 256 + HV * V, HV * V
    n_in = C + G + 2 * HV + 4
    h = _rand(M, D, dtype=torch.bfloat16, seed=20)
    w_in = _rand(n_in, D, dtype=torch.bfloat16, seed=21) * 0.05
    w_o, w_gu = _rand(D, HV * V, dtype=torch.bfloat16, seed=22) * 0.05, _rand(2 * I, D, dtype=torch.bfloat16, seed=23) * 0.05
    w_dn = _rand(D, I, dtype=torch.bfloat16, seed=24) * 0.05
    nw1, nw2, onw = (torch.rand(D, device="cuda") + 0.5, torch.rand(D, device="cuda") + 0.5,
                     torch.rand(V, device="cuda") + 0.5)
    A_log, dt_bias = torch.rand(HV, device="cuda"), torch.randn(HV, device="cuda")
    o = torch.randn(M, HV, V, device="cuda") * 0.3

    def block(h):
        p, g, beta = fused.linear_gating(h, w_in, nw1, 1e-6, C + G, A_log, dt_bias)
        h2 = fused.gated_norm_linear(o, p[:, C:C + G], onw, 1e-6, "swish", w_o, residual=h.clone(), residual_inplace=True)
        gu = fused.linear(h2, w_gu, nw2, 1e-6, prefetch=w_dn)
        return p, g, beta, fused.silu_mul_linear(gu, w_dn, residual=h2, residual_inplace=True)

    outs = block(h)
    assert prologues == ["rms_norm+g", "gated_rms_norm", "rms_norm", "silu_mul"]
    monkeypatch.setattr(fused, "SKINNY_FUSED", False)
    ref = block(h)
    monkeypatch.setattr(fused, "SKINNY_FUSED", True)
    assert prologues[4:] == [None, None, None, None]  # the plain skinny GEMM after the separate kernels
    for a, b in zip(outs, ref):  # four GEMMs deep: bf16 rounding boundaries differ, so one-ulp steps of large values
        a, b = a.float(), b.float()
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2 * float(b.abs().max()))
    g, out = capture(lambda: block(h))
    h.copy_(_rand(M, D, dtype=torch.bfloat16, seed=25))
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip(out, block(h)):
        assert torch.equal(a, b)
