"""Triton kernels for the non-recurrent per-layer work of a GDN decode / verify step.

GPU_BASELINE.md ("Where a batch-1 step goes"): a simple graph-captured step spends most of its
2.5 ms at batch 1 in ~25 small kernels per layer (norms, gates, softplus, conv taps, residual
adds, copies). These kernels fuse each group into one launch. One-row GEMMs on CUDA run
:func:`gemv_rows` (a CUDA-core row GEMV with the RMSNorm / gated RMSNorm / SwiGLU as optional
prologues and the residual added in place); every other GEMM is cuBLAS (``addmm_`` fuses the
residual add), or the CUDA skinny GEMM for 2-8 bf16 / fp16 rows once built (``csrc/cuda/skinny_gemm.cu``,
``ops/fused.py``). Every kernel here and in ``triton_chain`` launches with programmatic dependent
launch on sm90+ (``ops/pdl.py``): the row GEMV streams its first weight chunk while the previous
kernel still runs. On the H200 (benchmarks/RESULTS.md sessions 11-12), flame shape: the step's
one-row GEMMs in 0.78x cuBLAS's time (3.33 TB/s); the AR step at batch 1 1.383 (cuBLAS) -> 1.155 ms
(row GEMV), session 11, same call; 1.136 -> 1.046 ms (PDL off / on), session 12, same call. Measured slower than cuBLAS for 2+ rows and not dispatched
there: the row GEMV (2.2-5x at M = 5 and 7, session 12), and tensor-core skinny GEMMs (sessions 3-4,
again at 1.4-2.8x for 5 rows in session 12, and a batched K-split form at 1.28-1.52x in session 13).
Small weights (the trained pair's, ``fused.GEMV_ROWS_SMALL_*``) take the row GEMV for up to 8 rows.
:func:`argmax` gives the greedy tokens. The conv and recurrence are ``triton_chain``'s kernels.
Each kernel equals its plain-torch reference in :mod:`vllm_specla.ops.fused` (the dispatcher;
references there), tested in ``tests/test_fused_gpu.py``. All math in float32; inputs may be
token-strided (column slices of one projection output) as long as the feature dim is dense.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_specla.ops import pdl as _pdl


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """The start of a kernel that reads only its predecessors' results: wait for them, then let
    the next kernel launch (``ops/pdl.py``; a no-op without PDL)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _rms_norm_kernel(x, w, y, sx, sy, D, eps, BD: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BD)
    m = o < D
    xv = tl.load(x + i * sx + o, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(xv * xv, 0) / D + eps)
    wv = tl.load(w + o, mask=m, other=0.0).to(tl.float32)
    tl.store(y + i * sy + o, (xv * r * wv).to(y.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Row RMSNorm (fla ``RMSNorm``): ``x [N, D]`` (row stride free) -> ``[N, D]`` ``out_dtype``."""
    N, D = x.shape
    assert x.stride(1) == 1
    y = torch.empty(N, D, dtype=out_dtype or x.dtype, device=x.device)
    if N:
        BD = triton.next_power_of_2(D)
        on = _pdl.enabled(x)
        _rms_norm_kernel[(N,)](x, weight, y, x.stride(0), y.stride(0), D, eps, BD=BD, PDL=on,
                               num_warps=_rms_norm_warps(N, BD), **_pdl.launch_kw(on))
    return y


def _rms_norm_warps(N: int, BD: int) -> int:
    """Warps of :func:`_rms_norm_kernel` for ``N`` rows of ``BD`` (padded) channels
    (benchmarks/bench_norms.py, H200)."""
    return 4 if BD <= 2048 else 8


@triton.jit
def _gated_rms_norm_kernel(o, gate, w, y, so, sg, sy, HV, V, eps, BH: tl.constexpr, BV: tl.constexpr,
                           HAS_GATE: tl.constexpr, SIGMOID: tl.constexpr, PDL: tl.constexpr):
    # one program per (token, BH value heads): a [BH, BV] tile, RMS per head (row of the tile)
    pdl_enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    c = tl.arange(0, BV)
    m = (h < HV)[:, None] & (c < V)[None, :]
    off = h[:, None] * V + c[None, :]
    ov = tl.load(o + i * so + off, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(ov * ov, 1) / V + eps)
    out = ov * r[:, None] * tl.load(w + c, mask=c < V, other=0.0).to(tl.float32)[None, :]
    if HAS_GATE:
        gv = tl.load(gate + i * sg + off, mask=m, other=0.0).to(tl.float32)
        if SIGMOID:
            out = out * tl.sigmoid(gv)
        else:
            out = out * gv * tl.sigmoid(gv)
    tl.store(y + i * sy + off, out.to(y.dtype.element_ty), mask=m)


def _gated_norm_config(N: int, HV: int, V: int) -> tuple[int, int]:
    """``(BH, num_warps)`` of :func:`_gated_rms_norm_kernel`: value heads per program and warps
    (``bench_norms.py`` on the H200, benchmarks/norms_h200_s9c.json, us at 64 / 320 / 1280 rows).
    Heads of <= 256: tiles of ~1024 elements (8x256: BH = 4, 1.94 / 3.23 / 6.94, against 2.02 /
    4.37 / 9.47 for one head per program). Heads of >= 512: one head per program (6x512: 2.03 /
    4.16 / 10.16; BH = 2: 2.24 / 4.22 / 9.66; BH = 4: 2.79 / 5.01 / 10.98). 4 warps."""
    BV = triton.next_power_of_2(V)
    BH = 1 if BV >= 512 else max(1, min(triton.next_power_of_2(HV), 1024 // BV))
    return BH, 4


def gated_rms_norm(o: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, eps: float, act: str,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """fla ``FusedRMSNormGated`` per value head: ``o [N, HV, V]`` (fp32), ``gate [N, HV*V]`` or None
    -> ``[N, HV*V]`` ``out_dtype``; ``act`` is ``"swish"``/``"silu"`` or ``"sigmoid"``."""
    N, HV, V = o.shape
    assert o.stride(2) == 1 and o.stride(1) == V
    y = torch.empty(N, HV * V, dtype=out_dtype, device=o.device)
    if N:
        if gate is not None:
            assert gate.stride(1) == 1
        BH, nw = _gated_norm_config(N, HV, V)
        on = _pdl.enabled(o)
        _gated_rms_norm_kernel[(N, triton.cdiv(HV, BH))](
            o, gate if gate is not None else o, weight, y, o.stride(0),
            gate.stride(0) if gate is not None else 0, y.stride(0), HV, V, eps,
            BH=BH, BV=triton.next_power_of_2(V), HAS_GATE=gate is not None, SIGMOID=act == "sigmoid", PDL=on,
            num_warps=nw, **_pdl.launch_kw(on))
    return y


@triton.jit
def _silu_mul_kernel(x, y, sx, sy, I, BI: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BI + tl.arange(0, BI)
    m = c < I
    a = tl.load(x + i * sx + c, mask=m, other=0.0).to(tl.float32)
    b = tl.load(x + i * sx + I + c, mask=m, other=0.0).to(tl.float32)
    tl.store(y + i * sy + c, (a * tl.sigmoid(a) * b).to(y.dtype.element_ty), mask=m)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """``x [N, 2I]`` (gate | up, fla ``GatedMLP`` swish) -> ``silu(x[:, :I]) * x[:, I:]`` ``[N, I]``."""
    N, I2 = x.shape
    assert x.stride(1) == 1 and I2 % 2 == 0
    I = I2 // 2
    y = torch.empty(N, I, dtype=x.dtype, device=x.device)
    if N:
        BI = min(2048, triton.next_power_of_2(I))
        on = _pdl.enabled(x)
        _silu_mul_kernel[(N, triton.cdiv(I, BI))](x, y, x.stride(0), y.stride(0), I, BI=BI, PDL=on, num_warps=4,
                                                  **_pdl.launch_kw(on))
    return y


@triton.jit
def _gating_kernel(a, b, A_log, dt_bias, valid, out, sa, sb, HV, T, BH: tl.constexpr,
                   NEG: tl.constexpr, HAS_VALID: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BH)
    m = h < HV
    av = tl.load(a + i * sa + h, mask=m, other=0.0).to(tl.float32) + tl.load(dt_bias + h, mask=m, other=0.0).to(tl.float32)
    sp = tl.where(av > 20.0, av, tl.log(1.0 + tl.exp(tl.minimum(av, 20.0))))
    g = -tl.exp(tl.load(A_log + h, mask=m, other=0.0).to(tl.float32)) * sp
    beta = tl.sigmoid(tl.load(b + i * sb + h, mask=m, other=0.0).to(tl.float32))
    if NEG:
        beta = beta * 2.0
    if HAS_VALID:
        # token t of its row is a real token iff t < valid[row]; padding tokens get g = 0 and
        # beta = 0, which leaves the recurrent state unchanged (no decay, no write)
        ok = (i % T) < tl.load(valid + i // T)
        g = tl.where(ok, g, 0.0)
        beta = tl.where(ok, beta, 0.0)
    tl.store(out + i * 2 * HV + h, g, mask=m)
    tl.store(out + i * 2 * HV + HV + h, beta, mask=m)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
               allow_neg_eigval: bool = False, valid_len: torch.Tensor | None = None,
               tokens_per_row: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused :func:`vllm_specla.ops.reference.gdn_gating_ref` with an optional padding mask.

    ``a, b [N, HV]`` (row stride free) -> ``(g, beta)``, each ``[N, HV]`` float32 (column views of
    one ``[N, 2*HV]`` buffer). ``valid_len [N // tokens_per_row]`` int: token ``t`` of a row of
    ``tokens_per_row`` tokens is padding when ``t >= valid_len[row]`` (then ``g = beta = 0``).
    """
    N, HV = a.shape
    out = torch.empty(N, 2 * HV, dtype=torch.float32, device=a.device)
    if N:
        assert a.stride(1) == 1 and b.stride(1) == 1
        on = _pdl.enabled(a)
        _gating_kernel[(N,)](a, b, A_log, dt_bias, valid_len if valid_len is not None else a, out,
                             a.stride(0), b.stride(0), HV, tokens_per_row, BH=triton.next_power_of_2(HV),
                             NEG=bool(allow_neg_eigval), HAS_VALID=valid_len is not None, PDL=on, num_warps=1,
                             **_pdl.launch_kw(on))
    return out[:, :HV], out[:, HV:]


@triton.jit
def _gemv_x(x, gate, nw, k0, rk, K, rstd_or_eps, PRO: tl.constexpr, HD: tl.constexpr, HAS_GATE: tl.constexpr,
            GSIG: tl.constexpr, BK: tl.constexpr):
    """One row's activations ``[BK]`` at columns ``k0 + rk`` after the prologue, float32 (masked: 0).
    ``rstd_or_eps``: the row's 1 / RMS for PRO 1, the norm's eps for PRO 3."""
    mk = (k0 + rk) < K
    if PRO == 2:  # SwiGLU: x is [2K]
        a = tl.load(x + k0 + rk, mask=mk, other=0.0).to(tl.float32)
        b = tl.load(x + K + k0 + rk, mask=mk, other=0.0).to(tl.float32)
        xk = (a * tl.sigmoid(a) * b).to(x.dtype.element_ty).to(tl.float32)  # silu_mul_ref rounds to x.dtype
    else:
        xk = tl.load(x + k0 + rk, mask=mk, other=0.0).to(tl.float32)
    if PRO == 1:
        xk = xk * rstd_or_eps * tl.load(nw + k0 + rk, mask=mk, other=0.0).to(tl.float32)
    if PRO == 3:  # per-head RMSNorm (heads of HD columns, BK % HD == 0) times act(gate)
        xh = tl.reshape(xk, [BK // HD, HD])
        r = tl.rsqrt(tl.sum(xh * xh, 1) / HD + rstd_or_eps)
        xk = tl.reshape(xh * r[:, None], [BK]) * tl.load(nw + (k0 + rk) % HD).to(tl.float32)
        if HAS_GATE:
            gk = tl.load(gate + k0 + rk, mask=mk, other=0.0).to(tl.float32)
            xk = xk * (tl.sigmoid(gk) if GSIG else gk * tl.sigmoid(gk))
    return xk


@triton.jit
def _gemv_row(x, xr, m, sx, XR: tl.constexpr):
    """Token row ``m``'s activations: ``x + m * sx``, or ``x + xr[m] * sx`` (a row gather) with XR."""
    if XR:
        return x + tl.load(xr + m) * sx
    return x + m * sx


@triton.jit
def _gemv_rows_kernel(x, w, out, res, nw, gate, N, K, sx, sg, so, sr, eps, gb, A_log, dt_bias, A0, HV, ws,
                      xr, xo, sxo, tok, emb, ED, SE,
                      MR: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr,
                      PRO: tl.constexpr, HD: tl.constexpr, HAS_GATE: tl.constexpr, GSIG: tl.constexpr,
                      RES: tl.constexpr, PDL: tl.constexpr, GATING: tl.constexpr, NEG: tl.constexpr,
                      WS: tl.constexpr, XR: tl.constexpr, XO: tl.constexpr, EMB: tl.constexpr):
    # One program per BN weight rows, MR token rows (MP = next power of two >= MR). The K loop is
    # unrolled (NK = cdiv(K, BK) chunks, BK a power of two) and each weight chunk is loaded once and
    # multiplied into every token row in turn (a reduction over the chunk per row, across warps at
    # the default config, into column m of a [BN, MP] accumulator). The first chunk is loaded first
    # of all: no kernel of the step writes the weights (ops/pdl.py), so under PDL it streams while
    # the previous kernel still runs, and otherwise it is in flight
    # before the prologue's reductions (whose barriers would hold it back). Loading two chunks
    # first measured slower (0.857 against 0.792 ms for the step's GEMMs, flame, s12b).
    # At 2+ rows this form measured 2.2-5x cuBLAS's time (s12b): every row's pass over a chunk is a
    # dependent chain of x loads, layout conversion and reduction, so the dispatch keeps M = 1.
    # WS: w is float8 with one float32 scale per weight row (ws [N]; W8A16): the activations are rounded
    # to the output dtype, not to w's, and each row's sum is scaled once after the K loop.
    # XR: token row m reads x row xr[m] (int64; a row gather), and gate / residual row xr[m] likewise. XO:
    # program 0 also stores each row's activations after the prologue, rounded as the product uses them,
    # into xo (the normed features a later kernel reads). EMB: the row is [emb[tok[m]] (ED columns) | x row
    # (K - ED columns)], the EAGLE drafter's fc input (fused.embed_ref), without a launch of its own.
    pid = tl.program_id(0)
    rn = pid * BN + tl.arange(0, BN)
    mn = rn < N
    rk = tl.arange(0, BK)
    rm = tl.arange(0, MP)
    w0 = tl.load(w + rn[:, None] * K + rk[None, :], mask=mn[:, None] & (rk < K)[None, :], other=0.0)
    if PDL:  # everything below reads the previous kernels' results
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    om = mn[:, None] & (rm < MR)[None, :]
    if RES:  # (XR: residual row xr[m], as x's)
        if XR:
            rr = tl.load(xr + rm, mask=rm < MR, other=0)
        else:
            rr = rm
        r0 = tl.load(res + rr[None, :] * sr + rn[:, None], mask=om, other=0.0).to(tl.float32)
    rstd = tl.full([MP], eps, dtype=tl.float32)
    if PRO == 1:  # each row's RMS first (x is MR rows of a few KB, L1/L2-resident)
        for m in tl.static_range(MR):
            ss = tl.zeros([BK], dtype=tl.float32)
            for k0 in tl.static_range(0, NK * BK, BK):
                xk = tl.load(_gemv_row(x, xr, m, sx, XR) + k0 + rk, mask=(k0 + rk) < K, other=0.0).to(tl.float32)
                ss += xk * xk
            rstd = tl.where(rm == m, tl.rsqrt(tl.sum(ss, 0) / K + eps), rstd)
    acc = tl.zeros([BN, MP], dtype=tl.float32)
    for k0 in tl.static_range(0, NK * BK, BK):
        if k0 == 0:
            wk = w0
        else:
            wk = tl.load(w + rn[:, None] * K + (k0 + rk)[None, :], mask=mn[:, None] & ((k0 + rk) < K)[None, :],
                         other=0.0)
        wf = wk.to(tl.float32)
        for m in tl.static_range(MR):
            rs = tl.sum(tl.where(rm == m, rstd, 0.0), 0)
            if EMB:  # [emb[tok[m]] | x row]: embed_ref's cast to the table's dtype, then the GEMM's rounding
                kk = k0 + rk
                te = tl.load(tok + m)
                xe = tl.load(emb + te * SE + kk, mask=kk < ED, other=0.0)
                xf = tl.load(_gemv_row(x, xr, m, sx, XR) + (kk - ED), mask=(kk >= ED) & (kk < K), other=0.0)
                xk = tl.where(kk < ED, xe, xf.to(emb.dtype.element_ty)).to(tl.float32)
            else:
                xk = _gemv_x(_gemv_row(x, xr, m, sx, XR), _gemv_row(gate, xr, m, sg, XR), nw, k0, rk, K, rs, PRO,
                             HD, HAS_GATE, GSIG, BK)
            # the activation rounded to the weight dtype, as the unfused prologue kernel -> GEMM path has it
            # (out.dtype is w.dtype except with WS, where it is the activation dtype)
            xq = xk.to(out.dtype.element_ty)
            if XO:
                if pid == 0:
                    tl.store(xo + m * sxo + k0 + rk, xq, mask=(k0 + rk) < K)
            xk = xq.to(tl.float32)
            acc += tl.where(rm[None, :] == m, tl.sum(wf * xk[None, :], 1)[:, None], 0.0)
    if WS:
        acc = acc * tl.load(ws + rn, mask=mn, other=0.0)[:, None]
    if RES:
        acc += r0
    y = acc.to(out.dtype.element_ty)
    tl.store(out + rm[None, :] * so + rn[:, None], y, mask=om)
    if GATING:  # output columns A0 .. A0 + 2 HV are GDN's a | b: _gating_kernel's math on them
        ia = rn - A0
        in_a = (ia >= 0) & (ia < HV)
        in_g = in_a | ((ia >= HV) & (ia < 2 * HV))
        hh = tl.where(in_a, ia, ia - HV)
        hh = tl.where(in_g, hh, 0)
        yv = y.to(tl.float32)  # the rounded output, as _gating_kernel reads it
        av = yv + tl.load(dt_bias + hh, mask=in_g, other=0.0).to(tl.float32)[:, None]
        sp = tl.where(av > 20.0, av, tl.log(1.0 + tl.exp(tl.minimum(av, 20.0))))
        gv = -tl.exp(tl.load(A_log + hh, mask=in_g, other=0.0).to(tl.float32))[:, None] * sp
        bv = tl.sigmoid(yv)
        if NEG:
            bv = bv * 2.0
        tl.store(gb + rm[None, :] * (2 * HV) + ia[:, None], tl.where(in_a[:, None], gv, bv),
                 mask=om & in_g[:, None])


GEMV_ROWS_BLOCK = 16  # token rows per launch of the row GEMV (its MR is a compile-time constant)
GEMV_ROWS_MAX_M = 1  # token rows the dispatch gives the row GEMV (2+ rows: 1.15-1.98x cuBLAS at M = 2, s11a;
# 2.2-5x at M = 5 and 7 with each weight chunk loaded once for all rows, s12b)
# BN, BK (0: one tile, BK = next power of two >= K), num_warps: the best AR step at batch 1 with the
# prologues fused (s11c); (1, 0, 4) was the best bare GEMM set (s11a / s11b). Since session 31 not for one-row GEMMs
# of at most GEMV_ROWS_NARROW_N outputs (the in-projection, gate|up and the LM head keep it), see
# GEMV_ROWS_CONFIG_NARROW
GEMV_ROWS_CONFIG = (8, 1024, 8)
# bf16 / fp16 / fp32 GEMMs of one token row and at most GEMV_ROWS_NARROW_N outputs (o_proj and down_proj: N = 2048,
# one wave of 256 programs) run this config instead (None: GEMV_ROWS_CONFIG). Each program's first K tile is loaded
# before its PDL wait, so a 2048-wide tile streams 2/3 of o_proj's K = 3072 (down_proj's 5632: 36 %) while the
# previous kernel finishes, against 1/3 (18 %) at BK = 1024. AR step at batch 1, same call (s31c): flame 1.012 ->
# 0.969 ms, map 1.067 -> 1.009 (s31b agrees); BK 4096 (1.008 / 1.063), BN 16 (0.986 / 1.015), BN 4 / 2 and BK 512
# were slower, and the same 2048 tile for the wide GEMMs too (--gemv-rows 8,2048,8) gave 1.001 / 1.028
# (benchmarks/RESULTS.md "Session 31"; bench_e2e.py --gemv-rows-narrow). Measured at N = 2048 only, so the bound
# stops there; two or more rows keep the measured configs too
GEMV_ROWS_CONFIG_NARROW: tuple[int, int, int] | None = (8, 2048, 8)
GEMV_ROWS_NARROW_N = 2048
# float8 weights (w_scale): the same bytes per program as GEMV_ROWS_CONFIG's bf16 chunk (8 rows x 2048 k x 1 byte)
GEMV_ROWS_FP8_CONFIG = (8, 2048, 8)
# float8 one-row GEMMs of at most GEMV_ROWS_NARROW_N outputs (the drafter's fc, o_proj, down_proj) at this config
# instead (None: GEMV_ROWS_FP8_CONFIG), for the reason of GEMV_ROWS_CONFIG_NARROW: SpecLA's batch-1 K = 7 step 3-7 us
# faster (s31c; BN 16 at BK 2048 was 10 us slower; bench_e2e.py --fp8-narrow)
GEMV_ROWS_FP8_CONFIG_NARROW: tuple[int, int, int] | None = (8, 4096, 8)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_PROLOGUES = {None: 0, "rms_norm": 1, "silu_mul": 2, "gated_rms_norm": 3}


def rows_config(N: int, fp8: bool, M: int = 1) -> tuple[int, int, int]:
    """The ``(BN, BK, num_warps)`` :func:`gemv_rows` runs without ``config`` for ``M`` token rows
    and ``N`` outputs: one row and up to :data:`GEMV_ROWS_NARROW_N` outputs
    :data:`GEMV_ROWS_CONFIG_NARROW` (float8 weights: :data:`GEMV_ROWS_FP8_CONFIG_NARROW`) where
    set, else :data:`GEMV_ROWS_CONFIG` (:data:`GEMV_ROWS_FP8_CONFIG`)."""
    narrow = GEMV_ROWS_FP8_CONFIG_NARROW if fp8 else GEMV_ROWS_CONFIG_NARROW
    if narrow is not None and M == 1 and N <= GEMV_ROWS_NARROW_N:
        return tuple(narrow)
    return tuple(GEMV_ROWS_FP8_CONFIG if fp8 else GEMV_ROWS_CONFIG)


def _spans_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the first-to-last element byte spans of ``a`` and ``b`` intersect (host-only)."""
    def span(t):
        lo = t.data_ptr()
        return lo, lo + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) * t.element_size() + t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def gemv_rows(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
              residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
              config: tuple[int, int, int] | None = None, prologue: str | None = None,
              gate: torch.Tensor | None = None, head_dim: int = 0, gate_act: str = "silu",
              pdl: bool | None = None, gating: tuple | None = None,
              w_scale: torch.Tensor | None = None, x_rows: torch.Tensor | None = None,
              x_out: torch.Tensor | None = None, embed: tuple | None = None,
              out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode GEMV on CUDA cores: ``prologue(x) @ w.T [+ residual]`` for ``x [M, *]``, ``M`` small.

    Args:
        x: activations, row stride free, dense feature dim, any float dtype: ``[M, K]``, or
            ``[M, 2K]`` for ``prologue="silu_mul"``. Cast to ``w.dtype`` after the prologue
            (with ``w_scale``: rounded to ``x.dtype``).
        w: ``[N, K]`` row-major weight (``nn.Linear`` layout), bf16 / fp16 / fp32; or float8
            (``torch.float8_e4m3fn`` / ``float8_e5m2``) with ``w_scale``.
        w_scale: ``[N]`` float32, contiguous: ``w`` is float8 and weight row ``n`` is
            ``w[n].float() * w_scale[n]`` (per-output-row scales, ``fused.quantize_fp8``; W8A16).
            The output, and the rounding of the activations after the prologue, are then in
            ``out_dtype`` (default ``x.dtype``; bf16 / fp16 / fp32) instead of ``w.dtype``; the scale
            multiplies each row's float32 sum once, before the residual (``fused.Fp8Weight.ref_linear``).
        out_dtype: with ``w_scale`` only: the output / activation-rounding dtype when ``x`` is in
            another one (``Fp8Weight.dtype``, the model's, for the recurrence's float32 output into
            the gated-RMSNorm prologue); None: ``x.dtype``.
        norm_weight: the prologue's weight: ``[K]`` for ``"rms_norm"``, ``[head_dim]`` for
            ``"gated_rms_norm"``.
        prologue: ``None``; ``"rms_norm"`` (fla ``RMSNorm`` of the row; implied by ``norm_weight``
            alone); ``"silu_mul"`` (SwiGLU, ``fused.silu_mul_ref``, rounded to ``x.dtype``);
            ``"gated_rms_norm"`` (fla ``FusedRMSNormGated`` per head of ``head_dim`` columns, a power
            of two, times ``gate_act(gate)``; ``fused.gated_rms_norm_ref``). Float32 math.
        gate: ``[M, K]`` (dense feature dim; ``[R, K]`` with ``x_rows``) or None, for ``"gated_rms_norm"``.
        gate_act: ``"silu"`` / ``"swish"`` or ``"sigmoid"``.
        residual: optional ``[M, N]`` (``[R, N]`` with ``x_rows``) added in float32 after the product.
        out: optional ``[M, N]`` output in ``w.dtype`` (``x.dtype`` with ``w_scale``); may be ``residual``
            itself (each element is read, then written, by the same program), except with ``x_rows``
            (refused); must not overlap ``x`` or ``gate``.
        ``w`` must not be written by the kernels just before this call in the stream (under PDL its
        first chunk is read before the wait for them, ``ops/pdl.py``): model weights, set once.
        config: ``(BN, BK, num_warps)``, BN a power of two, BK 0 (one tile) or a power of two;
            default :func:`rows_config`.
        pdl: launch with programmatic dependent launch (``ops/pdl.py``); default
            ``pdl.enabled(x)``.
        gating: ``(gb, a0, A_log, dt_bias, allow_neg_eigval)``: the GDN gating of
            :func:`gdn_gating` as an epilogue. Output columns ``a0 .. a0 + HV`` are ``a`` and the
            next ``HV`` are ``b`` (``HV = A_log.numel()``); ``gb [M, 2 HV]`` float32 (contiguous)
            receives ``g | beta`` from the rounded outputs, as :func:`gdn_gating` computes them
            from the stored output (one launch fewer per layer).
        x_rows: ``[M]`` int64, contiguous: token row ``m`` is ``x[x_rows[m]]`` (a row gather; ``x``
            may then have any number of rows, and the indices must be valid rows of it: they are not
            checked on the device). ``M`` is then ``x_rows.numel()``. ``gate`` and ``residual`` rows
            are gathered alike (``[R, *]`` with the rows of ``x``: the drafter's absorb pass keeps only
            its accepted rows after the recurrence); ``out`` is then dense ``[M, N]`` and must not
            overlap ``residual``.
        x_out: ``[M, K]`` (dense feature dim) in the output dtype, or None: receives each row's
            activations after the prologue, rounded as the product uses them (for ``"rms_norm"``:
            ``fused.rms_norm_ref(x, norm_weight, eps, dtype)``), stored by the first program; must not
            overlap ``x``.
        embed: ``(table [V, ED] (row stride free), tokens [M] int64 contiguous)``: the row is ``[table[tokens[m]] | x[m]]``
            (``fused.embed_ref``: ``x`` cast to the table's dtype), ``x [M, K - ED]``; the EAGLE
            drafter's ``fc`` input without its own launch. Only without a prologue; token ids must
            be valid rows of ``table`` (not checked on the device).
        norm_weight / gate must be as stated (contiguous ``norm_weight``); ``gate`` and ``head_dim``
        only with ``"gated_rms_norm"``.
    Returns:
        ``[M, N]`` in ``w.dtype`` (``x.dtype`` with ``w_scale``; ``out`` when given); fp32 accumulation.
    Raises:
        ValueError: a layout or prologue argument outside the above (names the argument).

    One program per ``BN`` weight rows streams them once for up to 16 token rows (more rows: one
    launch per 16). The M = 1 decode step is a pure weight stream: ``benchmarks/bench_blas.py``
    times it against cuBLAS on the step's own weights (RESULTS.md sessions 11-12). The math is the
    unfused prologue kernel then ``linear_ref`` (``ops/fused.py``) up to summation order.
    """
    if prologue is None and norm_weight is not None:
        prologue = "rms_norm"
    if prologue not in _PROLOGUES:
        raise ValueError(f"gemv_rows: prologue must be one of {sorted(p for p in _PROLOGUES if p)} or None, got "
                         f"{prologue!r}")
    M, Kx = x.shape
    Mx = M  # rows of x (and of gate / residual): M unless x_rows gathers M of them
    N, K = w.shape
    ED = 0
    if embed is not None:
        if not (isinstance(embed, (tuple, list)) and len(embed) == 2):
            raise ValueError(f"gemv_rows: embed must be a pair (table, tokens), got {type(embed).__name__}")
        table, tok = embed
        if prologue is not None or table.dim() != 2 or table.stride(1) != 1 or tok.dtype != torch.int64:
            raise ValueError(f"gemv_rows: embed needs no prologue, a table [V, ED] with a dense feature dim and int64 "
                             f"tokens; got prologue {prologue!r}, table {tuple(table.shape)}, tokens {tok.dtype}")
        ED = table.shape[1]
        if tok.shape != (M,) or not tok.is_contiguous():
            raise ValueError(f"gemv_rows: embed's tokens must be contiguous [M] = [{M}], got {tuple(tok.shape)}")
    if x_rows is not None:
        if x_rows.dim() != 1 or x_rows.dtype != torch.int64 or not x_rows.is_contiguous():
            raise ValueError(f"gemv_rows: x_rows must be a contiguous int64 [M] tensor, got {tuple(x_rows.shape)} "
                             f"{x_rows.dtype}")
        if embed is not None:
            raise ValueError("gemv_rows: x_rows and embed are exclusive (embed reads row m of x for token m)")
        M = x_rows.numel()
    if Kx + ED != (2 * K if prologue == "silu_mul" else K) or not w.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"gemv_rows: need x [M, K] ([M, 2K] for silu_mul, [M, K - ED] with embed) with a dense feature "
                         f"dim and a contiguous w [N, K]; got x {tuple(x.shape)} stride {tuple(x.stride())}, "
                         f"w {tuple(w.shape)}, ED {ED}")
    pro = _PROLOGUES[prologue]
    odt = w.dtype
    if w_scale is not None:
        if w.dtype not in FP8_DTYPES:
            raise ValueError(f"gemv_rows: w_scale needs a float8 w ({', '.join(map(str, FP8_DTYPES))}), got {w.dtype}")
        if w_scale.shape != (N,) or w_scale.dtype != torch.float32 or not w_scale.is_contiguous():
            raise ValueError(f"gemv_rows: w_scale must be contiguous float32 [N] = [{N}], got {tuple(w_scale.shape)} "
                             f"{w_scale.dtype}")
        odt = x.dtype if out_dtype is None else out_dtype
        if odt not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"gemv_rows: with a float8 w the output dtype (out_dtype, else x.dtype) must be bfloat16, "
                             f"float16 or float32, got {odt}")
    elif w.dtype in FP8_DTYPES:
        raise ValueError("gemv_rows: a float8 w needs w_scale (its per-row scales), got w_scale None")
    elif out_dtype is not None and out_dtype != w.dtype:
        raise ValueError(f"gemv_rows: out_dtype goes with a float8 w (w_scale); the output of a {w.dtype} w is "
                         f"{w.dtype}, got out_dtype {out_dtype}")
    cfg = tuple(config or rows_config(N, w_scale is not None, M))
    if len(cfg) != 3:
        raise ValueError(f"gemv_rows: config must be (BN, BK, num_warps), got {cfg}")
    BN, BK, nw = cfg
    if BN < 1 or BN & (BN - 1) or (BK > 0 and BK & (BK - 1)):
        raise ValueError(f"gemv_rows: config (BN, BK, num_warps) needs BN a power of two and BK 0 or a power of two, "
                         f"got {cfg}")
    KP = triton.next_power_of_2(K)
    BK = KP if BK <= 0 else min(BK, KP)
    NK = triton.cdiv(K, BK)
    if pro == 3:
        if head_dim <= 0 or head_dim & (head_dim - 1) or K % head_dim or BK % head_dim:
            raise ValueError(f"gemv_rows: head_dim must be a power of two dividing K = {K} and BK = {BK}, got "
                             f"{head_dim}")
        if gate_act not in ("silu", "swish", "sigmoid"):
            raise ValueError(f"gemv_rows: gate_act must be 'silu', 'swish' or 'sigmoid', got {gate_act!r}")
        if gate is not None and (gate.shape != (Mx, K) or gate.stride(1) != 1):
            raise ValueError(f"gemv_rows: gate must be [{'R' if x_rows is not None else 'M'}, K] = [{Mx}, {K}] with a "
                             f"dense feature dim, got {tuple(gate.shape)}")
    if (pro in (1, 3)) != (norm_weight is not None):
        raise ValueError(f"gemv_rows: norm_weight is needed by (and only by) the norm prologues, got prologue "
                         f"{prologue!r} with norm_weight {'set' if norm_weight is not None else 'None'}")
    if norm_weight is not None and (norm_weight.shape != ((head_dim,) if pro == 3 else (K,))
                                    or not norm_weight.is_contiguous()):
        raise ValueError(f"gemv_rows: norm_weight must be contiguous [{head_dim if pro == 3 else K}] for prologue "
                         f"{prologue!r}, got {tuple(norm_weight.shape)} stride {tuple(norm_weight.stride())}")
    if pro != 3 and (gate is not None or head_dim):
        raise ValueError(f"gemv_rows: gate / head_dim belong to the 'gated_rms_norm' prologue, got prologue {prologue!r}")
    if residual is not None and (residual.shape != (Mx, N) or residual.stride(1) != 1):
        raise ValueError(f"gemv_rows: residual must be [{'R' if x_rows is not None else 'M'}, N] = [{Mx}, {N}] with a "
                         f"dense feature dim, got {tuple(residual.shape)} stride {tuple(residual.stride())}")
    if out is None:
        out = torch.empty(M, N, dtype=odt, device=x.device)
    elif x_rows is not None and residual is not None and out.numel() and _spans_overlap(out, residual):
        raise ValueError("gemv_rows: with x_rows, out must not overlap residual (row m is stored where another "
                         "program may still read residual row x_rows[m'])")
    if out.shape != (M, N) or out.stride(1) != 1 or out.dtype != odt:
        raise ValueError(f"gemv_rows: out must be [M, N] = [{M}, {N}] in {odt} with a dense feature dim, "
                         f"got {tuple(out.shape)} {out.dtype} stride {tuple(out.stride())}")
    if x_out is not None and (x_out.shape != (M, K) or x_out.stride(1) != 1 or x_out.dtype != odt):
        raise ValueError(f"gemv_rows: x_out must be [M, K] = [{M}, {K}] in {odt} with a dense feature dim, got "
                         f"{tuple(x_out.shape)} {x_out.dtype} stride {tuple(x_out.stride())}")
    if x_out is not None and x_out.numel() and x.numel() and _spans_overlap(x_out, x):
        raise ValueError("gemv_rows: x_out must not overlap x (the first program writes it while the others read x)")
    if M == 0:
        return out
    has_gate = pro == 3 and gate is not None
    if gating is not None:
        gb, a0, A_log, dt_bias, neg = gating
        HV = A_log.numel()
        if (gb.shape != (M, 2 * HV) or not gb.is_contiguous() or gb.dtype != torch.float32 or a0 < 0
                or a0 + 2 * HV > N or dt_bias.numel() != HV or not (A_log.is_contiguous() and dt_bias.is_contiguous())):
            raise ValueError(f"gemv_rows: gating needs gb contiguous float32 [M, 2 HV] = [{M}, {2 * HV}], "
                             f"0 <= a0 <= N - 2 HV = {N - 2 * HV} and contiguous A_log / dt_bias of HV elements; "
                             f"got gb {tuple(gb.shape)} {gb.dtype}, a0 {a0}, dt_bias {tuple(dt_bias.shape)}")
    else:
        gb, a0, A_log, dt_bias, neg, HV = w, 0, w, w, False, 1
    on = _pdl.enabled(x) if pdl is None else bool(pdl)
    for m0 in range(0, M, GEMV_ROWS_BLOCK):
        mr = min(GEMV_ROWS_BLOCK, M - m0)
        m1 = 0 if x_rows is not None else m0  # (a gather indexes x, gate, residual from their first row)
        xs, os_ = x[m1:], out[m0:]
        _gemv_rows_kernel[(triton.cdiv(N, BN),)](
            xs, w, os_, residual[m1:] if residual is not None else os_,
            norm_weight if norm_weight is not None else w, gate[m1:] if has_gate else xs, N, K, x.stride(0),
            gate.stride(0) if has_gate else 0, out.stride(0), residual.stride(0) if residual is not None else 0, eps,
            gb[m0:] if gating is not None else gb, A_log, dt_bias, a0, HV, GATING=gating is not None, NEG=bool(neg),
            MR=mr, MP=triton.next_power_of_2(mr), BN=BN, BK=BK, NK=NK, PRO=pro, HD=max(head_dim, 1),
            HAS_GATE=has_gate, GSIG=gate_act == "sigmoid", RES=residual is not None, PDL=on, num_warps=nw,
            ws=w_scale if w_scale is not None else w, WS=w_scale is not None,
            xr=x_rows[m0:] if x_rows is not None else w, XR=x_rows is not None,
            xo=x_out[m0:] if x_out is not None else os_, sxo=x_out.stride(0) if x_out is not None else 0,
            XO=x_out is not None, tok=embed[1][m0:] if embed is not None else w,
            emb=embed[0] if embed is not None else w, ED=ED, SE=embed[0].stride(0) if embed is not None else 0,
            EMB=embed is not None,
            **_pdl.launch_kw(on))
    return out


# ---------------------------------------------------------------- greedy token: argmax over the vocabulary
@triton.jit
def _argmax_kernel(x, out, ids, V, sx, so, BV: tl.constexpr, PDL: tl.constexpr, IDS: tl.constexpr):
    # one program per row: the first index of the maximum (NaN counts as the maximum, first NaN
    # wins), torch.argmax's rule; IDS: stored as ids[index] (a draft vocabulary's token ids)
    pdl_enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BV)
    m = o < V
    v = tl.load(x + i * sx + o, mask=m, other=float("-inf")).to(tl.float32)
    nan = (v != v) & m
    big = V + BV
    first_nan = tl.min(tl.where(nan, o, big), 0)
    mx = tl.max(tl.where(nan, float("-inf"), v), 0)
    first_max = tl.min(tl.where((v == mx) & m, o, big), 0)
    idx = tl.where(first_nan < big, first_nan, first_max).to(tl.int64)
    if IDS:
        idx = tl.load(ids + idx)
    tl.store(out + i * so, idx)


ARGMAX_MAX_V = 65536  # one program holds a whole row: larger vocabularies go to torch (fused.argmax)


def argmax_takes(x: torch.Tensor) -> bool:
    """Whether :func:`argmax` takes ``x``: 2-D bf16 / fp16 / fp32 logits with a dense last dim and
    ``1 <= V <= ARGMAX_MAX_V`` (fp32 compares are exact for these dtypes)."""
    return (x.dim() == 2 and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and x.stride(-1) == 1
            and 1 <= x.shape[1] <= ARGMAX_MAX_V)


def argmax(x: torch.Tensor, out: torch.Tensor | None = None, ids: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.argmax(x, -1)`` for logits ``x [N, V]`` (row stride free, dense last dim, bf16 /
    fp16 / fp32, ``1 <= V <= ARGMAX_MAX_V``): ``[N]`` int64, the first index of each row's maximum
    (NaN counts as the maximum, the first NaN wins). One program per row, the row in registers
    (fp32 compares: exact for these dtypes). torch's reduction took ~12 us per call for a
    32000-token vocabulary at one row on the H200, this 5.3 us (benchmarks/RESULTS.md session 13).

    Args:
        out: optional ``[N]`` int64 output on ``x``'s device, any stride (e.g. a column of the
            decode runtime's draft window: the drafts land where they are read, no copy).
        ids: optional ``[V]`` int64 contiguous map applied to the index (``ids[argmax]``: a draft
            vocabulary's target token ids, ``core/draft_vocab.py`` ``DraftHead.to_target``).
    Raises:
        ValueError: another dtype, ``V`` outside ``1..ARGMAX_MAX_V`` or a strided last dim; ``out``
            or ``ids`` not as above.
    """
    if not argmax_takes(x):
        raise ValueError(f"argmax: logits must be bf16 / fp16 / fp32 [N, V] with 1 <= V <= {ARGMAX_MAX_V} and a "
                         f"dense last dim, got {x.dtype} {tuple(x.shape)} stride {tuple(x.stride())}")
    N, V = x.shape
    from vllm_specla.ops.fused import check_argmax_out_ids  # noqa: PLC0415

    check_argmax_out_ids(x, out, ids)
    if out is None:
        out = torch.empty(N, dtype=torch.int64, device=x.device)
    if N:
        BV = triton.next_power_of_2(V)
        on = _pdl.enabled(x)
        _argmax_kernel[(N,)](x, out, ids if ids is not None else out, V, x.stride(0), out.stride(0), BV=BV, PDL=on,
                             IDS=ids is not None, num_warps=16 if BV >= 16384 else 4, **_pdl.launch_kw(on))
    return out


# ---------------------------------------------------------------- embedding rows [+ features]
@triton.jit
def _embed_kernel(tok, emb, feats, out, D, DF, st, se, sf, so, BD: tl.constexpr, FEATS: tl.constexpr,
                  PDL: tl.constexpr):
    # program (i, j): columns j*BD .. of output row i = [emb[tok[i]] | feats[i]] (one dtype: a pure copy)
    pdl_enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BD + tl.arange(0, BD)
    t = tl.load(tok + i * st).to(tl.int64)
    me = c < D
    v = tl.load(emb + t * se + c, mask=me, other=0.0)
    if FEATS:
        mf = (c >= D) & (c < D + DF)
        fv = tl.load(feats + i * sf + (c - D), mask=mf, other=0.0)
        v = tl.where(me, v, fv)
    tl.store(out + i * so + c, v, mask=c < D + DF)


def embed(weight: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor | None = None) -> torch.Tensor:
    """Embedding rows, optionally followed by features: ``torch.cat([weight[tokens], feats], -1)`` in one
    launch (programmatic dependent launch on sm90+), as ``fused.embed_ref`` (which also casts ``feats``).

    Args:
        weight: ``[V, D]`` embedding table with a dense last dim (row stride free).
        tokens: int32 / int64 token ids, any shape whose ``reshape(-1)`` is 1-D ``[N]`` (a strided
            column of the decode runtime's window is fine). Precondition, not checked (it would
            need a host sync): ``0 <= tokens < V``.
        feats: optional ``[N, DF]`` features in ``weight.dtype`` with a dense last dim: the EAGLE
            drafter's input ``[embed(x); f]`` (``models/drafter.py``).
    Returns:
        ``[N, D (+ DF)]`` in ``weight.dtype``.
    Raises:
        ValueError: shapes / dtypes / devices / strides outside the above.
    """
    tok = tokens.reshape(-1)
    if tok.dtype not in (torch.int32, torch.int64) or tok.device != weight.device:
        raise ValueError(f"embed: tokens must be int32 / int64 on {weight.device}, got {tok.dtype} on {tok.device}")
    if weight.dim() != 2 or weight.stride(1) != 1:
        raise ValueError(f"embed: weight must be [V, D] with a dense last dim, got {tuple(weight.shape)} "
                         f"stride {tuple(weight.stride())}")
    N, D = tok.shape[0], weight.shape[1]
    DF = 0
    if feats is not None:
        if (feats.dim() != 2 or feats.shape[0] != N or feats.stride(1) != 1 or feats.device != weight.device
                or feats.dtype != weight.dtype):
            raise ValueError(f"embed: feats must be a {weight.dtype} [N, DF] = [{N}, *] tensor on {weight.device} with a dense "
                             f"last dim, got {feats.dtype} {tuple(feats.shape)} stride {tuple(feats.stride())}")
        DF = feats.shape[1]
    out = torch.empty(N, D + DF, dtype=weight.dtype, device=weight.device)
    if N and D + DF:
        BD = min(1024, triton.next_power_of_2(D + DF))
        on = _pdl.enabled(weight)
        _embed_kernel[(N, triton.cdiv(D + DF, BD))](
            tok, weight, feats if feats is not None else out, out, D, DF, tok.stride(0), weight.stride(0),
            feats.stride(0) if feats is not None else 0, out.stride(0), BD=BD, FEATS=feats is not None, PDL=on,
            num_warps=4, **_pdl.launch_kw(on))
    return out
