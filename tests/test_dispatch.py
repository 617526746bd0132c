"""Kernel choice of the public chain-verify op on CUDA tensors (``ops/chain_verify.py``), and of the
decode runtime's GEMMs between cuBLAS and the CUDA skinny GEMM (``ops/fused.py``; at the end).

The rules are shape-only (no host sync, CUDA-graph safe), so they are checked here on CPU tensors
standing in for CUDA ones: the UT kernel for long verify windows at large batch, the CUDA csrc
kernel (when loaded) for other verify windows at > 16 (row, head) pairs and bf16 SpecLA steps at fewer, neither for
``write_final_state`` (AR / commit) except bf16 one-token AR at <= 16 pairs where the CUDA AR body measured faster,
and the environment switches.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from vllm_specla.ops import _cpp
from vllm_specla.ops import chain_verify as cv


def _kw(rows: int, T: int, HV: int = 6, final: bool = False, tmax: int | None = 16, pending: bool = False,
        K: int = 4):
    q = torch.zeros(rows * T, 6, K)
    kw = dict(cu_seqlens=torch.arange(0, rows * T + 1, T), state=torch.zeros(rows, HV, 2, K), write_final_state=final)
    if tmax is not None:  # factor banks [slots, 2, Tmax, H, K]
        kw.update(bank_k=torch.zeros(rows, 2, tmax, 6, K), write_bank=torch.zeros(rows, dtype=torch.long))
    if pending:
        kw.update(pending_len=torch.zeros(rows, dtype=torch.long), read_bank=torch.ones(rows, dtype=torch.long))
    return q, kw


def test_ut_rule(monkeypatch):
    monkeypatch.setattr(cv, "VERIFY_KERNEL", "auto")
    monkeypatch.setattr(_cpp, "CUDA_LOADED", False)
    assert cv._use_ut(*_kw(32, 8))
    assert cv._use_ut(*_kw(256, 9))
    assert not cv._use_ut(*_kw(32, 5))  # short windows: serial / csrc
    assert not cv._use_ut(*_kw(16, 8))  # small batch
    assert not cv._use_ut(*_kw(64, 8, final=True))  # AR / commit writes the state: serial
    assert not cv._use_ut(*_kw(64, 8, tmax=None))  # no banks: windows unbounded, UT takes <= 16
    assert not cv._use_ut(*_kw(64, 8, tmax=24))  # a 24-token bank allows windows UT cannot take
    monkeypatch.setattr(cv, "VERIFY_KERNEL", "serial")
    assert not cv._use_ut(*_kw(128, 8))
    monkeypatch.setattr(cv, "VERIFY_KERNEL", "ut")
    assert cv._use_ut(*_kw(1, 2))
    assert not cv._use_ut(*_kw(1, 2, final=True))
    assert not cv._use_ut(*_kw(1, 2, tmax=32))  # forced, but windows could exceed 16: serial


def test_pending_prefetch_rule_and_env():
    """The serial kernel's pending-factor prefetch depth (``triton_chain.PENDING_PREFETCH``, from
    ``VLLM_SPECLA_PENDING_PREFETCH``, default 4) goes only to launches of the measured regime: windows of more
    than one token per row with pending factors at <= ``SMALL_PAIRS`` (row, value head) pairs; the module
    reads the variable at import, and a value outside 0-4 is a ValueError naming it and the allowed values."""
    tc = cv._triton_impl()
    if tc is None:
        pytest.skip("triton not importable")
    d = tc.PENDING_PREFETCH
    assert tc._pend_prefetch(True, 8, 1, 6) == d and tc._pend_prefetch(True, 16, 2, 8) == d  # 6 / 16 pairs
    assert tc._pend_prefetch(True, 24, 3, 6) == 0  # 18 pairs
    assert tc._pend_prefetch(True, 1, 1, 6) == 0 and tc._pend_prefetch(True, 2, 2, 6) == 0  # one token per row
    assert tc._pend_prefetch(False, 8, 1, 6) == 0  # nothing pending
    _check_chain_env("VLLM_SPECLA_PENDING_PREFETCH", "PENDING_PREFETCH", ((None, "4"), ("2", "2")), "8",
                     "0, 1, 2, 3, 4")


def _import_chain_with(var: str, val: str | None, attr: str) -> subprocess.CompletedProcess:
    """A fresh interpreter importing ``triton_chain`` with environment variable ``var`` set to ``val`` (None:
    unset) and printing its ``attr``: the module reads its variables at import."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != var}
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if val is not None:
        env[var] = val
    code = f"from vllm_specla.ops import triton_chain as tc; print(tc.{attr})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def _check_chain_env(var: str, attr: str, cases, bad: str, allowed: str) -> None:
    """``triton_chain.<attr>`` as imported with ``var`` at each ``(value, expected)`` of ``cases`` (None: unset),
    and the import's ValueError for ``bad``, naming ``var`` and the ``allowed`` values."""
    for val, want in cases:
        run = _import_chain_with(var, val, attr)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split()[-1] == want, (val, run.stdout)
    run = _import_chain_with(var, bad, attr)
    assert run.returncode != 0
    assert f"{var}={bad!r}: allowed values are {allowed}" in run.stderr


