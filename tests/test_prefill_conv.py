"""The prompt's short conv (``ops/prefill.py``): the batched torch form and our Triton verify-window
conv on whole prompts (what CUDA runs) against the per-row reference (what CPU runs).

Random inputs and conv states (never zeros), varlen rows including empty rows and rows shorter
than the conv window, rows with and without an earlier state (a fresh slot holds garbage that must
not be read), slots out of order, fp32 and bf16 conv states, conv widths 2-4. The batched op does
the reference's multiply-adds in the same order, so outputs and committed windows must be equal
bit for bit (CPU here; CUDA in the GPU tests below, which skip without CUDA). The Triton kernel
fuses its multiply-adds: outputs within ``TRITON_TOL`` (absolute and relative, fp32 inputs of unit
scale), committed windows equal (copies of inputs; bf16 windows within one bf16 rounding step).
"""

from __future__ import annotations

import pytest
import torch

import vllm_specla.ops.prefill as prefill_mod
from vllm_specla.ops.prefill import causal_conv1d_prefill, causal_conv1d_prefill_batched
from vllm_specla.ops.reference import causal_conv1d_prefill_ref

HAVE_CUDA = torch.cuda.is_available()
TRITON_TOL = 1e-5
LENS = [[5, 0, 1, 2, 130, 3], [7], [0, 0], [64, 65, 1]]


def make(lens, W, C=96, dtype=torch.float32, seed=0, num_slots=10):
    gen = torch.Generator().manual_seed(seed)
    N, R = sum(lens), len(lens)
    x = torch.randn(N, C, generator=gen)
    w = torch.randn(C, W, generator=gen)
    cu = torch.tensor([0] + lens).cumsum(0)
    conv = torch.randn(num_slots, W - 1, C, generator=gen).to(dtype)
    slots = torch.cat([torch.randperm(num_slots, generator=gen)[:R], torch.tensor([num_slots - 1])])  # one spare
    has_init = torch.rand(R, generator=gen) > 0.5
    has_init[0] = True
    if R > 1:
        has_init[1] = False
    return x, w, cu, conv, slots, has_init


def check(args, device, op=causal_conv1d_prefill_batched, tol=None):
    x, w, cu, conv, slots, has_init = (t.to(device) for t in args)
    conv_ref, conv_new = conv.clone(), conv.clone()
    y_ref = causal_conv1d_prefill_ref(x, w, cu, conv_ref, slots, has_init)
    y = op(x, w, cu, conv_new, slots, has_init)
    assert y.dtype == torch.float32 and y.shape == x.shape
    if tol is None:
        assert torch.equal(y, y_ref)
        assert torch.equal(conv_new, conv_ref)  # rows' windows committed, every other slot untouched
    else:
        torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
        wtol = 0.0 if conv.dtype == torch.float32 else 2.0 ** -7  # (bf16: the cast's rounding mode)
        torch.testing.assert_close(conv_new.float(), conv_ref.float(), atol=0.0, rtol=wtol)
    R = cu.numel() - 1
    moved = torch.zeros(conv.shape[0], dtype=torch.bool, device=device)
    moved[slots[:R]] = True
    assert torch.equal(conv_new[~moved], conv[~moved])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("W", [4, 3, 2])
@pytest.mark.parametrize("lens", LENS)
def test_matches_reference_bitwise_cpu(lens, W, dtype):
    check(make(lens, W, dtype=dtype, seed=W + len(lens)), "cpu")


def test_garbage_in_fresh_slots_is_not_read():
    x, w, cu, conv, slots, has_init = make([3, 9], 4)
    has_init[:] = False
    y1 = causal_conv1d_prefill_batched(x, w, cu, conv.clone(), slots, has_init)
    conv2 = conv.clone()
    conv2[slots[:2]] = float("nan")
    y2 = causal_conv1d_prefill_batched(x, w, cu, conv2, slots, has_init)
    assert torch.equal(y1, y2) and torch.isfinite(conv2[slots[:2]]).all()


