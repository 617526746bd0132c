"""Fused per-layer elementwise ops of the decode runtime: dispatch + plain-torch references.

Each op runs the Triton kernel of :mod:`vllm_specla.ops.triton_fused` on CUDA tensors and the
reference below otherwise (CPU, CI, and the test oracle). The references are the math of fla 0.6.0
(``fla/modules/layernorm.py`` ``RMSNorm`` / ``FusedRMSNormGated``, ``fla/modules/mlp.py``
``GatedMLP`` swish, ``fla/layers/gated_deltanet.py`` gating), all in float32.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from vllm_specla.ops import _cpp
from vllm_specla.ops import pdl as _pdl  # noqa: F401  (checks VLLM_SPECLA_PDL on every device at import)
from vllm_specla.ops.reference import gdn_gating_ref


def _triton():
    try:
        from vllm_specla.ops import triton_fused  # noqa: PLC0415
    except Exception:  # no triton / no GPU backend
        return None
    return triton_fused


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x [N, D]`` -> ``x * rsqrt(mean(x^2) + eps) * weight`` in float32, cast to ``out_dtype``."""
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(out_dtype or x.dtype)


def gated_rms_norm_ref(o: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, eps: float, act: str,
                       out_dtype: torch.dtype) -> torch.Tensor:
    """``o [N, HV, V]``, ``gate [N, HV*V]`` -> ``RMSNorm_V(o) * weight * act(gate)`` ``[N, HV*V]``."""
    N, HV, V = o.shape
    o32 = o.float()
    y = o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if gate is not None:
        g32 = gate.reshape(N, HV, V).float()
        y = y * (torch.sigmoid(g32) if act == "sigmoid" else F.silu(g32))
    return y.reshape(N, HV * V).to(out_dtype)


def silu_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """``x [N, 2I]`` -> ``silu(x[:, :I]) * x[:, I:]`` (float32 math, ``x.dtype`` out)."""
    a, b = x.float().chunk(2, -1)
    return (F.silu(a) * b).to(x.dtype)


def gdn_gating_masked_ref(a, b, A_log, dt_bias, allow_neg_eigval=False, valid_len=None, tokens_per_row=1):
    """:func:`gdn_gating_ref` with padding tokens (``t >= valid_len[row]``) set to ``g = beta = 0``."""
    g, beta = gdn_gating_ref(A_log, a, dt_bias, b, allow_neg_eigval)
    if valid_len is not None:
        N = a.shape[0]
        t = torch.arange(N, device=a.device) % tokens_per_row
        ok = (t < valid_len.to(a.device).repeat_interleave(tokens_per_row))[:, None]
        g, beta = torch.where(ok, g, 0.0), torch.where(ok, beta, 0.0)
    return g, beta


def linear_ref(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
               residual: torch.Tensor | None = None) -> torch.Tensor:
    """``[rms_norm_ref(x, norm_weight)] @ w.T [+ residual]`` in ``w.dtype`` (the unfused form)."""
    if norm_weight is not None:
        x = rms_norm_ref(x, norm_weight, eps, w.dtype)
    x = x.to(w.dtype)
    return x @ w.t() if residual is None else torch.addmm(residual, x, w.t())