def test_rescale_precheck_rule_and_env(monkeypatch):
    """The serial chain kernel's renormalisation precheck (``triton_chain.RESCALE_PRECHECK``, from
    ``VLLM_SPECLA_RESCALE_PRECHECK``, default auto): ``0`` / ``1`` force it for every launch; ``auto`` gives
    it to windows of more than one token per row and to one-token rows at <= ``PRECHECK_AR_MAX_PAIRS`` (8) (row,
    value head) pairs (batch 1 of both GDN-1.3B shapes), not to larger one-token (AR) launches. The module reads
    the variable at import; another value is a ValueError naming it and the allowed values."""
    tc = cv._triton_impl()
    if tc is None:
        pytest.skip("triton not importable")
    # (N, R, HV): windows; windows; AR at 6 / 8 / 12 / 16 / 18 pairs
    shapes = [(8, 1, 6), (40, 5, 6), (1, 1, 6), (1, 1, 8), (2, 2, 6), (2, 2, 8), (3, 3, 6)]
    auto = [True, True, True, True, False, False, False]
    for mode, want in (("0", [False] * 7), ("1", [True] * 7), ("auto", auto)):
        monkeypatch.setattr(tc, "RESCALE_PRECHECK", mode)
        assert [tc._rescale_precheck(*x) for x in shapes] == want, mode
    _check_chain_env("VLLM_SPECLA_RESCALE_PRECHECK", "RESCALE_PRECHECK", ((None, "auto"), ("0", "0"), ("1", "1")),
                     "2", "auto, 0, 1")


def test_cuda_csrc_rule(monkeypatch):
    monkeypatch.setattr(_cpp, "CUDA_LOADED", False)
    assert not cv._use_cuda_csrc(_kw(64, 5)[1])  # not built: Triton
    monkeypatch.setattr(_cpp, "CUDA_LOADED", True)
    assert cv._use_cuda_csrc(_kw(64, 5)[1])
    assert cv._use_cuda_csrc(_kw(3, 5, HV=6)[1])  # 18 (row, head) pairs
    assert not cv._use_cuda_csrc(_kw(2, 5, HV=8)[1])  # 16 pairs: batch 1-2 stays on Triton
    assert not cv._use_cuda_csrc(_kw(64, 1, final=True)[1])  # AR: Triton
    q, kw = _kw(64, 5)
    kw["state"] = torch.zeros(64, 6, 2, 1024)  # K = 1024: beyond the CUDA kernel's tile
    assert not cv._use_cuda_csrc(kw)
    monkeypatch.setattr(cv, "USE_CUDA_CSRC", False)
    assert not cv._use_cuda_csrc(_kw(64, 5)[1])


def test_cuda_small_step_rule(monkeypatch):
    """At <= 16 (row, head) pairs the CUDA kernel takes bf16 SpecLA steps (pending factors given, more
    tokens than rows) on its 16-byte path with K = 128 / 256 (the binding's small-batch lean kernel);
    verify windows without pending factors, AR, fp32 inputs, other K, unaligned rows, larger batches
    (the > 16-pair rule's) and an unbuilt or switched-off CUDA op keep the other rules."""
    monkeypatch.setattr(_cpp, "CUDA_LOADED", True)

    def case(rows=1, T=5, HV=6, pending=True, K=256, dtype=torch.bfloat16, final=False):
        q, kw = _kw(rows, T, HV=HV, pending=pending, K=K, final=final)
        q = q.to(dtype)
        return q, q.clone(), torch.zeros(rows * T, HV, 8, dtype=dtype), kw

    def takes(q, k, v, kw):
        return cv._cuda_small_step(q, k, v, kw)

    assert takes(*case())  # batch 1, 6 heads, a 5-token step
    assert takes(*case(rows=2, HV=8, T=8, K=128))  # 16 pairs
    assert not takes(*case(rows=3, HV=6))  # 18 pairs: _use_cuda_csrc's rule
    assert not takes(*case(pending=False))  # verify without pending factors: Triton
    assert not takes(*case(T=1))  # AR-sized (one token per row): Triton
    assert not takes(*case(final=True))  # write_final_state: Triton
    assert not takes(*case(dtype=torch.float32))  # fp32 inputs: the binding's row-group kernels, Triton
    assert not takes(*case(K=64))  # off the 16-byte path with K = 128 / 256
    q, k, v, kw = case()
    assert not takes(q[:, :, 1:], k[:, :, 1:], v, kw)  # q / k rows not 16-byte aligned
    assert not takes(q, k, v.float(), kw)  # v not bf16
    monkeypatch.setattr(cv, "USE_CUDA_CSRC", False)
    assert not takes(*case())
    monkeypatch.setattr(cv, "USE_CUDA_CSRC", True)
    monkeypatch.setattr(_cpp, "CUDA_LOADED", False)
    assert not takes(*case())


