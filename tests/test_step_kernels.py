"""The decode runtime's one-launch step bookkeeping (``runtime/step_kernels.py``): the torch form
(``accept_advance_ref``, the CPU path) against a per-row Python oracle of the rules it replaces, and
the Triton kernel (``accept_advance``) against the torch form, exactly (integers; no tolerance).

The Triton tests run on CUDA, or on the CPU under ``TRITON_INTERPRET=1``; skipped otherwise.
"""

from __future__ import annotations

import os

import pytest
import torch

from vllm_specla.runtime import step_kernels
from vllm_specla.runtime.step_kernels import AcceptBuffers, accept_advance, accept_advance_ref

HAVE_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if HAVE_CUDA else "cpu"
LOG = 4


def _case(B, T, seed, flat=False, spec=True, cap=12, log=LOG, step=6, pad=0):
    """Random buffers: a 3-token vocabulary so drafts often match; row 0 accepts everything, row 1
    nothing; some rows near the output capacity (their tokens spill into the dump column)."""
    g = torch.Generator().manual_seed(seed)
    am = torch.randint(0, 3, (B, T), generator=g)
    window = torch.cat([torch.randint(0, 3, (B, 1), generator=g), torch.randint(0, 3, (B, T - 1), generator=g)], 1)
    if spec and T > 1:
        window[0, 1:] = am[0, : T - 1]
        if B > 1:
            window[1, 1] = (am[1, 0] + 1) % 3
    Lout = cap + T + 1
    out = torch.randint(0, 9, (B, Lout + pad), generator=g)[:, :Lout]  # pad: rows wider than Lout
    buf = AcceptBuffers(out=out, n=torch.randint(0, cap + 3, (B,), generator=g), window=window)
    if spec:
        buf.a = torch.full((B,), -7)
        buf.nxt = torch.full((B, T), -7)
        buf.acc_sum = torch.tensor(11)
        buf.acc_log = torch.randint(0, 5, (log, B), generator=g)
        buf.step_i = torch.tensor([step])
        buf.pending_len = torch.full((B,), -7)
        buf.read_bank = torch.randint(0, 2, (B,), generator=g)
        buf.write_bank = 1 - buf.read_bank
        buf.valid_len = torch.full((B,), -7)
        buf.flat_a = torch.full((B,), -7) if flat else None
    return am, buf


def _to(buf, dev):
    """A copy on ``dev`` (``out`` keeps its row stride: it may be a view of wider rows)."""
    def cp(k, v):
        if not isinstance(v, torch.Tensor):
            return v
        if k == "out" and v.stride(0) != v.shape[1]:
            wide = torch.zeros(v.shape[0], v.stride(0), dtype=v.dtype, device=dev)
            wide[:, : v.shape[1]] = v.to(dev)
            return wide[:, : v.shape[1]]
        return v.to(dev).clone()

    return AcceptBuffers(**{k: cp(k, v) for k, v in vars(buf).items()})


def _kernel_equals_ref(am, buf):
    """The kernel on DEV and the torch form on the CPU, from copies of ``buf``: every buffer equal
    (``out`` apart from its dump column)."""
    ref = _to(buf, "cpu")
    accept_advance_ref(am, ref)
    got = _to(buf, DEV)
    accept_advance(am.to(DEV), got)
    for k, v in vars(ref).items():
        if isinstance(v, torch.Tensor):
            w = getattr(got, k).cpu()
            if k == "out":
                v, w = v[:, :-1], w[:, :-1]
            assert torch.equal(w, v), k


