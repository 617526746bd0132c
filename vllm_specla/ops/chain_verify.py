"""Public chain-verify op: state-resident verify of a draft chain with factor output.

Dispatch on CUDA tensors: the UT (tensor-core) Triton kernel for long verify windows at large batch
(SpecLA steps at >= 192 (row, head) pairs go to the CUDA csrc kernel instead when it is built), the
CUDA csrc kernel when JIT-built (:func:`vllm_specla.ops._cpp.load_cuda`) for other verify windows
at more than 16 (row, head) pairs (its binding picks the v3 serial or the UT-form kernel by shape) and
for bf16 SpecLA steps at fewer (its small-batch lean kernel), else the serial Triton kernel (``vllm_specla.ops.triton_chain``);
the C++ CPU op (``csrc/``, :mod:`vllm_specla.ops._cpp`) on CPU tensors when built, else the
plain-torch :func:`vllm_specla.ops.reference.chain_verify_ref` (fallback, oracle).
Arguments, shapes and semantics: see :func:`~vllm_specla.ops.reference.chain_verify_ref`
(ALGORITHMS.md §3, §6).
"""

from __future__ import annotations

import functools
import os

import torch

from vllm_specla.ops import _cpp
from vllm_specla.ops.reference import (
    check_out_slots,
    chain_verify_ref,
    chain_verify_snapshots_ref,
    conv_step_heads,
    conv_verify_ref,
)


def _triton_impl():
    try:
        from vllm_specla.ops import triton_chain  # noqa: PLC0415
    except Exception:  # triton missing or no GPU backend
        return None
    return triton_chain


# CUDA kernel for chain verify: "serial" (triton_chain: per-token walk on the state tile), "ut"
# (triton_chain_ut: tensor-core UT/chunk form, pending factors committed first by the recover
# kernel, or folded into its state pass: triton_chain_ut.UT_FOLD), or "auto" (default): UT for
# verify windows of >= UT_MIN_TOKENS tokens per row at >= UT_MIN_ROWS rows, serial otherwise (AR
# decode, short windows, small batch, write_final_state).
# Shapes only: no host sync, CUDA-graph safe. Thresholds from the H200 (benchmarks/RESULTS.md,
# ut_v5_h200.json): at T = 8 the UT path (recover + UT verify) beats the serial fused step by
# 1.08-1.23x at B = 32-256; at T = 5 the serial kernel is faster.
VERIFY_KERNEL = os.environ.get("VLLM_SPECLA_VERIFY_KERNEL", "auto")
UT_MIN_TOKENS = 7.5
UT_MIN_ROWS = 32
UT_MAX_TOKENS = 16  # triton_chain_ut.BT


# SpecLA steps (pending factors given) at >= CUDA_UT_MIN_PAIRS (row, value head) pairs go to the CUDA
# csrc kernel when it is built, even for long windows: its UT-form kernel (csrc/cuda/chain_verify_ut.cu,
# fp32 FMA, pending fold fused) took 0.77-0.93x the Triton UT kernel's time (recover + tensor-core
# verify) for T = 8 steps at B = 32-256 on the H200 (RESULTS.md session 5, csrc_ut_h200_s5e.json;
# session 7: 0.60-0.69x, csrc_ut_h200_s7d.json). So do verify windows without pending factors whose factor bank holds <=
# CUDA_UT_VERIFY_MAX_BANK positions (the kernel's 8-token builds with the register phase 5): 0.74-0.92x
# the Triton UT kernel's time at T = 8, B = 32-128, both GDN-1.3B head shapes (session 7,
# csrc_ut_h200_s7c.json / _s7d.json; session 5's build was 1.18-1.37x slower). Longer banks (the
# 16-token builds, unmeasured against Triton UT since session 5) keep the Triton UT kernel.
CUDA_UT_MIN_PAIRS = 192  # = chain_verify_ut.cu's automatic threshold
CUDA_UT_VERIFY_MAX_BANK = 8


