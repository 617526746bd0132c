"""The embedding gather (``triton_fused.embed`` / ``fused.embed``): ``weight[tokens]`` followed by the
drafter's features, against the torch form ``fused.embed_ref`` (exact: a gather and one cast, no
arithmetic; no tolerance).

Runs on CUDA; skipped without it, except under ``TRITON_INTERPRET=1`` (CPU interpreter).
"""

from __future__ import annotations

import os

import pytest
import torch

from vllm_specla.ops import fused

HAVE_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if HAVE_CUDA else "cpu"
needs_triton = pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")


def _inputs(V=97, D=40, N=6, DF=24, dtype=torch.bfloat16, fdtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(V, D + 3, generator=g).to(dtype)[:, :D]  # a row-strided table
    tok = torch.randint(0, V, (N, 3), generator=g)[:, 1]  # a strided column, as the runtime's window
    if N:
        tok[0], tok[-1] = 0, V - 1
    feats = torch.randn(N, DF, generator=g).to(fdtype)
    return w.to(DEV), tok.to(DEV), feats.to(DEV)


def test_embed_ref_is_index_then_cat():
    w, tok, feats = _inputs()
    got = fused.embed_ref(w, tok[:, None], feats)
    assert got.dtype == w.dtype and got.shape == (6, 64)
    assert torch.equal(got[:, :40], w[tok]) and torch.equal(got[:, 40:], feats.to(w.dtype))
    assert torch.equal(fused.embed_ref(w, tok), w[tok])


@needs_triton
@pytest.mark.parametrize("D,DF,N", [(40, 24, 6), (2048, 2048, 3), (1500, 0, 7), (1, 1, 1), (64, 0, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embed_kernel_equals_ref(D, DF, N, dtype):
    """Equal to the torch form: widths over one or several 1024-column blocks, the embedding alone
    (DF = 0), one column, no rows, bf16 / fp32 tables, int32 tokens."""
    from vllm_specla.ops import triton_fused as tf

    w, tok, feats = _inputs(D=D, N=N, DF=max(DF, 1), dtype=dtype, fdtype=dtype, seed=D + N)
    f = feats if DF else None
    want = fused.embed_ref(w, tok, f)
    assert torch.equal(tf.embed(w, tok, f), want)
    assert torch.equal(tf.embed(w, tok.int(), f), want)


@needs_triton
def test_embed_dispatch(monkeypatch):
    """``fused.embed``: the kernel on the GPU with ``USE_TRITON_EMBED``, torch otherwise, same values."""
    from vllm_specla.ops import triton_fused as tf

    calls, inner = [], tf.embed
    monkeypatch.setattr(tf, "embed", lambda *a: (calls.append(1), inner(*a))[1])
    if not HAVE_CUDA:
        monkeypatch.setattr(fused, "_on_gpu", lambda t: True)
    w, tok, feats = _inputs(fdtype=torch.bfloat16)
    want = fused.embed_ref(w, tok, feats)
    f32 = feats.float()  # features of another dtype: cast first (torch), then the kernel
    for on in (True, False):
        monkeypatch.setattr(fused, "USE_TRITON_EMBED", on)
        assert torch.equal(fused.embed(w, tok, feats), want)
        assert torch.equal(fused.embed(w, tok, f32), want)
        assert torch.equal(fused.embed(w, tok[:, None]), w[tok])
    assert calls == [1, 1, 1]


@needs_triton
def test_embed_rejects_bad_input():
    from vllm_specla.ops import triton_fused as tf

    w, tok, feats = _inputs()
    with pytest.raises(ValueError, match="tokens must be int32 / int64"):
        tf.embed(w, tok.float(), feats)
    with pytest.raises(ValueError, match="dense last dim"):
        tf.embed(w.t(), tok, feats)
    with pytest.raises(ValueError, match="feats must be"):
        tf.embed(w, tok, feats[:5].to(w.dtype))
    with pytest.raises(ValueError, match="feats must be"):
        tf.embed(w, tok, feats)  # fp32 features for a bf16 table (fused.embed casts them first)
