"""The one-token step's conv + recurrence in one launch (``triton_chain.conv_chain_step``) against the
reference composition (``reference.conv_chain_step_ref``: ``conv_verify_ref`` then ``chain_verify_ref``).

Runs on CUDA; skipped without it, except under ``TRITON_INTERPRET=1`` where the small shapes run on the
CPU through Triton's interpreter (how the kernel was written without a GPU). Inputs random (never
zeros); the untouched slots are random too, so a write to a wrong slot shows. Outputs and states
compare norm-wise, ``TOL = 1e-4`` (fp32 FMA arithmetic in both, reduction order differs over K);
float32 conv windows exactly (they are copies of inputs), bf16 windows exactly on the GPU and to one
bf16 ulp under the interpreter (which truncates fp32 -> bf16 where the GPU rounds to nearest even).
The CPU dispatcher (the two-launch form every backend runs) is in ``tests/test_ops_reference.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAVE_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")
DEV = "cuda" if HAVE_CUDA else "cpu"
TOL = 1e-4
WIN_TOL_BF16 = 1e-2 if INTERPRET else 0.0

from vllm_specla.ops import reference as ref  # noqa: E402

if HAVE_CUDA or INTERPRET:
    from vllm_specla.ops import chain_verify as cv  # noqa: E402
    from vllm_specla.ops import triton_chain as tc  # noqa: E402

SMALL = [(2, 4, 32, 48), (1, 3, 16, 20)]  # (H, HV, K, V): GVA, V not a power of two
BIG = [(6, 6, 256, 512), (8, 8, 256, 256)]  # flame 1B, m-a-p 1.3B
SHAPES = SMALL if not HAVE_CUDA else SMALL + BIG
CONFIGS = [None, (8, 2, 16), (16, 4, 8), (2, 1, 4)]  # (BV, num_warps, KI); None: STEP_CONFIG


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all(), "non-finite output"
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


class StepCase:
    """``R`` one-token rows on random distinct slots of ``S``; x / conv window in ``xdt`` / ``wdt``."""

    def __init__(self, shape, R, seed, xdt=torch.float32, wdt=torch.float32, S=None):
        H, HV, K, V = shape
        gen = torch.Generator().manual_seed(seed)
        rn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
        S = S or 2 * R + 2
        C = 2 * H * K + HV * V
        d = lambda t, dt=torch.float32: t.to(device=DEV, dtype=dt)  # noqa: E731
        # x as a column slice of a wider projection output (row stride > C), as the runtime passes it
        self.x = d(rn(R, C + 24), xdt)[:, :C]
        self.conv_w = d(rn(C, 4) * 0.5)
        self.conv_state = d(rn(S, 3, C), wdt)
        self.g = d(-(torch.rand(R, HV, generator=gen) * 0.5 + 0.01))
        self.beta = d(torch.rand(R, HV, generator=gen) * 0.9 + 0.05)
        self.state = d(rn(S, HV, V, K) * 0.1)
        perm = torch.randperm(S, generator=gen)
        self.slots = d(perm[:R], torch.long)
        self.out_slots = d(perm[R : 2 * R], torch.long)  # distinct, read by no row
        self.scale = K ** -0.5
        self.R, self.C, self.H = R, C, H

    def run(self, fn, write, out):
        st, cs = self.state.clone(), self.conv_state.clone()
        kw = dict(out_slots=self.out_slots) if out else {}
        o = fn(self.x, self.conv_w, cs, self.g, self.beta, scale=self.scale, state=st, slots=self.slots,
               write=write, **kw)
        return o, st, cs


def _check(a, b, wdt):
    (o1, s1, c1), (o2, s2, c2) = a, b
    assert rel(o2, o1) < TOL
    for i in range(o1.shape[0]):  # every row, not only the batch norm
        assert rel(o2[i], o1[i]) < 10 * TOL
    assert rel(s2, s1) < TOL
    if wdt == torch.float32:
        assert torch.equal(c2, c1)
    else:
        assert rel(c2, c1) < WIN_TOL_BF16 or torch.equal(c2, c1)


@pytest.fixture
def config(request, monkeypatch):
    monkeypatch.setattr(tc, "STEP_CONFIG_OVERRIDE", request.param, raising=False)
    return request.param


@pytest.mark.parametrize("config", CONFIGS, indirect=True)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["write", "out_slots", "read"])
def test_conv_chain_step_vs_ref(shape, mode, config):
    """Outputs, every state slot and every conv window against the reference: in place (AR decode), onto
    out slots (the first draft step; the read slots stay as they were), read only (the last draft step:
    nothing written). The q / k window counters are left zero."""
    c = StepCase(shape, R=3 if shape in SMALL else 2, seed=hash((shape, mode, config)) % 10**6)
    write, out = mode != "read", mode == "out_slots"
    a = c.run(ref.conv_chain_step_ref, write, out)
    b = c.run(tc.conv_chain_step, write, out)
    _check(a, b, torch.float32)
    if not write:
        assert torch.equal(b[1], c.state) and torch.equal(b[2], c.conv_state)
    if out:  # the read slots keep their state and window
        assert torch.equal(b[1][c.slots], c.state[c.slots]) and torch.equal(b[2][c.slots], c.conv_state[c.slots])
    assert int(tc.step_counters(c.x.device, c.R * c.H).abs().sum()) == 0


@pytest.mark.parametrize("xdt,wdt", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                     (torch.float32, torch.bfloat16)])
def test_conv_chain_step_dtypes(xdt, wdt):
    """bf16 projection outputs (the runtime's) and bf16 conv windows: the window rows are the inputs
    stored in the window's dtype, as the reference does."""
    c = StepCase(SMALL[0], R=2, seed=5, xdt=xdt, wdt=wdt)
    _check(c.run(ref.conv_chain_step_ref, True, False), c.run(tc.conv_chain_step, True, False), wdt)


def test_conv_chain_step_repeated_steps():
    """Three AR steps in a row on the same slots (each step's window and state feed the next; the counters
    must be back at zero after every launch, or a later step's q / k window would never be written)."""
    c = StepCase(SMALL[0], R=2, seed=11)
    st1, cs1, st2, cs2 = c.state.clone(), c.conv_state.clone(), c.state.clone(), c.conv_state.clone()
    gen = torch.Generator().manual_seed(12)
    for _ in range(3):
        x = torch.randn(c.x.shape, generator=gen).to(DEV)
        kw = dict(scale=c.scale, slots=c.slots, write=True)
        o1 = ref.conv_chain_step_ref(x, c.conv_w, cs1, c.g, c.beta, state=st1, **kw)
        o2 = tc.conv_chain_step(x, c.conv_w, cs2, c.g, c.beta, state=st2, **kw)
        assert rel(o2, o1) < TOL and rel(st2, st1) < TOL and torch.equal(cs2, cs1)


def test_conv_chain_step_errors():
    c = StepCase(SMALL[0], R=2, seed=3)
    with pytest.raises(ValueError, match="channels"):
        tc.conv_chain_step(c.x[:, :-1], c.conv_w, c.conv_state, c.g, c.beta, scale=c.scale, state=c.state,
                           slots=c.slots)
    with pytest.raises(ValueError, match="out_slots needs write"):
        tc.conv_chain_step(c.x, c.conv_w, c.conv_state, c.g, c.beta, scale=c.scale, state=c.state, slots=c.slots,
                           write=False, out_slots=c.out_slots)
    with pytest.raises(ValueError, match="4-tap"):
        tc.conv_chain_step(c.x, c.conv_w[:, :3], c.conv_state, c.g, c.beta, scale=c.scale, state=c.state,
                           slots=c.slots)
    with pytest.raises(ValueError, match="out_slots \\(1\\) must cover the 2 rows"):
        tc.conv_chain_step(c.x, c.conv_w, c.conv_state, c.g, c.beta, scale=c.scale, state=c.state, slots=c.slots,
                           out_slots=c.out_slots[:1])
    with pytest.raises(ValueError, match="counters"):
        tc.conv_chain_step(c.x, c.conv_w, c.conv_state, c.g, c.beta, scale=c.scale, state=c.state, slots=c.slots,
                           counters=torch.zeros(1, dtype=torch.int32, device=DEV))


@pytest.mark.skipif(not HAVE_CUDA, reason="the dispatcher takes the one-launch form on CUDA tensors only")
@pytest.mark.parametrize("on", [False, True])
def test_dispatcher_conv_step(on, monkeypatch):
    """``chain_verify.conv_chain_step`` with CONV_STEP off (conv_verify + chain_verify) and on (one launch):
    both equal the reference, also inside a CUDA graph (the counters allocated before capture)."""
    monkeypatch.setattr(cv, "CONV_STEP", on)
    c = StepCase(BIG[0], R=1, seed=21, xdt=torch.bfloat16, wdt=torch.bfloat16)
    cu = torch.arange(2, device=DEV)
    a = c.run(ref.conv_chain_step_ref, True, False)
    st, cs = c.state.clone(), c.conv_state.clone()

    def step():
        return cv.conv_chain_step(c.x, c.conv_w, cs, c.g, c.beta, scale=c.scale, state=st, slots=c.slots,
                                  cu_seqlens=cu, write=True)

    tc.step_counters(c.x.device, 64)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compile and load the kernels outside the capture (a module load is not allowed while capturing)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            o = step()
    torch.cuda.current_stream().wait_stream(s)
    st.copy_(c.state)
    cs.copy_(c.conv_state)
    graph.replay()
    torch.cuda.synchronize()
    _check(a, (o, st, cs), torch.bfloat16)


@pytest.mark.skipif(HAVE_CUDA, reason="CUDA runs the real dispatcher: tests/test_decode_runtime_gpu.py test_conv_step_*")
def test_runtime_tokens_with_conv_step_interpreted(monkeypatch):
    """The decode runtime (tiny random-weight shape, fp32, batch 2) with every one-token step's conv + recurrence on
    the one-launch kernel under Triton's interpreter (the dispatcher takes it on CUDA tensors only, so the runtime's
    call is pointed at it here): the AR tokens, the SpecLA tokens (K = 3) and every draft window equal the two-launch
    path's, and all three call kinds ran (AR, a draft step onto scratch slots, the read-only last draft step)."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from bench_e2e import build

    from vllm_specla.runtime import fused_model
    from vllm_specla.runtime.decode import DecodeRuntime

    cfg, tgt, dr = build("tiny", "cpu", torch.float32)
    two_launch = fused_model.conv_chain_step
    kinds = set()

    def one_launch(x, conv_w, conv_state, g, beta, *, scale, state, slots, cu_seqlens, write=True, out_slots=None):
        kinds.add((write, out_slots is not None))
        return tc.conv_chain_step(x, conv_w, conv_state, g, beta, scale=scale, state=state, slots=slots, write=write,
                                  out_slots=out_slots)

    prompts = torch.randint(3, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    res = {}
    for fn in (two_launch, one_launch):
        monkeypatch.setattr(fused_model, "conv_chain_step", fn)
        ar = DecodeRuntime(tgt, 2, "ar", output_capacity=64, use_cuda_graphs=False)
        ar.prefill(prompts)
        ar.run(12)
        sp = DecodeRuntime(tgt, 2, "specla", 3, dr, output_capacity=64, use_cuda_graphs=False)
        sp.prefill(prompts)
        windows = []
        for _ in range(5):
            sp.step()
            windows.append(sp.window.clone())
        res[fn] = (ar.outputs(), sp.outputs(), torch.stack(windows))
    (a1, s1, w1), (a2, s2, w2) = res[two_launch], res[one_launch]
    assert a1 == a2 and s1 == s2 and torch.equal(w1, w2)
    assert kinds == {(True, False), (True, True), (False, False)}, kinds