def _cuda_ut_applies(q: torch.Tensor, k: torch.Tensor, kw: dict) -> bool:
    """Whether the CUDA binding will run its UT form for this window (the checks of
    ``chain_verify_ut_bounds`` / ``chain_verify_ut_auto`` in ``csrc/cuda/chain_verify_ut.cu`` that the
    host can make without a sync): automatic layout and ``VLLM_SPECLA_CUDA_UT`` not 0, K = 128 or 256,
    a factor bank of <= 16 positions, 16-byte aligned q / k rows and state."""
    if os.environ.get("VLLM_SPECLA_CUDA_UT", "") == "0" or os.environ.get("VLLM_SPECLA_CUDA_LAYOUT", "") not in ("", "auto", "ut"):
        return False
    bank_k = kw.get("bank_k")
    return bank_k is not None and bank_k.shape[2] <= UT_MAX_TOKENS and _cuda_vec_ok(q, k, kw)


def _cuda_vec_ok(q: torch.Tensor, k: torch.Tensor, kw: dict) -> bool:
    """The CUDA binding's 16-byte path (``vec_ok`` in ``csrc/cuda/torch_binding_cuda.cpp``) with K = 128 or 256:
    16-byte aligned q / k rows with unit key strides, fp32 state and k^ bank (if given) 16-byte aligned with
    unit key strides and outer strides in whole 16-byte units."""
    st, bank_k = kw["state"], kw.get("bank_k")
    if st.shape[-1] not in (128, 256):
        return False
    rows_ok = all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and t.stride(-1) == 1
                  for t in (q, k))
    return rows_ok and all(t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and all(d % 4 == 0 for d in t.stride()[:-1])
                           for t in (st,) + ((bank_k,) if bank_k is not None else ()))


def _cuda_takes_window(q: torch.Tensor, k: torch.Tensor, kw: dict) -> bool:
    """Whether the CUDA UT form takes this window ahead of the Triton UT kernel: SpecLA steps (pending
    factors given), or verify windows with a factor bank of <= CUDA_UT_VERIFY_MAX_BANK positions, at
    >= CUDA_UT_MIN_PAIRS (row, value head) pairs, where the binding will run its UT form."""
    bank_k = kw.get("bank_k")
    short_bank = bank_k is not None and bank_k.shape[2] <= CUDA_UT_VERIFY_MAX_BANK
    return (VERIFY_KERNEL == "auto" and (kw.get("pending_len") is not None or short_bank) and _use_cuda_csrc(kw)
            and (kw["cu_seqlens"].numel() - 1) * kw["state"].shape[1] >= CUDA_UT_MIN_PAIRS
            and _cuda_ut_applies(q, k, kw))


def _use_ut(q: torch.Tensor, kw: dict, k: torch.Tensor | None = None) -> bool:
    if VERIFY_KERNEL == "serial" or kw.get("write_final_state", False):
        return False
    if _cuda_takes_window(q, q if k is None else k, kw):
        return False
    # the UT kernel verifies <= 16 tokens per row and cannot check that during CUDA-graph capture;
    # the factor bank bounds every window (a longer one is an error), so without banks or with a
    # bank longer than 16 the serial kernel runs, also when "ut" is forced
    bank_k = kw.get("bank_k")
    if bank_k is None or kw.get("write_bank") is None or bank_k.shape[2] > UT_MAX_TOKENS:
        return False
    if VERIFY_KERNEL == "ut":
        return True
    rows = kw["cu_seqlens"].numel() - 1
    return rows >= UT_MIN_ROWS and q.shape[0] >= UT_MIN_TOKENS * max(rows, 1)


# The CUDA csrc chain verify (csrc/cuda) once _cpp.load_cuda() has JIT-built it: used for verify and
# SpecLA-step windows (no write_final_state) at more than CUDA_MIN_PAIRS (row, value head) pairs,
# where it measured 0.78-0.90x the Triton serial kernel's time on the H200 (v3, RESULTS.md,
# csrc_cuda_v3.json) and, from 192 pairs, its UT-form kernel 0.59-0.84x for steps (session 5); the
# binding picks v3 or the UT form by shape. At <= CUDA_MIN_PAIRS pairs it takes SpecLA steps (a pending_len
# tensor given) with bf16 q / k / v on its 16-byte path with K = 128 / 256 (_cuda_small_step): its
# small-batch lean kernel took 0.79-1.00x Triton's time for steps of 5 / 8 tokens at batch 1 / 2, both
# GDN-1.3B head shapes, and 0.89-1.03x for windows with nothing pending, which is what a step whose
# pending counts are zero costs (H200, RESULTS.md session 20, csrc_h200_s20d.json; the rule cannot read the
# counts without a host sync). Where the binding's sb_auto declines (its BV-8 warps more than the GPU holds
# at once: far beyond the GDN-1.3B shapes on an H100 / H200) it runs the row-group kernels, unmeasured against
# Triton since session 4. Triton keeps AR at large batch (equal there) and at batch 1-2 outside _cuda_small_ar's
# rule, and, at batch 1-2, windows without a pending_len tensor and everything else. (The decode runtime's q / k / v are fp32, its conv output, so its
# batch-1 steps stay on Triton: e2e_h200_s20c.jsonl.) VLLM_SPECLA_CUDA_CSRC=0 turns it off.
USE_CUDA_CSRC = os.environ.get("VLLM_SPECLA_CUDA_CSRC", "1") not in ("", "0")
CUDA_MIN_PAIRS = 16
CUDA_MAX_K = 512