def test_cuda_small_ar_rule(monkeypatch):
    """At <= 16 (row, head) pairs the CUDA kernel takes one-token bf16 AR launches (write_final_state, no banks or
    pending factors) with K = 256 where two launches of its RAW AR body fit on the GPU at once (2 x pairs x V / 4
    CTAs <= 20 per SM x SMs; an sm_90 GPU of 132 SMs here): 6x256x512 batch 1 and 8x256x256 batch 1 / 2, not
    6x256x512 batch 2, where Triton was faster; recording, pending, fp32, other K, unaligned rows, multi-token rows,
    forced kernel forms, older GPUs, larger batches and an unbuilt or switched-off CUDA op keep the other rules."""
    monkeypatch.setattr(_cpp, "CUDA_LOADED", True)
    monkeypatch.setattr(cv, "_gpu", lambda index: (132, 9))
    for name in cv._RAW_AR_ENV:
        monkeypatch.delenv(name, raising=False)

    def case(rows=1, HV=6, V=512, K=256, T=1, dtype=torch.bfloat16, final=True, tmax=None, pending=False):
        q, kw = _kw(rows, T, HV=HV, final=final, tmax=tmax, pending=pending, K=K)
        kw["state"] = torch.zeros(rows, HV, V, K)
        q = q.to(dtype)
        return q, q.clone(), torch.zeros(rows * T, HV, V, dtype=dtype), kw

    takes = cv._cuda_small_ar
    assert takes(*case())  # 6x256x512 batch 1: 768 CTAs
    assert takes(*case(rows=1, HV=8, V=256)) and takes(*case(rows=2, HV=8, V=256))  # 512 / 1,024 CTAs
    assert not takes(*case(rows=2))  # 6x256x512 batch 2: 1,536 CTAs, 3,072 > 2,640
    assert not takes(*case(rows=3, HV=6, V=256))  # 18 pairs
    assert not takes(*case(final=False))  # no state written: not AR
    assert not takes(*case(tmax=8))  # factors recorded: Triton
    assert not takes(*case(pending=True))  # pending factors: the step rules
    assert not takes(*case(T=2))  # more tokens than rows
    assert not takes(*case(dtype=torch.float32))  # fp32 (the decode runtime's conv output): Triton
    assert not takes(*case(K=128))  # K = 128: not measured, Triton
    q, k, v, kw = case()
    odd = torch.zeros(q.numel() + 1, dtype=q.dtype)[1:].view_as(q)  # K = 256 rows 2 bytes off 16-byte alignment
    assert takes(q, k, v, kw) and not takes(odd, k, v, kw) and not takes(q, odd, v, kw)
    assert not takes(q, k, v.float(), kw)
    for name, value in (("VLLM_SPECLA_CUDA_LAYOUT", "rowgroup"), ("VLLM_SPECLA_CUDA_BV", "8"),
                        ("VLLM_SPECLA_CUDA_RG_PREFETCH", "1"), ("VLLM_SPECLA_CUDA_RG_PIECE", "8"),
                        ("VLLM_SPECLA_CUDA_RG_AR", "2")):
        monkeypatch.setenv(name, value)
        assert not takes(*case()), name  # a forced form: the A/B's, not this rule's
        monkeypatch.delenv(name)
    for name, value in (("VLLM_SPECLA_CUDA_LAYOUT", "auto"), ("VLLM_SPECLA_CUDA_BV", "4"), ("VLLM_SPECLA_CUDA_RG_AR", "4")):
        monkeypatch.setenv(name, value)
        assert takes(*case()), name  # the defaults spelt out
        monkeypatch.delenv(name)
    monkeypatch.setattr(cv, "_gpu", lambda index: (132, 8))
    assert not takes(*case())  # below sm_90: not measured
    monkeypatch.setattr(cv, "_gpu", lambda index: (66, 9))
    assert not takes(*case(rows=2, HV=8, V=256))  # 2,048 CTAs > 20 x 66 SMs
    assert not takes(*case()) and takes(*case(rows=1, HV=8, V=256))  # 2 x 768 > 1,320 >= 2 x 512
    monkeypatch.setattr(cv, "_gpu", lambda index: (132, 9))
    monkeypatch.setattr(cv, "USE_CUDA_CSRC", False)
    assert not takes(*case())
    monkeypatch.setattr(cv, "USE_CUDA_CSRC", True)
    monkeypatch.setattr(_cpp, "CUDA_LOADED", False)
    assert not takes(*case())