# ---------------------------------------------------------------- float8 weights (W8A16) for the drafter's passes
FP8_MAX = 448.0  # the largest finite torch.float8_e4m3fn
FP8_WEIGHT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class Fp8Weight:
    """A linear weight stored as float8 e4m3 with one float32 scale per output row (W8A16): row
    ``n`` is ``weight[n].float() * scale[n]``. The decode runtime's drafter reads its one-token
    passes' weights in this form (``runtime/fused_model.py`` ``FusedEagle(draft_weights="fp8")``):
    half the bytes of bf16 per pass at batch 1, where a pass is a weight stream.

    Attributes:
        weight: ``[N, K]`` ``torch.float8_e4m3fn``, contiguous.
        scale: ``[N]`` float32, contiguous.
        dtype: the activation / output dtype (the model's: bf16 on GPU, fp32 in exact tests).

    The ops of this module (:func:`linear`, :func:`linear_gating`, :func:`gated_norm_linear`,
    :func:`silu_mul_linear`) take it wherever they take a weight: on CUDA the row GEMV
    (``triton_fused.gemv_rows(w_scale=)``, sm_89+) for any number of rows (16 per launch; slower
    than bf16 from 4 rows on, so the drafter limits it: ``fused_model.FP8_MAX_BATCH``; there is no
    tensor-core float8 path here) when the activations are in :attr:`dtype`,
    otherwise :meth:`ref_linear` (which builds a float32 copy of the weight per call: the CPU path,
    and a slow one on CUDA). Output values are those of :meth:`ref_linear` up to float32 summation
    order.

    Raises:
        ValueError: ``weight`` / ``scale`` / ``dtype`` not as above.
    """

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        if weight.dim() != 2 or weight.dtype != torch.float8_e4m3fn or not weight.is_contiguous():
            raise ValueError(f"Fp8Weight: weight must be a contiguous [N, K] torch.float8_e4m3fn tensor, got "
                             f"{tuple(weight.shape)} {weight.dtype}")
        if scale.shape != weight.shape[:1] or scale.dtype != torch.float32 or not scale.is_contiguous():
            raise ValueError(f"Fp8Weight: scale must be contiguous float32 [N] = [{weight.shape[0]}], got "
                             f"{tuple(scale.shape)} {scale.dtype}")
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"Fp8Weight: dtype must be torch.bfloat16, torch.float16 or torch.float32, got {dtype}")
        self.weight, self.scale, self.dtype = weight, scale, dtype

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @property
    def nbytes(self) -> int:
        """Bytes of the weight and its scales."""
        return self.weight.numel() + 4 * self.scale.numel()

    def dequantize(self) -> torch.Tensor:
        """``[N, K]`` float32: ``weight.float() * scale[:, None]``."""
        return self.weight.float() * self.scale[:, None]

    def ref_linear(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The row GEMV's math in torch: ``x`` (``[M, K]``, the activations after any prologue)
        rounded to :attr:`dtype`, ``(x @ weight.T) * scale`` in float32, ``+ residual`` in float32,
        rounded to :attr:`dtype`: ``[M, N]``."""
        xr = x.to(self.dtype).float()
        y = (xr @ self.weight.float().t()) * self.scale
        if residual is not None:
            y = y + residual.float()
        return y.to(self.dtype)


def quantize_fp8(w: torch.Tensor, dtype: torch.dtype | None = None) -> Fp8Weight:
    """Per-output-row symmetric float8 e4m3 quantization of ``w [N, K]`` (bf16 / fp16 / fp32 /
    fp64, finite): ``scale[n] = max_k |w[n, k]| / 448`` (at least the smallest normal float32; 1
    for an all-zero row), ``weight = w / scale`` rounded to the nearest e4m3. ``dtype``: the
    activation dtype of the result (bf16 / fp16 / fp32; default ``w.dtype``). Each element's error
    is at most 2^-4 of its magnitude (3 mantissa bits), or 2^-10 of the row's scale below e4m3's
    normal range. Rows are converted 4096 at a time, so the float32 temporaries stay small.
    Source: the per-channel float8 weight scheme of vLLM's online ``fp8`` quantization
    (``vllm/model_executor/layers/quantization/online/fp8.py``, ``_fp8_quant_per_channel``), weights
    only and without its scale floor of 1 / (448 * 512) (a row of small weights keeps its 3 bits).

    Raises:
        ValueError: ``w`` not 2-D, not floating point, or with a NaN / inf; ``dtype`` not one of
            the above."""
    if w.dim() != 2:
        raise ValueError(f"quantize_fp8: w must be [N, K], got {tuple(w.shape)}")
    if not w.is_floating_point() or w.dtype in FP8_WEIGHT_DTYPES:
        raise ValueError(f"quantize_fp8: w must be bfloat16, float16, float32 or float64, got {w.dtype}")
    dtype = dtype or w.dtype
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"quantize_fp8: dtype (the activation dtype) must be torch.bfloat16, torch.float16 or "
                         f"torch.float32, got {dtype}")
    w = w.detach()
    if not bool(torch.isfinite(w).all()):
        raise ValueError("quantize_fp8: w has NaN or inf entries (a float8 copy of them would be meaningless)")
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    tiny = torch.finfo(torch.float32).tiny
    for r in range(0, w.shape[0], 4096):
        wf = w[r : r + 4096].to(torch.float32, copy=True)  # (divided in place below: never the caller's tensor)
        amax = wf.abs().amax(1)
        sc = torch.where(amax > 0, (amax / FP8_MAX).clamp_min(tiny), torch.ones_like(amax))
        q[r : r + 4096] = wf.div_(sc[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        scale[r : r + 4096] = sc
    return Fp8Weight(q, scale, dtype)


def _fp8_parts(w) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight, w_scale)`` for ``triton_fused.gemv_rows``: an :class:`Fp8Weight`'s parts, or ``(w, None)``."""
    return (w.weight, w.scale) if isinstance(w, Fp8Weight) else (w, None)


def _fp8_linear_ref(x: torch.Tensor, w: Fp8Weight, residual: torch.Tensor | None, residual_inplace: bool):
    y = w.ref_linear(x, residual)
    return residual.copy_(y) if residual is not None and residual_inplace else y


# Row GEMV (CUDA cores, ``triton_fused.gemv_rows``) for rows <= triton_fused.GEMV_ROWS_MAX_M on CUDA:
# the AR step and the drafter's passes at batch 1. On: the AR step at batch 1 took 1.199 / 1.244 ms
# (flame / map) against 1.421 / 1.490 with cuBLAS (s11c, RESULTS.md session 11); with programmatic
# dependent launch (ops/pdl.py) 1.046 / 1.091 against 1.136 / 1.199 without (s12c, session 12). Not for 2+ rows: the
# row GEMV measured 1.15-1.98x cuBLAS at M = 2 (s11a) and 2.2-5x at M = 5 and 7 (s12b); a form holding [rows, BN, BK]
# partial sums 2.7-9x (s11d, removed); a Triton tensor-core skinny GEMM 1.4-2.8x at M = 5 (s12c, removed). Small
# weights are the exception (GEMV_ROWS_SMALL_*, below). 2-8 rows take the CUDA skinny GEMM once built (SKINNY_*,
# below), else cuBLAS
_ROWS_ENV = (os.environ.get("VLLM_SPECLA_GEMV_ROWS") or "1")  # (set but empty: the default)
if _ROWS_ENV not in ("0", "1"):
    raise ValueError(f"VLLM_SPECLA_GEMV_ROWS must be '0' (cuBLAS for one-row GEMMs) or '1' (the row GEMV, the "
                     f"default), got {_ROWS_ENV!r}")
USE_GEMV_ROWS = _ROWS_ENV == "1"
# Fuse the RMSNorm / gated RMSNorm / SwiGLU into the row GEMV as its prologue (one launch instead of
# two). Pays only with programs of several rows: at BN = 1 every program redoes the prologue's
# reductions before its short weight stream (AR step 1.552 ms against 1.412 for cuBLAS, s11b); at
# triton_fused.GEMV_ROWS_CONFIG, (8, 1024, 8), it measured 1.199 / 1.244 ms (flame / map) against
# 1.201 / 1.288 for the best bare config, (1, 0, 4), after separate prologue kernels (s11c; flame's
# difference is noise, and (8, 1024, 8) without the prologues was not run)
GEMV_ROWS_PROLOGUE = True
# Small weights also take the row GEMV for up to GEMV_ROWS_SMALL_MAX_M rows: there a GEMM is launch-
# bound, not a weight stream, and cuBLAS's split-K tiles plus their reduce kernel cost more. The
# trained pair (fp32, hidden 384, every layer weight <= 3 MiB) at batch 1 on the H200 (s13d, RESULTS.md
# session 13): its K = 6 step 0.861 -> 0.547 ms with the row GEMV for every GEMM of <= 16 rows (cuBLAS
# ran sm80_xmma 32x128 tiles for the 7-row fp32 GEMMs, 327 us a step), K = 4 0.483 -> 0.444, K = 2
# 0.442 -> 0.294; at batch 16 (16 rows) slower, AR 0.426 -> 0.553 ms. No flame / map weight is that
# small (the smallest, map's o_proj, is 8 MiB), so their steps do not change.
GEMV_ROWS_SMALL_MAX_M = 8
GEMV_ROWS_SMALL_BYTES = 4 << 20


def linear(x, w, norm_weight=None, eps=1e-6, residual=None, residual_inplace=False, prefetch=None):
    """``[RMSNorm(x)] @ w.T [+ residual]``: on CUDA the row GEMV when :func:`_rows_impl` takes the
    GEMM (one row, or up to ``GEMV_ROWS_SMALL_MAX_M`` rows on a small weight; ``USE_GEMV_ROWS``,
    :func:`vllm_specla.ops.triton_fused.gemv_rows`), else the RMSNorm kernel + the CUDA skinny GEMM
    (2..``SKINNY_MAX_M`` bf16 / fp16 rows once ``_cpp.load_cuda_gemm()`` has built it,
    :func:`_skinny_takes`) or cuBLAS; the reference math on the CPU.

    ``residual_inplace``: add into ``residual`` itself and return it (``residual.addmm_``: cuBLAS
    accumulates onto it with beta = 1). ``torch.addmm(residual, ...)`` first copies ``residual`` into
    a new output: one device-to-device copy of the residual stream per call, two per block and
    step in the decode runtime (the "Memcpy DtoD" rows of ``benchmarks/step_breakdown.py``). The
    same GEMM with the same operands, so the values are the same.

    ``prefetch``: the weight of the GEMM that runs next in the stream (``[N', K']``, any dtype), or
    None. Where the skinny GEMM runs this one, it prefetches the first
    :data:`SKINNY_PREFETCH_BYTES` of it into L2 as it finishes (:func:`_prefetch_args`); the other
    paths ignore it. A hint: it changes no value.

    ``w`` may be an :class:`Fp8Weight` (then: the row GEMV for any rows on CUDA, its
    :meth:`Fp8Weight.ref_linear` elsewhere; output in ``w.dtype``)."""
    impl = _rows_impl(x, w, residual, False, norm_weight)
    if impl is not None:  # the row GEMV (see _rows_impl), the norm its prologue or its own kernel
        if norm_weight is not None and not GEMV_ROWS_PROLOGUE:
            x, norm_weight = rms_norm(x, norm_weight, eps, w.dtype), None
        ww, wsc = _fp8_parts(w)
        return impl.gemv_rows(x, ww, norm_weight, eps, residual,
                              out=residual if residual is not None and residual_inplace else None, w_scale=wsc)
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps, w.dtype)
    if isinstance(w, Fp8Weight):
        if _skinny_fp8_takes(x, w, residual):
            return _cpp.skinny_gemm_fp8(x, w.weight, w.scale, residual,
                                        out=residual if residual is not None and residual_inplace else None)
        return _fp8_linear_ref(x, w, residual, residual_inplace)
    x = x.to(w.dtype)
    if _skinny_takes(x, w, residual):
        pf, pf_bytes = _prefetch_args(prefetch, w)
        warps, unroll = SKINNY_CONFIG
        return _cpp.skinny_gemm(x, w, residual, out=residual if residual is not None and residual_inplace else None,
                                warps=warps, unroll=unroll, prefetch=pf, prefetch_bytes=pf_bytes)
    if residual is None:
        return x @ w.t()
    return residual.addmm_(x, w.t()) if residual_inplace else torch.addmm(residual, x, w.t())


