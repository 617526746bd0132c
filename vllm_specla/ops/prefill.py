"""Public prefill op: the chunked gated delta rule over whole prompts (varlen rows, initial states).

Prefill is not where SpecLA differs from plain GDN decoding, so on CUDA it runs fla's kernel, the
standard one (``fla.ops.gated_delta_rule.chunk_gated_delta_rule``, flash-linear-attention 0.6,
Triton, chunked UT/WY form, varlen ``cu_seqlens``, state in our ``[N, HV, V, K]`` layout through
``state_v_first``). Everything else, and CUDA without fla, runs the plain-torch
:func:`vllm_specla.ops.reference.chunk_gated_delta_rule_ref` (one Python loop over rows and
64-token chunks: fine for CPU prompts; on an H100 5.6-50x slower than fla for 1-64 prompts of
512-2,048 tokens, e.g. 246 ms against 7.0 ms per layer for 16 prompts of 2,048 tokens at
6x256x512 heads, benchmarks/prefill_h100_s41a.json, RESULTS.md session 41).
``VLLM_SPECLA_PREFILL=ref`` forces the reference, ``fla`` fails loudly where fla cannot run
(read at call time).
"""

from __future__ import annotations

import functools
import os

import torch

from vllm_specla.ops.reference import chunk_gated_delta_rule_ref

__all__ = ["FLA_MAX_HEAD_DIM", "chunk_prefill", "prefill_backend"]

# fla's chunk kernels tile the key dimension up to 256 (fla/ops/common/chunk_delta_h.py asserts
# K <= 256); larger key heads stay on the reference.
FLA_MAX_HEAD_DIM = 256


@functools.lru_cache(maxsize=1)
def _fla_chunk():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: PLC0415
    except Exception:  # fla (or triton) missing, or no GPU backend
        return None
    return chunk_gated_delta_rule


def prefill_backend(q: torch.Tensor) -> str:
    """``"fla"`` or ``"ref"``: which implementation :func:`chunk_prefill` runs for these inputs.

    Raises:
        ValueError: ``VLLM_SPECLA_PREFILL`` is not ``auto``, ``fla`` or ``ref``; or it is ``fla``
        and fla cannot run here (CPU tensors, fla not importable, key head dim > 256).
    """
    mode = os.environ.get("VLLM_SPECLA_PREFILL", "auto") or "auto"
    if mode not in ("auto", "fla", "ref"):
        raise ValueError(f"VLLM_SPECLA_PREFILL must be auto, fla or ref, got {mode!r}")
    if mode == "ref":
        return "ref"
    ok = q.is_cuda and q.shape[-1] <= FLA_MAX_HEAD_DIM and _fla_chunk() is not None
    if mode == "fla" and not ok:
        raise ValueError("VLLM_SPECLA_PREFILL=fla needs CUDA tensors, an importable fla "
                         f"(flash-linear-attention==0.6.0) and key heads <= {FLA_MAX_HEAD_DIM} "
                         f"(got device {q.device}, K = {q.shape[-1]})")
    return "fla" if ok else "ref"


def chunk_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule over varlen prompts from given states (ALGORITHMS.md §4, chain topology).

    Args:
        q, k: ``[N, H, K]`` (any float dtype; l2-normalised inside).
        v: ``[N, HV, V]``, ``HV`` a multiple of ``H`` (grouped value heads).
        g: ``[N, HV]`` log decay (natural log, <= 0); beta: ``[N, HV]`` in (0, 1) (or (0, 2) with
            negative eigenvalues allowed).
        scale: query scale (``K ** -0.5`` for GDN).
        cu_seqlens: ``[R + 1]`` int row offsets into the ``N`` tokens.
        initial_state: ``[R, HV, V, K]`` fp32 per-row states, or None for zeros.

    Returns:
        ``(o, final)``: outputs ``[N, HV, V]`` float32 and final states ``[R, HV, V, K]`` float32.
        The fla path matches the reference within tests/test_prefill_gpu.py's tolerance (most of
        fla's dots take tf32 on fp32 inputs; ``gdn_mix`` passes fp32, the only dtype tested).

    Raises:
        ValueError: see :func:`prefill_backend`.
    """
    if prefill_backend(q) == "ref":
        return chunk_gated_delta_rule_ref(q, k, v, g, beta, scale, cu_seqlens, initial_state=initial_state)
    R = cu_seqlens.numel() - 1
    HV, V, K = v.shape[1], v.shape[2], k.shape[2]
    h0 = (torch.zeros(R, HV, V, K, dtype=torch.float32, device=v.device) if initial_state is None
          else initial_state.float().contiguous())
    o, final = _fla_chunk()(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.float().unsqueeze(0), beta.unsqueeze(0),
        scale=scale, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
        state_v_first=True, cu_seqlens=cu_seqlens.long())
    return o[0].float(), final.float()
