"""UT-form Triton chain verify (``ops/triton_chain_ut.py``) vs the torch reference ``chain_verify_ref``.

Runs on CUDA; skipped without it, except under ``TRITON_INTERPRET=1`` where everything runs on the
CPU through Triton's interpreter (small shapes; the GDN-1.3B head shapes with 1-2 short rows and a
coarser tile so the interpreter stays fast).

Inputs are random and never zero (banks are filled with random data, so an unwritten or misplaced
factor shows); the reference runs in fp32 on the same device. Every comparison is the norm-wise
relative error ``||x - ref|| / ||ref||`` of the outputs, the state slots (all of them: untouched
slots must stay equal) and the three factor banks (both buffers: the pending bank must be left
alone), plus a per-token check of the outputs.

Tolerances: ``TOL = 1e-4`` norm-wise (``10 * TOL`` per token) with the default ``tf32x3`` dots
(three TF32 tensor-core products per fp32 product, ~fp32 accuracy; expected errors ~1e-6 on the
GPU); ``TOL_IEEE = 1e-5`` with fp32 FMA dots (``DOT_PRECISION = "ieee"``). Under the interpreter
every dot is an fp32 numpy matmul (measured errors ~1e-7).
"""

from __future__ import annotations

import os
import random

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAVE_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")
DEV = "cuda" if HAVE_CUDA else "cpu"
TOL = 1e-4
TOL_IEEE = 1e-5

from vllm_specla.ops import reference as ref  # noqa: E402

if HAVE_CUDA or INTERPRET:
    from vllm_specla.ops import triton_chain as tc  # noqa: E402
    from vllm_specla.ops import triton_chain_ut as ut  # noqa: E402
    from vllm_specla.ops import triton_recover as tr  # noqa: E402

SMALL = [(2, 4, 32, 48), (1, 3, 16, 20)]  # (H, HV, K, V): odd GVA shapes
BIG = [(6, 6, 256, 512), (8, 8, 256, 256)]  # GDN-1.3B heads ("flame 1B", "m-a-p 1.3B")
LENS = [1, 2, 5, 8, 9, 16]  # window lengths, all in one launch
PEND = [1, 3, 5, 16, 2, 4]  # pending factors per row (1..5 and a full bank of 16)
# under the interpreter the big shapes run with few, large programs (fewer interpreted ops)
BIG_INTERP_CFG = (128, 4, 64, 1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all(), "non-finite output"
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.fixture(autouse=True, params=[("loop", "0"), ("dot", "1")], ids=["loop-recover", "dot-fold"])
def solve(request, monkeypatch):
    """Every test with both forms of the prep kernel's (I + A)^-1 (``UT_SOLVE``): forward
    substitution (the chains' default) and the blocked log-depth form (the trees'), and both forms
    of the deferred commit (``UT_FOLD``): the recover kernel first and the pending factors folded into
    the verify's state pass (by default from 64 MiB of state, launches that are not split, 16-token
    chunks; ``test_ut_fold_auto_wiring`` runs the default). The two switches change different kernels
    (prep / state pass), so pairing them covers each form of each at no extra test time."""
    if HAVE_CUDA or INTERPRET:
        monkeypatch.setattr(ut, "UT_SOLVE", request.param[0])
        monkeypatch.setattr(ut, "UT_FOLD", request.param[1])
    return request.param[0]


@pytest.fixture
def big_fast(monkeypatch):
    """Coarser tiles for the big shapes under the interpreter (a no-op on the GPU)."""
    if INTERPRET and not HAVE_CUDA:
        monkeypatch.setattr(ut, "CONFIG_OVERRIDE", BIG_INTERP_CFG)


class Case:
    """R rows with window lengths ``lens`` on random distinct slots; banks and pending random."""

    def __init__(self, shape, lens, seed=0, Tmax=16, dtype=torch.float32, pend=None, strong_decay=False):
        H, HV, K, V = shape
        gen = torch.Generator().manual_seed(seed)
        rn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
        ru = lambda *s: torch.rand(*s, generator=gen)  # noqa: E731
        R = len(lens)
        S = R + 3
        N = sum(lens)
        self.shape, self.R, self.N, self.Tmax, self.lens = shape, R, N, Tmax, list(lens)
        self.cu = torch.tensor([0] + torch.tensor(lens, dtype=torch.long).cumsum(0).tolist(), dtype=torch.int32,
                               device=DEV)
        d = lambda x, dt=None: x.to(device=DEV, dtype=dt or x.dtype)  # noqa: E731
        self.q, self.k, self.v = d(rn(N, H, K), dtype), d(rn(N, H, K), dtype), d(rn(N, HV, V), dtype)
        g = -(ru(N, HV) * 0.5 + 0.01)
        bank_g = -ru(S, 2, Tmax, HV) * 0.3
        if strong_decay:
            g = -ru(N, HV) * 40
            g[::3] = -100.0
            bank_g = -ru(S, 2, Tmax, HV) * 40
            bank_g[..., ::4, :] = -100.0
        self.g = d(g)
        self.beta = d(ru(N, HV) * 0.9 + 0.05)
        self.scale = K ** -0.5
        self.state = d(rn(S, HV, V, K) * 0.1)
        self.slots = d(torch.randperm(S, generator=gen)[:R])
        self.bank_k = d(ref.l2norm(rn(S, 2, Tmax, H, K)))
        self.bank_v = d(rn(S, 2, Tmax, HV, V) * 0.1)
        self.bank_g = d(bank_g)
        self.read_bank = d(torch.randint(0, 2, (R,), generator=gen))
        self.write_bank = 1 - self.read_bank
        pend = pend if pend is not None else [int(x) for x in torch.randint(1, 6, (R,), generator=gen)]
        self.pending_len = torch.tensor(pend, device=DEV)

    def inputs(self):
        return self.q, self.k, self.v, self.g, self.beta

    def banks(self):
        return [self.bank_k.clone(), self.bank_v.clone(), self.bank_g.clone()]


def run_both(c: Case, *, pending: bool, final: bool, banks: bool = True, fn=None):
    """Reference and UT kernel on clones of the same state / banks; returns both results."""
    fn = fn or ut.chain_verify_ut
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, write_final_state=final)
    if banks:
        kw.update(write_bank=c.write_bank)
    if pending:
        kw.update(pending_len=c.pending_len, read_bank=c.read_bank)
    k1 = dict(bank_k=b1[0], bank_v=b1[1], bank_g=b1[2]) if banks else {}
    k2 = dict(bank_k=b2[0], bank_v=b2[1], bank_g=b2[2]) if banks else {}
    o1 = ref.chain_verify_ref(*c.inputs(), state=s1, **k1, **kw)
    o2 = fn(*c.inputs(), state=s2, **k2, **kw)
    return (o1, s1, b1), (o2, s2, b2)