# The GDN gating (g, beta from the a / b columns of the in-projection) as the row GEMV's epilogue
# instead of its own launch (one launch fewer per layer in the AR step at batch 1)
GEMV_ROWS_GATING = True


def linear_gating(x, w, norm_weight, eps, a0, A_log, dt_bias, allow_neg_eigval=False, valid_len=None,
                  tokens_per_row=1, prefetch=None):
    """The in-projection and the GDN gating of its ``a | b`` columns: ``p = linear(x, w,
    norm_weight, eps)`` and ``(g, beta) = gdn_gating(p[:, a0 : a0 + HV], p[:, a0 + HV : a0 + 2 HV],
    A_log, dt_bias, allow_neg_eigval, valid_len, tokens_per_row)`` with ``HV = A_log.numel()``.

    Returns ``(p [N, out] in w.dtype, g [N, HV] float32, beta [N, HV] float32)``; ``g`` / ``beta``
    are column views of one ``[N, 2 HV]`` buffer, as :func:`gdn_gating` returns them. With
    :data:`GEMV_ROWS_GATING` on, a GEMM the row GEMV takes (:func:`_rows_impl`) without
    ``valid_len`` runs it with the gating as its epilogue (the same math on the same rounded
    outputs); otherwise the two ops run as above. ``prefetch``: as in :func:`linear`; ``w`` may be an
    :class:`Fp8Weight`."""
    impl = _rows_impl(x, w, None, False, norm_weight) if GEMV_ROWS_GATING and valid_len is None else None
    HV = A_log.numel()
    if impl is not None and a0 + 2 * HV <= w.shape[0] and A_log.is_contiguous() and dt_bias.is_contiguous():
        if norm_weight is not None and not GEMV_ROWS_PROLOGUE:
            x, norm_weight = rms_norm(x, norm_weight, eps, w.dtype), None
        gb = torch.empty(x.shape[0], 2 * HV, dtype=torch.float32, device=x.device)
        ww, wsc = _fp8_parts(w)
        p = impl.gemv_rows(x, ww, norm_weight, eps, gating=(gb, a0, A_log, dt_bias, allow_neg_eigval), w_scale=wsc)
        return p, gb[:, :HV], gb[:, HV:]
    p = linear(x, w, norm_weight, eps, prefetch=prefetch)
    g, beta = gdn_gating(p[:, a0 : a0 + HV], p[:, a0 + HV : a0 + 2 * HV], A_log, dt_bias, allow_neg_eigval,
                         valid_len, tokens_per_row)
    return p, g, beta


