"""Public prefill op: the chunked gated delta rule over whole prompts (varlen rows, initial states).

Prefill is not where SpecLA differs from plain GDN decoding, so on CUDA it runs fla's kernel, the
standard one (``fla.ops.gated_delta_rule.chunk_gated_delta_rule``, flash-linear-attention 0.6,
Triton, chunked UT/WY form, varlen ``cu_seqlens``, state in our ``[N, HV, V, K]`` layout through
``state_v_first``). Everything else, and CUDA without fla, runs the plain-torch
:func:`vllm_specla.ops.reference.chunk_gated_delta_rule_ref` (one Python loop over rows and
64-token chunks: fine for CPU prompts; on an H100 5.6-50x slower than fla for 1-64 prompts of
512-2,048 tokens, e.g. 246 ms against 7.0 ms per layer for 16 prompts of 2,048 tokens at
6x256x512 heads, benchmarks/prefill_h100_s41a.json, RESULTS.md session 41).
``VLLM_SPECLA_PREFILL=ref`` forces the references (recurrence and conv), ``fla`` fails loudly where
fla cannot run (read at call time).

The prompt's short conv (:func:`causal_conv1d_prefill`, :func:`conv_prefill_backend`) on CUDA runs our
Triton verify-window conv on the whole prompts (``triton_chain.conv_verify``, the rolling-window kernel
of verify steps; fresh slots' windows zeroed first): on an H100 0.14-2.4 ms a layer for 1-64 prompts of
512-2,048 tokens at 6,144 channels (64 x 2,048 tokens: ~2.7 TB/s of fp32 read and written), 0.82-4.0x
the speed of fla's Triton conv called with our windows (layout conversion included; slower only for a
single 2,048-token prompt), and 11-20x the per-row
reference at 16-64 prompts (two runs: benchmarks/prefill_conv_h100_s42c.json / _s42e.json, RESULTS.md
session 42). Without Triton,
:func:`causal_conv1d_prefill_batched` (plain torch over all rows at once, no host sync). The per-row
reference (:func:`vllm_specla.ops.reference.causal_conv1d_prefill_ref`, two host syncs per row and
layer on a GPU) runs on CPU, where it is the fastest of the torch forms.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from vllm_specla.ops.reference import causal_conv1d_prefill_ref, chunk_gated_delta_rule_ref

__all__ = ["FLA_MAX_HEAD_DIM", "causal_conv1d_prefill", "causal_conv1d_prefill_batched",
           "causal_conv1d_prefill_triton", "chunk_prefill", "conv_prefill_backend", "prefill_backend"]

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


@functools.lru_cache(maxsize=1)
def _triton_conv():
    try:
        from vllm_specla.ops import triton_chain  # noqa: PLC0415
    except Exception:  # no Triton (or no GPU backend)
        return None
    return triton_chain.conv_verify


def _mode() -> str:
    mode = os.environ.get("VLLM_SPECLA_PREFILL", "auto") or "auto"
    if mode not in ("auto", "fla", "ref"):
        raise ValueError(f"VLLM_SPECLA_PREFILL must be auto, fla or ref, got {mode!r}")
    return mode


def prefill_backend(q: torch.Tensor) -> str:
    """``"fla"`` or ``"ref"``: which implementation :func:`chunk_prefill` runs for these inputs.

    Raises:
        ValueError: ``VLLM_SPECLA_PREFILL`` is not ``auto``, ``fla`` or ``ref``; or it is ``fla``
        and fla cannot run here (CPU tensors, fla not importable, key head dim > 256).
    """
    mode = _mode()
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


def conv_prefill_backend(x: torch.Tensor) -> str:
    """``"triton"``, ``"batched"`` or ``"ref"``: which implementation :func:`causal_conv1d_prefill` runs.

    CUDA: our Triton verify-window conv when Triton imports, else
    :func:`causal_conv1d_prefill_batched`; CPU and ``VLLM_SPECLA_PREFILL=ref``: the per-row reference
    (on CPU the fastest torch form: each row's few MB stay in cache; batched over 16 rows of 128-512
    tokens at 6,144 channels took ~2x its time on this project's 2-core CPU, ``bench_prefill.py
    --device cpu``, benchmarks/prefill_conv_cpu_s42.json).

    Raises:
        ValueError: ``VLLM_SPECLA_PREFILL`` is not ``auto``, ``fla`` or ``ref``.
    """
    if _mode() == "ref" or not x.is_cuda:
        return "ref"
    return "triton" if _triton_conv() is not None else "batched"


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """The prompt's short conv, by :func:`conv_prefill_backend`: :func:`causal_conv1d_prefill_triton`,
    :func:`causal_conv1d_prefill_batched` or the per-row reference
    :func:`vllm_specla.ops.reference.causal_conv1d_prefill_ref`. Same arguments and result as
    :func:`causal_conv1d_prefill_batched` (the batched form bit for bit, the Triton one within fp32
    rounding: tests/test_prefill_conv.py).

    Raises:
        ValueError: see :func:`conv_prefill_backend`.
    """
    fn = {"triton": causal_conv1d_prefill_triton, "batched": causal_conv1d_prefill_batched,
          "ref": causal_conv1d_prefill_ref}[conv_prefill_backend(x)]
    return fn(x, weight, cu_seqlens, conv_state, slots, has_initial_state)


def causal_conv1d_prefill_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Our Triton verify-window conv (``triton_chain.conv_verify``: one program per (channel tile,
    row) walking the row's tokens with a rolling window for 4 taps) over whole prompts, the new
    windows written back (``write_final_state``); rows without an earlier state first get a zero
    window (one ``index_copy_``, no host sync).

    Same arguments, contract and result as :func:`causal_conv1d_prefill_batched` (CUDA tensors);
    outputs within fp32 rounding of the reference (fused multiply-adds), committed windows equal
    to it (copies of inputs).
    """
    R = cu_seqlens.numel() - 1
    if R <= 0:
        return torch.empty(x.shape, dtype=torch.float32, device=x.device)
    dev = x.device
    cu = cu_seqlens.to(device=dev, dtype=torch.long)
    slots = slots[:R].to(device=dev, dtype=torch.long)
    hist = conv_state.index_select(0, slots)
    keep = has_initial_state[:R].to(dev)[:, None, None]
    conv_state.index_copy_(0, slots, torch.where(keep, hist, torch.zeros_like(hist)))
    return _triton_conv()(x, weight, cu, conv_state, slots, write_final_state=True)


