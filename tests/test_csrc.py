"""C++ CPU ops (``csrc/``, ``torch.ops.vllm_specla.*``) vs the plain-torch references.

Every op is compared with its reference on random inputs (never zeros, banks pre-filled with random
values so that untouched entries are checked too) on clones of the same state: outputs, the
state, every factor bank and the conv window, for fp32 and bf16 token inputs, odd sizes
(H=2, HV=6, K=24, V=40: GVA, V not a multiple of the 32-row value block), several rows on
permuted slots of a larger cache, with and without pending factors, every accepted prefix
(recover / conv_commit for A = 0..T), every node of random trees and forests, and a state that
is a strided view into a larger page (as vLLM binds it).

Tolerances: recurrent ops fp32 ``atol=2e-5, rtol=1e-4`` (same math in fp32, only the summation
order differs; bf16 inputs are upcast identically on both sides, so the same tolerance);
conv ops ``atol=1e-6, rtol=1e-5`` (identical sums, SiLU's exp may differ in the last ulp);
conv_commit and the recorded raw inputs / k^ / g are exact copies (compared exactly).

Skipped when the extension is not built (``pip install`` without a compiler or under build
isolation); ``VLLM_SPECLA_REQUIRE_CPP=1`` (set by ``.ci/run``) turns that skip into a failure.
"""

from __future__ import annotations

import os
import random
import zlib

import pytest
import torch

from vllm_specla.ops import _cpp
from vllm_specla.ops.reference import chain_verify_ref, conv_commit_ref, conv_verify_ref, recover_ref
from vllm_specla.ops.tree_reference import tree_verify_ref, tree_verify_sequential_ref

REQUIRE_CPP = os.environ.get("VLLM_SPECLA_REQUIRE_CPP", "0") not in ("", "0")  # set by .ci/run
if not _cpp.AVAILABLE and not REQUIRE_CPP:
    pytest.skip(f"C++ CPU ops not built: {_cpp.LOAD_ERROR}", allow_module_level=True)
_MISSING_REPORTED = []


@pytest.fixture(autouse=True)
def _require_cpp():
    """With VLLM_SPECLA_REQUIRE_CPP=1 a missing extension is one test error (the first test of this
    module; the others skip with the same reason) instead of a module skip. Not a collection error,
    which would stop the whole pytest session before any other test runs."""
    if _cpp.AVAILABLE:
        return
    msg = f"VLLM_SPECLA_REQUIRE_CPP=1 but the C++ ops are not available: {_cpp.LOAD_ERROR}"
    if not _MISSING_REPORTED:
        _MISSING_REPORTED.append(msg)
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)

TOL = dict(atol=2e-5, rtol=1e-4)
CONV_TOL = dict(atol=1e-6, rtol=1e-5)
SHAPES = [(2, 6, 24, 40), (3, 3, 17, 33)]  # (H, HV, K, V)


class Case:
    """Random verify inputs: rows of ``lens`` tokens on random slots of an ``S``-slot cache."""

    def __init__(self, lens, H, HV, K, V, *, S=5, Tmax=None, dtype=torch.float32, seed=0, pending=None,
                 page_view=False):
        gen = torch.Generator().manual_seed(seed)
        self.lens, self.H, self.HV, self.K, self.V = lens, H, HV, K, V
        R, N = len(lens), sum(lens)
        Tmax = Tmax or max(max(lens), 1) + 1
        self.q = torch.randn(N, H, K, generator=gen).to(dtype)
        self.k = torch.randn(N, H, K, generator=gen).to(dtype)
        self.v = torch.randn(N, HV, V, generator=gen).to(dtype)
        self.g = -torch.rand(N, HV, generator=gen) * 0.7 - 0.01
        self.beta = torch.rand(N, HV, generator=gen) * 0.9 + 0.05
        self.scale = K ** -0.5
        self.cu = torch.tensor([0] + list(lens)).cumsum(0)
        self.slots = torch.randperm(S, generator=gen)[:R]
        if page_view:  # state as a strided view [S, HV, V, K] into a page [S, P] (vLLM state pages)
            page = torch.randn(S, HV * V * K + 37, generator=gen) * 0.3
            self.state = page[:, 5:5 + HV * V * K].view(S, HV, V, K)
            assert not self.state.is_contiguous()
        else:
            self.state = torch.randn(S, HV, V, K, generator=gen) * 0.3
        self.bank_k = torch.nn.functional.normalize(torch.randn(S, 2, Tmax, H, K, generator=gen), dim=-1)
        self.bank_v = torch.randn(S, 2, Tmax, HV, V, generator=gen)
        self.bank_g = -torch.rand(S, 2, Tmax, HV, generator=gen) * 0.5 - 0.01
        self.read_bank = torch.randint(0, 2, (R,), generator=gen)
        self.write_bank = 1 - self.read_bank
        self.pending = torch.tensor(pending if pending is not None else [0] * R)

    def mutables(self):
        return [self.state, self.bank_k, self.bank_v, self.bank_g]

    def clone_mutables(self):
        return [t.clone() for t in self.mutables()]

    def kwargs(self, muts, record=True, pending=True, write_final_state=None):
        st, bk, bv, bg = muts
        kw = dict(scale=self.scale, state=st, slots=self.slots, cu_seqlens=self.cu, bank_k=bk, bank_v=bv, bank_g=bg,
                  write_bank=self.write_bank if record else None,
                  pending_len=self.pending if pending else None, read_bank=self.read_bank if pending else None)
        if write_final_state is not None:
            kw["write_final_state"] = write_final_state
        return kw

    def tensors(self):
        return self.q, self.k, self.v, self.g, self.beta


def assert_all_close(got, exp, **tol):
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, **tol)


def force_ut(monkeypatch, build="", tpc=None, nw=None):
    """Force the CUDA UT kernel (VLLM_SPECLA_CUDA_LAYOUT=ut) with build variant ``build`` ('' =
    automatic), ``tpc`` value tiles per CTA and ``nw`` warps per CTA when given; JIT-load the ops."""
    monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", "ut")
    monkeypatch.setenv("VLLM_SPECLA_CUDA_UT_VAR", build)
    if nw is not None:
        monkeypatch.setenv("VLLM_SPECLA_CUDA_UT_NW", nw)
    if tpc is not None:
        monkeypatch.setenv("VLLM_SPECLA_CUDA_UT_TPC", str(tpc))
    assert _cpp.load_cuda()


def assert_matches_reference(c, record=True, pending=True, wfs=None, dev="cuda"):
    """Run case ``c`` through chain_verify_ref (CPU) and ``_cpp.chain_verify`` on ``dev``, each on its own
    copy of the state and factor banks, and assert the outputs and every mutated tensor equal within
    TOL. ``record`` / ``pending`` / ``wfs``: as :meth:`Case.kwargs`."""
    m_ref = c.clone_mutables()
    o_ref = chain_verify_ref(*c.tensors(), **c.kwargs(m_ref, record, pending, wfs))
    m_dev = [t.to(dev, copy=True) for t in c.mutables()]
    kw = {a: (t.to(dev) if isinstance(t, torch.Tensor) else t) for a, t in c.kwargs(m_dev, record, pending, wfs).items()}
    o = _cpp.chain_verify(*(t.to(dev) for t in c.tensors()), **kw)
    torch.testing.assert_close(o.cpu(), o_ref, **TOL)
    assert_all_close([t.cpu() for t in m_dev], m_ref, **TOL)


# --------------------------------------------------------------------------------------------
# chain verify
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["spec", "spec_pending", "ar", "ar_pending", "plain"])
def test_chain_verify_matches_reference(dtype, shape, mode):
    H, HV, K, V = shape
    lens = [5, 1, 3] if mode.startswith("spec") else [1, 1, 2]
    pend = [3, 0, 2] if mode.endswith("pending") else None
    c = Case(lens, H, HV, K, V, dtype=dtype, seed=hash((mode, shape)) % 1000, pending=pend)
    record = mode.startswith("spec")
    wfs = mode.startswith("ar")
    use_pending = pend is not None
    m_ref, m_cpp = c.clone_mutables(), c.clone_mutables()
    o_ref = chain_verify_ref(*c.tensors(), **c.kwargs(m_ref, record, use_pending, wfs))
    o_cpp = _cpp.chain_verify(*c.tensors(), **c.kwargs(m_cpp, record, use_pending, wfs))
    assert o_cpp.dtype == torch.float32 and o_cpp.shape == o_ref.shape
    torch.testing.assert_close(o_cpp, o_ref, **TOL)
    assert_all_close(m_cpp, m_ref, **TOL)
    if not (use_pending or wfs):
        assert torch.equal(m_cpp[0], c.state), "a speculative verify must not write the state"
    if record:  # k^ and g are copied verbatim
        torch.testing.assert_close(m_cpp[1], m_ref[1], atol=1e-7, rtol=1e-6)
        assert torch.equal(m_cpp[3], m_ref[3])


def test_chain_verify_no_l2norm_and_strided_state_view():
    c = Case([4, 2], 2, 6, 24, 40, seed=3, pending=[2, 1], page_view=True)
    m_ref, m_cpp = c.clone_mutables(), [c.state] + [t.clone() for t in c.mutables()[1:]]
    m_ref[0] = c.state.clone()
    o_ref = chain_verify_ref(*c.tensors(), use_qk_l2norm=False, **c.kwargs(m_ref))
    o_cpp = _cpp.chain_verify(*c.tensors(), use_qk_l2norm=False, **c.kwargs(m_cpp))
    torch.testing.assert_close(o_cpp, o_ref, **TOL)
    assert_all_close(m_cpp, m_ref, **TOL)