def check(res_ref, res_ut, tol=TOL, per_token=True):
    (o1, s1, b1), (o2, s2, b2) = res_ref, res_ut
    errs = {"o": rel(o2, o1), "state": rel(s2, s1), "bank_k": rel(b2[0], b1[0]), "bank_v": rel(b2[1], b1[1]),
            "bank_g": rel(b2[2], b1[2])}
    bad = {k: e for k, e in errs.items() if not e < tol}
    assert not bad, f"relative errors above {tol}: {bad} (all: {errs})"
    if per_token:
        for i in range(o1.shape[0]):  # every token, not only the batch norm
            assert rel(o2[i], o1[i]) < 10 * tol, f"token {i}: {rel(o2[i], o1[i])}"
    return errs


# ------------------------------------------------------------------------------------------------
# outputs, factors and state vs the reference
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SMALL)
@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("final", [False, True])
def test_ut_vs_ref_small(shape, pending, final):
    """T in {1, 2, 5, 8, 9, 16} (variable per row, one launch), P in {1..5, 16}."""
    c = Case(shape, LENS, seed=hash((shape, pending, final)) % 1000, pend=PEND)
    check(*run_both(c, pending=pending, final=final))


@pytest.mark.parametrize("shape", BIG)
@pytest.mark.parametrize("final", [False, True])
def test_ut_vs_ref_big(shape, final, big_fast):
    """GDN-1.3B head shapes; the interpreter runs 2 short rows, the GPU all window lengths."""
    lens, pend = ([3, 1], [2, 5]) if not HAVE_CUDA else (LENS, PEND)
    c = Case(shape, lens, seed=7 + int(final), pend=pend)
    check(*run_both(c, pending=True, final=final))


@pytest.mark.parametrize("shape", BIG)
def test_ut_big_no_pending_full_window(shape, big_fast):
    """Verify without pending (the benchmark's "verify" kind) on one full 16-token window (GPU: 8 rows)."""
    lens = [16] if not HAVE_CUDA else [16, 8, 5, 9, 1, 2, 16, 3]
    c = Case(shape, lens, seed=8)
    check(*run_both(c, pending=False, final=False))


