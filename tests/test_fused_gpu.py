"""Fused per-layer Triton kernels (``ops/triton_fused.py``) vs their torch references (``ops/fused.py``).

Runs on CUDA; skipped without it, except under ``TRITON_INTERPRET=1`` (CPU interpreter).
Tolerances: float32 math in both, different reduction order: 1e-5 relative (norm-wise) for fp32
outputs, one bf16 ulp (8e-3 relative) element-wise for bf16 outputs.
"""

from __future__ import annotations

import os

import pytest
import torch

HAVE_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")
DEV = "cuda" if HAVE_CUDA else "cpu"

if HAVE_CUDA or INTERPRET:
    from vllm_specla.ops import fused as F_ref
    from vllm_specla.ops import triton_fused as tf


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _close(a, b, dtype):
    if dtype == torch.float32:
        assert rel(a, b) < 1e-5
    else:
        torch.testing.assert_close(a.float(), b.float(), rtol=8e-3, atol=1e-3)


@pytest.mark.parametrize("D", [384, 2048, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm(D, dtype):
    g = torch.Generator().manual_seed(D)
    x = (torch.randn(7, D + 5, generator=g) * 3).to(DEV, dtype)[:, 2 : D + 2]  # row-strided
    w = torch.rand(D, generator=g).to(DEV) + 0.5
    _close(tf.rms_norm(x, w, 1e-6, dtype), F_ref.rms_norm_ref(x, w, 1e-6, dtype), dtype)


@pytest.mark.parametrize("act", ["swish", "sigmoid"])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("HV,BH", [(3, None), (6, 4), (8, 1), (5, 8)])
def test_gated_rms_norm(act, gated, HV, BH, monkeypatch):
    """Per-head RMS with ``BH`` value heads per program (None: the default), including a last
    program with fewer heads (6 / 4, 5 / 8): masked heads must not leak into the others' norms."""
    if BH is not None:
        monkeypatch.setattr(tf, "_gated_norm_config", lambda N, HV, V: (BH, 2))
    g = torch.Generator().manual_seed(3)
    N, V = 5, 48
    o = torch.randn(N, HV, V, generator=g).to(DEV)
    wide = torch.randn(N, HV * V + 11, generator=g).to(DEV, torch.bfloat16)
    gate = wide[:, 11:] if gated else None
    w = (torch.rand(V, generator=g) + 0.5).to(DEV)
    for dt in (torch.float32, torch.bfloat16):
        _close(tf.gated_rms_norm(o, gate, w, 1e-5, act, dt), F_ref.gated_rms_norm_ref(o, gate, w, 1e-5, act, dt), dt)


@pytest.mark.parametrize("I", [64, 5632 // 8, 3000])
def test_silu_mul(I):
    g = torch.Generator().manual_seed(I)
    for dt in (torch.float32, torch.bfloat16):
        x = (torch.randn(4, 2 * I, generator=g) * 2).to(DEV, dt)
        _close(tf.silu_mul(x), F_ref.silu_mul_ref(x), dt)


@pytest.mark.parametrize("neg", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_gdn_gating(neg, masked):
    g = torch.Generator().manual_seed(5)
    B, T, HV = 3, 4, 6
    N = B * T
    proj = (torch.randn(N, 2 * HV + 9, generator=g) * 8).to(DEV)  # a | b as strided column slices, large |a|
    a, b = proj[:, 9 : 9 + HV], proj[:, 9 + HV :]
    A_log = torch.rand(HV, generator=g).to(DEV) * 2
    dt_bias = torch.randn(HV, generator=g).to(DEV)
    valid = torch.tensor([1, 4, 2], device=DEV) if masked else None
    g1, b1 = tf.gdn_gating(a, b, A_log, dt_bias, neg, valid, T)
    g2, b2 = F_ref.gdn_gating_masked_ref(a, b, A_log, dt_bias, neg, valid, T)
    assert rel(g1, g2) < 1e-5 and rel(b1, b2) < 1e-5
    if masked:
        assert float(g1.reshape(B, T, HV)[0, 1:].abs().sum()) == 0.0  # padding: no decay, no write
        assert float(b1.reshape(B, T, HV)[2, 2:].abs().sum()) == 0.0
        assert float(b1.reshape(B, T, HV)[1].abs().min()) > 0.0


@pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA")
def test_state_slot_model_cuda_matches_cpu(monkeypatch):
    """The vLLM-path model (models/gdn.py on state slots, fused gated RMSNorm + Triton ops on CUDA)
    gives the CPU reference's hidden states for a prefill then a decode step (fp32). The prefill
    takes the torch reference on both devices here (``VLLM_SPECLA_PREFILL=ref``): fla's chunk
    kernel, the CUDA default, computes in tf32 (tests/test_prefill_gpu.py compares it, at 5e-3)."""
    monkeypatch.setenv("VLLM_SPECLA_PREFILL", "ref")
    from vllm_specla.core.state import allocate_layer_states, build_step_plan
    from vllm_specla.models.gdn import load_fla_checkpoint

    outs = []
    for dev in ("cpu", "cuda"):
        m = load_fla_checkpoint("models/specla-gdn-tiny/target", torch.float32, dev)
        st = allocate_layer_states(m.config, 2, 0, dev)
        toks = torch.tensor([5, 9, 33, 7, 100, 11, 12], device=dev)
        plan = build_step_plan([4, 3], [0, 1], [True, True], [False, False], speculative=False, device=dev)
        h1 = m(toks, plan, st)
        plan2 = build_step_plan([1, 1], [0, 1], [False, False], [True, True], speculative=False, device=dev)
        h2 = m(torch.tensor([42, 43], device=dev), plan2, st)
        outs.append(torch.cat([h1, h2]).cpu())
    assert rel(outs[1], outs[0]) < 1e-4


@pytest.mark.parametrize("M", [1, 2, 5, 17])
@pytest.mark.parametrize("norm,res", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("config", [(4, 0, 4), (1, 0, 2), (8, 128, 4), (8, 1024, 8)])
def test_gemv_rows(M, norm, res, config):
    """The row GEMV equals linear_ref on random inputs: odd K / N (masked tails), a row-strided x,
    the one-tile and the chunked-K forms, 1-16 token rows per
    launch and 17 (two launches); bf16 on CUDA (rel < 1e-2), fp32 under the interpreter (rel < 1e-5)."""
    if M == 17 and config[0] < 8:
        pytest.skip("compile / interpreter time: M = 17 (two launches) runs at the BN = 8 configs")
    g = torch.Generator().manual_seed(10 * M + config[0])
    K, N = 300, 70
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    x = torch.randn(M, K + 3, generator=g).to(DEV, dt)[:, 3:]
    w = (torch.randn(N, K, generator=g) * 0.05).to(DEV, dt)
    nw = (torch.rand(K, generator=g) + 0.5).to(DEV) if norm else None
    r = torch.randn(M, N, generator=g).to(DEV, dt) if res else None
    ref = F_ref.linear_ref(x, w, nw, 1e-6, r)
    got = tf.gemv_rows(x, w, nw, 1e-6, r, config=config)
    assert got.dtype == w.dtype and got.shape == (M, N)
    tol = 1e-2 if dt == torch.bfloat16 else 1e-5
    assert rel(got, ref) < tol
    if res:  # in place into the residual (the runtime's o_proj / down form)
        r2 = r.clone()
        tf.gemv_rows(x, w, nw, 1e-6, r2, out=r2, config=config)
        assert rel(r2, ref) < tol


def _spy_gemv_launch(monkeypatch) -> list:
    """Records ``(BN, BK, num_warps, PRO)`` of every ``_gemv_rows_kernel`` launch (then launches it)."""
    log, real = [], tf._gemv_rows_kernel

    class Spy:
        def __getitem__(self, grid):
            def run(*a, **kw):
                log.append((kw["BN"], kw["BK"], kw["num_warps"], kw["PRO"]))
                return real[grid](*a, **kw)
            return run

    monkeypatch.setattr(tf, "_gemv_rows_kernel", Spy())
    return log


def test_gemv_rows_narrow_config(monkeypatch):
    """``rows_config``: one-row GEMMs of at most ``GEMV_ROWS_NARROW_N`` outputs launch
    ``GEMV_ROWS_CONFIG_NARROW`` (float8 weights: ``GEMV_ROWS_FP8_CONFIG_NARROW``), wider ones and two
    or more rows the plain configs (BK clamped to the next power of two >= K), with correct values;
    the gated-norm dispatch fuses its prologue only where the head size divides the BK that
    ``gemv_rows`` will launch (else the unfused norm, then the GEMV: no error)."""
    monkeypatch.setattr(tf, "GEMV_ROWS_CONFIG_NARROW", (4, 128, 4))
    monkeypatch.setattr(tf, "GEMV_ROWS_FP8_CONFIG_NARROW", (2, 256, 4))
    monkeypatch.setattr(tf, "GEMV_ROWS_NARROW_N", 70)
    assert tf.rows_config(70, False) == (4, 128, 4) and tf.rows_config(70, True) == (2, 256, 4)
    assert tf.rows_config(71, False) == tuple(tf.GEMV_ROWS_CONFIG)
    assert tf.rows_config(71, True) == tuple(tf.GEMV_ROWS_FP8_CONFIG)
    assert tf.rows_config(70, False, M=2) == tuple(tf.GEMV_ROWS_CONFIG)
    monkeypatch.setattr(tf, "GEMV_ROWS_FP8_CONFIG_NARROW", None)
    assert tf.rows_config(70, True) == tuple(tf.GEMV_ROWS_FP8_CONFIG)
    log = _spy_gemv_launch(monkeypatch)
    g = torch.Generator().manual_seed(77)
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    K, dflt = 300, tuple(tf.GEMV_ROWS_CONFIG)
    for N, M, want in ((70, 1, (4, 128, 4)), (71, 1, dflt), (70, 2, dflt)):
        x = torch.randn(M, K, generator=g).to(DEV, dt)
        w = (torch.randn(N, K, generator=g) * 0.05).to(DEV, dt)
        log.clear()
        got = tf.gemv_rows(x, w)
        assert log == [(want[0], min(want[1], 512), want[2], 0)], (N, M, log)
        assert rel(got, F_ref.linear_ref(x, w)) < (1e-2 if dt == torch.bfloat16 else 1e-5)
    # the gated RMSNorm prologue (head size V = 256) through the dispatch: fused at a narrow BK of 512, not at 128
    _spy_row_gemv(monkeypatch, True, True)
    HV, V, N = 2, 256, 64
    o = torch.randn(1, HV, V, generator=g).to(DEV)
    gate = torch.randn(1, HV * V, generator=g).to(DEV, dt)
    nw = (torch.rand(V, generator=g) + 0.5).to(DEV)
    w = (torch.randn(N, HV * V, generator=g) * 0.05).to(DEV, dt)
    want = F_ref.linear_ref(F_ref.gated_rms_norm_ref(o, gate, nw, 1e-6, "silu", dt).reshape(1, -1), w)
    for narrow, pro in (((4, 128, 4), 0), ((4, 512, 4), 3)):
        monkeypatch.setattr(tf, "GEMV_ROWS_CONFIG_NARROW", narrow)
        log.clear()
        got = F_ref.gated_norm_linear(o, gate, nw, 1e-6, "silu", w)
        assert log == [(4, narrow[1], 4, pro)], (narrow, log)
        assert rel(got, want) < (1e-2 if dt == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("config", [(8, 2048, 8), (8, 4096, 8), (16, 2048, 8), (4, 2048, 8)])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("pro", [None, "silu_mul", "gated_rms_norm"])
def test_gemv_rows_long_k_tiles(config, fp8, pro):
    """The K tiles session 31 timed for the N = 2048 GEMMs (``GEMV_ROWS_CONFIG_NARROW`` /
    ``GEMV_ROWS_FP8_CONFIG_NARROW``), at o_proj's / down_proj's K (3072, 5632: a masked last tile)
    with their prologues and the in-place residual, bf16 and float8 weights, against the references
    (rel < 1e-2: bf16 activations; under the interpreter too, ~16 s)."""
    g = torch.Generator().manual_seed(config[0] * 7 + config[1] + 3 * fp8 + len(pro or ""))
    dt = torch.bfloat16
    N, V = 200, 512
    K = 5632 if pro == "silu_mul" else 3072
    wr = torch.randn(N, K, generator=g) * 0.03
    w8 = F_ref.quantize_fp8(wr.to(DEV), dt) if fp8 else None
    w = w8.weight if fp8 else wr.to(DEV, dt)
    lin = (lambda a, r: w8.ref_linear(a, r)) if fp8 else (lambda a, r: F_ref.linear_ref(a, w, None, 1e-6, r))
    r = torch.randn(1, N, generator=g).to(DEV, dt)
    kw = dict(config=config, w_scale=w8.scale if fp8 else None)
    r2 = r.clone()
    if pro == "silu_mul":
        x = torch.randn(1, 2 * K, generator=g).to(DEV, dt)
        ref = lin(F_ref.silu_mul_ref(x), r)
        got = tf.gemv_rows(x, w, residual=r2, out=r2, prologue="silu_mul", **kw)
    elif pro == "gated_rms_norm":
        o = torch.randn(1, K // V, V, generator=g).to(DEV)
        gate = torch.randn(1, K, generator=g).to(DEV, dt)
        nw = (torch.rand(V, generator=g) + 0.5).to(DEV)
        ref = lin(F_ref.gated_rms_norm_ref(o.to(dt), gate, nw, 1e-6, "silu", dt), r)
        got = tf.gemv_rows(o.reshape(1, K).to(dt), w, nw, 1e-6, r2, out=r2, prologue="gated_rms_norm", gate=gate,
                           head_dim=V, **kw)
    else:
        x = torch.randn(1, K, generator=g).to(DEV, dt)
        ref = lin(x, r)
        got = tf.gemv_rows(x, w, residual=r2, out=r2, **kw)
    assert got.data_ptr() == r2.data_ptr()
    assert rel(got, ref) < 1e-2


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("neg", [False, True])
@pytest.mark.parametrize("config", [(4, 0, 4), (8, 128, 4), (8, 1024, 8)])
def test_gemv_rows_gating_epilogue(M, neg, config):
    """The GDN gating as the row GEMV's epilogue equals gdn_gating on the GEMV's own output (the
    a | b columns at a0, with columns before and after them and an RMSNorm prologue), and leaves
    the GEMV output as it is without the epilogue; random inputs, HV = 6 heads (not a power of
    two). fp32 under the interpreter (g / beta rel < 1e-5), bf16 on CUDA (rel < 1e-5 against the
    reference gating of the same bf16 output)."""
    g = torch.Generator().manual_seed(M + config[0] + neg)
    K, HV, a0, N = 200, 6, 37, 70
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    x = torch.randn(M, K, generator=g).to(DEV, dt)
    w = (torch.randn(N, K, generator=g) * 0.2).to(DEV, dt)
    nw = (torch.rand(K, generator=g) + 0.5).to(DEV)
    A_log = torch.rand(HV, generator=g).mul(2.7).to(DEV)
    dt_bias = torch.randn(HV, generator=g).to(DEV)
    plain = tf.gemv_rows(x, w, nw, 1e-6, config=config)
    gb = torch.full((M, 2 * HV), float("nan"), device=DEV)
    p = tf.gemv_rows(x, w, nw, 1e-6, config=config, gating=(gb, a0, A_log, dt_bias, neg))
    assert torch.equal(p, plain)
    g_ref, b_ref = F_ref.gdn_gating_masked_ref(p[:, a0 : a0 + HV], p[:, a0 + HV : a0 + 2 * HV], A_log, dt_bias, neg)
    assert rel(gb[:, :HV], g_ref) < 1e-5 and rel(gb[:, HV:], b_ref) < 1e-5
    with pytest.raises(ValueError, match="gating needs gb"):
        tf.gemv_rows(x, w, config=config, gating=(gb, N - HV, A_log, dt_bias, neg))


@pytest.mark.parametrize("on", [True, False])
def test_linear_gating_dispatch(on, monkeypatch):
    """fused.linear_gating gives the unfused linear + gdn_gating values with the epilogue on (one
    row: the row GEMV takes the gating) and off, and falls back for two rows and for a padding
    mask (valid_len). Under the interpreter ``fused._on_gpu`` is pointed at the CPU tensors."""
    _spy_row_gemv(monkeypatch, True, True)
    monkeypatch.setattr(F_ref, "GEMV_ROWS_GATING", on)
    calls, inner = [], tf.gemv_rows  # whether each row-GEMV call had the gating epilogue
    monkeypatch.setattr(tf, "gemv_rows", lambda *a, **k: (calls.append(k.get("gating") is not None), inner(*a, **k))[1])
    gen = torch.Generator().manual_seed(5)
    K, HV, a0, N = 64, 4, 20, 40
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    w = (torch.randn(N, K, generator=gen) * 0.2).to(DEV, dt)
    nw = (torch.rand(K, generator=gen) + 0.5).to(DEV)
    A_log, dt_bias = torch.rand(HV, generator=gen).to(DEV), torch.randn(HV, generator=gen).to(DEV)
    for M, valid in [(1, None), (2, None), (1, torch.tensor([0], device=DEV))]:
        x = torch.randn(M, K, generator=gen).to(DEV, dt)
        calls.clear()
        p, gv, bv = F_ref.linear_gating(x, w, nw, 1e-6, a0, A_log, dt_bias, False, valid, 1)
        ref = F_ref.linear_ref(x, w, nw, 1e-6)
        g_ref, b_ref = F_ref.gdn_gating_masked_ref(p[:, a0 : a0 + HV], p[:, a0 + HV : a0 + 2 * HV], A_log, dt_bias,
                                                   False, valid, 1)
        assert rel(p, ref) < (1e-2 if dt == torch.bfloat16 else 1e-5)
        assert rel(gv, g_ref) < 1e-5 and torch.allclose(bv, b_ref, rtol=1e-5, atol=1e-6)
        # two rows: cuBLAS; one row: the row GEMV, with the gating epilogue unless off or masked
        assert calls == ([M == 1 and valid is None and on] if M == 1 else [])
        if valid is not None:
            assert torch.all(gv == 0) and torch.all(bv == 0)


def test_gemv_rows_rejects_bad_layout():
    w = torch.randn(8, 16, device=DEV)
    with pytest.raises(ValueError, match="dense feature dim"):
        tf.gemv_rows(torch.randn(16, 2, device=DEV).t(), w)


@pytest.mark.parametrize("M", [1, 2, 7])
@pytest.mark.parametrize("pro", ["silu_mul", "gated_silu", "gated_sigmoid", "gated_nogate"])
@pytest.mark.parametrize("config", [(4, 0, 4), (2, 64, 2), (8, 1024, 8)])
def test_gemv_rows_prologues(M, pro, config):
    """The SwiGLU and per-head gated-RMSNorm prologues equal the unfused references (silu_mul_ref /
    gated_rms_norm_ref, then linear_ref) on random inputs with a residual; K = 5 heads of 32 (not a
    power of two: masked tail heads in the one-tile form); bf16 on CUDA (rel < 1e-2), fp32 under the
    interpreter (rel < 1e-5)."""
    g = torch.Generator().manual_seed(7 * M + config[0] + len(pro))
    HV, V, N = 5, 32, 37
    K = HV * V
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    w = (torch.randn(N, K, generator=g) * 0.05).to(DEV, dt)
    r = torch.randn(M, N, generator=g).to(DEV, dt)
    if pro == "silu_mul":
        x = torch.randn(M, 2 * K, generator=g).to(DEV, dt)
        ref = F_ref.linear_ref(F_ref.silu_mul_ref(x), w, residual=r)
        got = tf.gemv_rows(x, w, residual=r, prologue="silu_mul", config=config)
    else:
        o = torch.randn(M, HV, V, generator=g).to(DEV)  # fp32, as chain_verify writes it
        gate = None if pro == "gated_nogate" else torch.randn(M, K + 4, generator=g).to(DEV, dt)[:, 4:]
        nw = (torch.rand(V, generator=g) + 0.5).to(DEV)
        act = "sigmoid" if pro == "gated_sigmoid" else "silu"
        ref = F_ref.linear_ref(F_ref.gated_rms_norm_ref(o, gate, nw, 1e-6, act, dt), w, residual=r)
        got = tf.gemv_rows(o.reshape(M, K), w, nw, 1e-6, r, prologue="gated_rms_norm", gate=gate, head_dim=V,
                           gate_act=act, config=config)
    assert rel(got, ref) < (1e-2 if dt == torch.bfloat16 else 1e-5)


@pytest.mark.skipif(not HAVE_CUDA, reason="programmatic dependent launch needs a GPU (sm90+)")
def test_pdl_chain_in_graph_matches_plain_launches(monkeypatch):
    """A dependent chain of the step's kernel kinds (row GEMVs with each prologue and an in-place
    residual, a 2-row GEMV, gating, the conv and chain verify of ``triton_chain``, RMSNorm) captured in one CUDA
    graph with programmatic dependent launch gives bit-identical results to the same chain
    launched plainly, over several replays with new inputs (a missing ``gdc_wait`` would read a
    predecessor's output early: a race that shows up as differing values)."""
    from vllm_specla.ops import pdl
    from vllm_specla.ops import triton_chain as tc

    if not pdl.enabled(torch.empty(0, device=DEV)):
        pytest.skip("PDL unavailable here (VLLM_SPECLA_PDL=0 or below sm90)")
    g = torch.Generator().manual_seed(12)
    D, HV, V, H, Kd, I = 512, 2, 128, 1, 128, 768
    C = H * Kd * 2 + HV * V
    dt = torch.bfloat16
    rnd = lambda *s, sc=1.0: (torch.randn(*s, generator=g) * sc).to(DEV)  # noqa: E731
    w_in = rnd(C + HV * V + 2 * HV, D, sc=0.05).to(dt)
    w_o, w_gu, w_dn = rnd(D, HV * V, sc=0.05).to(dt), rnd(2 * I, D, sc=0.05).to(dt), rnd(D, I, sc=0.05).to(dt)
    nw_a, nw_o, nw_m = rnd(D).abs() + 0.5, rnd(V).abs() + 0.5, rnd(D).abs() + 0.5
    A_log, dt_bias, conv_w = rnd(HV), rnd(HV), rnd(C, 4, sc=0.5)
    h_in = rnd(1, D).to(dt)
    slots, cu = torch.zeros(1, dtype=torch.long, device=DEV), torch.tensor([0, 1], device=DEV)

    def chain(h, ssm, conv):
        p = tf.gemv_rows(h, w_in, nw_a, 1e-6)
        g_, b_ = tf.gdn_gating(p[:, C + HV * V: C + HV * V + HV], p[:, C + HV * V + HV:], A_log, dt_bias)
        y = tc.conv_verify(p[:, :C], conv_w, cu, conv, slots, write_final_state=True)
        q, k, v = y[:, :H * Kd].view(1, H, Kd), y[:, H * Kd: 2 * H * Kd].view(1, H, Kd), y[:, 2 * H * Kd:].view(1, HV, V)
        o = tc.chain_verify(q, k, v, g_, b_, scale=Kd ** -0.5, state=ssm, slots=slots, cu_seqlens=cu,
                            write_final_state=True)
        tf.gemv_rows(o.reshape(1, HV * V), w_o, nw_o, 1e-6, h, out=h, prologue="gated_rms_norm",
                     gate=p[:, C: C + HV * V], head_dim=V)
        gu = tf.gemv_rows(h, w_gu, nw_m, 1e-6)
        two = tf.gemv_rows(gu.view(2, I), w_dn)  # a 2-row launch on the previous kernel's output
        tf.gemv_rows(gu, w_dn, residual=h, out=h, prologue="silu_mul")
        return torch.cat([tf.rms_norm(h, nw_m, 1e-6, torch.float32).reshape(-1), two.float().reshape(-1)])

    results = {}
    for on in (False, True):
        monkeypatch.setattr(pdl, "ENABLED", on)
        h = h_in.clone()
        ssm = torch.zeros(1, HV, V, Kd, device=DEV)
        conv = torch.zeros(1, 3, C, device=DEV)
        chain(h, ssm, conv)  # compile outside the capture
        h.copy_(h_in), ssm.zero_(), conv.zero_()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(h, ssm, conv)
        seen = []
        for _ in range(4):  # each replay advances the recurrent state, the conv window and h
            graph.replay()
            seen.append(torch.cat([out.reshape(-1), h.float().reshape(-1), ssm.reshape(-1), conv.reshape(-1)]).clone())
        torch.cuda.synchronize()
        results[on] = torch.stack(seen)
    assert torch.isfinite(results[False]).all()
    assert torch.equal(results[True], results[False])


@pytest.mark.skipif(not HAVE_CUDA, reason="programmatic dependent launch needs a GPU (sm90+)")
def test_pdl_recover_in_graph_matches_plain_launches(monkeypatch):
    """A commit chain captured in one CUDA graph: the verify-window conv of two rows (5 and 3 tokens) records the raw
    conv inputs and ``conv_commit`` folds an accepted prefix (4 and 2 tokens) into the conv windows right after it;
    the chain verify records factors and ``recover`` folds the same prefix into the state right after it; a
    one-token conv and verify read both. Each commit kernel directly follows the launch whose output it reads. With
    programmatic dependent launch (session 48: the commit kernels take it too) the graph gives bit-identical results
    to plain launches over several replays with new window inputs (a missing ``gdc_wait`` in a commit kernel would
    read its predecessor's bank early: differing values; a race test, so it catches a missing wait likely, not
    surely)."""
    from vllm_specla.ops import pdl
    from vllm_specla.ops import triton_chain as tc
    from vllm_specla.ops import triton_recover as tr

    if not pdl.enabled(torch.empty(0, device=DEV)):
        pytest.skip("PDL unavailable here (VLLM_SPECLA_PDL=0 or below sm90)")
    g = torch.Generator().manual_seed(13)
    H, HV, K, V, W1, Tmax = 2, 4, 64, 32, 3, 8
    C = 2 * H * K + HV * V
    rnd = lambda *s, sc=1.0: (torch.randn(*s, generator=g) * sc).to(DEV)  # noqa: E731
    conv_w = rnd(C, W1 + 1, sc=0.5)
    x_in = rnd(8, C)  # 5 + 3 window tokens
    gb_in = rnd(8, 2 * HV)
    x1_in = rnd(2, C)  # the one-token verify after the commit
    cu = torch.tensor([0, 5, 8], dtype=torch.int32, device=DEV)
    cu1 = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    slots = torch.tensor([3, 1], device=DEV)
    wb = torch.tensor([1, 0], device=DEV)
    acc = torch.tensor([4, 2], device=DEV)
    ssm_in, conv_in = rnd(4, HV, V, K, sc=0.1), rnd(4, W1, C)

    def split(y):
        n = y.shape[0]
        return (y[:, :H * K].reshape(n, H, K), y[:, H * K: 2 * H * K].reshape(n, H, K),
                y[:, 2 * H * K:].reshape(n, HV, V))

    def chain(x, gb, x1, ssm, conv, banks):
        y = tc.conv_verify(x, conv_w, cu, conv, slots, bank_x=banks[3], write_bank=wb)
        tr.conv_commit(conv, slots, banks[3], wb, acc)
        q, k, v = split(y)
        gg, beta = -torch.nn.functional.softplus(gb[:, :HV]), torch.sigmoid(gb[:, HV:])
        o = tc.chain_verify(q, k, v, gg, beta, scale=K ** -0.5, state=ssm, slots=slots, cu_seqlens=cu,
                            bank_k=banks[0], bank_v=banks[1], bank_g=banks[2], write_bank=wb)
        tr.recover(ssm, slots, banks[0], banks[1], banks[2], wb, acc)
        q1, k1, v1 = split(tc.conv_verify(x1, conv_w, cu1, conv, slots, write_final_state=True))
        o1 = tc.chain_verify(q1, k1, v1, gg[:2], beta[:2], scale=K ** -0.5, state=ssm, slots=slots,
                             cu_seqlens=cu1, write_final_state=True)
        return torch.cat([o.reshape(-1), o1.reshape(-1)])

    results = {}
    for on in (False, True):
        monkeypatch.setattr(pdl, "ENABLED", on)
        x, gb, x1, ssm, conv = x_in.clone(), gb_in.clone(), x1_in.clone(), ssm_in.clone(), conv_in.clone()
        banks = (torch.zeros(4, 2, Tmax, H, K, device=DEV), torch.zeros(4, 2, Tmax, HV, V, device=DEV),
                 torch.zeros(4, 2, Tmax, HV, device=DEV), torch.zeros(4, 2, Tmax, C, device=DEV))
        chain(x, gb, x1, ssm, conv, banks)  # compile outside the capture
        ssm.copy_(ssm_in), conv.copy_(conv_in)
        for b in banks:
            b.zero_()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(x, gb, x1, ssm, conv, banks)
        seen = []
        for i in range(4):  # new window inputs each replay; states and conv windows carry over
            x.copy_(x_in.roll(i, 0)), gb.copy_(gb_in.roll(i, 0)), x1.copy_(x1_in * (1 + i))
            graph.replay()
            seen.append(torch.cat([out, ssm.reshape(-1), conv.reshape(-1)] + [b.reshape(-1) for b in banks]).clone())
        torch.cuda.synchronize()
        results[on] = torch.stack(seen)
    assert torch.isfinite(results[False]).all()
    assert not torch.equal(results[False][0], results[False][1])  # the replays did new work
    assert torch.equal(results[True], results[False])


def test_gemv_rows_rejects_bad_prologue_args():
    w = torch.randn(8, 64, device=DEV)
    x = torch.randn(1, 64, device=DEV)
    with pytest.raises(ValueError, match="prologue must be one of"):
        tf.gemv_rows(x, w, prologue="gelu")
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        tf.gemv_rows(x, w, torch.ones(24, device=DEV), prologue="gated_rms_norm", head_dim=24)
    with pytest.raises(ValueError, match="norm_weight is needed"):
        tf.gemv_rows(x, w, prologue="gated_rms_norm", head_dim=32)
    with pytest.raises(ValueError, match=r"\[M, 2K\] for silu_mul"):
        tf.gemv_rows(x, w, prologue="silu_mul")
    with pytest.raises(ValueError, match="norm_weight must be contiguous"):
        tf.gemv_rows(x, w, torch.ones(16, device=DEV))
    with pytest.raises(ValueError, match="norm_weight must be contiguous"):
        tf.gemv_rows(x, w, torch.ones(128, device=DEV)[::2])
    with pytest.raises(ValueError, match="residual must be"):
        tf.gemv_rows(x, w, residual=torch.zeros(8, device=DEV))
    with pytest.raises(ValueError, match="out must be"):
        tf.gemv_rows(x, w, out=torch.empty(1, 8, dtype=torch.float64, device=DEV))
    with pytest.raises(ValueError, match="out must be"):
        tf.gemv_rows(x[:0], w, out=torch.empty(5, 5, device=DEV))
    with pytest.raises(ValueError, match="BN a power of two"):
        tf.gemv_rows(x, w, config=(3, 0, 4))
    with pytest.raises(ValueError, match=r"config must be \(BN, BK, num_warps\)"):
        tf.gemv_rows(x, w, config=(4, 0))
    with pytest.raises(ValueError, match="belong to the 'gated_rms_norm' prologue"):
        tf.gemv_rows(x, w, gate=x)


def _spy_row_gemv(monkeypatch, rows: bool, pro: bool, small_max_m: int = 1) -> list:
    """Set the row-GEMV switches (and, under the interpreter, point ``fused._on_gpu`` at the CPU so
    the dispatch runs there too); returns the list of its calls as (rows, prologue, whether a
    norm weight was passed, i.e. the RMSNorm fused). ``small_max_m``: ``GEMV_ROWS_SMALL_MAX_M``
    (1 by default here: the tests' weights are small, and most test the one-row rule)."""
    monkeypatch.setattr(F_ref, "USE_GEMV_ROWS", rows)
    monkeypatch.setattr(F_ref, "GEMV_ROWS_PROLOGUE", pro)
    monkeypatch.setattr(F_ref, "GEMV_ROWS_SMALL_MAX_M", small_max_m)
    if not HAVE_CUDA:
        monkeypatch.setattr(F_ref, "_on_gpu", lambda x: True)
    calls = []
    real = tf.gemv_rows

    def spy(*a, **k):
        calls.append((a[0].shape[0], k.get("prologue"), (a[2] if len(a) > 2 else k.get("norm_weight")) is not None))
        return real(*a, **k)

    monkeypatch.setattr(tf, "gemv_rows", spy)
    return calls


@pytest.mark.parametrize("rows,pro", [(True, True), (True, False), (False, False)])
def test_fused_prologue_linears_dispatch(rows, pro, monkeypatch):
    """fused.gated_norm_linear / silu_mul_linear / linear equal the unfused chain with the row GEMV
    on (one-row inputs take it; ``pro``: with the prologues fused, else after their own kernels) and
    off (the unfused kernels + cuBLAS), with the residual updated in place. Under the interpreter
    ``fused._on_gpu`` is pointed at the CPU tensors so the row-GEMV dispatch runs too."""
    calls = _spy_row_gemv(monkeypatch, rows, pro)
    g = torch.Generator().manual_seed(3)
    HV, V, N = 4, 64, 48
    K = HV * V
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    tol = 1e-2 if dt == torch.bfloat16 else 1e-5
    o = torch.randn(1, HV, V, generator=g).to(DEV)
    gate = torch.randn(1, K, generator=g).to(DEV, dt)
    nw = (torch.rand(V, generator=g) + 0.5).to(DEV)
    w = (torch.randn(N, K, generator=g) * 0.05).to(DEV, dt)
    h = torch.randn(1, N, generator=g).to(DEV, dt)
    ref = F_ref.linear_ref(F_ref.gated_rms_norm_ref(o, gate, nw, 1e-6, "sigmoid", dt), w, residual=h)
    h2 = h.clone()
    got = F_ref.gated_norm_linear(o, gate, nw, 1e-6, "sigmoid", w, residual=h2, residual_inplace=True)
    assert got.data_ptr() == h2.data_ptr() and rel(h2, ref) < tol
    w2 = (torch.randn(N, K, generator=g) * 0.05).to(DEV, dt)
    x = torch.randn(1, 2 * K, generator=g).to(DEV, dt)
    ref = F_ref.linear_ref(F_ref.silu_mul_ref(x), w2, residual=h)
    h3 = h.clone()
    F_ref.silu_mul_linear(x, w2, residual=h3, residual_inplace=True)
    assert rel(h3, ref) < tol
    nw2 = (torch.rand(K, generator=g) + 0.5).to(DEV)
    xr = torch.randn(1, K, generator=g).to(DEV, dt)
    assert rel(F_ref.linear(xr, w, nw2, 1e-6), F_ref.linear_ref(xr, w, nw2, 1e-6)) < tol
    want = [("gated_rms_norm", True), ("silu_mul", False), (None, True)] if pro else [(None, False)] * 3
    assert [(p, nw) for _, p, nw in calls] == (want if rows else [])


def test_row_gemv_dispatch_falls_back(monkeypatch):
    """Inputs the row GEMV does not take give the reference's values through the fallbacks: for the
    gated norm (a non-dense ``o``, a head dim that is not a power of two, a 3-D gate) its own kernel
    and then the bare row GEMV; for the GEMM (a non-contiguous weight, a 1-D residual (a bias), a
    strided norm weight, a 3-D ``x``) cuBLAS. 0 rows give an empty result. fp32 under
    the interpreter (``_on_gpu`` pointed at the CPU), bf16 on CUDA; rel < 1e-5 / 1e-2."""
    calls = _spy_row_gemv(monkeypatch, True, True)
    g = torch.Generator().manual_seed(4)
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    tol = 1e-2 if dt == torch.bfloat16 else 1e-5
    N = 24

    def check(got, ref):
        assert got.shape == ref.shape and (ref.numel() == 0 or rel(got, ref) < tol)

    for HV, V, M, layout in [(4, 16, 0, "dense"), (4, 16, 1, "transposed"), (3, 24, 1, "dense"), (4, 16, 1, "gate3d")]:
        o = torch.randn(M, V, HV, generator=g).to(DEV).transpose(1, 2) if layout == "transposed" else \
            torch.randn(M, HV, V, generator=g).to(DEV)
        gate = torch.randn(M, HV * V, generator=g).to(DEV, dt)
        nw = (torch.rand(V, generator=g) + 0.5).to(DEV)
        w = (torch.randn(N, HV * V, generator=g) * 0.05).to(DEV, dt)
        ref = F_ref.linear_ref(F_ref.gated_rms_norm_ref(o, gate, nw, 1e-6, "silu", dt), w)
        gt = gate.view(M, HV, V) if layout == "gate3d" else gate
        if layout in ("gate3d", "transposed") and HAVE_CUDA:  # the unfused Triton gated norm takes a dense o
            continue                                                # and a 2-D gate only
        check(F_ref.gated_norm_linear(o, gt, nw, 1e-6, "silu", w), ref)
    # the gated fallbacks run the gated-norm kernel, then the bare row GEMV (0 rows: the fused form, empty)
    assert calls and all(p is None for m, p, _ in calls if m)
    calls.clear()
    K = 32
    x = torch.randn(1, K, generator=g).to(DEV, dt)
    wt = (torch.randn(K, N, generator=g) * 0.05).to(DEV, dt).t()  # non-contiguous [N, K]
    check(F_ref.linear(x, wt), F_ref.linear_ref(x, wt))
    w = (torch.randn(N, K, generator=g) * 0.05).to(DEV, dt)
    bias = torch.randn(N, generator=g).to(DEV, dt)
    check(F_ref.linear(x, w, residual=bias), F_ref.linear_ref(x, w) + bias)
    nws = (torch.rand(2 * K, generator=g) + 0.5).to(DEV)[::2]
    check(F_ref.linear(x, w, nws, 1e-6), F_ref.linear_ref(x, w, nws.contiguous(), 1e-6))
    check(F_ref.linear(x.view(1, 1, K), w), F_ref.linear_ref(x, w).view(1, 1, N))
    x2 = torch.randn(1, 2 * K, generator=g).to(DEV, dt)
    check(F_ref.silu_mul_linear(x2, wt), F_ref.linear_ref(F_ref.silu_mul_ref(x2), wt))
    assert calls == []  # none of these took the row GEMV
    check(F_ref.linear(x, w), F_ref.linear_ref(x, w))  # and the plain case does (the seam works)
    assert calls == [(1, None, False)]



def test_small_weights_take_the_row_gemv_for_a_few_rows(monkeypatch):
    """fused.linear sends GEMMs of up to GEMV_ROWS_SMALL_MAX_M rows to the row GEMV when the weight
    has at most GEMV_ROWS_SMALL_BYTES (the trained pair's verify windows at batch 1), and larger
    weights or more rows to cuBLAS; the values equal linear_ref (rel < 1e-2 bf16 on CUDA, 1e-5
    fp32 under the interpreter) either way."""
    calls = _spy_row_gemv(monkeypatch, True, True, small_max_m=8)
    g = torch.Generator().manual_seed(8)
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    tol = 1e-2 if dt == torch.bfloat16 else 1e-5
    K, N = 96, 40
    w = (torch.randn(N, K, generator=g) * 0.1).to(DEV, dt)
    nw = (torch.rand(K, generator=g) + 0.5).to(DEV)
    monkeypatch.setattr(F_ref, "GEMV_ROWS_SMALL_BYTES", w.numel() * w.element_size())
    for M in (1, 7, 8, 9):
        x = torch.randn(M, K, generator=g).to(DEV, dt)
        assert rel(F_ref.linear(x, w, nw, 1e-6), F_ref.linear_ref(x, w, nw, 1e-6)) < tol
    assert [m for m, _, _ in calls] == [1, 7, 8]
    calls.clear()
    w2 = (torch.randn(N + 1, K, generator=g) * 0.1).to(DEV, dt)  # one row over the byte bound
    x = torch.randn(7, K, generator=g).to(DEV, dt)
    assert rel(F_ref.linear(x, w2), F_ref.linear_ref(x, w2)) < tol
    assert rel(F_ref.linear(x[:1], w2), F_ref.linear_ref(x[:1], w2)) < tol
    assert [m for m, _, _ in calls] == [1]


@pytest.mark.parametrize("M", [1, 3, 17])
@pytest.mark.parametrize("pro", [None, "rms_norm", "silu_mul", "gated_rms_norm", "gating"])
@pytest.mark.parametrize("config", [None, (8, 128, 4)])
def test_gemv_rows_fp8_weights(M, pro, config):
    """Float8 weights with per-row scales (``w_scale``, W8A16) equal ``Fp8Weight.ref_linear`` after
    each prologue's reference, with a residual (in place), for 1, 3 and 17 rows (two launches), odd
    N / K (masked tails); the gating epilogue reads the scaled, rounded outputs. The activations
    round to x's dtype (bf16 on CUDA, rel < 1e-2; fp32 under the interpreter, rel < 1e-5). The
    quantization's own error (``quantize_fp8``) is in the CPU tests. Weights down to e4m3's subnormals."""
    if M == 17 and (config is not None or pro not in (None, "gated_rms_norm")):
        pytest.skip("compile / interpreter time: two launches at the default config, two prologues")
    g = torch.Generator().manual_seed(M + len(pro or "") + (config or (0,))[0])
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    tol = 1e-2 if dt == torch.bfloat16 else 1e-5
    HV, V, N = 5, 32, 77
    K = HV * V
    wr = torch.randn(N, K, generator=g) * 0.05
    wr[:, :8] *= 1e-4  # e4m3 subnormals (under 2^-6 of the row's largest / 448)
    w8 = F_ref.quantize_fp8(wr.to(DEV), dt)
    bits = w8.weight.view(torch.uint8)
    assert bool((((bits & 0x78) == 0) & ((bits & 0x07) != 0)).any())  # some e4m3 subnormals
    r = torch.randn(M, N, generator=g).to(DEV, dt)
    kw = dict(config=config, w_scale=w8.scale)
    if pro == "silu_mul":
        x = torch.randn(M, 2 * K, generator=g).to(DEV, dt)
        ref = w8.ref_linear(F_ref.silu_mul_ref(x), r)
        got = tf.gemv_rows(x, w8.weight, residual=r, prologue="silu_mul", **kw)
    elif pro == "gated_rms_norm":
        o = torch.randn(M, HV, V, generator=g).to(DEV)
        gate = torch.randn(M, K, generator=g).to(DEV, dt)
        nw = (torch.rand(V, generator=g) + 0.5).to(DEV)
        got = tf.gemv_rows(o.reshape(M, K).to(dt), w8.weight, nw, 1e-6, r, prologue="gated_rms_norm", gate=gate,
                           head_dim=V, **kw)
        ref = w8.ref_linear(F_ref.gated_rms_norm_ref(o.to(dt), gate, nw, 1e-6, "silu", dt), r)
    else:
        x = torch.randn(M, K + 3, generator=g).to(DEV, dt)[:, 3:]
        nw = (torch.rand(K, generator=g) + 0.5).to(DEV) if pro in ("rms_norm", "gating") else None
        xa = F_ref.rms_norm_ref(x, nw, 1e-6, dt) if nw is not None else x
        if pro == "gating":
            HVg, a0 = 6, 31
            A_log, dt_bias = torch.rand(HVg, generator=g).to(DEV), torch.randn(HVg, generator=g).to(DEV)
            gb = torch.full((M, 2 * HVg), float("nan"), device=DEV)
            got = tf.gemv_rows(x, w8.weight, nw, 1e-6, gating=(gb, a0, A_log, dt_bias, False), **kw)
            g_ref, b_ref = F_ref.gdn_gating_masked_ref(got[:, a0 : a0 + HVg], got[:, a0 + HVg : a0 + 2 * HVg],
                                                       A_log, dt_bias, False)
            assert rel(gb[:, :HVg], g_ref) < 1e-5 and rel(gb[:, HVg:], b_ref) < 1e-5
            ref = w8.ref_linear(xa)
        else:
            r2 = r.clone()
            got = tf.gemv_rows(x, w8.weight, nw, 1e-6, r2, out=r2, **kw)
            assert got.data_ptr() == r2.data_ptr()
            ref = w8.ref_linear(xa, r)
    assert got.dtype == dt and got.shape == (M, N)
    assert rel(got, ref) < tol


def test_gemv_rows_fp8_rejects_bad_scales():
    """A float8 weight without its scales, scales of the wrong shape / dtype, or scales on a
    non-float8 weight are refused with the argument named."""
    w8 = F_ref.quantize_fp8(torch.randn(8, 16).to(DEV))
    x = torch.randn(1, 16, device=DEV)
    with pytest.raises(ValueError, match="float8 w needs w_scale"):
        tf.gemv_rows(x, w8.weight)
    with pytest.raises(ValueError, match=r"w_scale must be contiguous float32 \[N\] = \[8\]"):
        tf.gemv_rows(x, w8.weight, w_scale=w8.scale[:4])
    with pytest.raises(ValueError, match=r"w_scale must be contiguous float32"):
        tf.gemv_rows(x, w8.weight, w_scale=w8.scale.double())
    with pytest.raises(ValueError, match="w_scale needs a float8 w"):
        tf.gemv_rows(x, torch.randn(8, 16, device=DEV), w_scale=w8.scale)


def _maybe_fp8(w, fp8, dt):
    """``(weight for gemv_rows, w_scale, reference linear)``: bf16 / fp32 ``w``, or its per-row float8 copy."""
    if fp8:
        w8 = F_ref.quantize_fp8(w.to(DEV), dt)
        return w8.weight, w8.scale, w8.ref_linear
    wd = w.to(DEV, dt)
    return wd, None, lambda x: F_ref.linear_ref(x, wd)


@pytest.mark.parametrize("rows", [[3], [5, 0, 5]])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("config", [None, (8, 64, 4)])
def test_gemv_rows_row_gather_and_normed_out(rows, fp8, config):
    """``x_rows`` (token row m reads x[x_rows[m]], repeats allowed) with the RMSNorm prologue, and
    ``x_out`` receiving the normed rows as the product uses them: the logits equal the reference on
    ``rms_norm_ref(x[rows])`` and ``x_out`` equals ``rms_norm_ref(x[rows])`` (the drafter's final norm
    + LM head in one launch, ``fused.norm_rows_linear``). Odd K / N (masked tails), bf16 on CUDA
    (``x_out`` within one bf16 ulp: the kernel's sum of squares runs in another order), fp32 under
    the interpreter (rel < 1e-5)."""
    if fp8 and not HAVE_CUDA and not INTERPRET:
        pytest.skip("float8 GEMV runs on CUDA or the interpreter")
    g = torch.Generator().manual_seed(len(rows) + 2 * fp8)
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    R, K, N = 7, 150, 37
    x = (torch.randn(R, K, generator=g) * 3).to(DEV, dt)
    nw = (torch.rand(K, generator=g) + 0.5).to(DEV)
    ww, ws, ref_lin = _maybe_fp8(torch.randn(N, K, generator=g) * 0.05, fp8, dt)
    idx = torch.tensor(rows, dtype=torch.long, device=DEV)
    xo = torch.full((len(rows), K), float("nan"), device=DEV, dtype=dt)
    got = tf.gemv_rows(x, ww, nw, 1e-6, x_rows=idx, x_out=xo, config=config, w_scale=ws)
    xn = F_ref.rms_norm_ref(x[idx], nw, 1e-6, dt)
    _close(xo, xn, dt)
    assert got.shape == (len(rows), N) and got.dtype == dt
    assert rel(got, ref_lin(xn)) < (1e-2 if dt == torch.bfloat16 else 1e-5)
    # fused.norm_rows_linear: the same through the dispatcher (the row GEMV where fused._rows_impl gives
    # it the GEMM, storing into normed_out: on CUDA one row, float8, or a few rows of a small weight as
    # here; the unfused path, returning its own normed rows, otherwise)
    wl = F_ref.Fp8Weight(ww, ws, dt) if fp8 else ww
    xo2 = torch.empty_like(xo)
    got2, f2 = F_ref.norm_rows_linear(x, nw, 1e-6, wl, idx, xo2)
    _close(f2, xn, dt)
    assert rel(got2, ref_lin(xn)) < (1e-2 if dt == torch.bfloat16 else 1e-5)
    takes = F_ref._rows_impl(x[: len(rows)], wl, None, True, nw) is not None
    assert takes == HAVE_CUDA and (f2.data_ptr() == xo2.data_ptr()) == takes


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("config", [None, (4, 32, 4)])
def test_gemv_rows_embedding_prologue(M, fp8, config):
    """``embed=(table, tokens)``: the row is ``[table[tokens[m]] | x[m]]`` (``fused.embed_ref``), the
    EAGLE drafter's ``fc`` input gathered by the GEMV itself; equals the reference GEMM on
    ``embed_ref``'s output, for an embedding width that is not a multiple of the chunk (the two
    halves meet inside one), a table whose row stride is not its width (a column slice), odd N."""
    g = torch.Generator().manual_seed(M + 2 * fp8)
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    V, ED, DF, N = 50, 48, 40, 33
    table = torch.randn(V, ED + 16, generator=g).to(DEV, dt)[:, 5 : 5 + ED]  # row stride 64, not ED
    feats = torch.randn(M, DF, generator=g).to(DEV, dt)
    tok = torch.randint(0, V, (M,), generator=g).to(DEV)
    ww, ws, ref_lin = _maybe_fp8(torch.randn(N, ED + DF, generator=g) * 0.05, fp8, dt)
    got = tf.gemv_rows(feats, ww, embed=(table, tok), config=config, w_scale=ws)
    ref = ref_lin(F_ref.embed_ref(table, tok, feats))
    assert got.shape == (M, N) and got.dtype == dt
    assert rel(got, ref) < (1e-2 if dt == torch.bfloat16 else 1e-5)
    if M == 1 or fp8:  # fused.embed_linear takes the row GEMV here
        wl = F_ref.Fp8Weight(ww, ws, dt) if fp8 else ww
        assert rel(F_ref.embed_linear(table, tok, feats, wl), ref) < (1e-2 if dt == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("rows", [[4], [6, 1, 6]])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("one", [False, True])
def test_gemv_rows_gathers_gate_and_residual_rows(rows, fp8, gated, one, monkeypatch):
    """``x_rows`` with the gated-RMSNorm prologue and a residual: token row m reads row ``x_rows[m]``
    of ``o``, of ``gate`` and of the residual, and the output is dense ``[M, N]`` (the drafter's absorb
    pass keeping each request's accepted row past its recurrence, ``fused.gated_norm_linear(rows=)``):
    equals the reference on the gathered rows, through the kernel and through the dispatcher; ``out``
    overlapping the residual is refused. bf16 on CUDA (rel < 1e-2), fp32 under the interpreter (rel < 1e-5)."""
    if fp8 and not HAVE_CUDA and not INTERPRET:
        pytest.skip("float8 GEMV runs on CUDA or the interpreter")
    g = torch.Generator().manual_seed(len(rows) + 2 * fp8 + 4 * gated)
    dt = torch.bfloat16 if HAVE_CUDA else torch.float32
    R, HV, V, N = 7, 4, 32, 45
    K = HV * V
    o = torch.randn(R, HV, V, generator=g).to(DEV)  # fp32, as chain_verify writes it
    gate = torch.randn(R, K + 8, generator=g).to(DEV, dt)[:, 8:] if gated else None  # row stride K + 8
    nw = (torch.rand(V, generator=g) + 0.5).to(DEV)
    res = torch.randn(R, N, generator=g).to(DEV, dt)
    ww, ws, ref_lin = _maybe_fp8(torch.randn(N, K, generator=g) * 0.05, fp8, dt)
    idx = torch.tensor(rows, dtype=torch.long, device=DEV)
    y = F_ref.gated_rms_norm_ref(o[idx], None if gate is None else gate[idx], nw, 1e-6, "silu", dt)
    ref = ref_lin(y).float() + res[idx].float()
    tol = 1e-2 if dt == torch.bfloat16 else 1e-5
    res0 = res.clone()
    got = tf.gemv_rows(o.reshape(R, K), ww, nw, 1e-6, res, prologue="gated_rms_norm", gate=gate, head_dim=V,
                       w_scale=ws, x_rows=idx, out_dtype=dt if fp8 else None)
    assert got.shape == (len(rows), N) and got.dtype == dt and rel(got, ref) < tol and torch.equal(res, res0)
    # through the dispatcher: model-dtype weights in one row-GEMV launch with the gather (float8 weights on float32 o
    # gather first, then the norm and the GEMV, unless fused.FP8_GATHER_ONE_LAUNCH; under the interpreter the seam
    # fused._on_gpu points the dispatch at the CPU)
    monkeypatch.setattr(F_ref, "FP8_GATHER_ONE_LAUNCH", one)
    wl = F_ref.Fp8Weight(ww, ws, dt) if fp8 else ww
    calls, real = [], tf.gemv_rows
    monkeypatch.setattr(tf, "gemv_rows", lambda *a, **k: calls.append(k) or real(*a, **k))
    if INTERPRET:
        monkeypatch.setattr(F_ref, "_on_gpu", lambda t: True)
    got2 = F_ref.gated_norm_linear(o, gate, nw, 1e-6, "silu", wl, residual=res, rows=idx)
    assert got2.shape == (len(rows), N) and got2.dtype == dt and rel(got2, ref) < tol and torch.equal(res, res0)
    assert [c.get("x_rows") is not None for c in calls] == ([False] if fp8 and o.dtype != dt and not one else [True])
    with pytest.raises(ValueError, match="overlap"):
        tf.gemv_rows(o.reshape(R, K), ww, nw, 1e-6, res, out=res[: len(rows)], prologue="gated_rms_norm", gate=gate,
                     head_dim=V, w_scale=ws, x_rows=idx)


def test_gemv_rows_rejects_bad_gather_args():
    """Bad ``x_rows`` / ``x_out`` / ``embed`` are refused with the argument named."""
    x = torch.randn(3, 16).to(DEV)
    w = torch.randn(8, 16).to(DEV)
    with pytest.raises(ValueError, match="x_rows"):
        tf.gemv_rows(x, w, x_rows=torch.tensor([0, 1], dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="x_out"):
        tf.gemv_rows(x, w, x_out=torch.empty(3, 15, device=DEV))
    with pytest.raises(ValueError, match="out_dtype"):
        tf.gemv_rows(x, w, out_dtype=torch.float16 if x.dtype != torch.float16 else torch.float32)
    with pytest.raises(ValueError, match="embed"):
        tf.gemv_rows(x[:, :8], w, embed=(torch.randn(5, 8).to(DEV), torch.zeros(3, dtype=torch.int32, device=DEV)))
    with pytest.raises(ValueError, match="embed"):
        tf.gemv_rows(x[:, :8], w, torch.ones(16, device=DEV), embed=(torch.randn(5, 8).to(DEV),
                                                                      torch.zeros(3, dtype=torch.long, device=DEV)))
    with pytest.raises(ValueError, match="overlap"):
        tf.gemv_rows(x, w, torch.ones(16, device=DEV), x_out=x)
    with pytest.raises(ValueError, match="pair"):
        tf.gemv_rows(x[:, :8], w, embed=(torch.randn(5, 8).to(DEV),))
    with pytest.raises(ValueError, match="exclusive"):
        tf.gemv_rows(x[:, :8], w, x_rows=torch.zeros(3, dtype=torch.long, device=DEV),
                     embed=(torch.randn(5, 8).to(DEV), torch.zeros(3, dtype=torch.long, device=DEV)))


def test_runtime_drafter_passes_fuse_the_gather_and_the_final_norm(monkeypatch):
    """The chain runtime's drafter at batch 1 (the embedded trained pair, fp32): the ``fc`` GEMV
    gathers the embedding itself (``embed=``), each LM-head pass applies the drafter's final norm as
    its prologue and stores the normed features for the next pass (``x_out``), the absorb pass's
    ``o_proj`` gathers each request's accepted row (``x_rows``); the output stays lossless (AR's tokens). Under the
    interpreter (too slow for the trained pair's 8000-token head) a random pair of
    ``tests/helpers.py``'s tiny shape, and the dispatch seam ``fused._on_gpu`` points the row GEMV at
    the CPU."""
    from tests.helpers import TINY, runtime_ar_outputs
    from vllm_specla.models.config import GatedDeltaNetConfig
    from vllm_specla.models.drafter import EagleDrafter, drafter_config_from_target, load_eagle_drafter
    from vllm_specla.models.gdn import GatedDeltaNetForCausalLM, load_fla_checkpoint
    from vllm_specla.runtime.decode import DecodeRuntime
    from vllm_specla.runtime.fused_model import FusedEagle, FusedTarget

    if HAVE_CUDA:
        tm = load_fla_checkpoint("models/specla-gdn-tiny/target")
        dm = load_eagle_drafter("models/specla-gdn-tiny/drafter")
    else:
        cfg = GatedDeltaNetConfig(**TINY)
        tm = GatedDeltaNetForCausalLM(cfg).init_weights(seed=7, std=0.1)
        dm = EagleDrafter(drafter_config_from_target(cfg)).init_weights(seed=11, std=0.1)
    tgt = FusedTarget(tm, torch.float32, DEV)
    dr = FusedEagle(dm, tgt, torch.float32, DEV)
    prompts = torch.randint(3, tgt.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3)).to(DEV)
    ref = runtime_ar_outputs(tgt, prompts, 24, 64)
    if INTERPRET:
        monkeypatch.setattr(F_ref, "_on_gpu", lambda t: True)
    forms = set()
    orig = tf.gemv_rows

    def spy(*a, **k):
        forms.add(tuple(n for n in ("embed", "x_rows", "x_out") if k.get(n) is not None))
        return orig(*a, **k)

    monkeypatch.setattr(tf, "gemv_rows", spy)
    rt = DecodeRuntime(tgt, 1, "specla", 4, dr, output_capacity=64)
    rt.prefill(prompts)
    rt.run(4)
    out = rt.outputs()[0]
    # (the first draft of a step reads the absorb pass's accepted rows, which its o_proj gathered: x_rows)
    assert {("embed",), ("x_out",), ("x_rows",)} <= forms
    assert len(out) >= 5 and out == ref[0][: len(out)]  # (1 + one token or more per step)
