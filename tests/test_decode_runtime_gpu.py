"""The decode runtime on CUDA with the embedded trained pair and its *real* drafts (no acceptance
control), fp32, CUDA graphs: the GPU kernels of a draft step (``"ar"`` onto scratch slots with
``out_slots``, the last step ``"ar_read"`` writing nothing) must draft what the CPU reference path
drafts. The acceptance-controlled benchmarks replace the drafts and so cannot show a wrong draft,
and the mean acceptance of this small drafter hardly moves when its last draft position is wrong,
so the test compares the draft windows themselves, step by step.

Skipped without CUDA. Tolerance: greedy tokens from fp32 logits on two devices, so a near-tie may
flip a draft (and that row's later windows); 90 % of the draft tokens must agree. A wrong draft step
changes most drafts at its position (measured on the CPU with the last draft step reading a zeroed
state: 61 %, 75 % and 81 % agreement for K, W = 2, 1 / 4, 1 / 3, 2).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def models():
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint

    return load_fla_checkpoint("models/specla-gdn-tiny/target"), load_eagle_drafter("models/specla-gdn-tiny/drafter")


def _run(tm, dm, dev, B, K, W, steps, prompts, draft_vocab=None, draft_weights="model"):
    from vllm_specla.runtime.decode import DecodeRuntime
    from vllm_specla.runtime.fused_model import FusedEagle, FusedTarget

    tgt = FusedTarget(tm, torch.float32, dev)
    dr = FusedEagle(dm, tgt, torch.float32, dev, draft_vocab=draft_vocab, draft_weights=draft_weights)
    ar = DecodeRuntime(tgt, B, "ar", output_capacity=100)
    ar.prefill(prompts)
    ar.run(80)
    rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=100, tree_width=W)
    if dev == "cuda":
        rt.capture()
    rt.prefill(prompts)
    windows = [rt.window.cpu().clone()]
    for _ in range(steps):
        rt.step()
        windows.append(rt.window.cpu().clone())
    return ar.outputs(), rt.outputs(), torch.stack(windows)


@pytest.mark.parametrize("csrc", [False, True])
@pytest.mark.parametrize("K,W", [(2, 1), (4, 1), (3, 2)])
def test_real_drafts_on_cuda_match_cpu(models, K, W, csrc, monkeypatch):
    """``csrc``: with the CUDA csrc op built (``_cpp.load_cuda``), as the benchmarks run (B = 5 rows
    x 4 value heads = 20 (row, head) pairs, above ``CUDA_MIN_PAIRS``, so the read-only last draft
    step runs the csrc kernel), or Triton only. ``W = 2``: draft trees of two branches."""
    from vllm_specla.ops import _cpp
    from vllm_specla.ops import chain_verify as cv

    if csrc:
        try:
            built = _cpp.load_cuda()
        except RuntimeError as e:  # e.g. the CPU extension (the op schemas) is not built: VLLM_SPECLA_CPP_JIT unset
            pytest.skip(f"the CUDA csrc op is not available: {e}")
        if not built:
            pytest.skip("the CUDA csrc op did not build")
    monkeypatch.setattr(cv, "USE_CUDA_CSRC", csrc)
    tm, dm = models
    B, steps = 5, 12
    assert B * (tm.config.num_v_heads or tm.config.num_heads) > cv.CUDA_MIN_PAIRS
    prompts = torch.randint(3, 8000, (B, 8), generator=torch.Generator().manual_seed(5))
    res = {dev: _run(tm, dm, dev, B, K, W, steps, prompts) for dev in ("cpu", "cuda")}
    for dev, (ar_out, sp_out, _) in res.items():
        for a, s in zip(ar_out, sp_out):
            n = min(len(a), len(s))
            assert n >= steps and a[:n] == s[:n], dev  # lossless on each device
    w_cpu, w_gpu = res["cpu"][2], res["cuda"][2]
    drafts = (slice(None), slice(None), slice(1, None))
    agree = float((w_cpu[drafts] == w_gpu[drafts]).float().mean())
    assert agree >= 0.9, f"only {agree:.1%} of the draft tokens agree between CPU and CUDA"


@pytest.mark.parametrize("K,pro", [(1, False), (4, False), (4, True)])
def test_batch1_row_gemv_matches_cpu(models, K, pro, monkeypatch):
    """Batch 1 with the row GEMV (``fused.USE_GEMV_ROWS``: every one-row GEMM of the AR steps and the
    drafter's passes; ``pro``: the RMSNorm / gated-norm / SwiGLU prologues fused) is lossless on CUDA and
    drafts what the CPU reference drafts (same 90 % rule as above); the row GEMV must actually run."""
    from vllm_specla.ops import fused, triton_fused

    calls = []
    real = triton_fused.gemv_rows
    monkeypatch.setattr(fused, "USE_GEMV_ROWS", True)
    monkeypatch.setattr(fused, "GEMV_ROWS_PROLOGUE", pro)
    monkeypatch.setattr(triton_fused, "gemv_rows", lambda *a, **k: calls.append(
        k.get("prologue") or ("rms_norm" if len(a) > 2 and a[2] is not None else None)) or real(*a, **k))
    tm, dm = models
    prompts = torch.randint(3, 8000, (1, 8), generator=torch.Generator().manual_seed(11))
    res = {dev: _run(tm, dm, dev, 1, K, 1, 16, prompts) for dev in ("cpu", "cuda")}
    assert calls, "the row GEMV never ran"
    assert set(calls) == ({"rms_norm", "gated_rms_norm", "silu_mul", None} if pro else {None}), set(calls)
    for dev, (ar_out, sp_out, _) in res.items():
        n = min(len(ar_out[0]), len(sp_out[0]))
        assert n >= 16 and ar_out[0][:n] == sp_out[0][:n], dev
    w_cpu, w_gpu = res["cpu"][2], res["cuda"][2]
    agree = float((w_cpu[:, :, 1:] == w_gpu[:, :, 1:]).float().mean())
    assert agree >= 0.9, f"only {agree:.1%} of the draft tokens agree between CPU and CUDA"


@pytest.mark.parametrize("B,K,W", [(1, 4, 1), (2, 3, 1), (1, 3, 2)])
def test_conv_step_matches_cpu(models, B, K, W, monkeypatch):
    """One-token steps with the conv and the recurrence in one launch (``chain_verify.CONV_STEP``: the AR
    steps, the drafter's first draft step onto scratch slots, the read-only last one) under CUDA graphs:
    lossless, and the same drafts as the CPU path (the 90 % rule above); the one-launch kernel must run."""
    from vllm_specla.ops import chain_verify as cv, triton_chain as tc

    calls = []
    real = tc.conv_chain_step
    monkeypatch.setattr(cv, "CONV_STEP", True)
    monkeypatch.setattr(tc, "conv_chain_step", lambda *a, **k: calls.append(k.get("write")) or real(*a, **k))
    tm, dm = models
    prompts = torch.randint(3, 8000, (B, 8), generator=torch.Generator().manual_seed(13))
    res = {dev: _run(tm, dm, dev, B, K, W, 16, prompts) for dev in ("cpu", "cuda")}
    assert set(calls) == {True, False}, set(calls)  # "ar" (AR, draft steps) and "ar_read" (the last draft step)
    for dev, (ar_out, sp_out, _) in res.items():
        for a, s in zip(ar_out, sp_out):
            n = min(len(a), len(s))
            assert n >= 16 and a[:n] == s[:n], dev
    w_cpu, w_gpu = res["cpu"][2], res["cuda"][2]
    agree = float((w_cpu[:, :, 1:] == w_gpu[:, :, 1:]).float().mean())
    assert agree >= 0.9, f"only {agree:.1%} of the draft tokens agree between CPU and CUDA"


@pytest.mark.parametrize("size,W", [(1000, 1), (4096, 1), (1000, 2)])
def test_draft_vocab_on_cuda_matches_cpu(models, size, W):
    """A frequency-ranked draft vocabulary (``draft_vocab_size``; 1000 rows: not a multiple of the
    GEMV tiles) under CUDA graphs: lossless, every draft in the vocabulary, and the same drafts as
    the CPU path (the tolerance of the module docstring)."""
    from vllm_specla.core.draft_vocab import draft_vocab_ids, load_token_counts

    tm, dm = models
    ids = draft_vocab_ids(load_token_counts("models/specla-gdn-tiny/drafter"), size)
    B, K, steps = 5, 3, 12
    prompts = torch.randint(3, 8000, (B, 8), generator=torch.Generator().manual_seed(6))
    res = {dev: _run(tm, dm, dev, B, K, W, steps, prompts, ids) for dev in ("cpu", "cuda")}
    for dev, (ar_out, sp_out, win) in res.items():
        for a, s in zip(ar_out, sp_out):
            n = min(len(a), len(s))
            assert n >= steps and a[:n] == s[:n], dev
        assert bool(torch.isin(win[:, :, 1:], ids).all()), dev
    agree = float((res["cpu"][2][:, :, 1:] == res["cuda"][2][:, :, 1:]).float().mean())
    assert agree >= 0.9, f"only {agree:.1%} of the draft tokens agree between CPU and CUDA"


@pytest.mark.parametrize("B,K,W,max_batch", [(1, 4, 1, None), (3, 3, 1, 3), (1, 3, 2, None), (3, 3, 1, None)])
def test_fp8_draft_weights_on_cuda_match_cpu(models, B, K, W, max_batch, monkeypatch):
    """Float8 draft-pass weights (``draft_weights="fp8"``) under CUDA graphs: lossless, the float8
    row GEMV actually runs (``w_scale`` given), and the same drafts as the CPU reference path
    (``Fp8Weight.ref_linear``; the 90 % rule of the module docstring). ``max_batch`` 3: the batch limit
    raised so that B = 3 drafts on the float8 weights too; at the default limit (2) B = 3 never runs the
    float8 row GEMV."""
    from vllm_specla.ops import triton_fused
    from vllm_specla.runtime import fused_model

    if max_batch is not None:
        monkeypatch.setattr(fused_model, "FP8_MAX_BATCH", max_batch)
    fp8_expected = B <= fused_model.FP8_MAX_BATCH  # (a tree's first draft pass has B rows)

    scaled = []
    real = triton_fused.gemv_rows
    monkeypatch.setattr(triton_fused, "gemv_rows",
                        lambda *a, **k: scaled.append(k.get("w_scale") is not None) or real(*a, **k))
    tm, dm = models
    steps = 12
    prompts = torch.randint(3, 8000, (B, 8), generator=torch.Generator().manual_seed(13))
    res = {dev: _run(tm, dm, dev, B, K, W, steps, prompts, draft_weights="fp8") for dev in ("cpu", "cuda")}
    if fp8_expected:
        assert any(scaled), "the float8 row GEMV never ran"
    else:
        assert not any(scaled), "float8 weights above the batch limit"
    for dev, (ar_out, sp_out, _) in res.items():
        for a, sp in zip(ar_out, sp_out):
            n = min(len(a), len(sp))
            assert n >= steps and a[:n] == sp[:n], dev
    agree = float((res["cpu"][2][:, :, 1:] == res["cuda"][2][:, :, 1:]).float().mean())
    assert agree >= 0.9, f"only {agree:.1%} of the draft tokens agree between CPU and CUDA"


@pytest.mark.parametrize("mode", ["specla", "snapshot"])
def test_acceptance_control_under_cuda_graphs(models, mode):
    """The acceptance-controlled drafter on CUDA (``step_kernels.control_drafts``'s Triton coins inside the
    captured step, ``_speculate_chain``): lossless against the AR trace, every draft the trace's token or
    its + 1, and the mean acceptance length within 0.35 of (1 - alpha^(K+1)) / (1 - alpha) over 8 x 40
    steps; alpha 0 / 1 (``set_alpha``, no re-capture) give exactly 1 / K + 1."""
    from vllm_specla.runtime.decode import DecodeRuntime
    from vllm_specla.runtime.fused_model import FusedEagle, FusedTarget

    tm, dm = models
    tgt = FusedTarget(tm, torch.float32, "cuda")
    dr = FusedEagle(dm, tgt, torch.float32, "cuda")
    B, K, alpha = 8, 4, 0.6
    prompts = torch.randint(3, 8000, (B, 6), generator=torch.Generator().manual_seed(4))
    ar = DecodeRuntime(tgt, B, "ar", output_capacity=230)
    ar.prefill(prompts)
    ar.run(220)
    trace = torch.tensor([o[:221] for o in ar.outputs()])
    rt = DecodeRuntime(tgt, B, mode, K, dr, output_capacity=230, alpha=alpha, trace=trace)
    rt.capture()
    rt.prefill(prompts)
    r = rt.run(40)
    expect = (1 - alpha ** (K + 1)) / (1 - alpha)
    assert abs(r.mean_acceptance_length - expect) < 0.35, (r.mean_acceptance_length, expect)
    for o, t in zip(rt.outputs(), trace.tolist()):
        assert o == t[: len(o)]
    n = rt.n.cpu()
    true = trace.gather(1, (n[:, None] + torch.arange(K)).clamp(max=trace.shape[1] - 1))
    drafts = rt.window[:, 1:].cpu()
    assert bool(((drafts == true) | (drafts == (true + 1) % tgt.config.vocab_size)).all())
    for a, want in ((0.0, 1.0), (1.0, K + 1.0)):
        rt.set_alpha(a)
        rt.prefill(prompts)
        assert rt.run(10).mean_acceptance_length == want