# The CUDA skinny GEMM (csrc/cuda/skinny_gemm.cu, once ops/_cpp.py load_cuda_gemm() has built it) for
# the GEMMs of at most SKINNY_MAX_M rows that the row GEMV does not take: a batch-1 verify window
# (K + 1 rows) instead of cuBLAS. benchmarks/RESULTS.md, session 15.
_SKINNY_ENV = (os.environ.get("VLLM_SPECLA_SKINNY_GEMM") or "1")  # (set but empty: the default)
if _SKINNY_ENV not in ("0", "1"):
    raise ValueError(f"VLLM_SPECLA_SKINNY_GEMM must be '0' (cuBLAS for 2-8-row GEMMs) or '1' (the CUDA skinny GEMM "
                     f"once ops._cpp.load_cuda_gemm() has built it, the default), got {_SKINNY_ENV!r}")
USE_SKINNY_GEMM = _SKINNY_ENV == "1"
# up to 8 rows (one 8-token MMA tile): at 9 rows (two tiles) the kernel took 1.16x cuBLAS's time (s15c), and 1.11-1.14x
# with the rows past 8 staged in shared memory (session 30, s30b-s30d, removed: RESULTS.md "Session 30"), so K = 8's
# 9-row windows stay on cuBLAS (benchmarks/bench_e2e.py --skinny-max-m raises it). Float8 weights stop at 8 rows
# (_skinny_fp8_takes: the float8 form has one tile).
SKINNY_MAX_M = 8
# (warps, unroll) of ops/_cpp.py skinny_gemm; (0, 0): its automatic choice
SKINNY_CONFIG = (0, 0)
# The skinny GEMM's L2 prefetch of the next GEMM's weight (``linear(prefetch=)``, ops/_cpp.py skinny_gemm):
# bytes from its start, 0 = off. The step's GEMM chain (bench_blas.py skinny-pf, RESULTS.md session 17):
# 4 MiB was the best size or within 0.006 ms of it in every row (flame M = 5 / 8 0.6-2.7 % / 2.1-2.8 % faster
# than none, map 0.3-1.1 %); 16 and 32 MiB were 7-10 % slower than none, 1 MiB -0.5..+2.5 %. End to end at
# batch 1 (s17c, K = 6, alpha 0.8): flame's SpecLA step 2.166 -> 2.127 ms, map's 2.213 -> 2.182; the 4-row AR
# step at batch 4 1.405 -> 1.358. (The op's own default, one constant: _cpp.SKINNY_PREFETCH_DEFAULT_BYTES.)
SKINNY_PREFETCH_BYTES = _cpp.SKINNY_PREFETCH_DEFAULT_BYTES


def _prefetch_args(prefetch: torch.Tensor | None, w: torch.Tensor) -> tuple[torch.Tensor | None, int]:
    """``(tensor, bytes)`` for ``_cpp.skinny_gemm(prefetch=, prefetch_bytes=)``: the first
    ``min(SKINNY_PREFETCH_BYTES, its bytes)`` (rounded down to 16) of ``prefetch``, or ``(None, 0)``
    when it is None, off (``SKINNY_PREFETCH_BYTES = 0``) or a tensor the op would refuse (not
    contiguous, not 16-byte aligned, on another device than ``w``): a hint is never an error."""
    if (not isinstance(prefetch, torch.Tensor) or SKINNY_PREFETCH_BYTES <= 0 or prefetch.device != w.device
            or not prefetch.is_contiguous() or prefetch.data_ptr() % 16):
        return None, 0
    n = int(min(SKINNY_PREFETCH_BYTES, prefetch.numel() * prefetch.element_size())) // 16 * 16
    return (prefetch, n) if n else (None, 0)