def test_cuda_takes_long_steps_when_built(monkeypatch):
    """With the CUDA ops built, SpecLA steps (pending factors given) at >= 192 (row, head) pairs go to
    the CUDA kernel (its UT form) instead of the Triton UT kernel, also for windows of >= 8 tokens,
    where the binding will take its UT form (K = 128 / 256, 16-byte aligned rows, not switched off);
    so do verify windows without pending factors whose factor bank holds <= 8 positions; longer
    banks, smaller batches and forced kernels keep the Triton rule."""
    monkeypatch.delenv("VLLM_SPECLA_CUDA_UT", raising=False)
    monkeypatch.delenv("VLLM_SPECLA_CUDA_LAYOUT", raising=False)
    monkeypatch.setattr(cv, "VERIFY_KERNEL", "auto")
    monkeypatch.setattr(_cpp, "CUDA_LOADED", True)
    step = _kw(32, 8, pending=True, K=256)  # 32 rows x 6 heads = 192 pairs
    assert not cv._use_ut(*step)
    assert cv._use_cuda_csrc(step[1])
    assert cv._use_ut(*_kw(32, 8, K=256))  # no pending factors, a 16-token bank: Triton UT
    verify8 = _kw(32, 8, K=256, tmax=8)  # no pending factors, an 8-token bank: the CUDA UT form
    assert not cv._use_ut(*verify8) and cv._use_cuda_csrc(verify8[1])
    assert cv._use_ut(*_kw(32, 8, HV=4, K=256, tmax=8))  # 128 pairs: Triton UT
    assert cv._use_ut(*_kw(32, 8, HV=4, pending=True, K=256))  # 128 pairs: below the CUDA UT threshold
    assert cv._use_ut(*_kw(32, 8, pending=True, K=64))  # K = 64: the binding would run v3, keep Triton UT
    q, kw = step
    assert cv._use_ut(q[:, :, 1:], kw)  # q rows not 16-byte aligned: the binding's UT form refuses
    odd = dict(kw, state=torch.zeros(32, 6, 2, 257)[..., :256])  # a state page view with odd strides
    assert cv._use_ut(q, odd)
    monkeypatch.setenv("VLLM_SPECLA_CUDA_UT", "0")
    assert cv._use_ut(*step)  # the CUDA UT form switched off
    monkeypatch.delenv("VLLM_SPECLA_CUDA_UT")
    monkeypatch.setattr(cv, "VERIFY_KERNEL", "ut")
    assert cv._use_ut(*step)  # forced
    monkeypatch.setattr(cv, "VERIFY_KERNEL", "auto")
    monkeypatch.setattr(cv, "USE_CUDA_CSRC", False)
    assert cv._use_ut(*step)  # CUDA csrc switched off


def test_out_slots_on_cpu_backends():
    """``out_slots`` through the public ops on CPU (the C++ op when built, else the reference): the
    read slots are copied to the out slots first, so the result equals an in-place run there; the
    read slots stay unchanged; a call outside the contract is a ValueError naming the field."""
    from vllm_specla.ops import reference as ref  # noqa: PLC0415

    gen = torch.Generator().manual_seed(5)
    H, HV, K, V, R, S = 2, 4, 16, 12, 3, 7
    q, k = torch.randn(R, H, K, generator=gen), torch.randn(R, H, K, generator=gen)
    v = torch.randn(R, HV, V, generator=gen)
    g, beta = -torch.rand(R, HV, generator=gen), torch.rand(R, HV, generator=gen)
    state = torch.randn(S, HV, V, K, generator=gen)
    read, out = torch.tensor([1, 1, 3]), torch.tensor([4, 5, 6])
    cu = torch.arange(R + 1, dtype=torch.int32)
    kw = dict(scale=K ** -0.5, cu_seqlens=cu, write_final_state=True)
    s1, s2 = state.clone(), state.clone()
    s1[out] = s1[read]
    o1 = ref.chain_verify_ref(q, k, v, g, beta, state=s1, slots=out, **kw)
    o2 = cv.chain_verify(q, k, v, g, beta, state=s2, slots=read, out_slots=out, **kw)
    assert torch.allclose(o1, o2, atol=1e-6) and torch.allclose(s1, s2, atol=1e-6)
    assert torch.equal(s2[:4], state[:4])
    C, W = 10, 4
    x, w = torch.randn(R, C, generator=gen), torch.randn(C, W, generator=gen)
    cs = torch.randn(S, W - 1, C, generator=gen)
    c1, c2 = cs.clone(), cs.clone()
    c1[out] = c1[read]
    y1 = ref.conv_verify_ref(x, w, cu, c1, out, write_final_state=True)
    y2 = cv.conv_verify(x, w, cu, c2, read, write_final_state=True, out_slots=out)
    assert torch.allclose(y1, y2, atol=1e-6) and torch.allclose(c1, c2, atol=1e-6) and torch.equal(c2[:4], cs[:4])
    with pytest.raises(ValueError, match="write_final_state"):
        cv.chain_verify(q, k, v, g, beta, state=s2, slots=read, out_slots=out, scale=1.0, cu_seqlens=cu)
    with pytest.raises(ValueError, match="cover"):
        cv.conv_verify(x, w, cu, c2, read, write_final_state=True, out_slots=out[:2])


def test_ut_split_and_solve_forms(monkeypatch):
    """The UT launch's forms (``triton_chain_ut.ut_forms``): by default trees take the blocked
    log-depth inverse and, at <= 64 (row, value head) pairs, the split launch; chains take neither;
    the switches force them; a bad value names the variable and the allowed values."""
    from vllm_specla.ops import triton_chain_ut as ut

    monkeypatch.setattr(ut, "UT_SPLIT", "auto")
    monkeypatch.setattr(ut, "UT_SOLVE", "auto")
    assert ut.ut_forms(48, tree=True) == (True, True)  # B = 8 trees, 6 value heads
    assert ut.ut_forms(64, tree=True) == (True, True)
    assert ut.ut_forms(65, tree=True) == (False, True)  # B = 32: no split
    assert ut.ut_forms(48, tree=False) == (False, False)  # chains: substitution, one stream
    monkeypatch.setattr(ut, "UT_SPLIT", "1")
    monkeypatch.setattr(ut, "UT_SOLVE", "dot")
    assert ut.ut_forms(48, tree=False) == (True, True)
    assert ut.ut_forms(192, tree=False) == (False, True)  # the pair cap holds when forced
    monkeypatch.setattr(ut, "UT_SPLIT", "0")
    monkeypatch.setattr(ut, "UT_SOLVE", "loop")
    assert ut.ut_forms(8, tree=True) == (False, False)
    monkeypatch.setattr(ut, "UT_SPLIT", "yes")
    with pytest.raises(ValueError, match=r"VLLM_SPECLA_UT_SPLIT='yes'.*0, 1, auto"):
        ut.ut_forms(8, tree=True)
    monkeypatch.setattr(ut, "UT_SPLIT", "auto")
    monkeypatch.setattr(ut, "UT_SOLVE", "Dot")
    with pytest.raises(ValueError, match=r"VLLM_SPECLA_UT_SOLVE='Dot'.*loop, dot, auto"):
        ut.ut_forms(8, tree=True)