@pytest.mark.parametrize("K_draft", [1, 4, 7])
def test_verify_then_recover_every_prefix(K_draft):
    """Chain verify + DeltaConstruct for EVERY accepted prefix A = 0..T, C++ vs reference, and the
    C++ fused pending fold in the next verify == C++ recover then verify."""
    T = K_draft + 1
    H, HV, K, V = 2, 6, 24, 40
    c = Case([T, T, T], H, HV, K, V, seed=K_draft, Tmax=T)
    m_ref, m_cpp = c.clone_mutables(), c.clone_mutables()
    chain_verify_ref(*c.tensors(), **c.kwargs(m_ref, pending=False))
    _cpp.chain_verify(*c.tensors(), **c.kwargs(m_cpp, pending=False))
    assert_all_close(m_cpp, m_ref, **TOL)
    for A in range(T + 1):
        acc = torch.tensor([A, max(A - 1, 0), T - A])
        st_ref, st_cpp = m_ref[0].clone(), m_cpp[0].clone()
        recover_ref(st_ref, c.slots, m_ref[1], m_ref[2], m_ref[3], c.write_bank, acc)
        _cpp.recover(st_cpp, c.slots, m_cpp[1], m_cpp[2], m_cpp[3], c.write_bank, acc)
        torch.testing.assert_close(st_cpp, st_ref, **TOL)
        others = [i for i in range(st_cpp.shape[0]) if i not in c.slots.tolist()]
        assert torch.equal(st_cpp[others], m_cpp[0][others])
        # next window with the accepted prefix pending (fused commit) == recover then verify
        c2 = Case([2, T, 1], H, HV, K, V, seed=100 + A)
        nxt = dict(scale=c.scale, slots=c.slots, cu_seqlens=c2.cu, write_bank=c.read_bank)
        b_sep = [t.clone() for t in m_cpp[1:]]
        o_sep = _cpp.chain_verify(*c2.tensors(), state=st_cpp, bank_k=b_sep[0], bank_v=b_sep[1], bank_g=b_sep[2],
                                  **nxt)
        st_f = m_cpp[0].clone()
        b_f = [t.clone() for t in m_cpp[1:]]
        o_f = _cpp.chain_verify(*c2.tensors(), state=st_f, bank_k=b_f[0], bank_v=b_f[1], bank_g=b_f[2],
                                pending_len=acc, read_bank=c.write_bank, **nxt)
        torch.testing.assert_close(o_f, o_sep, **TOL)
        torch.testing.assert_close(st_f, st_cpp, **TOL)


def test_chain_verify_same_read_and_write_bank():
    """read_bank == write_bank (not used by the runtime): the pending fold reads before the window writes."""
    c = Case([3, 2], 2, 6, 24, 40, seed=11, pending=[2, 3])
    c.write_bank = c.read_bank.clone()
    m_ref, m_cpp = c.clone_mutables(), c.clone_mutables()
    o_ref = chain_verify_ref(*c.tensors(), **c.kwargs(m_ref))
    o_cpp = _cpp.chain_verify(*c.tensors(), **c.kwargs(m_cpp))
    torch.testing.assert_close(o_cpp, o_ref, **TOL)
    assert_all_close(m_cpp, m_ref, **TOL)


def test_chain_verify_rejects_long_window_and_empty_rows_ok():
    c = Case([4], 2, 6, 24, 40, Tmax=3)
    with pytest.raises(ValueError, match="exceeds the factor bank"):
        _cpp.chain_verify(*c.tensors(), **c.kwargs(c.clone_mutables(), pending=False))
    # zero-length rows are valid (pending fold only)
    c = Case([0, 3], 2, 6, 24, 40, pending=[2, 0], seed=4)
    m_ref, m_cpp = c.clone_mutables(), c.clone_mutables()
    o_ref = chain_verify_ref(*c.tensors(), **c.kwargs(m_ref))
    o_cpp = _cpp.chain_verify(*c.tensors(), **c.kwargs(m_cpp))
    torch.testing.assert_close(o_cpp, o_ref, **TOL)
    assert_all_close(m_cpp, m_ref, **TOL)


def test_dispatchers_use_cpp_on_cpu(monkeypatch):
    from vllm_specla.ops import chain_verify as cv_mod  # noqa: PLC0415
    from vllm_specla.ops import recover as rec_mod  # noqa: PLC0415

    calls = []
    for name in ("chain_verify", "conv_verify", "recover", "conv_commit"):
        real = getattr(_cpp, name)
        monkeypatch.setattr(_cpp, name, lambda *a, _r=real, _n=name, **kw: (calls.append(_n), _r(*a, **kw))[1])
    c = Case([3, 2], 2, 6, 24, 40, seed=5, pending=[1, 2])
    m_ref, m_cpp = c.clone_mutables(), c.clone_mutables()
    o = cv_mod.chain_verify(*c.tensors(), **c.kwargs(m_cpp))
    torch.testing.assert_close(o, chain_verify_ref(*c.tensors(), **c.kwargs(m_ref)), **TOL)
    rec_mod.recover(m_cpp[0], c.slots, m_cpp[1], m_cpp[2], m_cpp[3], c.write_bank, torch.tensor([2, 1]))
    cc = ConvCase([3, 2], C=20, seed=5)
    cv_mod.conv_verify(cc.x, cc.w, cc.cu, cc.conv.clone(), cc.slots)
    rec_mod.conv_commit(cc.conv.clone(), cc.slots, cc.bank_x, cc.read_bank, torch.tensor([1, 2]))
    assert calls == ["chain_verify", "recover", "conv_verify", "conv_commit"]


def test_check_mode_compares_with_reference(monkeypatch):
    """VLLM_SPECLA_CPP_CHECK (debug): every op also runs its reference on copies of the rows' slots."""
    monkeypatch.setattr(_cpp, "CHECK", True)
    c = Case([3, 2], 2, 6, 24, 40, seed=12, pending=[1, 2], page_view=True)
    m = c.clone_mutables()
    m[0] = c.state
    _cpp.chain_verify(*c.tensors(), **c.kwargs(m))
    _cpp.recover(m[0], c.slots, m[1], m[2], m[3], c.write_bank, torch.tensor([2, 1]))
    cc = ConvCase([3, 2], C=20, seed=12, pending=[1, 2])
    _cpp.conv_verify(cc.x, cc.w, cc.cu, cc.conv, cc.slots, bank_x=cc.bank_x, write_bank=cc.write_bank,
                     pending_len=cc.pending, read_bank=cc.read_bank)
    _cpp.conv_commit(cc.conv, cc.slots, cc.bank_x, cc.read_bank, torch.tensor([1, 2]))
    # a wrong kernel is caught
    def wrong_recover(state, *args):
        state.add_(1.0)

    monkeypatch.setattr(torch.ops.vllm_specla, "recover", wrong_recover, raising=False)
    with pytest.raises(RuntimeError, match="differs from recover_ref"):
        _cpp.recover(m[0], c.slots, m[1], m[2], m[3], c.write_bank, torch.tensor([2, 1]))


# --------------------------------------------------------------------------------------------
# tree verify (sequential per-node form)
# --------------------------------------------------------------------------------------------