def _skinny_takes(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether the CUDA skinny GEMM takes ``x @ w.T [+ residual]``: built and on
    (``_cpp.GEMM_LOADED``, :data:`USE_SKINNY_GEMM`), CUDA, 2..``SKINNY_MAX_M`` rows (one-row GEMMs
    are the row GEMV's, or cuBLAS's with ``VLLM_SPECLA_GEMV_ROWS=0``), and operands the op accepts
    (``_cpp.skinny_problem``; the residual judged as the in-place output, so one overlapping x or w
    goes to cuBLAS)."""
    if not (USE_SKINNY_GEMM and _cpp.GEMM_LOADED and _on_gpu(x) and x.dim() == 2 and 2 <= x.shape[0] <= SKINNY_MAX_M):
        return False
    return _cpp.skinny_problem(x, w, residual, residual) is None


# Float8 weights (Fp8Weight) of 2..min(SKINNY_MAX_M, 8) rows on the CUDA skinny GEMM's float8 form (_cpp.skinny_gemm_fp8:
# f16 tensor-core MMAs) instead of the row GEMV, which loses more at 7 rows than the halved bytes give (RESULTS.md
# "Session 27"): for the drafter's absorb pass with runtime/fused_model.py FP8_MAX_TOKENS > 1. Measured in session 29
# (RESULTS.md "Session 29"): 1.24-1.29x the bf16 skinny GEMM's speed on the absorb pass's GEMMs at 5 / 7 rows, 2-2.6x
# the float8 row GEMV's, -9..-12 us per batch-1 step with the float8 window; off by default, as that window is (its
# acceptance cost exceeds its gain on the trained pair); float8 draft passes at batch 2 are unmeasured on it (3+ rows
# draft on the model weights: fused_model.FP8_MAX_BATCH).
# benchmarks/bench_e2e.py --skinny-fp8.
USE_SKINNY_FP8 = False


def _skinny_fp8_takes(x: torch.Tensor, w, residual: torch.Tensor | None) -> bool:
    """Whether :func:`_cpp.skinny_gemm_fp8` takes ``x @ w.T [+ residual]`` for an :class:`Fp8Weight`
    ``w``: :data:`USE_SKINNY_FP8` and the skinny GEMM built and on, CUDA, 2..min(``SKINNY_MAX_M``, 8) bf16 rows
    (dense, 16-byte aligned), an e4m3 weight with ``K % 16 == 0``, a bf16 ``[M, N]`` residual."""
    if not (USE_SKINNY_FP8 and USE_SKINNY_GEMM and _cpp.GEMM_LOADED and isinstance(w, Fp8Weight) and _on_gpu(x)):
        return False
    ok = (x.dim() == 2 and 2 <= x.shape[0] <= min(SKINNY_MAX_M, 8) and x.dtype == torch.bfloat16 == w.dtype
          and w.weight.dtype == torch.float8_e4m3fn and w.shape[1] % 16 == 0 and x.stride(1) == 1
          and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0)
    return ok and (residual is None or (residual.shape == (x.shape[0], w.shape[0]) and residual.dtype == torch.bfloat16
                                        and residual.stride(1) == 1))


def _on_gpu(x: torch.Tensor) -> bool:
    """Whether ``x`` is where the Triton kernels run (a seam: the tests point it at the CPU under
    Triton's interpreter to exercise the dispatch)."""
    return x.is_cuda


def _rows_impl(x, w, residual=None, prologue: bool = False, norm_weight=None, fp8_any_x: bool = False):
    """``triton_fused`` when the row GEMV takes this GEMM, else None (the caller falls back to the
    unfused kernels + cuBLAS, which take any layout): CUDA, ``USE_GEMV_ROWS`` (and
    ``GEMV_ROWS_PROLOGUE`` for a fused prologue), a 2-D ``x`` of at most ``GEMV_ROWS_MAX_M`` rows
    (``GEMV_ROWS_SMALL_MAX_M`` for a weight of at most ``GEMV_ROWS_SMALL_BYTES``) with a dense
    feature dim, a 2-D contiguous ``w``, a ``[rows, N]`` residual with a dense feature
    dim, a contiguous 1-D ``norm_weight``. An :class:`Fp8Weight` takes it at any number of rows
    when ``x`` is in its dtype (``USE_GEMV_ROWS`` aside: there is no other float8 GEMM), or in any
    float dtype with ``fp8_any_x`` (the caller then passes ``out_dtype=w.dtype``)."""
    fp8 = isinstance(w, Fp8Weight)
    if fp8:
        x_ok = x.dtype in (torch.bfloat16, torch.float16, torch.float32) if fp8_any_x else x.dtype == w.dtype
        if not x_ok or _skinny_fp8_takes(x, w, residual):  # (the kernel's output and activation rounding are
            return None  # in x.dtype unless out_dtype; the skinny GEMM's float8 form takes it in linear())
        w = w.weight
    if not ((USE_GEMV_ROWS or fp8) and _on_gpu(x)) or (prologue and not GEMV_ROWS_PROLOGUE):
        return None
    impl = _triton()
    if impl is None or x.dim() != 2 or x.stride(-1) != 1 or w.dim() != 2 or not w.is_contiguous():
        return None
    M = x.shape[0]
    small = M <= GEMV_ROWS_SMALL_MAX_M and w.numel() * w.element_size() <= GEMV_ROWS_SMALL_BYTES
    if M > impl.GEMV_ROWS_MAX_M and not small and not fp8:
        return None
    if residual is not None and (residual.shape != (x.shape[0], w.shape[0]) or residual.stride(-1) != 1):
        return None
    if norm_weight is not None and (norm_weight.dim() != 1 or not norm_weight.is_contiguous()):
        return None
    return impl


# The drafter's glue on the row GEMV (one-row passes at batch 1, float8 passes): the embedding gather as the fc GEMV's
# prologue, the final norm (and the accepted row's gather) as the LM head's, the normed features stored by it
# (embed_linear / norm_rows_linear). False: the separate embed / rms_norm launches (an A/B switch,
# benchmarks/bench_e2e.py --draft-glue)
DRAFT_GLUE_PROLOGUES = True


def embed_linear(table: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor, w, prefetch=None) -> torch.Tensor:
    """``linear(embed(table, tokens, feats), w)``: the EAGLE drafter's ``fc([embed(x); f])``.

    ``table [V, D]``, ``tokens`` int64 (``N`` ids, any shape; valid rows of ``table``), ``feats [N, DF]``,
    ``w [out, D + DF]`` (or an :class:`Fp8Weight`). Returns ``[N, out]`` in ``w.dtype``. Where the row
    GEMV takes the GEMM (:func:`_rows_impl`: one token row on CUDA, or float8 weights) the gather is its
    prologue (``triton_fused.gemv_rows(embed=)``: one launch instead of two, the same values up to the
    GEMM's summation order); otherwise
    :func:`embed` then :func:`linear` (``prefetch`` as there)."""
    tok = tokens.reshape(-1)
    ok = DRAFT_GLUE_PROLOGUES and feats.dim() == 2 and tok.numel() == feats.shape[0]
    impl = _rows_impl(feats, w) if ok else None
    if impl is not None and GEMV_ROWS_PROLOGUE and table.dim() == 2 and table.stride(-1) == 1 \
            and table.shape[1] + feats.shape[1] == w.shape[1]:
        ww, wsc = _fp8_parts(w)
        return impl.gemv_rows(feats, ww, w_scale=wsc, embed=(table, tok.contiguous()))
    return linear(embed(table, tokens, feats), w, prefetch=prefetch)


def norm_rows_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, w, rows: torch.Tensor | None = None,
                     normed_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x[rows]) @ w.T, rms_norm(x[rows]))``: a drafter's final norm and its LM head in one
    launch, the normed features kept for its next pass.

    ``x [R, D]``; ``rows`` int64 ``[N]`` (valid rows of ``x``) or None (all ``R`` rows); ``norm_weight [D]``;
    ``w [V, D]`` (or an :class:`Fp8Weight`); ``normed_out [N, D]`` in the norm's output dtype (``w.dtype``:
    :func:`rms_norm_ref` rounds to it) or None. Returns the logits ``[N, V]`` in ``w.dtype`` and the
    normed rows ``[N, D]``. The row GEMV (:func:`_rows_impl`, ``GEMV_ROWS_PROLOGUE``,
    :data:`DRAFT_GLUE_PROLOGUES`) runs it as one launch (``gemv_rows(x_rows=, x_out=)`` with the RMSNorm
    prologue) and stores the normed rows into ``normed_out`` (a new tensor when None); otherwise
    :func:`embed` (the row gather), :func:`rms_norm` and :func:`linear` run, and the normed rows are
    returned as :func:`rms_norm` made them (``normed_out`` is then not written: no copy). The same
    values either way up to float32 summation order (the prologue sums the squares chunk by chunk: the
    normed rows may differ from :func:`rms_norm`'s by one ulp of the output dtype)."""
    N = x.shape[0] if rows is None else rows.numel()
    ok = DRAFT_GLUE_PROLOGUES and x.dim() == 2
    impl = _rows_impl(x[:N] if N <= x.shape[0] else x, w, None, True, norm_weight) if ok else None
    if impl is not None and (rows is None or (rows.dim() == 1 and rows.dtype == torch.int64)):
        ww, wsc = _fp8_parts(w)
        if normed_out is None:
            normed_out = torch.empty(N, x.shape[1], dtype=w.dtype, device=x.device)
        logits = impl.gemv_rows(x, ww, norm_weight, eps, x_rows=None if rows is None else rows.contiguous(),
                                x_out=normed_out, w_scale=wsc)
        return logits, normed_out
    xs = x if rows is None else embed(x, rows)
    xn = rms_norm(xs, norm_weight, eps, w.dtype)
    return linear(xn, w), xn


# The drafter's absorb on float8 weights (fused_model.ABSORB_ROWS_FP8): its gathered o_proj as one row-GEMV launch on
# the recurrence's float32 output (gemv_rows(out_dtype=)), not three row gathers, the gated norm and the GEMV. s30e
# (RESULTS.md "Session 30"): 3-8 us per batch-1 step faster in each of its eight pairs (flame / map, K = 7 / 8). The
# normed rows skip their rounding to bf16 before the GEMV, so drafts can differ at that rounding (the CPU path, which
# measures acceptance, has no row GEMV and is unchanged). A/B: benchmarks/bench_e2e.py --fp8-gather.
FP8_GATHER_ONE_LAUNCH = True


def gated_norm_linear(o, gate, norm_weight, eps, act, w, residual=None, residual_inplace=False, prefetch=None,
                      rows=None):
    """``linear(gated_rms_norm(o, gate, norm_weight, eps, act, w.dtype), w, residual=...)``.

    ``o [N, HV, V]`` (any float dtype), ``gate [N, HV*V]`` or None, ``norm_weight [V]`` float32,
    ``act`` ``"sigmoid"`` or silu (``"swish"`` / ``"silu"``), ``w [out, HV*V]``, ``residual [N, out]``
    (added; in place with ``residual_inplace``). Returns ``[N, out]`` in ``w.dtype``. The gated norm
    is fla ``FusedRMSNormGated`` (:func:`gated_rms_norm_ref`). With ``GEMV_ROWS_PROLOGUE`` on row-GEMV
    CUDA input it is the row GEMV's prologue (one launch instead of two) when ``o`` is dense
    (``[N, HV*V]`` viewable), ``V`` a power of two dividing the config's BK, and ``gate`` 2-D with a
    dense feature dim; otherwise the two kernels run. ``prefetch``: as in :func:`linear`; ``w`` may be
    an :class:`Fp8Weight`.

    ``rows``: int64 ``[M]`` (valid rows of ``o``) or None: only rows ``rows`` of ``o``, ``gate`` and
    ``residual`` (which is then required) are computed, into a new ``[M, out]`` tensor (the drafter's
    absorb pass after its recurrence needs only each request's accepted row). The row GEMV gathers
    them itself (``gemv_rows(x_rows=)``); otherwise they are gathered first. A float8 weight on
    activations in another dtype (the recurrence's float32 ``o``) takes the one-launch form only with
    :data:`FP8_GATHER_ONE_LAUNCH`.

    Raises:
        ValueError: ``rows`` without ``residual`` or with ``residual_inplace``, or not a 1-D int64 tensor.
    """
    N, HV, V = o.shape
    M = N
    if rows is not None:
        if residual is None or residual_inplace or rows.dim() != 1 or rows.dtype != torch.int64:
            raise ValueError(f"gated_norm_linear: rows needs a 1-D int64 index (got {rows.dtype} "
                             f"{tuple(rows.shape)}), a residual and residual_inplace=False")
        M = rows.numel()
    on = o.reshape(N, HV * V) if o.stride(-1) == 1 and o.stride(1) == V and M <= N else None
    # (the dispatch judges the M rows the GEMM computes: with rows, the first M rows stand for the gathered ones)
    any_x = rows is not None and FP8_GATHER_ONE_LAUNCH and isinstance(w, Fp8Weight)
    impl = _rows_impl(on[:M], w, None if residual is None else residual[:M], True, norm_weight, any_x) \
        if on is not None else None
    BK = impl.rows_config(w.shape[0], isinstance(w, Fp8Weight), M)[1] if impl is not None else 0
    if (impl is not None and V & (V - 1) == 0 and (BK <= 0 or BK % V == 0)
            and (gate is None or (gate.dim() == 2 and gate.stride(-1) == 1))):
        ww, wsc = _fp8_parts(w)
        return impl.gemv_rows(on, ww, norm_weight, eps, residual,
                              out=residual if residual is not None and residual_inplace else None,
                              prologue="gated_rms_norm", gate=gate, head_dim=V,
                              gate_act="sigmoid" if act == "sigmoid" else "silu", w_scale=wsc,
                              x_rows=None if rows is None else rows.contiguous(),
                              out_dtype=w.dtype if any_x else None)
    if rows is not None:  # gathered first, then the unfused path on the M rows
        return gated_norm_linear(o.index_select(0, rows), None if gate is None else gate.index_select(0, rows),
                                 norm_weight, eps, act, w, residual.index_select(0, rows), True, prefetch)
    y = gated_rms_norm(o, gate, norm_weight, eps, act, w.dtype)
    return linear(y, w, residual=residual, residual_inplace=residual_inplace, prefetch=prefetch)


def silu_mul_linear(x, w, residual=None, residual_inplace=False, prefetch=None):
    """``linear(silu_mul(x), w, residual=...)``: ``x [N, 2I]``, ``w [out, I]``, ``residual [N, out]``
    (added; in place with ``residual_inplace``); returns ``[N, out]`` in ``w.dtype``. The SwiGLU is
    fla ``GatedMLP``'s (:func:`silu_mul_ref`); with ``GEMV_ROWS_PROLOGUE`` on row-GEMV CUDA input
    it is the row GEMV's prologue (one launch instead of two). ``prefetch``: as in :func:`linear`;
    ``w`` may be an :class:`Fp8Weight`."""
    impl = _rows_impl(x, w, residual, True) if x.dim() == 2 and x.shape[-1] == 2 * w.shape[-1] else None
    if impl is not None:
        ww, wsc = _fp8_parts(w)
        return impl.gemv_rows(x, ww, residual=residual, prologue="silu_mul",
                              out=residual if residual is not None and residual_inplace else None, w_scale=wsc)
    return linear(silu_mul(x), w, residual=residual, residual_inplace=residual_inplace, prefetch=prefetch)


def rms_norm(x, weight, eps, out_dtype=None):
    """Row RMSNorm; Triton on CUDA, :func:`rms_norm_ref` otherwise."""
    impl = _triton() if x.is_cuda else None  # (the kernel reads a dense weight: .contiguous() is free when it is)
    return impl.rms_norm(x, weight.contiguous(), eps, out_dtype) if impl else rms_norm_ref(x, weight, eps, out_dtype)


def gated_rms_norm(o, gate, weight, eps, act, out_dtype):
    """Per-head gated RMSNorm; Triton on CUDA, :func:`gated_rms_norm_ref` otherwise."""
    impl = _triton() if o.is_cuda else None
    fn = impl.gated_rms_norm if impl else gated_rms_norm_ref
    return fn(o, gate, weight.contiguous() if impl else weight, eps, act, out_dtype)


def silu_mul(x):
    """SwiGLU activation; Triton on CUDA, :func:`silu_mul_ref` otherwise."""
    impl = _triton() if x.is_cuda else None
    return impl.silu_mul(x) if impl else silu_mul_ref(x)


# Greedy tokens with our one-program-per-row argmax on CUDA instead of torch's reduction
USE_TRITON_ARGMAX = True


def argmax(logits: torch.Tensor, out: torch.Tensor | None = None, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy tokens ``[N]`` int64 of ``logits [N, V]``: ``torch.argmax(logits, -1)`` (first index
    of the maximum), mapped through ``ids`` (``[V]`` int64: ``ids[argmax]``, a draft vocabulary's
    token ids) when given, written into ``out`` (``[N]`` int64, any stride) when given. A
    one-program-per-row Triton kernel (``triton_fused.argmax``) on CUDA when
    :data:`USE_TRITON_ARGMAX` and it takes the input (2-D, dense last dim, bf16 / fp16 / fp32,
    ``1 <= V <= ARGMAX_MAX_V``), torch otherwise (which also raises torch's errors)."""
    impl = _triton() if USE_TRITON_ARGMAX and _on_gpu(logits) else None
    if impl is not None and impl.argmax_takes(logits):
        return impl.argmax(logits, out=out, ids=ids)
    if logits.dim() == 2:
        check_argmax_out_ids(logits, out, ids)
    idx = logits.argmax(-1)
    if ids is not None:
        idx = ids[idx]
    if out is None:
        return idx
    out.copy_(idx)
    return out


def check_argmax_out_ids(logits: torch.Tensor, out: torch.Tensor | None, ids: torch.Tensor | None) -> None:
    """:func:`argmax`'s ``out`` / ``ids`` contract for ``logits [N, V]`` (both paths).

    Raises:
        ValueError: ``out`` not ``[N]`` int64 on ``logits``' device; ``ids`` not a contiguous ``[V]``
            int64 tensor on it.
    """
    N, V = logits.shape
    if out is not None and (out.shape != (N,) or out.dtype != torch.int64 or out.device != logits.device):
        raise ValueError(f"argmax: out must be [N] = [{N}] int64 on {logits.device}, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    if ids is not None and (ids.shape != (V,) or ids.dtype != torch.int64 or ids.device != logits.device
                            or not ids.is_contiguous()):
        raise ValueError(f"argmax: ids must be a contiguous [V] = [{V}] int64 tensor on {logits.device}, got "
                         f"{tuple(ids.shape)} {ids.dtype} on {ids.device} with stride {tuple(ids.stride())}")


# The Triton embedding gather (triton_fused.embed) on CUDA (off: torch indexing and cat; bench_e2e.py
# --glue-kernels torch)
USE_TRITON_EMBED = True


def embed_ref(weight: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor | None = None) -> torch.Tensor:
    """``weight[tokens.reshape(-1)]`` (``[N, D]``), then ``feats [N, DF]`` cast to ``weight.dtype``
    appended: ``[N, D + DF]`` (the EAGLE drafter's input ``[embed(x); f]``, ``models/drafter.py``)."""
    e = weight[tokens.reshape(-1)]
    return e if feats is None else torch.cat([e, feats.to(weight.dtype)], -1)


def embed(weight: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`embed_ref`: one Triton launch (``triton_fused.embed``) on CUDA with
    :data:`USE_TRITON_EMBED` (``feats`` cast to ``weight.dtype`` first where it differs: the runtime's
    features are already), torch indexing otherwise (which also raises torch's index errors).
    ``weight`` may be any row table: the decode runtime also picks the drafter's feature row at the
    accepted position with it (``embed(fh [B*T, D], b*T + a)``, no torch gather in the graph)."""
    impl = _triton() if USE_TRITON_EMBED and _on_gpu(weight) else None
    if impl is None:
        return embed_ref(weight, tokens, feats)
    return impl.embed(weight, tokens, feats if feats is None or feats.dtype == weight.dtype else feats.to(weight.dtype))


def gdn_gating(a, b, A_log, dt_bias, allow_neg_eigval=False, valid_len=None, tokens_per_row=1):
    """``(g, beta)`` float32 ``[N, HV]``; Triton on CUDA, :func:`gdn_gating_masked_ref` otherwise."""
    impl = _triton() if a.is_cuda else None
    fn = impl.gdn_gating if impl else gdn_gating_masked_ref
    return fn(a, b, A_log, dt_bias, allow_neg_eigval, valid_len, tokens_per_row)