def test_ut_fold_rule(monkeypatch):
    """Where the UT launch folds the pending factors into its state pass (``triton_chain_ut.ut_fold``,
    ``UT_FOLD``): by default launches that are not split, with 16-token chunks and at least
    ``UT_FOLD_MIN_STATE_BYTES`` (64 MiB) of state (from B = 32 on both GDN-1.3B head shapes: the
    measured H100 rows of session 38 that the fold helped or left even, not B = 16, where one row lost
    13 %), not split launches or 32-node chunks;
    the switch forces it on / off; a bad value names the variable and the allowed values."""
    from vllm_specla.ops import triton_chain_ut as ut

    def state(B, HV, V, K=256):
        return B * HV * V * K * 4

    monkeypatch.setattr(ut, "UT_FOLD", "auto")
    assert ut.ut_fold(split=False, bt=16, state_bytes=state(32, 8, 256))  # 8x256x256, B = 32: 64 MiB
    assert ut.ut_fold(split=False, bt=16, state_bytes=state(32, 6, 512))
    assert not ut.ut_fold(split=False, bt=16, state_bytes=state(16, 6, 512))  # 48 MiB: in the L2
    assert not ut.ut_fold(split=False, bt=16, state_bytes=state(31, 8, 256))
    assert not ut.ut_fold(split=True, bt=16, state_bytes=state(128, 8, 256))
    assert not ut.ut_fold(split=False, bt=32, state_bytes=state(128, 8, 256))
    monkeypatch.setattr(ut, "UT_FOLD", "1")
    assert ut.ut_fold(split=True, bt=32, state_bytes=1)
    monkeypatch.setattr(ut, "UT_FOLD", "0")
    assert not ut.ut_fold(split=False, bt=16, state_bytes=state(256, 8, 256))
    monkeypatch.setattr(ut, "UT_FOLD", "on")
    with pytest.raises(ValueError, match=r"VLLM_SPECLA_UT_FOLD='on'.*0, 1, auto"):
        ut.ut_fold(split=False, bt=16, state_bytes=state(32, 8, 256))