def test_ut_bf16_inputs():
    shape = SMALL[0] if not HAVE_CUDA else BIG[0]
    c = Case(shape, [5, 1, 9, 16], seed=5, dtype=torch.bfloat16, pend=[3, 16, 1, 0])
    for final in (False, True):
        check(*run_both(c, pending=True, final=final))


@pytest.mark.parametrize("config", [None, (16, 4, 16, 1), (32, 2, 32, 2), (64, 4, 16, 3), (16, 1, 16, 1)])
@pytest.mark.parametrize("precision", ["tf32x3", "ieee"])
def test_ut_strong_decay_and_configs(config, precision, monkeypatch):
    """Every tile config and dot precision, with strong decay (g down to -100: e^g underflows, the
    cumulative decays of a window reach -1600) in the window and in the pending factors."""
    monkeypatch.setattr(ut, "CONFIG_OVERRIDE", config)
    monkeypatch.setattr(ut, "DOT_PRECISION", precision)
    tol = TOL_IEEE if precision == "ieee" else TOL
    c = Case((2, 4, 32, 48), [7, 1, 16, 4], seed=61, pend=[5, 16, 0, 2], strong_decay=True)
    for final in (False, True):
        check(*run_both(c, pending=True, final=final), tol=tol)


def test_ut_multi_chunk_and_long_pending(monkeypatch):
    """Rows longer than one 16-token chunk (write_final_state; no banks), an empty row, and more than
    16 pending factors (a bank with Tmax = 24: several rank-16 folds)."""
    c = Case((1, 3, 16, 20), [33, 1, 17, 0], seed=71)
    check(*run_both(c, pending=False, final=True, banks=False))
    c = Case((2, 4, 32, 48), [3, 5, 1], seed=72, Tmax=24, pend=[20, 17, 0])
    for final in (False, True):
        check(*run_both(c, pending=True, final=final))


def test_ut_windows_too_long():
    c = Case((2, 4, 32, 48), [3, 5], seed=1, Tmax=4)
    with pytest.raises(ValueError):
        ut.chain_verify_ut(*c.inputs(), scale=c.scale, state=c.state, slots=c.slots, cu_seqlens=c.cu,
                           bank_k=c.bank_k, bank_v=c.bank_v, bank_g=c.bank_g, write_bank=c.write_bank)
    c = Case((2, 4, 32, 48), [17, 2], seed=2)
    with pytest.raises(ValueError):  # > 16 tokens without write_final_state (the UT kernel's limit)
        ut.chain_verify_ut(*c.inputs(), scale=c.scale, state=c.state, slots=c.slots, cu_seqlens=c.cu)


def test_ut_no_rows():
    c = Case((2, 4, 32, 48), [2], seed=3)
    cu = torch.zeros(1, dtype=torch.int32, device=DEV)
    e = torch.empty(0, dtype=torch.long, device=DEV)
    o = ut.chain_verify_ut(c.q[:0], c.k[:0], c.v[:0], c.g[:0], c.beta[:0], scale=c.scale, state=c.state,
                           slots=e, cu_seqlens=cu)
    assert o.shape == (0, 4, 48)


# ------------------------------------------------------------------------------------------------
# consistency with the serial kernel and across steps
# ------------------------------------------------------------------------------------------------


def test_ut_matches_serial_kernel():
    c = Case((2, 4, 32, 48), [1, 5, 9, 16], seed=81, pend=[3, 16, 0, 2])
    for final in (False, True):
        _, (o_s, s_s, b_s) = run_both(c, pending=True, final=final, fn=tc.chain_verify)
        _, (o_u, s_u, b_u) = run_both(c, pending=True, final=final)
        assert rel(o_u, o_s) < TOL and rel(s_u, s_s) < TOL
        for x, y in zip(b_u, b_s):
            assert rel(x, y) < TOL