@pytest.mark.parametrize("B,T", [(1, 1), (3, 1), (1, 5), (4, 2), (5, 7), (9, 17)])
def test_ref_matches_the_rules(B, T):
    """Per row: a = the longest prefix with window[i + 1] == am[i]; the bonus am[a]; tokens am[0..a] at
    n.. (clamped to the dump column); n += a + 1; counters; pending / valid = a + 1; banks swapped;
    nxt = drafts then bonus with nxt[a] = bonus; window[0] = bonus. AR mode (T = 1): a = 0."""
    spec = T > 1
    am, buf = _case(B, T, seed=B * 31 + T, flat=spec, spec=spec)
    before = _to(buf, "cpu")
    accept_advance_ref(am, buf)
    Lout = buf.out.shape[1]
    acc = 0
    for b in range(B):
        a = 0
        while spec and a < T - 1 and int(before.window[b, a + 1]) == int(am[b, a]):
            a += 1
        acc += a
        bonus = int(am[b, a])
        n0 = int(before.n[b])
        for i in range(a + 1):
            if n0 + i < Lout - 1:
                assert int(buf.out[b, n0 + i]) == int(am[b, i])
        assert torch.equal(buf.out[b, : Lout - 1][: n0], before.out[b, : Lout - 1][: n0])
        assert torch.equal(buf.out[b, n0 + a + 1 : Lout - 1], before.out[b, n0 + a + 1 : Lout - 1])
        assert int(buf.n[b]) == n0 + a + 1 and int(buf.window[b, 0]) == bonus
        assert torch.equal(buf.window[b, 1:], before.window[b, 1:])
        if spec:
            assert int(buf.a[b]) == a and int(buf.pending_len[b]) == int(buf.valid_len[b]) == a + 1
            assert int(buf.read_bank[b]) == int(before.write_bank[b]) and int(buf.write_bank[b]) == int(before.read_bank[b])
            assert int(buf.acc_log[6 % LOG, b]) == a and int(buf.flat_a[b]) == b * T + a
            want = [int(t) for t in before.window[b, 1:]] + [bonus]
            want[a] = bonus
            assert buf.nxt[b].tolist() == want
    if spec:
        assert int(buf.acc_sum) == 11 + acc and int(buf.step_i) == 7
        assert torch.equal(buf.acc_log[[i for i in range(LOG) if i != 6 % LOG]],
                           before.acc_log[[i for i in range(LOG) if i != 6 % LOG]])
        if B > 1:
            assert int(buf.a[0]) == T - 1 and int(buf.a[1]) == 0  # both ends


@pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")
@pytest.mark.parametrize("B,T", [(1, 1), (3, 1), (1, 5), (4, 2), (5, 7), (9, 17), (130, 5), (257, 1)])
@pytest.mark.parametrize("flat", [False, True])
def test_kernel_equals_ref(B, T, flat):
    """Every buffer the kernel writes equals the torch form's, rows in several blocks of 128 (B = 130 /
    257), with and without flat_a, AR mode at T = 1; ``out`` apart from its dump column."""
    spec = T > 1
    if flat and not spec:
        pytest.skip("flat_a is a spec-mode buffer")
    am, buf = _case(B, T, seed=B + 7 * T, flat=flat, spec=spec)
    _kernel_equals_ref(am, buf)


@pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")
@pytest.mark.parametrize("B,T,log,step,pad", [(3, 33, 4, 6, 0), (2, 64, 1, 5, 0), (6, 9, 3, 2**40 + 3, 5),
                                               (17, 5, 2, 1, 3)])
def test_kernel_equals_ref_edges(B, T, log, step, pad):
    """Windows of 33-64 positions (a row's columns split across warps), a one-step ring and a
    wrapped step counter, ``out`` rows wider than the buffer (a row-strided view)."""
    am, buf = _case(B, T, seed=T + log, flat=True, log=log, step=step, pad=pad)
    _kernel_equals_ref(am, buf)