def test_skinny_gemm_rule_and_route(monkeypatch):
    """``fused.linear``'s skinny-GEMM rule (``fused._skinny_takes``; the ``_on_gpu`` seam points it at
    CPU tensors): once built, bf16 / fp16 GEMMs of 2..``SKINNY_MAX_M`` dense rows with ``K % 8 == 0``
    take it; one row, 9 rows, fp32, ``K % 8 != 0``, a mismatched residual or the switch off do not;
    with ``SKINNY_MAX_M`` raised to 9, 9 rows take it; whatever it takes passes ``_cpp._skinny_check``
    (up to the CUDA-device check). Routed
    GEMMs get the RMSNorm first and the residual in place, as the cuBLAS path does (the op is
    replaced by the reference here; its GPU tests: tests/test_skinny_gemm_gpu.py)."""
    from vllm_specla.ops import fused

    monkeypatch.setattr(fused, "_on_gpu", lambda x: True)
    monkeypatch.setattr(fused, "USE_GEMV_ROWS", False)  # (the row GEMV would take one-row GEMMs first)
    monkeypatch.setattr(_cpp, "GEMM_LOADED", True)
    bf = torch.bfloat16
    w = torch.randn(64, 32).to(bf)
    take = fused._skinny_takes
    assert all(take(torch.randn(m, 32).to(bf), w, None) for m in range(2, fused.SKINNY_MAX_M + 1))
    assert not take(torch.randn(1, 32).to(bf), w, None)  # one row: the row GEMV's (or cuBLAS's), not this
    assert not take(torch.randn(5, 40).to(bf), w, None)  # K mismatch
    assert take(torch.randn(5, 32).half(), w.half(), torch.randn(5, 64).half())
    assert not take(torch.randn(fused.SKINNY_MAX_M + 1, 32).to(bf), w, None)
    assert not take(torch.randn(5, 32), w.float(), None)  # fp32
    assert not take(torch.randn(5, 36).to(bf), torch.randn(64, 36).to(bf), None)  # K % 8
    assert not take(torch.randn(5, 36).to(bf)[:, :32], w, None)  # row stride 36: rows not 16-byte aligned
    assert take(torch.randn(5, 40).to(bf)[:, :32], w, None)  # row stride 40: a column slice read in place
    assert not take(torch.randn(5, 32).to(bf), w, torch.randn(5, 63).to(bf))  # residual shape
    assert not take(torch.randn(5, 32).to(bf), w.t().contiguous().t(), None)  # w not contiguous
    buf = torch.randn(5, 128).to(bf)  # a residual overlapping x (the op would refuse it in place): cuBLAS
    assert not take(buf[:, :32], w, buf[:, 64:])
    for m in range(2, fused.SKINNY_MAX_M + 1):  # accepted -> valid for the op (CPU: only "CUDA" is left)
        with pytest.raises(ValueError, match="CUDA tensors"):
            _cpp.skinny_gemm(torch.randn(m, 32).to(bf), w, torch.randn(m, 64).to(bf))
    # SKINNY_MAX_M raised (bench_e2e.py --skinny-max-m): 9 rows take it, 10 do not
    monkeypatch.setattr(fused, "SKINNY_MAX_M", 9)
    assert take(torch.randn(9, 32).to(bf), w, None) and not take(torch.randn(10, 32).to(bf), w, None)
    monkeypatch.setattr(fused, "SKINNY_MAX_M", 8)
    calls, pfs = [], []

    def fake(x, w_, residual=None, out=None, warps=0, unroll=0, pdl=None, prefetch=None, prefetch_bytes=None):
        calls.append((x.shape[0], residual is not None, out is not None and out is residual))
        pfs.append((prefetch, prefetch_bytes))
        y = fused.linear_ref(x, w_, residual=residual)
        return out.copy_(y) if out is not None else y

    monkeypatch.setattr(_cpp, "skinny_gemm", fake)
    x, nw = torch.randn(5, 32).to(bf), torch.rand(32) + 0.5
    y = fused.linear(x, w, nw, 1e-6)
    assert torch.equal(y, fused.linear_ref(x, w, nw, 1e-6))
    r = torch.randn(5, 32).to(bf)
    r0 = r.clone()
    z = fused.linear(y, torch.randn(32, 64).to(bf), residual=r, residual_inplace=True)
    assert z is r and not torch.equal(r, r0)
    assert calls == [(5, False, False), (5, True, True)]
    assert pfs == [(None, 0), (None, 0)]
    # the next GEMM's weight as an L2 prefetch: its first SKINNY_PREFETCH_BYTES (or all of it), in 16s
    big, small = torch.randn(4096, 1024).to(bf), torch.randn(9, 3).to(bf)  # 8 MiB; 54 bytes
    fused.linear(x, w, prefetch=big)
    fused.linear(x, w, prefetch=small)
    assert pfs[2][0] is big and pfs[2][1] == fused.SKINNY_PREFETCH_BYTES == 4 << 20
    assert pfs[3][0] is small and pfs[3][1] == 48
    for pf in pfs[2:4]:  # what the route passes, the op's own checks accept
        assert _cpp.skinny_problem(x, w, None, None, 0, 0, *pf) is None
    # not contiguous / unaligned / < 16 bytes / another device / not a tensor: no prefetch, no error
    for bad in (big.t(), torch.randn(9).to(bf)[1:], torch.randn(1).to(bf), big.to("meta"), [big]):
        fused.linear(x, w, prefetch=bad)
        assert pfs[-1] == (None, 0)
    monkeypatch.setattr(fused, "SKINNY_PREFETCH_BYTES", 0)  # off
    fused.linear(x, w, prefetch=big)
    assert pfs[-1] == (None, 0)
    monkeypatch.setattr(fused, "USE_SKINNY_GEMM", False)
    assert not take(x, w, None)