def _use_cuda_csrc(kw: dict) -> bool:
    if not (USE_CUDA_CSRC and _cpp.CUDA_LOADED) or kw.get("write_final_state", False):
        return False
    if kw["state"].shape[-1] > CUDA_MAX_K:  # the CUDA kernel's register tile (K <= 512)
        return False
    return (kw["cu_seqlens"].numel() - 1) * kw["state"].shape[1] > CUDA_MIN_PAIRS


def _cuda_small_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kw: dict) -> bool:
    """Whether a window at <= CUDA_MIN_PAIRS (row, value head) pairs goes to the CUDA csrc kernel: a SpecLA
    step (a ``pending_len`` tensor given, whatever its counts; no ``write_final_state``) of more tokens than
    rows, bf16 q / k / v on the binding's 16-byte path with K = 128 / 256 (where its automatic layout runs the
    small-batch lean kernel, ``sb_auto`` in ``csrc/cuda/chain_verify.cu``). Shapes and strides only: no host
    sync, CUDA-graph safe."""
    if not (USE_CUDA_CSRC and _cpp.CUDA_LOADED) or kw.get("write_final_state", False) or kw.get("pending_len") is None:
        return False
    rows = kw["cu_seqlens"].numel() - 1
    return (rows * kw["state"].shape[1] <= CUDA_MIN_PAIRS and q.shape[0] > rows
            and q.dtype == k.dtype == v.dtype == torch.bfloat16 and _cuda_vec_ok(q, k, kw))


# One-token AR rows at <= CUDA_MIN_PAIRS pairs (bf16 q / k / v, K = 256, the binding's 16-byte path, its tuning
# variables at their defaults) go to the CUDA op on sm_90+ GPUs where its RAW AR body runs: two launches' CTAs (pairs x
# V / 4) fit on the GPU at once at RAW_AR_MIN_CTAS_PER_SM per SM (the H200 holds 20 of
# ``chain_verify_rg_ar_raw_kernel``, 96 registers: Nsight Compute, session 23; the binding's own rule,
# ``rg_ar_raw_fits``, asks the occupancy API). There it measured 0.91-0.98x the Triton kernel's time (H200:
# 6x256x512 batch 1, 8x256x256 batch 1 / 2; RESULTS.md "Session 23", csrc_h200_s23c_*.json); where it does not
# (6x256x512 batch 2) the CUDA op took 1.08x and Triton keeps it. Only sm_90+ (the H100 / H200 class) was measured.
RAW_AR_MIN_CTAS_PER_SM = 20
# the binding's variables that would send AR off the RAW body (or the automatic layout): their default values only
_RAW_AR_ENV = {"VLLM_SPECLA_CUDA_LAYOUT": ("", "auto"), "VLLM_SPECLA_CUDA_BV": ("", "0", "4"),
               "VLLM_SPECLA_CUDA_RG_PREFETCH": ("", "0"), "VLLM_SPECLA_CUDA_RG_PIECE": ("", "4"),
               "VLLM_SPECLA_CUDA_RG_AR": ("", "4")}


@functools.lru_cache(maxsize=None)
def _gpu(index: int) -> tuple[int, int]:
    """``(SMs, compute capability major)`` of CUDA device ``index`` (cached; host-only, no sync)."""
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count, props.major