def test_ut_speculative_steps():
    """Three SpecLA steps (deferred commit): each verify folds the previous step's accepted prefix
    from the other bank, then the banks swap; the UT kernel and the reference stay in lockstep.
    Between steps 2 and 3 the accepted prefix is committed by triton_recover.recover instead."""
    shape = (2, 4, 32, 48)
    rng = random.Random(5)
    c = Case(shape, [5, 5, 5, 5], seed=91)
    st_r, st_u = c.state.clone(), c.state.clone()
    bk_r, bk_u = c.banks(), c.banks()
    wb = c.write_bank.clone()
    pend = torch.zeros(c.R, dtype=torch.long, device=DEV)
    for step in range(3):
        ci = Case(shape, [rng.randint(1, 16) for _ in range(c.R)], seed=100 + step)
        kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=ci.cu, write_bank=wb, pending_len=pend, read_bank=1 - wb)
        o_r = ref.chain_verify_ref(*ci.inputs(), state=st_r, bank_k=bk_r[0], bank_v=bk_r[1], bank_g=bk_r[2], **kw)
        o_u = ut.chain_verify_ut(*ci.inputs(), state=st_u, bank_k=bk_u[0], bank_v=bk_u[1], bank_g=bk_u[2], **kw)
        assert rel(o_u, o_r) < TOL and rel(st_u, st_r) < TOL
        for x, y in zip(bk_u, bk_r):
            assert rel(x, y) < TOL
        acc = torch.tensor([rng.randint(0, n) for n in ci.lens], device=DEV)
        if step == 1:  # separate commit instead of the fused one
            ref.recover_ref(st_r, c.slots, *bk_r, wb, acc)
            tr.recover(st_u, c.slots, *bk_u, wb, acc)
            pend = torch.zeros_like(acc)
        else:
            pend = acc
        wb = 1 - wb


def test_ut_token_strided_inputs():
    """q/k/v as column slices of one [N, C] tensor and g/beta as slices of one [N, 2*HV] tensor are
    read in place and give the contiguous result."""
    c = Case((2, 4, 32, 48), [3, 1, 4], seed=11)
    q, k, v, g, beta = c.inputs()
    N = q.shape[0]
    big = torch.cat([q.reshape(N, -1), k.reshape(N, -1), v.reshape(N, -1)], 1) + 0.0
    qs, ks, vs = torch.split(big, [q[0].numel(), k[0].numel(), v[0].numel()], 1)
    gb = torch.cat([g, beta], 1)
    gs, bs = gb[:, : g.shape[1]], gb[:, g.shape[1]:]
    assert not qs.is_contiguous() and not gs.is_contiguous()
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, write_bank=c.write_bank,
              pending_len=c.pending_len, read_bank=c.read_bank)
    o1 = ut.chain_verify_ut(q, k, v, g, beta, state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2], **kw)
    o2 = ut.chain_verify_ut(qs.view(q.shape), ks.view(k.shape), vs.view(v.shape), gs, bs, state=s2,
                            bank_k=b2[0], bank_v=b2[1], bank_g=b2[2], **kw)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    for x, y in zip(b1, b2):
        assert torch.equal(x, y)


def test_pick_config_ut_shape_only():
    for R in (1, 8, 128, 256):
        for shape in SMALL + BIG:
            H, HV, K, V = shape
            BV, nw, KC, ns = ut.pick_config_ut(R, HV, V, K, 8.0)
            assert BV >= 16 and BV & (BV - 1) == 0 and nw in (1, 2, 4, 8) and KC >= 16 and ns >= 1