def test_dispatch_falls_back_to_torch(monkeypatch):
    """``accept`` runs the kernel on the GPU for windows of up to ``ACCEPT_MAX_T`` positions with
    ``USE_TRITON_ACCEPT``, the torch form otherwise (longer windows, the switch off, CPU tensors)."""
    calls = []
    monkeypatch.setattr(step_kernels, "accept_advance", lambda am, buf: calls.append(("triton", am.shape[1])))
    monkeypatch.setattr(step_kernels, "accept_advance_ref", lambda am, buf: calls.append(("torch", am.shape[1])))
    am = torch.zeros(2, 5, dtype=torch.long)
    step_kernels.accept(am, None)
    monkeypatch.setattr(step_kernels, "_on_gpu", lambda t: True)
    step_kernels.accept(am, None)
    step_kernels.accept(torch.zeros(2, step_kernels.ACCEPT_MAX_T + 1, dtype=torch.long), None)
    monkeypatch.setattr(step_kernels, "USE_TRITON_ACCEPT", False)
    step_kernels.accept(am, None)
    assert calls == [("torch", 5), ("triton", 5), ("torch", 65), ("torch", 5)]


@pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")
def test_kernel_rejects_bad_buffers():
    am, buf = _case(4, 5, seed=1)
    buf = _to(buf, DEV)
    with pytest.raises(ValueError, match="1..64 positions"):
        accept_advance(torch.zeros(4, 65, dtype=torch.long, device=DEV), buf)
    with pytest.raises(ValueError, match="1 in AR mode"):
        accept_advance(am.to(DEV), AcceptBuffers(buf.out, buf.n, buf.window))
    bad = _to(buf, DEV)
    bad.n = bad.n.int()
    with pytest.raises(ValueError, match="n must be an int64 tensor"):
        accept_advance(am.to(DEV), bad)
    bad = _to(buf, DEV)
    bad.nxt = bad.nxt[:, :4]
    with pytest.raises(ValueError, match="nxt must be"):
        accept_advance(am.to(DEV), bad)
    bad = _to(buf, DEV)
    bad.acc_log = bad.acc_log[:0]
    with pytest.raises(ValueError, match=r"LOG >= 1"):
        accept_advance(am.to(DEV), bad)
    bad = _to(buf, DEV)
    bad.out = bad.out[:, :0]
    with pytest.raises(ValueError, match=r"Lout >= 1"):
        accept_advance(am.to(DEV), bad)
    for name in ("acc_sum", "step_i"):
        bad = _to(buf, DEV)
        setattr(bad, name, torch.zeros(2, dtype=torch.long, device=DEV))
        with pytest.raises(ValueError, match=f"{name} must hold one element"):
            accept_advance(am.to(DEV), bad)