def _cuda_small_ar(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kw: dict) -> bool:
    """Whether a one-token-per-row AR launch (``write_final_state``, no factor banks or pending factors, as many
    tokens as rows) at <= CUDA_MIN_PAIRS (row, value head) pairs goes to the CUDA csrc op: bf16 q / k / v on its
    16-byte path with K = 256, the binding's variables of ``_RAW_AR_ENV`` at their defaults, an sm_90+ GPU and
    2 x pairs x ceil(V / 4) CTAs <= RAW_AR_MIN_CTAS_PER_SM x its SMs. Shapes, strides and the environment only: no
    host sync, CUDA-graph safe."""
    if not (USE_CUDA_CSRC and _cpp.CUDA_LOADED) or not kw.get("write_final_state", False):
        return False
    if any(kw.get(n) is not None for n in ("bank_k", "write_bank", "pending_len")):
        return False
    if any(os.environ.get(name, "") not in ok for name, ok in _RAW_AR_ENV.items()):
        return False
    rows = kw["cu_seqlens"].numel() - 1
    _, HV, V, K = kw["state"].shape
    if not (rows >= 1 and q.shape[0] == rows and rows * HV <= CUDA_MIN_PAIRS and K == 256):
        return False
    if not (q.dtype == k.dtype == v.dtype == torch.bfloat16 and _cuda_vec_ok(q, k, kw)):
        return False
    sms, major = _gpu(q.device.index if q.device.index is not None else torch.cuda.current_device() if q.is_cuda else 0)
    return major >= 9 and 2 * rows * HV * -(-V // 4) <= RAW_AR_MIN_CTAS_PER_SM * sms


def _ut_impl():
    try:
        from vllm_specla.ops import triton_chain_ut  # noqa: PLC0415
    except Exception:
        return None
    return triton_chain_ut


def _emulate_out_slots(state: torch.Tensor, kw: dict) -> dict:
    """``out_slots`` for the backends without it (C++ CPU op, torch reference): copy each row's read
    slot into its out slot, then run in place there. The contract (``write_final_state``, no banks
    or pending factors: :func:`~vllm_specla.ops.reference.check_out_slots`) makes the two forms equal."""
    out = kw.pop("out_slots")
    R = kw["cu_seqlens"].numel() - 1
    check_out_slots(out, R, kw.get("write_final_state", False),
                    *(kw.get(n) for n in ("bank_k", "bank_x", "write_bank", "pending_len")))
    out = out[:R].to(device=state.device, dtype=torch.long)
    state.index_copy_(0, out, state.index_select(0, kw["slots"][:R].to(device=state.device, dtype=torch.long)))
    return dict(kw, slots=out)


def chain_verify(q, k, v, g, beta, **kw) -> torch.Tensor:
    """Chain verify (outputs ``[N, HV, V]`` float32); see :func:`chain_verify_ref`.

    ``out_slots`` (``[R]`` int; with ``write_final_state`` and no factor banks or pending factors):
    row ``r`` reads ``state[slots[r]]`` and writes the state after its window to
    ``state[out_slots[r]]``; out slots distinct and not read in the launch. The Triton kernel does it
    in its one state pass (a draft step onto a scratch slot without copying the state first); other
    backends copy the read slots first (:func:`_emulate_out_slots`). Raises ``ValueError`` when the
    contract does not hold."""
    if kw.get("out_slots") is None:
        kw.pop("out_slots", None)
    elif q.is_cuda and _triton_impl() is not None:
        return _triton_impl().chain_verify(q, k, v, g, beta, **kw)  # write_final_state: the serial kernel
    else:
        kw = _emulate_out_slots(kw["state"], kw)
    if q.is_cuda:
        if _use_ut(q, kw, k):
            ut = _ut_impl()
            if ut is not None:
                return ut.chain_verify_ut(q, k, v, g, beta, **kw)
        if _use_cuda_csrc(kw) or _cuda_small_step(q, k, v, kw) or _cuda_small_ar(q, k, v, kw):
            return _cpp.chain_verify(q, k, v, g, beta, **kw)
        impl = _triton_impl()
        if impl is not None and hasattr(impl, "chain_verify"):
            return impl.chain_verify(q, k, v, g, beta, **kw)
    elif _cpp.use("chain_verify", q, kw.get("state")):
        return _cpp.chain_verify(q, k, v, g, beta, **kw)
    return chain_verify_ref(q, k, v, g, beta, **kw)


def chain_verify_snapshots(q, k, v, g, beta, **kw) -> torch.Tensor:
    """Per-token-snapshot verify (baseline); see :func:`chain_verify_snapshots_ref`."""
    if q.is_cuda:
        impl = _triton_impl()
        if impl is not None and hasattr(impl, "chain_verify_snapshots"):
            return impl.chain_verify_snapshots(q, k, v, g, beta, **kw)
    return chain_verify_snapshots_ref(q, k, v, g, beta, **kw)


def conv_verify(x, weight, cu_seqlens, conv_state, slots, **kw) -> torch.Tensor:
    """Conv of a verify window with deferred conv commit; see :func:`conv_verify_ref`.
    ``out_slots``: as :func:`chain_verify` (the window after the row to ``conv_state[out_slots[r]]``)."""
    if kw.get("out_slots") is None:
        kw.pop("out_slots", None)
    elif not (x.is_cuda and _triton_impl() is not None):
        kw = _emulate_out_slots(conv_state, dict(kw, cu_seqlens=cu_seqlens, slots=slots))
        slots = kw.pop("slots")
        kw.pop("cu_seqlens")
    if x.is_cuda:
        impl = _triton_impl()
        if impl is not None and hasattr(impl, "conv_verify"):
            return impl.conv_verify(x, weight, cu_seqlens, conv_state, slots, **kw)
    elif _cpp.use("conv_verify", x, conv_state):
        return _cpp.conv_verify(x, weight, cu_seqlens, conv_state, slots, **kw)
    return conv_verify_ref(x, weight, cu_seqlens, conv_state, slots, **kw)


# One-token steps (AR decode, the drafter's one-token passes) on CUDA: the conv and the recurrence in one
# Triton launch (triton_chain.conv_chain_step) instead of two. Off: on an H100 (benchmarks/RESULTS.md "Session 35",
# s32b; bench_e2e.py --conv-step) the AR step was no faster at any of four tiles (the default tile +0.9 % / +3.8 %,
# flame / map); not measured on the H200. VLLM_SPECLA_CONV_STEP=1 turns it on.
_CONV_STEP_ENV = os.environ.get("VLLM_SPECLA_CONV_STEP") or "0"
if _CONV_STEP_ENV not in ("0", "1"):
    raise ValueError(f"VLLM_SPECLA_CONV_STEP must be '0' (conv and recurrence as two launches, the default) or '1' "
                     f"(one launch for one-token steps on CUDA), got {_CONV_STEP_ENV!r}")
CONV_STEP = _CONV_STEP_ENV == "1"


def conv_chain_step(x, conv_w, conv_state, g, beta, *, scale, state, slots, cu_seqlens, write=True,
                    out_slots=None) -> torch.Tensor:
    """The short conv (+ SiLU) and chain verify of a step of one token per row: ``o [R, HV, V]`` float32.

    ``x [R, C]`` (q | k | v conv inputs, ``C = 2 H K + HV V``), ``conv_w [C, W]``, ``conv_state [S, W-1, C]``,
    ``g`` / ``beta [R, HV]``, ``state [S, HV, V, K]`` float32, ``slots`` / ``cu_seqlens`` as
    :func:`chain_verify` (``cu_seqlens = arange(R + 1)``: one token per row). ``write``: store the state and
    conv window after the token (AR decode, to ``out_slots`` when given); False: only read them (the last
    draft step). With :data:`CONV_STEP` on CUDA (4 taps): one Triton launch
    (``triton_chain.conv_chain_step``); otherwise :func:`conv_verify` then :func:`chain_verify` on the conv
    output's column slices (every backend; the reference composition is ``reference.conv_chain_step_ref``).

    Raises:
        ValueError: ``C`` not of the form ``2 H K + HV V``; ``out_slots`` without ``write``.
    """
    R, C = x.shape
    H = conv_step_heads(C, state, write, out_slots)
    S, HV, V, K = state.shape
    if CONV_STEP and x.is_cuda and conv_w.shape[-1] == 4 and _triton_impl() is not None:
        tc = _triton_impl()
        if tc.step_counters(x.device, R * H) is not None:
            return tc.conv_chain_step(x, conv_w, conv_state, g, beta, scale=scale, state=state, slots=slots,
                                      write=write, out_slots=out_slots)
    out = dict(out_slots=out_slots) if out_slots is not None else {}
    y = conv_verify(x, conv_w, cu_seqlens, conv_state, slots, write_final_state=write, **out)
    q = y[:, : H * K].view(R, H, K)
    k = y[:, H * K : 2 * H * K].view(R, H, K)
    v = y[:, 2 * H * K :].view(R, HV, V)
    return chain_verify(q, k, v, g, beta, scale=scale, state=state, slots=slots, cu_seqlens=cu_seqlens,
                        write_final_state=write, **out)