@pytest.mark.skipif(not HAVE_CUDA, reason="CUDA graphs need CUDA")
def test_ut_cuda_graph_capture():
    """The launch is graph-capturable (no host sync during capture) and replays the eager result."""
    c = Case(BIG[0], [8] * 4, seed=12, pend=[5, 0, 3, 16])
    st, bk = c.state.clone(), c.banks()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, write_bank=c.write_bank,
              pending_len=c.pending_len, read_bank=c.read_bank, bank_k=bk[0], bank_v=bk[1], bank_g=bk[2])
    o_eager = ut.chain_verify_ut(*c.inputs(), state=st, **kw).clone()
    st_eager, bk_eager = st.clone(), [b.clone() for b in bk]
    st.copy_(c.state)
    for b, b0 in zip(bk, c.banks()):
        b.copy_(b0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ut.chain_verify_ut(*c.inputs(), state=st, **kw)
    torch.cuda.current_stream().wait_stream(s)
    st.copy_(c.state)
    for b, b0 in zip(bk, c.banks()):
        b.copy_(b0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g = ut.chain_verify_ut(*c.inputs(), state=st, **kw)
    st.copy_(c.state)
    for b, b0 in zip(bk, c.banks()):
        b.copy_(b0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g, o_eager) and torch.equal(st, st_eager)
    for x, y in zip(bk, bk_eager):
        assert torch.equal(x, y)


# ------------------------------------------------------------------------------------------------
# draft trees (tree_verify_ut) vs the sequential tree reference
# ------------------------------------------------------------------------------------------------


def _trees(rng, lens, forest=False):
    """One parent list per row: random trees (``forest``: several roots), plus fixed shapes."""
    fixed = {1: [-1], 2: [-1, 0], 5: [-1, 0, 0, 1, 2], 8: [-1, 0, 0, 1, 1, 2, 2, 3],
             9: [-1, 0, 1, 2, 0, 4, 5, 0, 7], 16: [-1] + [(t - 1) // 2 for t in range(1, 16)]}
    out = []
    for i, n in enumerate(lens):
        if i % 2 == 0 and n in fixed:
            out.append(fixed[n])
        else:
            out.append([-1] + [rng.randint(-1 if forest else 0, t - 1) for t in range(1, n)])
    return out


def run_tree(c: Case, parents, *, pending: bool):
    from vllm_specla.ops import tree_reference as tref  # noqa: PLC0415

    par = torch.tensor([p for row in parents for p in row], dtype=torch.int32, device=DEV)
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, parents=par, write_bank=c.write_bank)
    if pending:
        kw.update(pending_len=c.pending_len, read_bank=c.read_bank)
    o1 = tref.tree_verify_sequential_ref(*c.inputs(), state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2], **kw)
    o2 = ut.tree_verify_ut(*c.inputs(), state=s2, bank_k=b2[0], bank_v=b2[1], bank_g=b2[2], **kw)
    return (o1, s1, b1), (o2, s2, b2)


@pytest.mark.parametrize("shape", SMALL)
@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("forest", [False, True])
def test_ut_tree_vs_sequential_ref(shape, pending, forest):
    """Random trees / forests and fixed shapes (star-like, binary, three chains from the root) of
    1-16 nodes per row in one launch: every node's output and factors, the committed state."""
    rng = random.Random(hash((shape, pending, forest)) % 1000)
    c = Case(shape, LENS, seed=rng.randint(0, 999), pend=PEND)
    check(*run_tree(c, _trees(rng, LENS, forest), pending=pending))


def test_ut_tree_strong_decay_and_chain_equivalence():
    """Strong decay inside trees; and a chain-shaped tree equals the chain kernel."""
    rng = random.Random(3)
    c = Case((2, 4, 32, 48), [7, 1, 16, 4], seed=62, pend=[5, 16, 0, 2], strong_decay=True)
    check(*run_tree(c, _trees(rng, c.lens), pending=True))
    c = Case((2, 4, 32, 48), [5, 9], seed=63, pend=[2, 3])
    chain = [list(range(-1, n - 1)) for n in c.lens]
    (_, _, _), (o_t, s_t, b_t) = run_tree(c, chain, pending=True)
    (_, _, _), (o_c, s_c, b_c) = run_both(c, pending=True, final=False)
    assert rel(o_t, o_c) < 1e-6 and rel(s_t, s_c) < 1e-6
    for x, y in zip(b_t, b_c):
        assert rel(x, y) < 1e-6


def test_ut_tree_big_shape(big_fast):
    rng = random.Random(4)
    lens = [9, 3] if not HAVE_CUDA else [16, 9, 5, 16, 8, 3, 1, 12]
    c = Case(BIG[0], lens, seed=64, pend=[3, 5] if not HAVE_CUDA else PEND + [1, 2])
    check(*run_tree(c, _trees(rng, lens), pending=True))


@pytest.mark.parametrize("forest", [False, True])
def test_ut_tree_17_to_32_nodes(forest):
    """Trees of 17-32 nodes run with 32-node chunks (``BT = 32``, picked from the 32-position bank),
    beside short trees in the same launch: every node's output and factors, the committed state."""
    rng = random.Random(11 + forest)
    lens = [32, 17, 3, 24] if HAVE_CUDA else [32, 20]
    par = [[-1] + [(t - 1) // 2 for t in range(1, lens[0])]] + _trees(rng, lens[1:], forest)
    c = Case((2, 4, 32, 48), lens, seed=66 + forest, Tmax=32, pend=[3, 32, 1, 7][: len(lens)])
    check(*run_tree(c, par, pending=True))


def test_ut_tree_bt_choice_and_limits():
    """The chunk follows the longest tree (16 -> 16, 17-32 -> 32), more than 32 nodes is an error
    naming the limit, and a 20-node tree with an explicit 16-node bound is caught on the host."""
    assert ut._pick_bt(None) == 16 and ut._pick_bt(16) == 16 and ut._pick_bt(17) == 32 and ut._pick_bt(32) == 32
    with pytest.raises(ValueError, match="at most 32 nodes"):
        ut._pick_bt(33)
    rng = random.Random(12)
    c = Case((2, 4, 32, 48), [20], seed=67, Tmax=32, pend=[2])
    par = torch.tensor(_trees(rng, c.lens)[0], dtype=torch.int32, device=DEV)
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, parents=par, write_bank=c.write_bank,
              bank_k=c.bank_k.clone(), bank_v=c.bank_v.clone(), bank_g=c.bank_g.clone())
    with pytest.raises(ValueError, match="at most 16"):
        ut.tree_verify_ut(*c.inputs(), state=c.state.clone(), max_nodes=16, **kw)


def check_chain_and_tree_with_inf(c: Case, rng: random.Random):
    """Chain and tree launches of ``c`` (pending factors folded) against the reference, where some
    log decays are -inf: outputs, state, ``k^`` / ``v~`` factors within ``TOL`` (finite: ``rel()``
    checks), the ``g`` factors equal, -inf included."""
    for (o1, s1, b1), (o2, s2, b2) in (run_both(c, pending=True, final=False),
                                       run_tree(c, _trees(rng, c.lens), pending=True)):
        assert rel(o2, o1) < TOL and rel(s2, s1) < TOL
        assert rel(b2[0], b1[0]) < TOL and rel(b2[1], b1[1]) < TOL
        assert torch.equal(b2[2], b1[2])


def test_ut_minus_inf_decay():
    """A log decay of -inf (a reset: e^g = 0) gives the reference result, not NaN, in the chain
    and the tree form (the prep's decay products clamp g; review finding, session 8)."""
    c = Case((2, 4, 32, 48), [5, 9], seed=68, pend=[2, 3])
    c.g[1, 0] = float("-inf")
    c.g[8, 2] = float("-inf")
    check_chain_and_tree_with_inf(c, random.Random(13))


def test_ut_fold_edges(monkeypatch):
    """The pending fold (``UT_FOLD=1``) at its edges, chain and tree: more pending factors than the
    bank holds (clamped to ``Tmax``, as the reference), a log decay of -inf among the pending ones, and
    a row with nothing pending next to rows that have some; outputs, state and banks as the reference."""
    monkeypatch.setattr(ut, "UT_FOLD", "1")
    c = Case((2, 4, 32, 48), [4, 4, 3], seed=81, Tmax=4, pend=[7, 0, 2])  # windows within the 4-position bank
    c.bank_g[c.slots[0], c.read_bank[0], 1, 2] = float("-inf")
    c.bank_g[c.slots[2], c.read_bank[2], 0, 0] = float("-inf")
    check_chain_and_tree_with_inf(c, random.Random(21))


def test_ut_fold_auto_wiring(monkeypatch):
    """``UT_FOLD=auto`` as launched: a chain launch that is not split folds (no recover launch) once its
    state reaches ``UT_FOLD_MIN_STATE_BYTES``, and not below it; a split tree launch runs the recover
    kernel first. Each result equals the reference."""
    monkeypatch.setattr(ut, "UT_FOLD", "auto")
    calls = []
    real = ut._tr.recover
    monkeypatch.setattr(ut._tr, "recover", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    c = Case((2, 4, 32, 48), [5, 9], seed=82, pend=[2, 3])
    monkeypatch.setattr(ut, "UT_FOLD_MIN_STATE_BYTES", 0)
    check(*run_both(c, pending=True, final=False))
    assert calls == []  # folded
    monkeypatch.setattr(ut, "UT_FOLD_MIN_STATE_BYTES", 1 << 62)
    check(*run_both(c, pending=True, final=False))
    assert calls == [1]  # below the threshold: recover first
    monkeypatch.setattr(ut, "UT_FOLD_MIN_STATE_BYTES", 0)
    check(*run_tree(c, _trees(random.Random(3), c.lens), pending=True))  # 2 rows x 4 heads: split
    assert calls == [1, 1]


def test_ut_tree_forced_dispatch_without_bank_takes_the_tree_size(monkeypatch):
    """``tree_verify(tree_kernel="ut")`` with no factor bank and no ``max_nodes``: the chunk comes
    from the longest row (read on the host), so a 20-node tree runs with BT = 32."""
    from vllm_specla.ops import tree_reference as tref  # noqa: PLC0415
    from vllm_specla.ops import tree_verify as tv  # noqa: PLC0415

    rng = random.Random(14)
    c = Case((2, 4, 32, 48), [20, 3], seed=69)
    par = torch.tensor([p for row in _trees(rng, c.lens) for p in row], dtype=torch.int32, device=DEV)
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, parents=par)
    s1, s2 = c.state.clone(), c.state.clone()
    o1 = tref.tree_verify_sequential_ref(*c.inputs(), state=s1, **kw)
    if HAVE_CUDA:
        o2 = tv.tree_verify(*c.inputs(), state=s2, tree_kernel="ut", chain=False, **kw)
    else:  # the interpreter runs CPU tensors: the dispatcher's CUDA branch is taken through is_cuda
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
        o2 = tv.tree_verify(*c.inputs(), state=s2, tree_kernel="ut", chain=False, **kw)
        monkeypatch.undo()
    assert rel(o2, o1) < TOL and rel(s2, s1) < TOL


@pytest.mark.skipif(not HAVE_CUDA, reason="CUDA graphs need CUDA")
def test_ut_tree_32_nodes_cuda_graph_capture():
    """The 32-node chunk through the public dispatcher inside a CUDA graph (the host window check is
    skipped there, so the chunk must come from shapes: the 32-position bank, as in the runtime):
    the replay equals the sequential reference."""
    from vllm_specla.ops import tree_reference as tref  # noqa: PLC0415
    from vllm_specla.ops import tree_verify as tv  # noqa: PLC0415

    rng = random.Random(15)
    lens = [32, 20, 17, 32, 9, 25, 32, 18]  # >= 8 rows: the automatic rule takes UT
    c = Case(BIG[1], lens, seed=70, Tmax=32, pend=[3, 1, 5, 2, 4, 1, 2, 3])
    par = torch.tensor([p for row in _trees(rng, lens) for p in row], dtype=torch.int32, device=DEV)
    assert tv.pick_tree_kernel(len(lens), 8, 256, 256, 32) == "ut"
    b1 = c.banks()
    s1 = c.state.clone()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, parents=par, write_bank=c.write_bank,
              pending_len=c.pending_len, read_bank=c.read_bank)
    o1 = tref.tree_verify_sequential_ref(*c.inputs(), state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2], **kw)
    st, bk = c.state.clone(), c.banks()
    run = lambda: tv.tree_verify(*c.inputs(), state=st, bank_k=bk[0], bank_v=bk[1], bank_g=bk[2], chain=False,  # noqa: E731
                                 **kw)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # compile outside the graph
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g = run()
    st.copy_(c.state)
    for b, b0 in zip(bk, c.banks()):
        b.copy_(b0)
    graph.replay()
    torch.cuda.synchronize()
    check((o1, s1, b1), (o_g, st, bk))


def test_ut_strided_index_tensors_and_padded_slots():
    """Review findings: a strided ``parents`` view and a ``slots`` buffer longer than the rows
    (its extra entries, and pending/read_bank padding, must be ignored, as by the reference)."""
    from vllm_specla.ops import tree_reference as tref  # noqa: PLC0415

    rng = random.Random(9)
    c = Case((2, 4, 32, 48), [5, 9], seed=65, pend=[2, 3])
    parents = _trees(rng, c.lens)
    flat = torch.tensor([p for row in parents for p in row], dtype=torch.int64, device=DEV)
    strided = torch.stack([flat, torch.full_like(flat, 99)], 1).reshape(-1)[::2]  # stride-2 view
    assert not strided.is_contiguous()
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    pad = torch.tensor([x for x in range(c.state.shape[0]) if x not in c.slots.tolist()][:2], device=DEV)
    kw = dict(scale=c.scale, cu_seqlens=c.cu, write_bank=c.write_bank)
    o1 = tref.tree_verify_sequential_ref(*c.inputs(), state=s1, slots=c.slots, parents=flat, bank_k=b1[0],
                                         bank_v=b1[1], bank_g=b1[2], pending_len=c.pending_len,
                                         read_bank=c.read_bank, **kw)
    o2 = ut.tree_verify_ut(*c.inputs(), state=s2, slots=torch.cat([c.slots, pad]), parents=strided,
                           bank_k=b2[0], bank_v=b2[1], bank_g=b2[2],
                           pending_len=torch.cat([c.pending_len, torch.tensor([4, 4], device=DEV)]),
                           read_bank=torch.cat([c.read_bank, c.read_bank]), **kw)
    check((o1, s1, b1), (o2, s2, b2))


# ------------------------------------------------------------------------------------------------
# the split launch (UT_SPLIT: products on the raw q / k beside the prep, on a second stream)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def split(monkeypatch):
    monkeypatch.setattr(ut, "UT_SPLIT", "1")
    monkeypatch.setattr(ut, "UT_SPLIT_MAX_PAIRS", 1 << 30)


@pytest.mark.parametrize("shape", SMALL)
@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("forest", [False, True])
def test_ut_split_tree_vs_sequential_ref(shape, pending, forest, split):
    """Trees through the split launch: the products of the raw q / k scaled by the prep's l2norm
    scales give every node's output and factors and the committed state of the reference (the
    pending commit runs between the fork and the products)."""
    rng = random.Random(hash((shape, pending, forest, "split")) % 1000)
    c = Case(shape, LENS, seed=rng.randint(0, 999), pend=PEND)
    check(*run_tree(c, _trees(rng, LENS, forest), pending=pending))


@pytest.mark.parametrize("l2norm", [True, False])
def test_ut_split_chain_bf16_and_no_l2norm(l2norm, split):
    """Chain windows through the split launch with bf16 raw q / k (converted in the products
    kernel) and without the l2norm (the scales are 1 and ``scale``)."""
    c = Case(SMALL[0], [5, 16, 1, 9], seed=71, dtype=torch.bfloat16, pend=[2, 4, 16, 1])
    fn = lambda *a, **kw: ut.chain_verify_ut(*a, use_qk_l2norm=l2norm, **kw)  # noqa: E731
    res_ref, res_ut = run_both(c, pending=True, final=False, fn=fn)
    if not l2norm:  # the reference with the same setting
        s1, b1 = c.state.clone(), c.banks()
        o1 = ref.chain_verify_ref(*c.inputs(), state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2], scale=c.scale,
                                  slots=c.slots, cu_seqlens=c.cu, write_bank=c.write_bank,
                                  pending_len=c.pending_len, read_bank=c.read_bank, use_qk_l2norm=False)
        res_ref = (o1, s1, b1)
    check(res_ref, res_ut)


