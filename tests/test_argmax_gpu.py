"""The greedy-token argmax (``triton_fused.argmax`` / ``fused.argmax``) against ``torch.argmax``.

Runs on CUDA; skipped without it, except under ``TRITON_INTERPRET=1`` (CPU interpreter). Exact:
equal to ``torch.argmax`` index for index (no tolerance).
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
    from vllm_specla.ops import fused
    from vllm_specla.ops import triton_fused as tf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("V", [32000, 1000, 7])
def test_argmax_equals_torch(dtype, V):
    """Index for index torch.argmax on random logits with planted ties (the first index wins),
    NaNs (the first NaN wins), an all -inf row (index 0), +inf ties and row-strided input; an
    all-NaN row too."""
    g = torch.Generator().manual_seed(V)
    x = torch.randn(6, V + 5, generator=g).to(dtype)[:, 5:]
    if V > 4:
        x[1, 3] = x[1, V - 1] = 40.0
        x[2, V - 2] = x[2, 1] = float("nan")
        x[3] = float("-inf")
        x[4, V // 2] = x[4, V // 3] = x[4].max()
        x[5, V - 3] = x[5, 2] = float("inf")
    x = x.to(DEV)
    got = tf.argmax(x)
    assert got.dtype == torch.int64 and torch.equal(got, x.argmax(-1))
    assert torch.equal(tf.argmax(x[:0]), x[:0].argmax(-1))
    nan = torch.full((2, V), float("nan"), dtype=dtype, device=DEV)
    assert torch.equal(tf.argmax(nan), nan.argmax(-1))


def test_argmax_rejects_what_it_does_not_take():
    with pytest.raises(ValueError, match="bf16 / fp16 / fp32"):
        tf.argmax(torch.randn(2, 8, dtype=torch.float64, device=DEV))
    with pytest.raises(ValueError, match="1 <= V"):
        tf.argmax(torch.empty(3, 0, device=DEV))
    with pytest.raises(ValueError, match="dense last dim"):
        tf.argmax(torch.randn(8, 2, device=DEV).t())


def test_argmax_dispatch(monkeypatch):
    """fused.argmax is torch.argmax's result with the Triton kernel on and off."""
    calls, inner = [], tf.argmax
    if not HAVE_CUDA:
        monkeypatch.setattr(fused, "_on_gpu", lambda t: True)
    monkeypatch.setattr(tf, "argmax", lambda x, **kw: (calls.append(x.shape), inner(x, **kw))[1])
    x = torch.randn(3, 500, generator=torch.Generator().manual_seed(1)).to(DEV)
    for on in (True, False):
        monkeypatch.setattr(fused, "USE_TRITON_ARGMAX", on)
        assert torch.equal(fused.argmax(x), x.argmax(-1))
    assert calls == [(3, 500)]
    # torch for what the kernel does not take: fp64 (exact compares need fp64), a vocabulary over
    # ARGMAX_MAX_V; V = 0 raises torch's error
    monkeypatch.setattr(fused, "USE_TRITON_ARGMAX", True)
    x64 = torch.tensor([[1.0, 1.0 + 1e-12]], dtype=torch.float64, device=DEV)
    assert fused.argmax(x64).tolist() == [1]
    monkeypatch.setattr(tf, "ARGMAX_MAX_V", 400)
    assert torch.equal(fused.argmax(x), x.argmax(-1))
    assert calls == [(3, 500)]
    with pytest.raises((RuntimeError, IndexError)):
        fused.argmax(torch.empty(2, 0, device=DEV))


@pytest.mark.parametrize("kernel", [True, False])
def test_argmax_out_and_ids(monkeypatch, kernel):
    """``out``: written in place through its stride (a column of a wider int64 tensor; the other
    columns untouched), and returned; ``ids``: the index mapped through it (``ids[argmax]``), in the
    Triton kernel and in the torch fallback (``fused.argmax`` with the kernel off)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 300, generator=g).to(torch.bfloat16).to(DEV)
    ids = (torch.randperm(1000, generator=g)[:300].sort().values * 3 + 1).to(DEV)
    monkeypatch.setattr(fused, "USE_TRITON_ARGMAX", kernel)
    if not HAVE_CUDA:
        monkeypatch.setattr(fused, "_on_gpu", lambda t: True)
    win = torch.full((4, 3), -5, dtype=torch.long, device=DEV)
    got = fused.argmax(x, out=win[:, 1], ids=ids)
    assert got.data_ptr() == win[:, 1].data_ptr()
    assert torch.equal(win[:, 1], ids[x.argmax(-1)])
    assert (win[:, 0] == -5).all() and (win[:, 2] == -5).all()
    assert torch.equal(fused.argmax(x, ids=ids), ids[x.argmax(-1)])
    assert torch.equal(fused.argmax(x, out=win[:, 2]), x.argmax(-1)) and torch.equal(win[:, 2], x.argmax(-1))
    with pytest.raises(ValueError, match="out must be"):  # the same contract on both paths
        fused.argmax(x, out=torch.zeros(4, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="ids must be"):
        fused.argmax(x, ids=ids.int())


def test_argmax_rejects_bad_out_and_ids():
    x = torch.randn(3, 50, device=DEV)
    with pytest.raises(ValueError, match="out must be"):
        tf.argmax(x, out=torch.zeros(4, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="out must be"):
        tf.argmax(x, out=torch.zeros(3, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="ids must be"):
        tf.argmax(x, ids=torch.arange(49, device=DEV))
    with pytest.raises(ValueError, match="ids must be"):
        tf.argmax(x, ids=torch.arange(100, device=DEV)[::2])