def causal_conv1d_prefill_batched(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Depthwise causal conv + SiLU over varlen prompt rows; commits each row's new conv window.

    Same contract and arithmetic as :func:`vllm_specla.ops.reference.causal_conv1d_prefill_ref`
    (the same multiply-adds in the same order, so the same bits: tests/test_prefill_conv.py),
    batched: every row's history (``W - 1`` conv inputs) and tokens are laid out one after another
    in one buffer, the conv runs over that buffer with ``W`` shifted slices (a few rows between
    rows are computed and dropped), the tokens' outputs are gathered from it, and the new windows
    go back with one ``index_copy_``. No Python loop over rows and no host synchronisation, on CPU
    and CUDA alike.

    Args:
        x: ``[N, C]`` raw conv inputs (the q | k | v projections), any float dtype.
        weight: ``[C, W]`` depthwise conv taps.
        cu_seqlens: ``[R + 1]`` int row offsets into the ``N`` tokens (rows may be empty).
        conv_state: ``[num_slots, W - 1, C]``, updated in place: ``conv_state[slots[r]]`` becomes
            the last ``W - 1`` inputs of history ++ row ``r``. The ``slots[:R]`` must be distinct.
        slots: ``[>= R]`` int state slots of the rows.
        has_initial_state: ``[>= R]`` bool; False: the row's history is zeros (the slot's contents,
            possibly garbage in a fresh vLLM block, are never read into the output).

    Returns:
        ``y [N, C]`` float32.
    """
    N, C = x.shape
    W = weight.shape[-1]
    R = cu_seqlens.numel() - 1
    x32, w32 = x.float(), weight.float()
    if R <= 0:
        return torch.empty_like(x32)
    dev = x.device
    cu = cu_seqlens.to(device=dev, dtype=torch.long)
    slots = slots[:R].to(device=dev, dtype=torch.long)
    hist = conv_state.index_select(0, slots).float()  # [R, W-1, C]
    hist = torch.where(has_initial_state[:R].to(dev)[:, None, None], hist, torch.zeros_like(hist))
    # row r is hist_r ++ x[cu[r]:cu[r+1]] at ext[cu[r] + r (W-1) : cu[r+1] + (r+1) (W-1)]
    tok = torch.arange(N, device=dev)
    row = torch.searchsorted(cu[1:], tok, right=True)  # the row of each token
    base = tok + row * (W - 1)  # ext index of the token's first tap
    head = cu[:-1] + torch.arange(R, device=dev) * (W - 1)  # ext index of each row's history
    taps = torch.arange(W - 1, device=dev)
    ext = x32.new_empty(N + R * (W - 1), C)
    ext[base + (W - 1)] = x32
    ext[(head[:, None] + taps).reshape(-1)] = hist.reshape(-1, C)
    L = N + (R - 1) * (W - 1)  # conv over the whole buffer with slices; the tokens' rows are picked after
    acc = x32.new_zeros(L, C)
    for i in range(W):  # the reference's order: y = (((0 + w0 z0) + w1 z1) + ...)
        acc = acc + w32[:, i] * ext[i : i + L]
    window = ext[((cu[1:] + torch.arange(R, device=dev) * (W - 1))[:, None] + taps).reshape(-1)]
    conv_state.index_copy_(0, slots, window.view(R, W - 1, C).to(conv_state.dtype))
    return F.silu(acc.index_select(0, base))
