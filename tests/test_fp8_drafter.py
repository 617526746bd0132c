"""Float8 draft-pass weights (``ops/fused.py`` ``quantize_fp8`` / ``Fp8Weight``,
``runtime/fused_model.py`` ``FusedEagle(draft_weights="fp8")``) on CPU, fp32.

The quantization's error bound, the fused ops' float8 reference path (the one the Triton row GEMV is
tested against in ``test_fused_gpu.py``), the drafter's one-token passes equal to a drafter whose
weights were replaced by their dequantized float8 values, and the decode runtime staying lossless.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import runtime_ar_outputs

from vllm_specla.core.state import allocate_layer_states
from vllm_specla.ops import fused
from vllm_specla.runtime import fused_model
from vllm_specla.runtime.decode import DecodeRuntime, drafter_config
from vllm_specla.runtime.fused_model import (
    DRAFT_WEIGHTS,
    FusedEagle,
    FusedTarget,
    StepCtrl,
)


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


@pytest.fixture(scope="module")
def models():
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint

    return load_fla_checkpoint("models/specla-gdn-tiny/target"), load_eagle_drafter("models/specla-gdn-tiny/drafter")


def test_quantize_fp8_error_bound_and_scales():
    """Per-row scales are amax / 448; every element within 2^-4 of its magnitude (e4m3's 3 mantissa
    bits, round to nearest) or 2^-10 of the row scale (subnormals); an all-zero row gets scale 1 and
    zeros; the row maximum is exact; a row of float32 subnormals gets a normal scale (no NaN); bf16
    input gives the same scales as its float32 value; NaN / inf weights and bad dtypes are refused."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(33, 70, generator=g) * torch.logspace(-3, 2, 33)[:, None]  # rows of very different size
    w[5] = 0
    w0 = w.clone()
    q = fused.quantize_fp8(w)
    assert torch.equal(w, w0)  # the input is never written
    assert q.weight.dtype == torch.float8_e4m3fn and q.scale.dtype == torch.float32 and q.dtype == torch.float32
    amax = w.abs().amax(1)
    assert torch.allclose(q.scale[amax > 0], amax[amax > 0] / 448)
    assert q.scale[5] == 1 and torch.all(q.weight[5].float() == 0)
    dq = q.dequantize()
    err = (dq - w).abs()
    bound = torch.maximum(w.abs() * 2.0**-4, q.scale[:, None] * 2.0**-10)
    assert bool((err <= bound * (1 + 1e-6)).all())
    rows = torch.arange(33)
    top = w.abs().argmax(1)
    assert torch.allclose(dq[rows, top].abs(), amax)
    assert q.nbytes == 33 * 70 + 4 * 33
    with pytest.raises(ValueError, match=r"quantize_fp8: w must be \[N, K\]"):
        fused.quantize_fp8(torch.randn(4))
    tiny = fused.quantize_fp8(torch.tensor([[1e-44, 0.0, -1e-45, 2e-44]]))
    assert tiny.scale[0] >= torch.finfo(torch.float32).tiny and bool(torch.isfinite(tiny.dequantize()).all())
    wb = w.to(torch.bfloat16)
    assert torch.equal(fused.quantize_fp8(wb).scale, fused.quantize_fp8(wb.float()).scale)
    assert fused.quantize_fp8(wb).dtype == torch.bfloat16
    big = torch.randn(5000, 3, generator=g)  # more rows than one conversion chunk (4096)
    assert torch.equal(fused.quantize_fp8(big).weight.float()[4090:4100],
                       fused.quantize_fp8(big[4090:4100]).weight.float())
    for bad in (float("nan"), float("inf")):
        wbad = w.clone()
        wbad[3, 4] = bad
        with pytest.raises(ValueError, match="NaN or inf"):
            fused.quantize_fp8(wbad)
    with pytest.raises(ValueError, match="w must be bfloat16, float16, float32 or float64"):
        fused.quantize_fp8(torch.ones(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="dtype .the activation dtype. must be"):
        fused.quantize_fp8(w, torch.float64)


def test_fp8_weight_rejects_bad_parts():
    q = fused.quantize_fp8(torch.randn(4, 8))
    with pytest.raises(ValueError, match="weight must be a contiguous"):
        fused.Fp8Weight(q.weight.float(), q.scale, torch.float32)
    with pytest.raises(ValueError, match=r"scale must be contiguous float32 \[N\] = \[4\]"):
        fused.Fp8Weight(q.weight, q.scale[:3], torch.float32)
    with pytest.raises(ValueError, match="dtype must be torch.bfloat16, torch.float16 or torch.float32"):
        fused.Fp8Weight(q.weight, q.scale, torch.int8)


def test_fused_ops_take_fp8_weights_on_cpu():
    """linear (with an RMSNorm, a residual in place), linear_gating, gated_norm_linear and
    silu_mul_linear given an Fp8Weight equal their unfused reference chains with the weight
    dequantized (fp32: rel < 1e-6, summation order only)."""
    g = torch.Generator().manual_seed(1)
    HV, V, N = 3, 16, 29
    K = HV * V
    w = fused.quantize_fp8(torch.randn(N, K, generator=g) * 0.1)
    wd = w.dequantize()
    x = torch.randn(2, K, generator=g)
    nw = torch.rand(K, generator=g) + 0.5
    h = torch.randn(2, N, generator=g)
    h2 = h.clone()
    got = fused.linear(x, w, nw, 1e-6, residual=h2, residual_inplace=True)
    assert got.data_ptr() == h2.data_ptr()
    assert rel(h2, fused.linear_ref(x, wd, nw, 1e-6, h)) < 1e-6
    A_log, dt_bias = torch.rand(2, generator=g), torch.randn(2, generator=g)
    p, gv, bv = fused.linear_gating(x, w, nw, 1e-6, 7, A_log, dt_bias)
    p_ref = fused.linear_ref(x, wd, nw, 1e-6)
    g_ref, b_ref = fused.gdn_gating_masked_ref(p_ref[:, 7:9], p_ref[:, 9:11], A_log, dt_bias)
    assert rel(p, p_ref) < 1e-6 and rel(gv, g_ref) < 1e-5 and rel(bv, b_ref) < 1e-5
    o, gate, onw = torch.randn(2, HV, V, generator=g), torch.randn(2, K, generator=g), torch.rand(V, generator=g) + 0.5
    got = fused.gated_norm_linear(o, gate, onw, 1e-6, "sigmoid", w, residual=h.clone())
    ref = fused.linear_ref(fused.gated_rms_norm_ref(o, gate, onw, 1e-6, "sigmoid", torch.float32), wd, residual=h)
    assert rel(got, ref) < 1e-6
    wm = fused.quantize_fp8(torch.randn(N, K, generator=g) * 0.1)
    xm = torch.randn(2, 2 * K, generator=g)
    got = fused.silu_mul_linear(xm, wm, residual=h.clone())
    assert rel(got, fused.linear_ref(fused.silu_mul_ref(xm), wm.dequantize(), residual=h)) < 1e-6


def _fake_quantized(dm, only: tuple[str, ...] = ()):
    """A copy of an EagleDrafter whose fc and block GEMM weights hold their dequantized float8 values
    (``only``: just the weights whose names contain one of these)."""
    dq = copy.deepcopy(dm)
    with torch.no_grad():
        for name, p in dq.named_parameters():
            if (p.dim() == 2 and name.endswith("weight") and "embed" not in name
                    and (not only or any(o in name for o in only))):
                p.copy_(fused.quantize_fp8(p).dequantize())
    return dq


def test_fp8_draft_passes_equal_a_fake_quantized_drafter(models):
    """One-token passes (T = 1) of ``draft_weights="fp8"`` equal the model-dtype passes of a drafter
    whose GEMM weights were replaced by their dequantized float8 values, and its draft logits those
    of the dequantized LM head; multi-token passes (the absorb window) equal the unquantized
    drafter's. (Per-row quantization of the packed weights equals per-row quantization of each
    projection: rows are quantized independently.) Passes of more than ``FP8_MAX_BATCH`` (2) rows
    read the model weights: equal to the unquantized drafter's."""
    tm, dm = models
    tgt = FusedTarget(tm, torch.float32, "cpu")
    dr8 = FusedEagle(dm, tgt, torch.float32, "cpu", draft_weights="fp8")
    dr = FusedEagle(dm, tgt, torch.float32, "cpu")
    drq = FusedEagle(_fake_quantized(dm), tgt, torch.float32, "cpu")
    assert fused_model.FP8_MAX_BATCH == 2
    g = torch.Generator().manual_seed(4)
    head_q = fused.quantize_fp8(tgt.lm_head).dequantize()
    for B in (1, 2, 3, 5):
        toks = torch.randint(3, 8000, (B, 1), generator=g)
        feats = torch.randn(B, tm.config.hidden_size, generator=g)
        outs = {}
        for name, d in (("fp8", dr8), ("model", dr), ("fake", drq)):
            st = allocate_layer_states(drafter_config(d), B, 0)
            for s in st:  # the same non-zero starting state for each
                s.ssm.copy_(torch.randn(s.ssm.shape, generator=torch.Generator().manual_seed(9)))
            outs[name] = d.hidden(toks, feats, st, "ar", StepCtrl.uniform(B, 1, "cpu"), norm=False)
        f = outs["fp8"]
        got_f, got_t = torch.empty_like(f), torch.empty(B, dtype=torch.long)
        got_f = dr8.draft_from_hidden(f, got_t, got_f)
        if B <= 2:
            assert rel(f, outs["fake"]) < 1e-5, B
            assert rel(f, outs["model"]) > 1e-4, B  # the float8 weights are what ran
            head = head_q
        else:  # over the batch limit: the model weights, the same ops
            assert torch.equal(f, outs["model"]), B
            head = tgt.lm_head
        fn = dr8.norm(f)
        assert rel(got_f, fn) < 1e-6, B
        assert torch.equal(dr8.draft_tokens(fn), (fn @ head.t()).argmax(-1)), B
        assert torch.equal(got_t, (got_f @ head.t()).argmax(-1)), B
    T = 4
    toks = torch.randint(3, 8000, (1, T), generator=g)
    feats = torch.randn(T, tm.config.hidden_size, generator=g)
    got = [d.hidden(toks, feats, allocate_layer_states(drafter_config(d), 1, 0), "ar", StepCtrl.uniform(1, T, "cpu"))
           for d in (dr8, dr)]
    assert torch.equal(got[0], got[1])


def test_fp8_head_only_up_to_the_batch_limit(models, monkeypatch):
    """The draft head reads the float8 LM head in passes of at most ``FP8_MAX_BATCH`` rows and the
    model's above: ``draft_tokens`` by its feature rows, ``draft_from_hidden`` by ``rows`` (or all of
    ``h``). The weight each GEMM got is recorded (argmax alone rarely tells the two heads apart)."""
    tm, dm = models
    tgt = FusedTarget(tm, torch.float32, "cpu")
    dr8 = FusedEagle(dm, tgt, torch.float32, "cpu", draft_weights="fp8")
    got = []
    real_linear, real_nrl = fused.linear, fused.norm_rows_linear
    monkeypatch.setattr(fused, "linear", lambda x, w, *a, **k: got.append(isinstance(w, fused.Fp8Weight))
                        or real_linear(x, w, *a, **k))
    monkeypatch.setattr(fused, "norm_rows_linear", lambda h, nw, eps, w, *a, **k: got.append(
        isinstance(w, fused.Fp8Weight)) or real_nrl(h, nw, eps, w, *a, **k))
    h = torch.randn(5, tm.config.hidden_size, generator=torch.Generator().manual_seed(8))
    for n, want in ((1, True), (2, True), (3, False), (5, False)):
        got.clear()
        dr8.draft_tokens(h[:n])
        assert got and set(got) == {want}, n
        got.clear()
        dr8.draft_from_hidden(h[:n], torch.empty(n, dtype=torch.long))
        assert got and set(got) == {want}, n
        got.clear()
        dr8.draft_from_hidden(h, torch.empty(n, dtype=torch.long), rows=torch.arange(n))
        assert got and set(got) == {want}, n
    monkeypatch.setattr(fused_model, "FP8_MAX_BATCH", 5)
    got.clear()
    dr8.draft_tokens(h)
    assert got and set(got) == {True}


@pytest.mark.parametrize("tail_fp8,max_batch", [(True, 3), (False, 3), (True, 2)])
def test_absorb_pass_on_the_accepted_rows(models, monkeypatch, tail_fp8, max_batch):
    """``FusedEagle.hidden(rows=)`` (the absorb of an accepted window, ``runtime/decode.py``
    ``ABSORB_ACCEPTED_ROWS``): the state and conv window advance exactly as the full pass's, and the
    returned ``[M, D]`` rows equal the full pass's rows ``rows`` (model weights: rel < 1e-5; the
    same ops on fewer rows). With ``draft_weights="fp8"`` the GEMMs past the recurrence read the float8
    weights (``fused_model.ABSORB_ROWS_FP8``; those of a drafter with only ``o_proj`` and the MLP
    dequantized, rel < 1e-5), or the model weights with the switch off or with more rows than
    ``FP8_MAX_BATCH``."""
    monkeypatch.setattr(fused_model, "ABSORB_ROWS_FP8", tail_fp8)
    monkeypatch.setattr(fused_model, "FP8_MAX_BATCH", max_batch)
    tm, dm = models
    tgt = FusedTarget(tm, torch.float32, "cpu")
    B, T = 3, 5
    g = torch.Generator().manual_seed(6)
    toks = torch.randint(3, 8000, (B, T), generator=g)
    feats = torch.randn(B * T, tm.config.hidden_size, generator=g)
    a = torch.tensor([2, 0, 4])
    rows = torch.arange(B) * T + a

    def run(d, rows=None):
        st = allocate_layer_states(drafter_config(d), B, T)
        for s in st:  # the same non-zero starting state for each
            s.ssm.copy_(torch.randn(s.ssm.shape, generator=torch.Generator().manual_seed(9)))
        ctrl = StepCtrl.uniform(B, T, "cpu")
        ctrl.valid_len.copy_(a + 1)
        return d.hidden(toks, feats, st, "commit", ctrl, rows=rows), st

    dr = FusedEagle(dm, tgt, torch.float32, "cpu")
    full, st_full = run(dr)
    got, st = run(dr, rows)
    assert got.shape == (B, tm.config.hidden_size) and rel(got, full[rows]) < 1e-5
    for s0, s1 in zip(st_full, st):
        assert torch.equal(s0.ssm, s1.ssm) and torch.equal(s0.conv, s1.conv)
    got8, st8 = run(FusedEagle(dm, tgt, torch.float32, "cpu", draft_weights="fp8"), rows)
    for s0, s1 in zip(st_full, st8):  # (the window's own passes keep the model weights: FP8_MAX_TOKENS = 1)
        assert torch.equal(s0.ssm, s1.ssm) and torch.equal(s0.conv, s1.conv)
    if tail_fp8 and B <= max_batch:
        mix = FusedEagle(_fake_quantized(dm, ("o_proj", "gate_proj", "up_proj", "down_proj")), tgt, torch.float32,
                         "cpu")
        assert rel(got8, run(mix)[0][rows]) < 1e-5 and rel(got8, got) > 1e-4
    else:
        assert rel(got8, got) < 1e-6


def test_fp8_drafter_is_lossless_and_keeps_acceptance(models, monkeypatch):
    """The decode runtime with float8 draft passes emits the AR tokens (chain and tree), and on the
    trained pair its acceptance stays near the model-dtype drafter's (the measured cost is in
    RESULTS.md; here: within 0.5 of the mean acceptance length over 3 rows x 12 steps; the batch
    limit raised so that every draft pass, the tree's 6-row ones too, reads the float8 weights)."""
    monkeypatch.setattr(fused_model, "FP8_MAX_BATCH", 6)
    tm, dm = models
    tgt = FusedTarget(tm, torch.float32, "cpu")
    B, K = 3, 4
    prompts = torch.randint(7, 8000, (B, 6), generator=torch.Generator().manual_seed(5))
    ref = runtime_ar_outputs(tgt, prompts, 60, 80)
    taus = {}
    for dw in DRAFT_WEIGHTS:
        dr = FusedEagle(dm, tgt, torch.float32, "cpu", draft_weights=dw)
        for W in (1, 2):
            rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=80, tree_width=W)
            rt.prefill(prompts)
            r = rt.run(12)
            for a, b in zip(ref, rt.outputs()):
                n = min(len(a), len(b))
                assert n >= 13 and a[:n] == b[:n]
            taus[dw, W] = r.mean_acceptance_length
    assert abs(taus["fp8", 1] - taus["model", 1]) < 0.5, taus


def test_draft_weights_field_is_checked(models):
    tm, dm = models
    tgt = FusedTarget(tm, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"draft_weights must be one of \('model', 'fp8'\), got 'int4'"):
        FusedEagle(dm, tgt, torch.float32, "cpu", draft_weights="int4")
    dr = FusedEagle(dm, tgt, torch.float32, "cpu")
    with pytest.raises(ValueError, match="draft_weights must be one of"):
        dr.with_draft_weights("fp16")
    d8 = dr.with_draft_weights("fp8")
    assert d8.draft_weights == "fp8" and dr.draft_weights == "model" and dr.head8 is None
    again = d8.with_draft_weights("fp8")
    assert again.head8 is d8.head8 and again.stack8 is d8.stack8  # nothing quantized twice
    assert d8.with_draft_weights("model").stack8 is None
    assert d8.stack8.layers[0].w_in.weight.dtype == torch.float8_e4m3fn
    assert d8.stack.layers[0].w_in is dr.stack.layers[0].w_in  # the model-dtype weights are shared
    small = d8.with_draft_vocab(torch.arange(100))
    assert small.head8.shape == (100, tm.config.hidden_size) and d8.head8.shape[0] == tm.config.vocab_size