# ------------------------------------------------------------------ acceptance-controlled drafts
def _control_case(B, K, L=9, V=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    trace = torch.randint(0, V, (B, L), generator=g)
    n = torch.randint(1, L + 3, (B,), generator=g)  # some rows past the trace's end (clamped)
    window = torch.randint(0, V, (B, K + 1), generator=g)
    return trace, n, window


def _truth(trace, n, K):
    idx = (n[:, None] + torch.arange(K)[None, :]).clamp(max=trace.shape[1] - 1)
    return trace.gather(1, idx)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_control_drafts_ref_at_the_ends(alpha):
    """alpha 1: draft k of row b is the target's token trace[b, min(n + k - 1, L - 1)]; alpha 0: that
    token + 1 (mod V), never the target's; column 0 (the last token) untouched."""
    trace, n, window = _control_case(5, 4, V=50, seed=3)
    before = window.clone()
    step_kernels.control_drafts_ref(trace, n, torch.tensor(alpha), window, 50)
    true = _truth(trace, n, 4)
    assert torch.equal(window[:, 1:], true if alpha == 1.0 else (true + 1) % 50)
    assert torch.equal(window[:, 0], before[:, 0])


@pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")
@pytest.mark.parametrize("B,K", [(1, 1), (5, 4), (70, 6), (3, 9)])
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_control_kernel_equals_ref_at_the_ends(monkeypatch, B, K, alpha):
    """At alpha 0 / 1 the coins do not matter: the kernel's window equals the torch form's exactly
    (rows in several programs at B = 70, a window wider than its power-of-two K block at K = 9)."""
    trace, n, window = _control_case(B, K, V=50, seed=B + K)
    ref = window.clone()
    step_kernels.control_drafts_ref(trace, n, torch.tensor(alpha), ref, 50)
    if not HAVE_CUDA:
        monkeypatch.setattr(step_kernels, "_on_gpu", lambda t: True)
    got = window.to(DEV, copy=True)
    step_kernels.control_drafts(trace.to(DEV), n.to(DEV), torch.tensor(alpha, device=DEV),
                                torch.tensor([3], device=DEV), got, 50)
    assert torch.equal(got.cpu(), ref)


@pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")
def test_control_kernel_coins(monkeypatch):
    """At alpha 0.3 each draft is the target's token or its +1 and nothing else; the share of target
    tokens is 0.3 within 5 standard deviations over 4,096 draws; the same step count draws the same
    coins, the next step count other ones (fresh coins every step inside a CUDA graph)."""
    B, K, V = 512, 8, 50
    trace, n, window = _control_case(B, K, L=40, V=V, seed=11)
    if not HAVE_CUDA:
        monkeypatch.setattr(step_kernels, "_on_gpu", lambda t: True)
    args = (trace.to(DEV), n.to(DEV), torch.tensor(0.3, device=DEV))
    outs = []
    for step in (7, 7, 8):
        w = window.to(DEV, copy=True)
        step_kernels.control_drafts(*args, torch.tensor([step], device=DEV), w, V)
        outs.append(w.cpu())
    true = _truth(trace, n, K)
    hit = outs[0][:, 1:] == true
    assert ((outs[0][:, 1:] == (true + 1) % V) | hit).all()
    sd = (0.3 * 0.7 / hit.numel()) ** 0.5
    assert abs(hit.float().mean().item() - 0.3) < 5 * sd
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_control_dispatch_and_errors(monkeypatch):
    """CPU tensors (or the switch off) take the torch form; bad shapes / dtypes raise naming them."""
    calls = []
    monkeypatch.setattr(step_kernels, "control_drafts_ref", lambda *a: calls.append("torch"))
    trace, n, window = _control_case(2, 3)
    a, s = torch.tensor(0.5), torch.tensor([0])
    step_kernels.control_drafts(trace, n, a, s, window, 50)
    monkeypatch.setattr(step_kernels, "_on_gpu", lambda t: True)
    monkeypatch.setattr(step_kernels, "USE_TRITON_CONTROL", False)
    step_kernels.control_drafts(trace, n, a, s, window, 50)
    assert calls == ["torch", "torch"]
    with pytest.raises(ValueError, match="window"):
        step_kernels.control_drafts(trace, n, a, s, window[:, :1], 50)
    with pytest.raises(ValueError, match="trace"):
        step_kernels.control_drafts(trace[:1], n, a, s, window, 50)
    with pytest.raises(ValueError, match="n"):
        step_kernels.control_drafts(trace, n.int(), a, s, window, 50)
    with pytest.raises(ValueError, match="window must be"):
        step_kernels.control_drafts(trace, n, a, s, window[0], 50)
    with pytest.raises(ValueError, match="alpha must be"):
        step_kernels.control_drafts(trace, n, 0.5, s, window, 50)
    with pytest.raises(ValueError, match="step_i must be"):
        step_kernels.control_drafts(trace, n, a, s.int(), window, 50)
    with pytest.raises(ValueError, match="vocab_size"):
        step_kernels.control_drafts(trace, n, a, s, window, 0)
    with pytest.raises(ValueError, match="seed"):
        step_kernels.control_drafts(trace, n, a, s, window, 50, seed=2**31)
    assert calls == ["torch", "torch"]  # every bad input raised before the dispatch