def test_skinny_gemm_input_errors():
    """``_cpp.skinny_gemm`` refuses inputs outside the kernel's contract with a ``ValueError`` naming
    the argument, before the op runs (on the CPU: after every other check, "must be CUDA")."""
    bf = torch.bfloat16
    w = torch.randn(64, 32).to(bf)
    cases = [((torch.randn(17, 32).to(bf), w), "1..16 rows"), ((torch.randn(4, 32), w.float()), "bfloat16 or float16"),
             ((torch.randn(4, 32).to(bf), w.half()), "one dtype"),
             ((torch.randn(4, 36).to(bf), torch.randn(64, 36).to(bf)), "K % 8"),
             ((torch.randn(4, 32).to(bf), torch.randn(64, 40).to(bf)), "w must be"),
             ((torch.randn(4, 32).to(bf), w.t().contiguous().t()), "contiguous"),
             ((torch.randn(4, 32).to(bf), w, torch.randn(4, 63).to(bf)), "residual must be"),
             ((torch.randn(4, 32).to(bf), w, None, torch.randn(1, 64).to(bf).expand(4, 64)), "out must be"),
             ((torch.randn(4, 32).to(bf), w.to("meta")), "one device"),
             ((torch.randn(4, 32).to(bf), w), "CUDA tensors")]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            _cpp.skinny_gemm(*args)
    with pytest.raises(ValueError, match="warps, unroll"):
        _cpp.skinny_gemm(torch.randn(4, 32).to(bf), w, warps=2, unroll=4)
    x4 = torch.randn(4, 32).to(bf)
    nxt = torch.randn(64, 32).to(bf)  # 4096 bytes
    for kw, msg in ((dict(prefetch=nxt, prefetch_bytes=4112), "prefetch_bytes must be a multiple of 16 in 0..4096"),
                    (dict(prefetch=nxt, prefetch_bytes=8), "multiple of 16"),
                    (dict(prefetch=nxt, prefetch_bytes=16.0), "prefetch_bytes must be"),
                    (dict(prefetch=nxt.t()), "prefetch must be a contiguous"),
                    (dict(prefetch=nxt.to("meta")), "prefetch must be a contiguous"),
                    (dict(prefetch=[1]), "prefetch must be a torch.Tensor or None, got list"),
                    (dict(prefetch=nxt, prefetch_bytes=True), "prefetch_bytes must be"),
                    (dict(prefetch=nxt, prefetch_bytes=-16), "prefetch_bytes must be"),
                    (dict(prefetch=nxt.view(-1)[1:]), "16-byte aligned"),
                    (dict(prefetch_bytes=16), "prefetch_bytes needs a prefetch tensor")):
        with pytest.raises(ValueError, match=msg):
            _cpp.skinny_gemm(x4, w, **kw)
    for kw in (dict(prefetch=nxt), dict(prefetch=nxt, prefetch_bytes=4096), dict(prefetch=nxt, prefetch_bytes=0)):
        with pytest.raises(ValueError, match="CUDA tensors"):  # valid: only the device check is left
            _cpp.skinny_gemm(x4, w, **kw)
    for kw, msg in ((dict(warps="8", unroll="8"), "warps must be an int, got '8'"), (dict(warps=False), "warps must be"),
                    (dict(residual=True), "residual must be a torch.Tensor or None"), (dict(pdl="no"), "pdl must be")):
        with pytest.raises(ValueError, match=msg):
            _cpp.skinny_gemm(x4, w, **kw)
    with pytest.raises(ValueError, match="x must be a torch.Tensor"):
        _cpp.skinny_gemm(None, w)
    with pytest.raises(ValueError, match="not overlap w"):  # out inside w's memory
        _cpp.skinny_gemm(x4, w, out=w.view(-1)[: 4 * 64].view(4, 64))
    buf = torch.randn(4, 128).to(bf)  # out overlapping x / part of the residual; the residual itself is fine
    with pytest.raises(ValueError, match="not overlap x"):
        _cpp.skinny_gemm(buf[:, :32], w, out=buf[:, 64:])
    r = torch.randn(4, 128).to(bf)
    with pytest.raises(ValueError, match="residual itself"):
        _cpp.skinny_gemm(torch.randn(4, 32).to(bf), w, r[:, :64], out=r[:, 32:96])
    with pytest.raises(ValueError, match="CUDA tensors"):
        _cpp.skinny_gemm(torch.randn(4, 32).to(bf), w, r[:, :64], out=r[:, :64])


def test_skinny_fp8_rule_and_route(monkeypatch):
    """Float8 weights (``Fp8Weight``) of 2..``SKINNY_MAX_M`` bf16 rows go to the skinny GEMM's float8 form
    (``_cpp.skinny_gemm_fp8``) once built and switched on (``fused.USE_SKINNY_FP8``, off by default: the
    float8 absorb window it serves costs more acceptance than it saves, RESULTS.md "Session 29"), not to
    the row GEMV; through ``linear`` (its RMSNorm first, the residual in
    place), ``linear_gating`` (the gating kernel after it) and ``silu_mul_linear``. One row, 9 rows (even with
    ``SKINNY_MAX_M`` raised to 9: the float8 form has one 8-row tile), fp32
    activations, ``K % 16 != 0`` or the switch off do not; the op's own checks refuse bad inputs by name
    (the kernel itself: tests/test_skinny_gemm_gpu.py)."""
    from vllm_specla.ops import fused

    monkeypatch.setattr(fused, "_on_gpu", lambda x: True)
    monkeypatch.setattr(_cpp, "GEMM_LOADED", True)
    bf = torch.bfloat16
    w8 = fused.quantize_fp8(torch.randn(64, 32), bf)
    take = fused._skinny_fp8_takes
    assert not take(torch.randn(3, 32).to(bf), w8, None)  # the switch is off by default
    monkeypatch.setattr(fused, "USE_SKINNY_FP8", True)
    assert all(take(torch.randn(m, 32).to(bf), w8, None) for m in range(2, fused.SKINNY_MAX_M + 1))
    assert not take(torch.randn(1, 32).to(bf), w8, None)
    assert not take(torch.randn(fused.SKINNY_MAX_M + 1, 32).to(bf), w8, None)
    monkeypatch.setattr(fused, "SKINNY_MAX_M", 9)  # the float8 form has one 8-row tile whatever the bf16 limit
    assert take(torch.randn(8, 32).to(bf), w8, None) and not take(torch.randn(9, 32).to(bf), w8, None)
    monkeypatch.setattr(fused, "SKINNY_MAX_M", 8)
    assert not take(torch.randn(3, 24).to(bf), fused.quantize_fp8(torch.randn(64, 24), bf), None)  # K % 16
    assert not take(torch.randn(3, 32), fused.quantize_fp8(torch.randn(64, 32)), None)  # fp32 activations
    assert not take(torch.randn(3, 32).to(bf), w8, torch.randn(3, 63).to(bf))  # residual shape
    assert fused._rows_impl(torch.randn(3, 32).to(bf), w8) is None  # not the row GEMV's
    calls = []

    def fake(x, w, scale, residual=None, out=None, warps=0, unroll=0, pdl=None):
        calls.append((x.shape[0], residual is not None, out is not None and out is residual))
        y = fused.Fp8Weight(w, scale, bf).ref_linear(x, residual)
        return out.copy_(y) if out is not None else y

    real = _cpp.skinny_gemm_fp8
    monkeypatch.setattr(_cpp, "skinny_gemm_fp8", fake)
    x, nw = torch.randn(5, 32).to(bf), torch.rand(32) + 0.5
    y = fused.linear(x, w8, nw, 1e-6)
    assert torch.equal(y, w8.ref_linear(fused.rms_norm_ref(x, nw, 1e-6, bf)))
    r = torch.randn(5, 64).to(bf)
    assert fused.linear(x, w8, residual=r, residual_inplace=True) is r
    A_log, dt_bias = torch.rand(4), torch.randn(4)
    p, g, beta = fused.linear_gating(x, w8, nw, 1e-6, 40, A_log, dt_bias)
    g_ref, b_ref = fused.gdn_gating_masked_ref(p[:, 40:44], p[:, 44:48], A_log, dt_bias)
    assert torch.equal(g, g_ref) and torch.equal(beta, b_ref)
    wd = fused.quantize_fp8(torch.randn(16, 32), bf)
    fused.silu_mul_linear(torch.randn(5, 64).to(bf), wd)
    assert calls == [(5, False, False), (5, True, True), (5, False, False), (5, False, False)]
    with pytest.raises(ValueError, match="K % 16"):
        real(torch.randn(3, 24).to(bf), torch.zeros(8, 24, dtype=torch.float8_e4m3fn), torch.ones(8))
    with pytest.raises(ValueError, match="w_scale"):
        real(torch.randn(3, 32).to(bf), w8.weight, torch.ones(63))
    with pytest.raises(ValueError, match="CUDA"):
        real(torch.randn(3, 32).to(bf), w8.weight, w8.scale)