def test_zero_rows():
    x, w, _, conv, slots, has_init = make([4], 4)
    conv_before = conv.clone()
    y = causal_conv1d_prefill_batched(x[:0], w, torch.tensor([0]), conv, slots[:0], has_init[:0])
    assert y.shape == (0, x.shape[1]) and torch.equal(conv, conv_before)


def test_dispatch(monkeypatch):
    """CPU takes the reference; CUDA our Triton conv, or the batched form without Triton; ``ref``
    forces the reference; a bad value names the variable."""
    import vllm_specla.ops.prefill as prefill  # noqa: PLC0415

    calls = []
    for name in ("ref", "batched", "triton"):
        monkeypatch.setattr(prefill, f"causal_conv1d_prefill_{name}", lambda *a, n=name: calls.append(n) or n)
    x, w, cu, conv, slots, has_init = make([3, 9], 4)
    assert causal_conv1d_prefill(x, w, cu, conv, slots, has_init) == "ref" and calls == ["ref"]
    if HAVE_CUDA:
        xc = x.cuda()
        assert causal_conv1d_prefill(xc, w, cu, conv, slots, has_init) == (
            "triton" if prefill._triton_conv() is not None else "batched")
        monkeypatch.setattr(prefill, "_triton_conv", lambda: None)
        assert causal_conv1d_prefill(xc, w, cu, conv, slots, has_init) == "batched"
        monkeypatch.setenv("VLLM_SPECLA_PREFILL", "ref")
        assert causal_conv1d_prefill(xc, w, cu, conv, slots, has_init) == "ref"
    monkeypatch.setenv("VLLM_SPECLA_PREFILL", "fast")
    with pytest.raises(ValueError, match="VLLM_SPECLA_PREFILL must be auto, fla or ref, got 'fast'"):
        causal_conv1d_prefill(x, w, cu, conv, slots, has_init)


gpu = pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA")


@gpu
@pytest.mark.parametrize("W", [4, 2])
@pytest.mark.parametrize("lens", LENS)
def test_matches_reference_bitwise_cuda(lens, W):
    check(make(lens, W, C=6144 if W == 4 else 96, seed=W + len(lens)), "cuda")


triton = pytest.mark.skipif(not HAVE_CUDA or prefill_mod._triton_conv() is None, reason="needs CUDA and Triton")


@triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("W", [4, 3, 2])
@pytest.mark.parametrize("lens", LENS + [[2048, 512, 3]])
def test_triton_matches_reference_cuda(lens, W, dtype):
    check(make(lens, W, C=6144 if W == 4 else 96, dtype=dtype, seed=W + len(lens)), "cuda",
          op=prefill_mod.causal_conv1d_prefill_triton, tol=TRITON_TOL)


@triton
def test_triton_takes_int32_and_host_row_tensors_cuda():
    """As the batched form: int32 slots / offsets and host-side row tensors are accepted."""
    x, w, cu, conv, slots, has_init = make([5, 0, 40], 4)
    conv_ref, conv_new = conv.clone(), conv.cuda()
    y_ref = causal_conv1d_prefill_ref(x, w, cu, conv_ref, slots, has_init)
    y = prefill_mod.causal_conv1d_prefill_triton(x.cuda(), w.cuda(), cu.int(), conv_new, slots.int(), has_init)
    torch.testing.assert_close(y.cpu(), y_ref, atol=TRITON_TOL, rtol=TRITON_TOL)
    assert torch.equal(conv_new.cpu(), conv_ref)


@gpu
def test_no_host_sync_cuda():
    x, w, cu, conv, slots, has_init = (t.cuda() for t in make([5, 0, 300, 2], 4, C=1024))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = causal_conv1d_prefill_batched(x, w, cu, conv, slots, has_init)
        if prefill_mod._triton_conv() is not None:
            y = prefill_mod.causal_conv1d_prefill_triton(x, w, cu, conv, slots, has_init)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(y).all()