def test_ut_split_32_nodes_big_shape(split, big_fast):
    """32-node trees (``BT = 32``) at a GDN-1.3B head shape through the split launch."""
    rng = random.Random(12)
    lens = [32, 20] if not HAVE_CUDA else [32, 20, 17, 32, 5, 9, 32, 1]
    c = Case(BIG[0], lens, seed=72, Tmax=32, pend=[3, 7] if not HAVE_CUDA else [3, 7, 1, 32, 2, 5, 8, 4])
    check(*run_tree(c, _trees(rng, lens), pending=True))


@pytest.mark.skipif(not HAVE_CUDA, reason="CUDA graphs need CUDA")
def test_ut_split_in_cuda_graph(split):
    """The split launch's fork / join captured in a CUDA graph: replays equal eager calls (the
    second stream's prep is ordered before the combine kernel in the graph)."""
    rng = random.Random(13)
    c = Case(BIG[1], [16, 9, 16, 5], seed=73, pend=[2, 3, 1, 5])
    par = torch.tensor([p for row in _trees(rng, c.lens) for p in row], dtype=torch.int32, device=DEV)
    b_e, b_g = c.banks(), c.banks()
    s_e, s_g = c.state.clone(), c.state.clone()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, parents=par, write_bank=c.write_bank,
              pending_len=c.pending_len, read_bank=c.read_bank, max_nodes=16)
    o_e = ut.tree_verify_ut(*c.inputs(), state=s_e, bank_k=b_e[0], bank_v=b_e[1], bank_g=b_e[2], **kw)
    s_w, b_w = s_g.clone(), [b.clone() for b in b_g]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compiles) on copies
        ut.tree_verify_ut(*c.inputs(), state=s_w, bank_k=b_w[0], bank_v=b_w[1], bank_g=b_w[2], **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g = ut.tree_verify_ut(*c.inputs(), state=s_g, bank_k=b_g[0], bank_v=b_g[1], bank_g=b_g[2], **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert rel(o_g, o_e) < 1e-6 and rel(s_g, s_e) < 1e-6
    for x, y in zip(b_g, b_e):
        assert rel(x, y) < 1e-6


@pytest.mark.parametrize("n", [16, 32])
def test_ut_tree_deep_chain_strong_coupling(n):
    """A chain-shaped tree of ``n`` nodes whose keys are nearly parallel, ``beta`` ~ 1 and decay ~ 0:
    ``A`` is close to the all-ones strictly lower matrix, so every power ``A^j`` up to ``j = n - 1``
    matters in ``(I + A)^-1``; both forms (the ``solve`` fixture) must give the reference (a product
    form that stops one doubling short leaves out ``A^8 .. A^15``)."""
    c = Case(SMALL[0], [n, 3], seed=81, Tmax=32, pend=[0, 0])
    base = torch.randn(1, 1, c.k.shape[-1], generator=torch.Generator().manual_seed(82)).to(DEV)
    c.k = base + 0.02 * c.k  # nearly parallel keys
    c.q = base + 0.5 * c.q
    c.beta = torch.full_like(c.beta, 0.98)
    c.g = torch.full_like(c.g, -1e-3)
    parents = [list(range(-1, n - 1)), [-1, 0, 1]]
    check(*run_tree(c, parents, pending=False))
