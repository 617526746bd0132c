"""The prefill op (``ops/prefill.py``): fla's chunk kernel on CUDA vs the torch reference.

The dispatch tests run everywhere (CPU tensors must take the reference, bit for bit); the fla
comparisons need CUDA and fla and skip cleanly without them. Inputs are random (never zeros):
varlen rows of 1..200 tokens (across fla's 64-token chunks), random initial states, grouped value
heads, beta in (0, 1) and in (0, 2) (``allow_neg_eigval``). Shapes (H, HV, K, V): 6x6x256x512 ("flame 1B"), 8x8x256x256 ("m-a-p 1.3B") and small odd
GVA shapes (2, 4, 32, 48), (1, 3, 16, 20). Error: norm-wise relative ``||x - ref|| / ||ref||``
against the fp32 reference on the same device, ``TOL = 5e-3`` (fla's dots take tf32 on fp32
inputs, 10-bit mantissas: 1.5e-3 measured on an H100 at both GDN-1.3B head shapes over 512-2,048
tokens per row, benchmarks/prefill_h100_s41a.json; these tests passed there, session 41).
"""

from __future__ import annotations

import pytest
import torch

from vllm_specla.ops import prefill
from vllm_specla.ops.reference import chunk_gated_delta_rule_ref

HAVE_CUDA = torch.cuda.is_available()
TOL = 5e-3
SHAPES = [(2, 4, 32, 48), (1, 3, 16, 20), (6, 6, 256, 512), (8, 8, 256, 256)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all(), "non-finite output"
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def make(shape, lens, device, seed=0, init=True, neg_eig=False):
    H, HV, K, V = shape
    gen = torch.Generator().manual_seed(seed)
    N, R = sum(lens), len(lens)
    q = torch.randn(N, H, K, generator=gen)
    k = torch.randn(N, H, K, generator=gen)
    v = torch.randn(N, HV, V, generator=gen)
    g = -torch.rand(N, HV, generator=gen) * 0.3 - 0.01  # log decay in [-0.31, -0.01]
    beta = (torch.rand(N, HV, generator=gen) * 0.9 + 0.05) * (2 if neg_eig else 1)  # (0, 2): allow_neg_eigval
    cu = torch.tensor([0] + lens).cumsum(0)
    h0 = torch.randn(R, HV, V, K, generator=gen) * 0.1 if init else None
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    return [mv(t) for t in (q, k, v, g, beta)] + [K ** -0.5, mv(cu), mv(h0)]


def test_cpu_inputs_take_the_reference(monkeypatch):
    args = make((2, 4, 32, 48), [3, 70], "cpu")
    assert prefill.prefill_backend(args[0]) == "ref"
    o, f = prefill.chunk_prefill(*args)
    o_ref, f_ref = chunk_gated_delta_rule_ref(*args[:7], initial_state=args[7])
    assert torch.equal(o, o_ref) and torch.equal(f, f_ref)
    monkeypatch.setenv("VLLM_SPECLA_PREFILL", "fla")
    with pytest.raises(ValueError, match="VLLM_SPECLA_PREFILL=fla needs CUDA"):
        prefill.chunk_prefill(*args)
    monkeypatch.setenv("VLLM_SPECLA_PREFILL", "fast")
    with pytest.raises(ValueError, match="must be auto, fla or ref, got 'fast'"):
        prefill.prefill_backend(args[0])


gpu = pytest.mark.skipif(not HAVE_CUDA or prefill._fla_chunk() is None, reason="needs CUDA and fla")


@gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("lens", [[1], [64], [5, 200, 63, 1, 130]])
@pytest.mark.parametrize("init,neg_eig", [(True, False), (False, False), (True, True)])
def test_fla_prefill_matches_the_reference(shape, lens, init, neg_eig):
    args = make(shape, lens, "cuda", seed=len(lens) + shape[3], init=init, neg_eig=neg_eig)
    assert prefill.prefill_backend(args[0]) == "fla"
    o, f = prefill.chunk_prefill(*args)
    o_ref, f_ref = chunk_gated_delta_rule_ref(*args[:7], initial_state=args[7])
    assert o.dtype == f.dtype == torch.float32 and o.shape == o_ref.shape and f.shape == f_ref.shape
    assert rel(o, o_ref) < TOL and rel(f, f_ref) < TOL
    for r in range(len(lens)):  # per row too: a row reading its neighbour's state would show here
        s, e = int(args[6][r]), int(args[6][r + 1])
        assert rel(o[s:e], o_ref[s:e]) < TOL and rel(f[r], f_ref[r]) < TOL


@gpu
def test_forced_reference_on_cuda(monkeypatch):
    args = make((2, 4, 32, 48), [9, 80], "cuda")
    monkeypatch.setenv("VLLM_SPECLA_PREFILL", "ref")
    o, f = prefill.chunk_prefill(*args)
    o_ref, f_ref = chunk_gated_delta_rule_ref(*args[:7], initial_state=args[7])
    assert torch.equal(o, o_ref) and torch.equal(f, f_ref)


@gpu
def test_gdn_model_prefill_on_cuda(monkeypatch):
    """The embedded default target on CUDA, fp32: a varlen prefill (rows of 5 / 70 / 130 tokens, two
    of them continuing from a first prefill, so the recurrence and the conv start from carried states)
    through the model's forward with fla's chunk kernel and our Triton conv gives the logits and
    states of the same forward with the reference prefill and conv (rel < TOL)."""
    import os  # noqa: PLC0415

    from vllm_specla.core.state import allocate_layer_states, build_step_plan  # noqa: PLC0415
    from vllm_specla.models.gdn import load_fla_checkpoint  # noqa: PLC0415

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "specla-gdn-tiny", "target")
    if not os.path.isdir(path):
        pytest.skip("embedded default model not present")
    t = load_fla_checkpoint(path, device="cuda").eval()
    gen = torch.Generator().manual_seed(3)
    first = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (1, 9, 40)]
    second = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (5, 70, 130)]
    res, calls, convs = {}, [], []
    real, real_conv = prefill._fla_chunk(), prefill._triton_conv()
    monkeypatch.setattr(prefill, "_fla_chunk", lambda: lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(prefill, "_triton_conv", lambda: lambda *a, **kw: convs.append(1) or real_conv(*a, **kw))
    for mode in ("ref", "auto"):
        monkeypatch.setenv("VLLM_SPECLA_PREFILL", mode)
        states = allocate_layer_states(t.config, 4, 1, device="cuda")
        for i, st in enumerate(states):  # garbage in the fresh slots' conv windows: never read
            st.conv.copy_(torch.randn(st.conv.shape, generator=torch.Generator().manual_seed(i)))
        with torch.no_grad():
            t(torch.tensor(sum(first, []), device="cuda"),
              build_step_plan([1, 9, 40], [2, 0, 3], [True] * 3, [False] * 3, speculative=False, device="cuda"), states)
            h = t(torch.tensor(sum(second, []), device="cuda"),
                  build_step_plan([5, 70, 130], [2, 0, 1], [True] * 3, [True, True, False], speculative=False,
                                  device="cuda"), states)
            last = torch.tensor([5, 75, 205], device="cuda") - 1
            res[mode] = (t.compute_logits(h[last]), torch.stack([st.ssm[[2, 0, 1, 3]] for st in states]),
                         torch.stack([st.conv[[2, 0, 1]] for st in states]))
        assert len(calls) == (0 if mode == "ref" else 2 * t.config.num_hidden_layers)  # fla ran each prefill
        assert len(convs) == len(calls)  # and our Triton conv (the per-row reference conv under "ref")
        calls.clear()
        convs.clear()
    assert prefill.prefill_backend(torch.zeros(1, 1, t.config.head_k_dim, device="cuda")) == "fla"
    assert rel(res["auto"][0], res["ref"][0]) < TOL and rel(res["auto"][1], res["ref"][1]) < TOL
    assert rel(res["auto"][2], res["ref"][2]) < TOL  # the conv windows after the second prefill
    assert torch.equal(res["auto"][2][0], res["ref"][2][0])  # (layer 0's: copies of the same embeddings' projections)