def random_tree(T, rng, forest=False):
    return [-1] + [rng.randint(-1 if forest else 0, t - 1) for t in range(1, T)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("forest", [False, True])
def test_tree_verify_every_node_matches_reference(dtype, pending, forest):
    rng = random.Random(7 + 2 * pending + forest)
    lens = [9, 1, 6]
    trees = [random_tree(T, rng, forest) for T in lens]
    trees[2] = list(range(-1, 5))  # a chain row
    parents = torch.tensor([p for t in trees for p in t])
    c = Case(lens, 2, 6, 24, 40, dtype=dtype, seed=rng.randrange(1000), pending=[2, 1, 0] if pending else None)
    m_ref, m_cpp = c.clone_mutables(), c.clone_mutables()
    kw_ref = c.kwargs(m_ref, pending=pending)
    kw_cpp = c.kwargs(m_cpp, pending=pending)
    o_ref = tree_verify_sequential_ref(*c.tensors(), parents=parents, **kw_ref)
    o_cpp = _cpp.tree_verify(*c.tensors(), parents=parents, **kw_cpp)
    for n in range(sum(lens)):  # every node
        torch.testing.assert_close(o_cpp[n], o_ref[n], **TOL)
    assert_all_close(m_cpp, m_ref, **TOL)
    # a chain row of the tree op == chain verify
    s = int(c.cu[2])
    m2 = c.clone_mutables()
    o_chain = _cpp.chain_verify(*c.tensors(), **c.kwargs(m2, pending=pending))
    torch.testing.assert_close(o_cpp[s:], o_chain[s:], **TOL)


@pytest.mark.parametrize("pending", [False, True])
def test_tree_dispatcher_uses_cpp_on_cpu(monkeypatch, pending):
    """ops.tree_verify sends non-chain CPU trees (and forests) to the C++ op; == tree_verify_ref at
    every node, state and banks; chains still go to chain verify; tree_conv stays on the torch
    reference (no C++ tree conv op)."""
    from vllm_specla.ops import tree_verify as tv_mod  # noqa: PLC0415

    calls = []
    for name in ("tree_verify", "chain_verify"):
        real = getattr(_cpp, name)
        monkeypatch.setattr(_cpp, name, lambda *a, _r=real, _n=name, **kw: (calls.append(_n), _r(*a, **kw))[1])
    rng = random.Random(31 + pending)
    for it in range(4):
        lens = [rng.randint(2, 16) for _ in range(3)] + [1]
        trees = [random_tree(T, rng, forest=(it % 2 == 1)) for T in lens]
        trees[1] = [-1] + [0] * (lens[1] - 1)  # a star
        parents = torch.tensor([p for t in trees for p in t])
        c = Case(lens, 2, 6, 24, 40, seed=rng.randrange(1000), pending=[2, 0, 1, 3] if pending else None)
        m_ref, m_cpp = c.clone_mutables(), c.clone_mutables()
        o_ref = tree_verify_ref(*c.tensors(), parents=parents, **c.kwargs(m_ref, pending=pending))
        calls.clear()
        o = tv_mod.tree_verify(*c.tensors(), parents=parents, **c.kwargs(m_cpp, pending=pending))
        assert calls == ["tree_verify"]
        for n in range(sum(lens)):
            torch.testing.assert_close(o[n], o_ref[n], **TOL)
        assert_all_close(m_cpp, m_ref, **TOL)
    # a chain topology: chain verify (C++), not the tree op
    c = Case([4, 2], 2, 6, 24, 40, seed=3)
    calls.clear()
    tv_mod.tree_verify(*c.tensors(), parents=torch.tensor([-1, 0, 1, 2, -1, 0]),
                       **c.kwargs(c.clone_mutables(), pending=False))
    assert calls == ["chain_verify"]


def test_tree_verify_check_mode(monkeypatch):
    """VLLM_SPECLA_CPP_CHECK covers the tree op too (the dispatcher now routes trees to it)."""
    monkeypatch.setattr(_cpp, "CHECK", True)
    c = Case([5, 3], 2, 6, 24, 40, seed=13, pending=[1, 2])
    _cpp.tree_verify(*c.tensors(), parents=torch.tensor([-1, 0, 0, 1, 1, -1, 0, 0]), **c.kwargs(c.clone_mutables()))

    def wrong_tree(*args):
        return torch.ops.vllm_specla.chain_verify(*args[:9], *args[10:16], False, args[16])

    monkeypatch.setattr(torch.ops.vllm_specla, "tree_verify", wrong_tree, raising=False)
    with pytest.raises(RuntimeError, match="differs from tree_verify_sequential_ref"):
        _cpp.tree_verify(*c.tensors(), parents=torch.tensor([-1, 0, 0, 1, 1, -1, 0, 0]),
                         **c.kwargs(c.clone_mutables()))


def test_tree_verify_rejects_bad_parents():
    c = Case([3], 2, 6, 24, 40)
    with pytest.raises(ValueError, match="topological"):
        _cpp.tree_verify(*c.tensors(), parents=[-1, 2, 0], **c.kwargs(c.clone_mutables(), pending=False))


# --------------------------------------------------------------------------------------------
# conv verify / conv commit
# --------------------------------------------------------------------------------------------


class ConvCase:
    def __init__(self, lens, C=300, W=4, S=4, Tmax=None, dtype=torch.float32, conv_dtype=torch.float32, seed=0,
                 pending=None):
        gen = torch.Generator().manual_seed(seed)
        R, N = len(lens), sum(lens)
        Tmax = Tmax or max(max(lens), 1) + 1
        self.x = torch.randn(N, C, generator=gen).to(dtype)
        self.w = torch.randn(C, W, generator=gen).to(dtype)
        self.cu = torch.tensor([0] + list(lens)).cumsum(0)
        self.slots = torch.randperm(S, generator=gen)[:R]
        self.conv = torch.randn(S, W - 1, C, generator=gen).to(conv_dtype)
        self.bank_x = torch.randn(S, 2, Tmax, C, generator=gen)
        self.read_bank = torch.randint(0, 2, (R,), generator=gen)
        self.write_bank = 1 - self.read_bank
        self.pending = torch.tensor(pending if pending is not None else [0] * R)


@pytest.mark.parametrize("dtype,conv_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                              (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("mode", ["spec", "spec_pending", "ar", "ar_pending"])
def test_conv_verify_matches_reference(dtype, conv_dtype, mode):
    lens = [5, 1, 3] if mode.startswith("spec") else [1, 1, 1]
    pend = [3, 1, 5] if mode.endswith("pending") else None
    c = ConvCase(lens, dtype=dtype, conv_dtype=conv_dtype, seed=len(mode), pending=pend, Tmax=5)
    record, wfs = mode.startswith("spec"), mode.startswith("ar")
    res = []
    for fn in (conv_verify_ref, _cpp.conv_verify):
        conv, bank_x = c.conv.clone(), c.bank_x.clone()
        y = fn(c.x, c.w, c.cu, conv, c.slots, bank_x=bank_x, write_bank=c.write_bank if record else None,
               pending_len=c.pending if pend else None, read_bank=c.read_bank if pend else None,
               write_final_state=wfs)
        res.append((y, conv, bank_x))
    (y_r, conv_r, bx_r), (y_c, conv_c, bx_c) = res
    assert y_c.dtype == torch.float32
    torch.testing.assert_close(y_c, y_r, **CONV_TOL)
    assert torch.equal(conv_c, conv_r)
    assert torch.equal(bx_c, bx_r)


@pytest.mark.parametrize("conv_dtype", [torch.float32, torch.bfloat16])
def test_conv_commit_every_prefix(conv_dtype):
    T = 5
    c = ConvCase([T, T, T], C=300, conv_dtype=conv_dtype, Tmax=T, seed=2)
    for A in range(T + 1):
        acc = torch.tensor([A, T - A, min(A, 2)])
        conv_r, conv_c = c.conv.clone(), c.conv.clone()
        conv_commit_ref(conv_r, c.slots, c.bank_x, c.read_bank, acc)
        _cpp.conv_commit(conv_c, c.slots, c.bank_x, c.read_bank, acc)
        assert torch.equal(conv_c, conv_r)


# --------------------------------------------------------------------------------------------
# argument checks: the C++ ops and the references refuse the same inputs with the same ValueError
# --------------------------------------------------------------------------------------------

BACKENDS = {
    "reference": dict(chain=chain_verify_ref, tree=tree_verify_sequential_ref, conv=conv_verify_ref,
                      recover=recover_ref, commit=conv_commit_ref),
    "cpp": dict(chain=_cpp.chain_verify, tree=_cpp.tree_verify, conv=_cpp.conv_verify, recover=_cpp.recover,
                commit=_cpp.conv_commit),
}
# (rows [3, 2] on slots [3, 1] of 5, Tmax 4; a change to the call's keyword arguments, and the error it raises)
BAD_ROWS = [
    ({"slots": [3, 5]}, r"slots must be in \[0, 4\], got 5"),
    ({"slots": [-1, 1]}, r"slots must be in \[0, 4\], got -1"),
    ({"slots": [3]}, r"slots must have an entry for each of the 2 rows, got 1"),
    ({"cu_seqlens": [0, 4, 3]}, r"cu_seqlens must be non-decreasing within \[0, 5\]"),
    ({"cu_seqlens": [0, 3, 6]}, r"cu_seqlens must be non-decreasing within \[0, 5\]"),
    ({"cu_seqlens": [-1, 3, 5]}, r"cu_seqlens must be non-decreasing within \[0, 5\]"),
    ({"write_bank": [0, 2]}, r"write_bank must be in \[0, 1\], got 2"),
    ({"write_bank": [1]}, r"write_bank must have an entry for each of the 2 rows, got 1"),
    ({"read_bank": [2, 0]}, r"read_bank must be in \[0, 1\], got 2"),
    ({"read_bank": [0]}, r"read_bank must have an entry for each of the 2 rows, got 1"),
    ({"pending_len": [2]}, r"pending_len must have an entry for each of the 2 rows, got 1"),
    ({"read_bank": None}, r"pending_len > 0 needs read_bank and the factor banks"),
    ({"banks": None, "write_bank": None}, r"pending_len > 0 needs read_bank and the factor banks"),
    ({"banks": None, "pending_len": None, "read_bank": None}, r"write_bank needs the factor banks"),
]


def _bad_call(change):
    """The keyword arguments of a verify call on rows [3, 2] (row 0 with 2 pending factors) with ``change``
    applied (lists become int64 tensors; ``banks``: None drops the factor banks)."""
    c = Case([3, 2], 2, 6, 24, 40, seed=21, pending=[2, 0], Tmax=4)
    c.slots = torch.tensor([3, 1])
    c.read_bank, c.write_bank = torch.tensor([1, 0]), torch.tensor([0, 1])
    kw = c.kwargs(c.clone_mutables())
    for name, val in change.items():
        if name == "banks":
            kw.update(bank_k=None, bank_v=None, bank_g=None)
        else:
            kw[name] = None if val is None else torch.tensor(val)
    return c, kw


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("change,message", BAD_ROWS)
def test_chain_and_tree_verify_refuse_bad_rows(backend, change, message):
    """A slot outside the cache (a padding -1 included), a bank index of 2, a decreasing or out-of-range
    cu_seqlens, a per-row argument shorter than the rows, pending factors without a read bank / banks, or a write
    bank without banks: the C++ chain / tree verify raise the references' ValueError (they raised RuntimeError), with
    the same message naming the argument, before any state or bank is written."""
    ops = BACKENDS[backend]
    for op, extra in ((ops["chain"], {}), (ops["tree"], {"parents": torch.tensor([-1, 0, 0, -1, 0])})):
        c, kw = _bad_call(change)
        before = [t.clone() for t in c.mutables()]
        muts = [kw["state"], kw["bank_k"], kw["bank_v"], kw["bank_g"]]
        with pytest.raises(ValueError, match=message):
            op(*c.tensors(), **kw, **extra)
        assert all(m is None or torch.equal(m, b) for m, b in zip(muts, before))


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("change,message", BAD_ROWS)
def test_conv_verify_refuses_bad_rows(backend, change, message):
    """The conv verify of the same rows refuses the same inputs with the same ValueError, conv windows and bank
    untouched."""
    _, kw = _bad_call(change)
    cc = ConvCase([3, 2], C=20, S=5, Tmax=4, seed=21)
    conv, bank_x = cc.conv.clone(), cc.bank_x.clone()
    ckw = {n: kw[n] for n in ("slots", "cu_seqlens", "write_bank", "pending_len", "read_bank")}
    with pytest.raises(ValueError, match=message):
        BACKENDS[backend]["conv"](cc.x, cc.w, conv_state=conv, bank_x=None if kw["bank_k"] is None else bank_x,
                                  **ckw)
    assert torch.equal(conv, cc.conv) and torch.equal(bank_x, cc.bank_x)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_read_bank_is_checked_only_where_factors_are_pending(backend):
    """read_bank is read only on rows with pending factors: both backends check it there alone (the reference used to
    refuse a bad entry on a row without pending factors, which the C++ op accepted), and slots / banks past the rows
    of cu_seqlens are not used."""
    ops = BACKENDS[backend]
    c, kw = _bad_call({"read_bank": [1, 5], "slots": [3, 1, -1]})
    c2, kw2 = _bad_call({})
    o1 = ops["chain"](*c.tensors(), **kw)
    o2 = ops["chain"](*c2.tensors(), **kw2)
    torch.testing.assert_close(o1, o2, **TOL)
    assert torch.equal(kw["state"], kw2["state"])
    cc = ConvCase([3, 2], C=20, S=5, Tmax=4, seed=21)
    ckw = {n: kw[n] for n in ("slots", "cu_seqlens", "write_bank", "pending_len", "read_bank")}
    ops["conv"](cc.x, cc.w, conv_state=cc.conv.clone(), bank_x=cc.bank_x.clone(), **ckw)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("slots,bank_idx,num_accepted,message", [
    ([3, 5], [0, 1], [2, 1], r"slots must be in \[0, 4\], got 5"),
    ([-1, 1], [0, 1], [2, 1], r"slots must be in \[0, 4\], got -1"),
    ([3, 1], [0, 2], [2, 1], r"bank_idx must be in \[0, 1\], got 2"),
    ([3, 1], [0], [2, 1], r"bank_idx must have an entry for each of the 2 rows, got 1"),
    ([3, 1], [0, 1], [2], r"num_accepted must have an entry for each of the 2 rows, got 1"),
    ([3, 1], [0, 1], [2, 5], r"num_accepted 5 exceeds the factor bank \(Tmax=4\)"),
])
def test_recover_and_conv_commit_refuse_bad_rows(backend, slots, bank_idx, num_accepted, message):
    """recover / conv_commit: a slot outside the cache, a bank index of 2, an argument shorter than the slots or an
    accepted count above the bank's Tmax is the same ValueError in the C++ ops and the references (the reference
    used to truncate the count to Tmax; the C++ ops raised RuntimeError), nothing committed."""
    ops = BACKENDS[backend]
    c = Case([3, 2], 2, 6, 24, 40, seed=22, Tmax=4)
    st, bk, bv, bg = c.clone_mutables()
    args = [torch.tensor(a) for a in (slots, bank_idx, num_accepted)]
    with pytest.raises(ValueError, match=message):
        ops["recover"](st, args[0], bk, bv, bg, *args[1:])
    assert torch.equal(st, c.state)
    cc = ConvCase([3, 2], C=20, S=5, Tmax=4, seed=22)
    conv = cc.conv.clone()
    with pytest.raises(ValueError, match=message):
        ops["commit"](conv, args[0], cc.bank_x, *args[1:])
    assert torch.equal(conv, cc.conv)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_commit_rows_accepting_nothing_are_not_checked(backend):
    """A row that accepts nothing (0 or a negative count) is skipped unread by every backend (the Triton kernels
    too): its slot and bank index are not checked, so padding rows may carry any value."""
    ops = BACKENDS[backend]
    c = Case([3, 2], 2, 6, 24, 40, seed=23, Tmax=4)
    st, bk, bv, bg = c.clone_mutables()
    slots, banks, acc = torch.tensor([3, -1]), torch.tensor([0, 7]), torch.tensor([2, 0])
    ops["recover"](st, slots, bk, bv, bg, banks, acc)
    assert not torch.equal(st[3], c.state[3]) and torch.equal(st[:3], c.state[:3])
    cc = ConvCase([3, 2], C=20, S=5, Tmax=4, seed=23)
    conv = cc.conv.clone()
    ops["commit"](conv, slots, cc.bank_x, banks, torch.tensor([2, -3]))
    assert not torch.equal(conv[3], cc.conv[3]) and torch.equal(conv[:3], cc.conv[:3])


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("parents,message", [
    ([-1, 0, 0, -1], r"parents must be \[N\]: one entry per node \(N=5\), got 4"),
    ([-1, 0, 0, -1, 0, 1], r"parents must be \[N\]: one entry per node \(N=5\), got 6"),
    ([-1, 0, 2, -1, 0], r"parents must be topological"),
    ([-1, 0, 1, 0, 0], r"parents must be topological"),  # node 0 of row 1 has a parent: not local to the row
])
def test_tree_verify_refuses_bad_parents(backend, parents, message):
    """``parents`` with another length than the N nodes is a ValueError naming it in both backends (the reference
    raised a bare IndexError for a short one), as are non-topological or non-local parents."""
    c, kw = _bad_call({})
    with pytest.raises(ValueError, match=message):
        BACKENDS[backend]["tree"](*c.tensors(), parents=torch.tensor(parents), **kw)
    assert torch.equal(kw["state"], c.state)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_non_fp32_state_is_refused(backend):
    """The recurrent state is float32 in every backend: a bf16 state is refused by the C++ ops and the references
    alike (RuntimeError, as torch's own ops for a tensor of the wrong dtype; the reference used to compute in it)."""
    ops = BACKENDS[backend]
    c, kw = _bad_call({})
    kw["state"] = c.state.to(torch.bfloat16)
    for op, extra in ((ops["chain"], {}), (ops["tree"], {"parents": torch.tensor([-1, 0, 0, -1, 0])})):
        with pytest.raises(RuntimeError, match="state must be float32"):
            op(*c.tensors(), **kw, **extra)
    with pytest.raises(RuntimeError, match="state must be float32"):
        ops["recover"](kw["state"], c.slots, kw["bank_k"], kw["bank_v"], kw["bank_g"], c.read_bank,
                       torch.tensor([1, 1]))


def test_cpp_ops_refuse_two_rows_writing_one_slot():
    """Intended difference: the C++ ops refuse two rows that write the same state slot (their rows run in
    parallel), a ValueError naming ``slots``; the references run such rows one after the other."""
    c, kw = _bad_call({"slots": [1, 1], "pending_len": [2, 1]})  # (both rows fold pending factors into the slot)
    with pytest.raises(ValueError, match=r"slots: a state slot is written by two rows \(slot 1\)"):
        _cpp.chain_verify(*c.tensors(), **kw)
    st, bk, bv, bg = c.clone_mutables()
    with pytest.raises(ValueError, match=r"slots: a state slot is written by two rows \(slot 1\)"):
        _cpp.recover(st, torch.tensor([1, 1]), bk, bv, bg, torch.tensor([0, 1]), torch.tensor([1, 1]))


def test_pending_len_above_the_bank_clamped_by_the_reference_refused_by_cpp():
    """Intended difference (documented in chain_verify_ref / conv_verify_ref): a pending count above Tmax is
    clamped to Tmax by the reference (and the Triton kernels, which cannot raise), refused by the C++ ops with a
    ValueError naming ``pending_len``."""
    c, kw = _bad_call({"pending_len": [6, 0]})
    with pytest.raises(ValueError, match=r"pending_len 6 exceeds the factor bank \(Tmax=4\)"):
        _cpp.chain_verify(*c.tensors(), **kw)
    kw2 = dict(kw, state=c.state.clone(), pending_len=torch.tensor([4, 0]))
    o1 = chain_verify_ref(*c.tensors(), **kw)
    o2 = chain_verify_ref(*c.tensors(), **kw2)
    assert torch.equal(o1, o2) and torch.equal(kw["state"], kw2["state"])
    cc = ConvCase([3, 2], C=20, S=5, Tmax=4, seed=21)
    with pytest.raises(ValueError, match=r"pending_len 6 exceeds the factor bank \(Tmax=4\)"):
        _cpp.conv_verify(cc.x, cc.w, kw["cu_seqlens"], cc.conv.clone(), kw["slots"], bank_x=cc.bank_x,
                         pending_len=kw["pending_len"], read_bank=kw["read_bank"])


# --------------------------------------------------------------------------------------------
# registration: schemas, fake kernels (torch.compile)
# --------------------------------------------------------------------------------------------


def test_opcheck_schemas_and_fakes():
    c = Case([3, 2], 2, 6, 24, 40, seed=8, pending=[1, 2])
    st, bk, bv, bg = c.clone_mutables()
    cc = ConvCase([3, 2], C=20, seed=8, pending=[1, 2])
    tests = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.vllm_specla.chain_verify.default,
                          (*c.tensors(), c.scale, st, c.slots, c.cu, bk, bv, bg, c.write_bank, c.pending,
                           c.read_bank, False, True), test_utils=tests)
    torch.library.opcheck(torch.ops.vllm_specla.tree_verify.default,
                          (*c.tensors(), c.scale, st, c.slots, c.cu, torch.tensor([-1, 0, 0, -1, 0]), bk, bv, bg,
                           c.write_bank, c.pending, c.read_bank, True), test_utils=tests)
    torch.library.opcheck(torch.ops.vllm_specla.recover.default,
                          (st, c.slots, bk, bv, bg, c.read_bank, torch.tensor([2, 1])), test_utils=tests)
    torch.library.opcheck(torch.ops.vllm_specla.conv_verify.default,
                          (cc.x, cc.w, cc.cu, cc.conv, cc.slots, cc.bank_x, cc.write_bank, cc.pending, cc.read_bank,
                           False), test_utils=tests)
    torch.library.opcheck(torch.ops.vllm_specla.conv_commit.default,
                          (cc.conv, cc.slots, cc.bank_x, cc.read_bank, torch.tensor([1, 2])), test_utils=tests)


# --------------------------------------------------------------------------------------------
# CUDA chain verify (csrc/cuda, JIT): run on the H200 (RESULTS.md); skipped without CUDA
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("mode", ["spec_pending", "ar", "plain"])
def test_cuda_chain_verify_matches_reference(mode):
    assert _cpp.load_cuda()
    c = Case([5, 1, 3], 2, 6, 24, 40, seed=21, pending=[3, 0, 2] if mode == "spec_pending" else None)
    record, pend, wfs = mode.startswith("spec"), mode == "spec_pending", mode == "ar"
    m_ref = c.clone_mutables()
    o_ref = chain_verify_ref(*c.tensors(), **c.kwargs(m_ref, record, pend, wfs))
    dev = torch.device("cuda")
    cuda = lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t  # noqa: E731
    m_gpu = [t.to(dev) for t in c.mutables()]
    kw = {k: cuda(v) for k, v in c.kwargs(m_gpu, record, pend, wfs).items()}
    o = _cpp.chain_verify(*(cuda(t) for t in c.tensors()), **kw)
    torch.testing.assert_close(o.cpu(), o_ref, **TOL)
    assert_all_close([t.cpu() for t in m_gpu], m_ref, **TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("decay", [1.0, 20.0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(6, 6, 256, 512), (8, 8, 256, 256), (2, 4, 48, 20), (2, 2, 128, 24)])
def test_cuda_chain_verify_bf16_inputs_big_shapes(shape, dtype, decay):
    """bf16 q/k/v are read in the kernel (no conversion), K % 128 == 0 takes the 16-byte path:
    equals the reference on the same values at both GDN-1.3B head shapes and odd shapes, with
    pending factors and factor output. ``decay = 20``: log decays down to -40 per token and -80
    per pending factor, so e^g underflows to 0 on some heads (a scaled-tile form, tried in session 4
    and not kept, would have to rescale here)."""
    assert _cpp.load_cuda()
    H, HV, K, V = shape
    g = torch.Generator().manual_seed(sum(shape))
    lens, S, Tm = [5, 1, 8], 4, 16
    N = sum(lens)
    q, k = (torch.randn(N, H, K, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(N, HV, V, generator=g).to(dtype)
    gg, beta = -torch.rand(N, HV, generator=g) * 2 * decay, torch.rand(N, HV, generator=g)
    state = torch.randn(S, HV, V, K, generator=g) * 0.1
    banks = [torch.randn(S, 2, Tm, H, K, generator=g) * 0.05, torch.randn(S, 2, Tm, HV, V, generator=g) * 0.05,
             -torch.rand(S, 2, Tm, HV, generator=g) * 0.1 * decay ** 2]
    kw = dict(scale=K ** -0.5, slots=torch.tensor([2, 0, 3]), cu_seqlens=torch.tensor([0, 5, 6, 14]),
              write_bank=torch.tensor([1, 0, 1]), pending_len=torch.tensor([3, 0, 16]), read_bank=torch.tensor([0, 1, 0]))
    st_ref, b_ref = state.clone(), [b.clone() for b in banks]
    o_ref = chain_verify_ref(q, k, v, gg, beta, state=st_ref, bank_k=b_ref[0], bank_v=b_ref[1], bank_g=b_ref[2], **kw)
    dev = torch.device("cuda")
    st, bs = state.to(dev), [b.to(dev) for b in banks]
    o = _cpp.chain_verify(q.to(dev), k.to(dev), v.to(dev), gg.to(dev), beta.to(dev), state=st, bank_k=bs[0],
                          bank_v=bs[1], bank_g=bs[2], **{a: (t.to(dev) if isinstance(t, torch.Tensor) else t)
                                                           for a, t in kw.items()})
    torch.testing.assert_close(o.cpu(), o_ref, **TOL)
    torch.testing.assert_close(st.cpu(), st_ref, **TOL)
    for x, y in zip(bs, b_ref):
        torch.testing.assert_close(x.cpu(), y, **TOL)


# UT-form CUDA kernel (csrc/cuda/chain_verify_ut.cu), forced with VLLM_SPECLA_CUDA_LAYOUT=ut (strict:
# an error where it does not apply, so these tests cannot pass through another kernel). Same
# tolerance as the other CUDA tests (fp32 state; the UT form sums in another order).
UT_CASES = {  # mode: (lens, pending, record, write_final_state)
    "verify": ([5, 1, 8, 3], None, True, False),
    "step": ([5, 1, 8, 3], [3, 0, 8, 5], True, False),
    "step_empty_row": ([0, 4, 2], [2, 3, 0], True, False),
    "fold_no_record": ([2, 3], [4, 1], False, False),
    "ar": ([1, 1, 1], None, False, True),
    "ar_pending": ([1, 1, 1], [2, 0, 1], True, True),
    "commit": ([5, 1, 3], None, False, True),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("build", ["", "1", "3"])
@pytest.mark.parametrize("variant", ["auto", "loop"])
@pytest.mark.parametrize("nw", ["", "1"])
@pytest.mark.parametrize("tmax", [8, 16])
@pytest.mark.parametrize("mode", list(UT_CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(6, 6, 256, 512), (8, 8, 256, 256), (2, 4, 128, 20)])
def test_cuda_ut_chain_verify_matches_reference(monkeypatch, shape, dtype, mode, tmax, nw, variant, build):
    """Every output, the state and all three factor banks (pre-filled with random values, so entries
    the kernel must not touch are checked too) equal chain_verify_ref at both GDN-1.3B head shapes and
    a GVA shape whose V is not a multiple of the CTA's value tile, windows of 0..tmax tokens and up
    to tmax pending factors, with 4 or 1 warps per CTA, one value tile per CTA (what the automatic
    split gives these small batches) or a loop over 3 tiles per CTA with the next tile prefetched
    (VLLM_SPECLA_CUDA_UT_TPC, the large-batch form), in the automatic build variant (2 or 3 by the
    cost model; 2 with a forced tile count), variant 1 (per-thread cp.async refills: the path of
    GPUs without the sm_90 code) or variant 3 (16 lanes per value row) forced."""
    force_ut(monkeypatch, build, tpc=3 if variant == "loop" else None, nw=nw)
    lens, pend, record, wfs = UT_CASES[mode]
    if tmax == 16 and mode in ("verify", "step"):
        lens, pend = [16, 1, 9, 5], (None if pend is None else [16, 0, 9, 2])
    H, HV, K, V = shape
    c = Case(lens, H, HV, K, V, S=6, Tmax=tmax, dtype=dtype, seed=zlib.crc32(repr((shape, mode, tmax, nw)).encode()) % 997, pending=pend)
    assert_matches_reference(c, record, pend is not None, wfs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("build", ["", "3"])
@pytest.mark.parametrize("variant", ["auto", "loop"])
@pytest.mark.parametrize("mode", ["verify", "step", "step_empty_row", "fold_no_record"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(6, 6, 256, 512), (8, 8, 256, 256)])
def test_cuda_ut_p5_is_bit_identical_and_matches_reference(monkeypatch, shape, dtype, mode, variant, build):
    """The phase 4 / 5 forms of chain_verify_ut.cu (P5; K = 256, windows and pending factors <= 8, no
    write_final_state) run the same operations in the same order: VLLM_SPECLA_CUDA_UT_P5=0 (the
    previous phase 5), 1 (v~ in registers, the default) and 2 (plus one batched reduce-scatter of
    the window products), and 2 with one TMA copy per state row (VLLM_SPECLA_CUDA_UT_ROWCOPY=1)
    give outputs, state and factor banks equal bit for bit, and chain_verify_ref within the CUDA
    tolerance; automatic or forced variant 3, one tile per CTA or the tile loop."""
    force_ut(monkeypatch, build, tpc=3 if variant == "loop" else None)
    lens, pend, record, wfs = UT_CASES[mode]
    H, HV, K, V = shape
    c = Case(lens, H, HV, K, V, S=6, Tmax=8, dtype=dtype, seed=zlib.crc32(repr((shape, mode, "p5")).encode()) % 997,
             pending=pend)
    use_pending = pend is not None
    m_ref = c.clone_mutables()
    o_ref = chain_verify_ref(*c.tensors(), **c.kwargs(m_ref, record, use_pending, wfs))
    dev = torch.device("cuda")
    outs = []
    for p5, rowcopy in (("0", "0"), ("1", "0"), ("2", "0"), ("2", "1")):
        monkeypatch.setenv("VLLM_SPECLA_CUDA_UT_P5", p5)
        monkeypatch.setenv("VLLM_SPECLA_CUDA_UT_ROWCOPY", rowcopy)
        m_gpu = [t.to(dev) for t in c.mutables()]
        kw = {a: (t.to(dev) if isinstance(t, torch.Tensor) else t)
              for a, t in c.kwargs(m_gpu, record, use_pending, wfs).items()}
        outs.append((_cpp.chain_verify(*(t.to(dev) for t in c.tensors()), **kw).cpu(), [t.cpu() for t in m_gpu]))
    o0, m0 = outs[0]
    for o1, m1 in outs[1:]:
        assert torch.equal(o0, o1) and all(torch.equal(x, y) for x, y in zip(m0, m1))
    torch.testing.assert_close(o0, o_ref, **TOL)
    assert_all_close(m0, m_ref, **TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
def test_cuda_ut_long_chain_of_steps(monkeypatch):
    """24 SpecLA steps in a row (5-token windows, 1-5 accepted positions folded at the next step, the two
    factor banks alternating), mild decays so the state carries its history: the state, outputs and
    banks stay within the CUDA tolerance of chain_verify_ref after every step (automatic build)."""
    monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", "ut")
    monkeypatch.setenv("VLLM_SPECLA_CUDA_UT_VAR", "")
    assert _cpp.load_cuda()
    H, K, V, R, T, S = 8, 256, 256, 8, 5, 10
    gen = torch.Generator().manual_seed(7)
    dev = torch.device("cuda")
    slots = torch.randperm(S, generator=gen)[:R]
    muts_ref = [torch.randn(S, H, V, K, generator=gen) * 0.3, torch.zeros(S, 2, T, H, K), torch.zeros(S, 2, T, H, V),
                torch.zeros(S, 2, T, H)]
    muts_gpu = [t.to(dev) for t in muts_ref]
    read = torch.zeros(R, dtype=torch.long)
    pending = torch.zeros(R, dtype=torch.long)
    cu = torch.arange(R + 1) * T
    for step in range(24):
        q, k = (torch.randn(R * T, H, K, generator=gen).to(torch.bfloat16) for _ in range(2))
        v = torch.randn(R * T, H, V, generator=gen).to(torch.bfloat16)
        g = -torch.rand(R * T, H, generator=gen) * 0.05 - 0.005
        beta = torch.rand(R * T, H, generator=gen) * 0.9 + 0.05
        kw = dict(scale=K ** -0.5, slots=slots, cu_seqlens=cu, write_bank=1 - read, pending_len=pending, read_bank=read)
        o_ref = chain_verify_ref(q, k, v, g, beta, **kw, **dict(zip(("state", "bank_k", "bank_v", "bank_g"), muts_ref)))
        kw_gpu = {a: (t.to(dev) if isinstance(t, torch.Tensor) else t) for a, t in kw.items()}
        o = _cpp.chain_verify(*(t.to(dev) for t in (q, k, v, g, beta)), **kw_gpu,
                              **dict(zip(("state", "bank_k", "bank_v", "bank_g"), muts_gpu)))
        torch.testing.assert_close(o.cpu(), o_ref, **TOL, msg=lambda m, s=step: f"step {s}: {m}")
        assert_all_close([t.cpu() for t in muts_gpu], muts_ref, **TOL)
        pending = torch.randint(1, T + 1, (R,), generator=gen)  # accepted positions, folded at the next step
        read = 1 - read


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("build", ["", "1", "2", "3"])
@pytest.mark.parametrize("decay", [1.0, 20.0])
def test_cuda_ut_strong_decay_and_big_batch(monkeypatch, decay, build):
    """40 rows of 5-token windows with 5 pending factors (the SpecLA step at K = 4), log decays down
    to -40 per token (e^g underflows on some heads): equals the reference, in each build variant
    (automatic, 1, 2, 3), where the automatic split loops over several value tiles per CTA."""
    monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", "ut")
    monkeypatch.setenv("VLLM_SPECLA_CUDA_UT_VAR", build)
    assert _cpp.load_cuda()
    c = Case([5] * 40, 6, 6, 256, 512, S=44, Tmax=5, dtype=torch.bfloat16, seed=int(decay), pending=[5] * 40)
    c.g = c.g * 2 * decay
    c.bank_g = c.bank_g * decay
    assert_matches_reference(c)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
def test_cuda_ut_forced_is_strict(monkeypatch):
    """Forced UT where it does not apply (K = 48: not the 16-byte path) is an error, not a silent
    fall-back (so the UT tests above test the UT kernel)."""
    monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", "ut")
    assert _cpp.load_cuda()
    c = Case([3, 2], 2, 4, 48, 20, seed=3)
    dev = torch.device("cuda")
    kw = {a: (t.to(dev) if isinstance(t, torch.Tensor) else t) for a, t in c.kwargs(c.mutables()).items()}
    with pytest.raises(RuntimeError, match="not supported"):
        _cpp.chain_verify(*(t.to(dev) for t in c.tensors()), **kw)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("name,value", [("VLLM_SPECLA_CUDA_BV", "16"), ("VLLM_SPECLA_CUDA_LAYOUT", "rowgroup4"),
                                        ("VLLM_SPECLA_CUDA_UT_NW", "2"), ("VLLM_SPECLA_CUDA_UT_P5", "4"),
                                        ("VLLM_SPECLA_CUDA_UT_ROWCOPY", "yes"), ("VLLM_SPECLA_CUDA_UT_TPC", "-1"),
                                        ("VLLM_SPECLA_CUDA_UT", "2"), ("VLLM_SPECLA_CUDA_REGCAP", "off"),
                                        ("VLLM_SPECLA_CUDA_RG_PREFETCH", "true"), ("VLLM_SPECLA_PDL", "2"),
                                        ("VLLM_SPECLA_PDL", "x"), ("VLLM_SPECLA_CUDA_SB_LATE", "2"),
                                        ("VLLM_SPECLA_CUDA_SB_SCALED", "1"), ("VLLM_SPECLA_CUDA_UT_VAR", "4"),
                                        ("VLLM_SPECLA_CUDA_UT_VAR", "5"), ("VLLM_SPECLA_CUDA_UT_VAR", "x"),
                                        ("VLLM_SPECLA_CUDA_STORE_SWAP", "1"), ("VLLM_SPECLA_CUDA_RG_PIECE", "16"),
                                        ("VLLM_SPECLA_CUDA_RG_AR", "5")])
def test_cuda_tuning_variable_out_of_range_is_an_error(monkeypatch, name, value):
    """Every tuning variable of the CUDA binding rejects a value outside its list (a RuntimeError naming the
    variable and the values it takes; e.g. VLLM_SPECLA_CUDA_UT_VAR=4 / 5, variants removed in session 8; or, for
    VLLM_SPECLA_CUDA_SB_LATE / _SB_SCALED / _STORE_SWAP, whose forms were removed in sessions 20 / 21, any value) before
    the kernel launches: the
    state and the banks are left as they were, and the next call with the variable unset runs. A stale or mistyped
    setting must not run another kernel form under its name."""
    monkeypatch.setenv(name, value)
    assert _cpp.load_cuda()
    c = Case([5, 3], 6, 6, 256, 512, S=3, Tmax=6, dtype=torch.bfloat16, seed=6, pending=[2, 1])
    dev = torch.device("cuda")
    m_dev = [t.to(dev, copy=True) for t in c.mutables()]
    kw = {a: (t.to(dev) if isinstance(t, torch.Tensor) else t) for a, t in c.kwargs(m_dev).items()}
    with pytest.raises(RuntimeError, match=f"{name} must be"):
        _cpp.chain_verify(*(t.to(dev) for t in c.tensors()), **kw)
    assert_all_close([t.cpu() for t in m_dev], c.mutables(), rtol=0, atol=0)
    monkeypatch.delenv(name)
    assert_matches_reference(c)


def test_check_windows_host_side():
    """The host-side window check of the CUDA wrapper (the CUDA kernels cannot raise): a window longer
    than the factor bank raises the reference's ValueError; windows that fit, and empty rows, pass."""
    _cpp.check_windows(torch.tensor([0, 3, 7]), 4)
    _cpp.check_windows(torch.tensor([0, 0, 4]), 4)
    _cpp.check_windows(torch.tensor([0]), 4)
    with pytest.raises(ValueError, match="exceeds the factor bank"):
        _cpp.check_windows(torch.tensor([0, 3, 9]), 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
def test_cuda_ut_no_l2norm_and_over_long_window(monkeypatch):
    """UT form without the in-kernel l2norm equals the reference; a recorded window longer than the
    factor bank raises the reference's ValueError (host-side check of the wrapper, outside capture)."""
    monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", "ut")
    assert _cpp.load_cuda()
    dev = torch.device("cuda")
    c = Case([5, 3], 2, 4, 128, 24, S=4, Tmax=8, seed=7, pending=[2, 4])
    m_ref = c.clone_mutables()
    o_ref = chain_verify_ref(*c.tensors(), **c.kwargs(m_ref), use_qk_l2norm=False)
    m_gpu = [t.to(dev) for t in c.mutables()]
    kw = {a: (t.to(dev) if isinstance(t, torch.Tensor) else t) for a, t in c.kwargs(m_gpu).items()}
    o = _cpp.chain_verify(*(t.to(dev) for t in c.tensors()), **kw, use_qk_l2norm=False)
    torch.testing.assert_close(o.cpu(), o_ref, **TOL)
    assert_all_close([t.cpu() for t in m_gpu], m_ref, **TOL)

    c = Case([3, 6], 2, 4, 128, 24, S=4, Tmax=4, seed=8)  # row 1: 6 tokens, the bank holds 4
    m_gpu = [t.to(dev) for t in c.mutables()]
    kw = {a: (t.to(dev) if isinstance(t, torch.Tensor) else t) for a, t in c.kwargs(m_gpu, pending=False).items()}
    with pytest.raises(ValueError, match="exceeds the factor bank"):
        _cpp.chain_verify(*(t.to(dev) for t in c.tensors()), **kw)


# Small-batch CUDA kernels (at most 16 (row, head) pairs: batch 1-2 of the GDN-1.3B head shapes): each
# layout forced (VLLM_SPECLA_CUDA_LAYOUT; sb: the lean kernel), BV 4 and 8 (VLLM_SPECLA_CUDA_BV), with and without
# programmatic dependent launch (VLLM_SPECLA_PDL); sb takes bf16 q / k / v (fp32 inputs run the automatic layout
# under it).
SMALL_CASES = {  # mode: (lens, pending, record, write_final_state)
    "verify": ([8, 5], None, True, False),
    "step": ([5, 8], [5, 2], True, False),
    "step_empty_row": ([0, 3], [4, 0], True, False),
    "ar": ([1, 1], None, False, True),
    "ar_pending": ([1, 1], [3, 1], True, True),
    "commit": ([6, 1], None, False, True),
}


# (layout, dtype, decay, pdl): every layout on bf16 inputs; fp32 inputs (the decode runtime's) and plain launches
# through the automatic layout and under sb; strong decay (states that shrink by e^-42 per token)
SMALL_VARIANTS = ([(lay, torch.bfloat16, 1.0, "1") for lay in ("auto", "sb", "rowgroup8", "rowgroup16")]
                  + [("auto", torch.float32, 1.0, "1"), ("sb", torch.float32, 1.0, "1"), ("auto", torch.bfloat16, 1.0, "0"),
                     ("sb", torch.bfloat16, 1.0, "0"), ("sb", torch.bfloat16, 60.0, "1"), ("auto", torch.bfloat16, 60.0, "1")])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("layout,dtype,decay,pdl", SMALL_VARIANTS)
@pytest.mark.parametrize("bv", ["4", "8"])
@pytest.mark.parametrize("mode", list(SMALL_CASES))
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("shape", [(6, 6, 256, 512), (8, 8, 256, 256), (2, 4, 128, 20)])
def test_cuda_small_batch_layouts_match_reference(monkeypatch, shape, rows, mode, bv, layout, dtype, decay, pdl):
    """Outputs, the state and all three factor banks equal chain_verify_ref for batch 1 / 2 windows,
    pending folds, AR steps and commits, at both GDN-1.3B head shapes and a GVA K = 128 shape whose V
    is not a multiple of the value tile. ``decay = 60``: log decays down to -42 per token and -30 per
    pending factor (states that underflow towards zero within a few tokens)."""
    monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", layout)
    monkeypatch.setenv("VLLM_SPECLA_CUDA_BV", bv)
    monkeypatch.setenv("VLLM_SPECLA_PDL", pdl)
    if layout == "auto":
        monkeypatch.delenv("VLLM_SPECLA_CUDA_LAYOUT")
    assert _cpp.load_cuda()
    lens, pend, record, wfs = SMALL_CASES[mode]
    lens, pend = lens[:rows], (None if pend is None else pend[:rows])
    H, HV, K, V = shape
    c = Case(lens, H, HV, K, V, S=5, Tmax=9, dtype=dtype, pending=pend,
             seed=zlib.crc32(repr((shape, rows, mode, layout, bv)).encode()) % 997)
    c.g, c.bank_g = c.g * decay, c.bank_g * decay
    assert_matches_reference(c, record, pend is not None, wfs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout,bv", [("auto", "4"), ("rowgroup", "8"), ("rowgroup8", "4"), ("rowgroup8", "8"),
                                       ("rowgroup16", ""), ("rowgroup32", "")])
@pytest.mark.parametrize("mode", list(SMALL_CASES))
@pytest.mark.parametrize("shape", [(6, 6, 256, 512), (2, 4, 128, 20)])
def test_cuda_row_group_piece_widths_match_reference(monkeypatch, shape, mode, layout, bv, dtype):
    """The row-group kernels' one-ahead body with 8-key lane pieces (VLLM_SPECLA_CUDA_RG_PIECE=8, the layout before
    session 21) and 4-key pieces (=4, the default; the other small-batch tests run it): outputs, state and factor
    banks equal chain_verify_ref (the pieces change which keys a lane sums, so the two agree to the tolerance, not
    bit for bit), in each row-group form (rowgroup32: K = 256; it runs rowgroup16 at K = 128), bf16 and fp32 inputs;
    V = 20 leaves rows past V in the last 8-row tile. (The automatic layout sends bf16 windows to the sb kernel and
    steps without the ring to v3, so its cell tests the one-ahead body on fp32 windows and AR only.)"""
    monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", layout)
    monkeypatch.setenv("VLLM_SPECLA_CUDA_BV", bv)
    monkeypatch.setenv("VLLM_SPECLA_CUDA_RG_PREFETCH", "0")  # the one-ahead body for every mode ...
    monkeypatch.setenv("VLLM_SPECLA_CUDA_RG_AR", "0")  # ... one-token rows included (the AR body has its own test)
    if layout == "auto":
        monkeypatch.delenv("VLLM_SPECLA_CUDA_LAYOUT")
    assert _cpp.load_cuda()
    lens, pend, record, wfs = SMALL_CASES[mode]
    H, HV, K, V = shape
    for piece in ("8", "4"):
        monkeypatch.setenv("VLLM_SPECLA_CUDA_RG_PIECE", piece)
        c = Case(lens, H, HV, K, V, S=5, Tmax=9, dtype=dtype, pending=pend,
                 seed=zlib.crc32(repr((shape, mode, layout, bv, piece)).encode()) % 997)
        assert_matches_reference(c, record, pend is not None, wfs)


# one-token rows without pending factors (N <= R): (lens, record, write_final_state); [2, 0] is N <= R with a
# two-token row (the AR body's token loop), [0, 1] an empty row; [1, 0, 0]: empty rows whose first token index is past
# the batch's tokens (the AR body computes a row's first token before its bounds are known, on a clamped index, and
# must neither store it nor touch the empty rows' state and banks; [1, 0 x 7]: seven empty rows on the live row's token,
# so a leaked o store would race the live row's own)
AR_CASES = {"ar": ([1, 1], False, True), "ar_record": ([1, 1], True, True), "ar_no_final": ([0, 1], True, False),
            "two_and_empty": ([2, 0], True, True), "one_row": ([1], False, True),
            "empty_last": ([1, 0, 0], True, True), "empty_many": ([1, 0, 0, 0, 0, 0, 0, 0], True, True),
            "plain_two_and_empty": ([2, 0, 1], False, True), "plain_no_final": ([0, 1, 0], False, False)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", list(AR_CASES))
@pytest.mark.parametrize("shape", [(6, 6, 256, 512), (8, 8, 256, 256), (2, 4, 128, 18)])
def test_cuda_rg_ar_body_is_bit_identical_and_matches_reference(monkeypatch, shape, case, dtype):
    """The row-group AR bodies (chain_verify.cu, chain_verify_rg_ar: q / k / v / g / beta and the state tile loaded
    straight into registers; VLLM_SPECLA_CUDA_RG_AR=1; =2 the same kernel at most 12 CTAs per SM; =3 the RAW body,
    q / k kept as loaded, for plain AR; =4, the default, 3 or 2 by the grid) and the one-ahead body (=0) run the same
    token arithmetic on the same 4-key lane pieces: outputs, state and factor banks equal bit for bit, and chain_verify_ref within the CUDA tolerance; rows with two tokens or none (N <= R
    allows them), factors recorded (the AR kernel with the factor-bank path) or not (its build without it), the final
    state written or not; V = 18: rows past V in the last 4-row tile."""
    monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", "rowgroup")  # (the automatic layout takes v3 past 16 row-heads)
    monkeypatch.delenv("VLLM_SPECLA_CUDA_BV", raising=False)
    assert _cpp.load_cuda()
    lens, record, wfs = AR_CASES[case]
    H, HV, K, V = shape
    c = Case(lens, H, HV, K, V, S=max(5, len(lens)), Tmax=4, dtype=dtype, seed=zlib.crc32(repr((shape, case, "ar")).encode()) % 997)
    m_ref = c.clone_mutables()
    o_ref = chain_verify_ref(*c.tensors(), **c.kwargs(m_ref, record, False, wfs))
    dev = torch.device("cuda")
    outs = []
    # (2: the AR body at most 12 CTAs per SM; 3: on q / k as loaded; 4: 3 or 2 by the grid, the default)
    bodies = ("1", "0", "2", "3", "4")
    for body in bodies:
        monkeypatch.setenv("VLLM_SPECLA_CUDA_RG_AR", body)
        m_gpu = [t.to(dev) for t in c.mutables()]
        kw = {a: (t.to(dev) if isinstance(t, torch.Tensor) else t) for a, t in c.kwargs(m_gpu, record, False, wfs).items()}
        outs.append((_cpp.chain_verify(*(t.to(dev) for t in c.tensors()), **kw).cpu(), [t.cpu() for t in m_gpu]))
    (o0, m0) = outs[bodies.index("0")]
    for body, (ob, mb) in zip(bodies, outs):
        assert torch.equal(ob, o0), body
        assert all(torch.equal(x, y) for x, y in zip(mb, m0)), body
    o1, m1 = outs[0]
    torch.testing.assert_close(o1, o_ref, **TOL)
    assert_all_close(m1, m_ref, **TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("batch,shape", [(1, (6, 6, 256, 512)), (2, (8, 8, 256, 256)), (2, (6, 6, 256, 512))])
def test_cuda_public_op_routes_small_bf16_ar_by_the_raw_body_rule(monkeypatch, batch, shape):
    """The public ``ops.chain_verify`` sends one-token bf16 AR to the CUDA op where ``_cuda_small_ar`` says its RAW
    AR body's two launches fit (on an H100 / H200: 6x256x512 batch 1 and 8x256x256 batch 2, not 6x256x512 batch 2),
    else to Triton; either way outputs and state equal chain_verify_ref (norm-wise relative error < 1e-4)."""
    from vllm_specla.ops import chain_verify as cv  # noqa: PLC0415

    for name in cv._RAW_AR_ENV:
        monkeypatch.delenv(name, raising=False)
    assert _cpp.load_cuda()
    sms, major = cv._gpu(torch.cuda.current_device())
    cuda = major >= 9 and 2 * batch * shape[1] * shape[3] // 4 <= cv.RAW_AR_MIN_CTAS_PER_SM * sms
    calls = []
    real = _cpp.chain_verify
    monkeypatch.setattr(_cpp, "chain_verify", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    H, HV, K, V = shape
    c = Case([1] * batch, H, HV, K, V, S=4, dtype=torch.bfloat16, seed=11 * batch + V)
    m_ref = c.clone_mutables()
    o_ref = chain_verify_ref(*c.tensors(), **c.kwargs(m_ref, False, False, True))
    dev = torch.device("cuda")
    m_gpu = [t.to(dev) for t in c.mutables()]
    kw = {a: (t.to(dev) if isinstance(t, torch.Tensor) else t) for a, t in c.kwargs(m_gpu, False, False, True).items()}
    for name in ("bank_k", "bank_v", "bank_g"):
        kw.pop(name)
    o = cv.chain_verify(*(t.to(dev) for t in c.tensors()), **kw)
    assert (calls == [1]) == cuda
    for got, exp in ((o.cpu(), o_ref), (m_gpu[0].cpu(), m_ref[0])):  # norm-wise (tests/test_kernels_gpu.py's TOL)
        assert float((got - exp).norm() / exp.norm()) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("layout,bv", [("auto", ""), ("sb", "4"), ("sb", "8")])
@pytest.mark.parametrize("pending", [None, [7, 2]])
@pytest.mark.parametrize("shape", [(6, 6, 256, 512), (2, 4, 128, 20), (2, 4, 128, 19)])
def test_cuda_sb_long_windows_match_reference(monkeypatch, shape, pending, bv, layout):
    """Long windows (37 and 18 tokens, a bank of 38) through the sb kernel at BV 4 / 8 and the automatic layout
    (which takes the sb kernel at these 2 x 6 / 2 x 4 (row, head) pairs and picks its own BV) equal
    chain_verify_ref: outputs, state and factor banks, with and without pending factors folded first. V = 19: the
    last value tile has rows past V at BV 4 and BV 8 (zero tile rows, v read from row 0 and zeroed at use)."""
    if layout == "auto":
        monkeypatch.delenv("VLLM_SPECLA_CUDA_LAYOUT", raising=False)
    else:
        monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", "sb")
    monkeypatch.setenv("VLLM_SPECLA_CUDA_BV", bv)  # ("": automatic)
    assert _cpp.load_cuda()
    H, HV, K, V = shape
    c = Case([37, 18], H, HV, K, V, S=4, Tmax=38, dtype=torch.bfloat16, pending=pending,
             seed=zlib.crc32(repr((shape, pending, bv, layout)).encode()) % 997)
    assert_matches_reference(c, True, pending is not None, False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (csrc/cuda is JIT-built on a GPU machine)")
@pytest.mark.parametrize("layout", ["auto", "sb", "ut"])
def test_cuda_pdl_chain_of_steps_in_a_graph(monkeypatch, layout):
    """Programmatic dependent launch keeps stream order where it matters: a CUDA graph of 6 SpecLA windows
    on one state slot (each folds the factors the kernel just before it wrote, into the state that kernel
    left), then an AR step, gives bit-identical outputs, state and banks with PDL on (VLLM_SPECLA_PDL=1)
    and off. The seven kernels run back to back (every index tensor is made before), so with PDL each one
    starts while its predecessor runs and only its griddepcontrol.wait orders them."""
    monkeypatch.delenv("VLLM_SPECLA_CUDA_LAYOUT", raising=False)
    assert _cpp.load_cuda()
    dev = torch.device("cuda")
    H, HV, K, V = (6, 6, 256, 512)
    B = 1 if layout != "ut" else 32  # the UT form takes >= 192 (row, head) pairs
    T, S, Tm = 5, B + 1, 8
    gen = torch.Generator().manual_seed(7)
    q, k = (torch.randn(7, B * T, H, K, generator=gen).to(torch.bfloat16).to(dev) for _ in range(2))
    v = torch.randn(7, B * T, HV, V, generator=gen).to(torch.bfloat16).to(dev)
    g, beta = (-torch.rand(7, B * T, HV, generator=gen) * 0.5).to(dev), torch.rand(7, B * T, HV, generator=gen).to(dev)
    cu, cu1 = torch.arange(B + 1, device=dev) * T, torch.arange(B + 1, device=dev)
    slots = torch.arange(B, device=dev)
    lens = torch.full((B,), T, dtype=torch.long, device=dev)
    wbs = [torch.full((B,), i % 2, dtype=torch.long, device=dev) for i in range(6)]
    rbs = [1 - wb for wb in wbs]
    banks = [torch.randn(S, 2, Tm, H, K, generator=gen), torch.randn(S, 2, Tm, HV, V, generator=gen),
             -torch.rand(S, 2, Tm, HV, generator=gen)]
    state0 = torch.randn(S, HV, V, K, generator=gen) * 0.1

    def run(pdl: str, graph: bool):
        monkeypatch.setenv("VLLM_SPECLA_PDL", pdl)
        st, bk, bv, bg = state0.to(dev), *(b.to(dev) for b in banks)
        outs = []

        def steps():
            outs.clear()
            try:
                if layout != "auto":  # the windows (the AR step: the automatic layout, which UT does not take)
                    monkeypatch.setenv("VLLM_SPECLA_CUDA_LAYOUT", layout)
                for i in range(6):
                    outs.append(_cpp.chain_verify(q[i], k[i], v[i], g[i], beta[i], scale=K ** -0.5, state=st,
                                                  slots=slots, cu_seqlens=cu, bank_k=bk, bank_v=bv, bank_g=bg,
                                                  write_bank=wbs[i], pending_len=lens if i else None,
                                                  read_bank=rbs[i] if i else None))
            finally:
                monkeypatch.delenv("VLLM_SPECLA_CUDA_LAYOUT", raising=False)
            outs.append(_cpp.chain_verify(q[6][:B], k[6][:B], v[6][:B], g[6][:B], beta[6][:B], scale=K ** -0.5,
                                          state=st, slots=slots, cu_seqlens=cu1, write_final_state=True))
        if graph:
            gr = torch.cuda.CUDAGraph()
            st0 = st.clone()
            steps()  # warm-up outside the graph, then restore the state
            st.copy_(st0)
            with torch.cuda.graph(gr):
                steps()
            st.copy_(st0)
            gr.replay()
        else:
            steps()
        torch.cuda.synchronize()
        return [o.cpu() for o in outs] + [st.cpu(), bk.cpu(), bv.cpu(), bg.cpu()]

    plain = run("0", graph=False)
    for got, exp in zip(run("1", graph=True), plain):
        assert torch.equal(got, exp)