@pytest.mark.parametrize("one", [False, True])
def test_fp8_gathered_o_proj_dispatch(monkeypatch, one):
    """The absorb's gathered ``o_proj`` on a float8 weight (``gated_norm_linear(rows=)``, ``o`` in float32 as the
    recurrence writes it): with ``fused.FP8_GATHER_ONE_LAUNCH`` one row-GEMV call that gathers the rows itself,
    output and activation rounding in the weight's dtype (``out_dtype``); without it the rows are gathered first
    and the GEMV runs on the normed bf16 rows. Model-dtype weights are not affected, nor are float8 calls without
    ``rows``. Routed through a recording stand-in for ``triton_fused.gemv_rows`` (the kernel itself:
    tests/test_fused_gpu.py)."""
    from vllm_specla.ops import fused, triton_fused

    monkeypatch.setattr(fused, "_on_gpu", lambda x: True)
    monkeypatch.setattr(fused, "FP8_GATHER_ONE_LAUNCH", one)
    bf = torch.bfloat16
    w8 = fused.quantize_fp8(torch.randn(24, 64), bf)
    calls = []

    def fake(x, w, norm_weight=None, eps=1e-6, residual=None, out=None, **kw):
        calls.append(dict(kw, x_dtype=x.dtype))
        m = kw["x_rows"].numel() if kw.get("x_rows") is not None else x.shape[0]
        return torch.zeros(m, w.shape[0], dtype=kw.get("out_dtype") or x.dtype)

    monkeypatch.setattr(triton_fused, "gemv_rows", fake)
    o, gate, nw = torch.randn(5, 2, 32), torch.randn(5, 64).to(bf), torch.rand(32) + 0.5
    res = torch.randn(5, 24).to(bf)
    y = fused.gated_norm_linear(o, gate, nw, 1e-6, "silu", w8, residual=res, rows=torch.tensor([4, 1]))
    assert y.shape == (2, 24) and y.dtype == bf and len(calls) == 1
    kw = calls[0]
    if one:
        assert kw["prologue"] == "gated_rms_norm" and kw["out_dtype"] == bf and kw["x_rows"].tolist() == [4, 1]
        assert kw["x_dtype"] == torch.float32
    else:  # gathered and normed first: the GEMV reads bf16 rows, no prologue, no gather
        assert kw.get("x_rows") is None and kw.get("prologue") is None and kw["x_dtype"] == bf
    calls.clear()
    fused.gated_norm_linear(o, gate, nw, 1e-6, "silu", w8, residual=res.clone())  # (no rows: never one launch)
    assert calls[-1].get("x_rows") is None and calls[-1].get("out_dtype") is None


def test_conv_step_env_values():
    """A bad value of the one-launch conv step's switch fails at import with the variable and the allowed values
    named; the valid ones import."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    var, module, msg = "VLLM_SPECLA_CONV_STEP", "vllm_specla.ops.chain_verify", "VLLM_SPECLA_CONV_STEP must be '0'"
    for val, ok in (("bogus", False), ("", True), ("1", True)):
        r = subprocess.run([sys.executable, "-c", f"import {module}"], env=dict(env, **{var: val}), capture_output=True,
                           text=True, timeout=300)
        assert (r.returncode == 0) == ok, r.stderr[-2000:]
        if not ok:
            assert msg in r.stderr
