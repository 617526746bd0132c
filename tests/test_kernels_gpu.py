"""Triton kernels vs the torch references (ALGORITHMS.md §2-§4, §6, §10.1-10.2).

Runs on CUDA; skipped without it, except under ``TRITON_INTERPRET=1`` where the small shapes run
on the CPU through Triton's interpreter (how the kernels were developed without a GPU).

Inputs are random (never zeros; banks are filled with random data so an unwritten or misplaced
factor shows), the references run in float32 on the same device, and every comparison is the
norm-wise relative error ``||x - ref|| / ||ref||``. Tolerance ``TOL = 1e-4``: all kernels use fp32
FMA arithmetic (no tf32 dots), measured errors are ~1e-7 to 1e-6; the margin covers reduction
order differences over K = 256. Shapes: (H, HV, K, V) = 6x256x512 ("flame 1B"), 8x256x256
("m-a-p 1.3B"), and small odd GVA shapes (2, 4, 32, 48), (1, 3, 16, 20).
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
# Triton's interpreter converts fp32 -> bf16 by truncation (the GPU rounds to nearest even, like
# torch), so bf16 conv windows are compared to 1 bf16 ulp there and exactly on the GPU.
STATE_TOL_BF16 = 1e-2 if INTERPRET else 0.0

from vllm_specla.ops import reference as ref  # noqa: E402
from vllm_specla.ops import tree_reference as tref  # noqa: E402

if HAVE_CUDA or INTERPRET:
    from vllm_specla.ops import triton_chain as tc  # noqa: E402
    from vllm_specla.ops import triton_recover as tr  # noqa: E402
    from vllm_specla.ops import tree_verify as tv  # noqa: E402

SMALL = [(2, 4, 32, 48), (1, 3, 16, 20)]
BIG = [(6, 6, 256, 512), (8, 8, 256, 256)]
SHAPES = SMALL if not HAVE_CUDA else SMALL + BIG


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all(), "non-finite output"
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


class Case:
    """R rows with window lengths ``lens`` on random distinct slots; banks and pending random."""

    def __init__(self, shape, lens, seed=0, Tmax=16, dtype=torch.float32, S=None, W=4):
        H, HV, K, V = shape
        gen = torch.Generator().manual_seed(seed)
        rn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
        ru = lambda *s: torch.rand(*s, generator=gen)  # noqa: E731
        R = len(lens)
        S = S or R + 2
        N = sum(lens)
        self.shape, self.R, self.N, self.Tmax = shape, R, N, Tmax
        self.cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
        d = lambda x, dt=None: x.to(device=DEV, dtype=dt or x.dtype)  # noqa: E731
        self.q, self.k, self.v = d(rn(N, H, K), dtype), d(rn(N, H, K), dtype), d(rn(N, HV, V), dtype)
        self.g = d(-(ru(N, HV) * 0.5 + 0.01))
        self.beta = d(ru(N, HV) * 0.9 + 0.05)
        self.scale = K ** -0.5
        self.state = d(rn(S, HV, V, K) * 0.1)
        self.slots = d(torch.randperm(S, generator=gen)[:R])
        self.bank_k = d(ref.l2norm(rn(S, 2, Tmax, H, K)))
        self.bank_v = d(rn(S, 2, Tmax, HV, V) * 0.1)
        self.bank_g = d(-ru(S, 2, Tmax, HV) * 0.3)
        self.read_bank = d(torch.randint(0, 2, (R,), generator=gen))
        self.write_bank = 1 - self.read_bank
        self.pending_len = d(torch.randint(0, Tmax + 1, (R,), generator=gen))
        C = 2 * H * K + HV * V
        self.C, self.W = C, W
        self.x = d(rn(N, C), dtype)
        self.weight = d(rn(C, W) * 0.5)
        self.conv_state = d(rn(S, W - 1, C))
        self.bank_x = d(rn(S, 2, Tmax, C))

    def inputs(self):
        return self.q, self.k, self.v, self.g, self.beta

    def banks(self):
        return [self.bank_k.clone(), self.bank_v.clone(), self.bank_g.clone()]


def _lens(rng, R, tmin=1, tmax=16):
    return [rng.randint(tmin, tmax) for _ in range(R)]


# ------------------------------------------------------------------------------------------------
# chain verify
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("final", [False, True])
def test_chain_verify_vs_ref(shape, pending, final):
    rng = random.Random(hash((shape, pending, final)) % 1000)
    R = 3 if shape in SMALL else 5
    c = Case(shape, _lens(rng, R), seed=rng.randint(0, 10**6))
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, write_bank=c.write_bank, write_final_state=final)
    if pending:
        kw.update(pending_len=c.pending_len, read_bank=c.read_bank)
    o1 = ref.chain_verify_ref(*c.inputs(), state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2], **kw)
    o2 = tc.chain_verify(*c.inputs(), state=s2, bank_k=b2[0], bank_v=b2[1], bank_g=b2[2], **kw)
    assert rel(o2, o1) < TOL
    assert rel(s2, s1) < TOL
    for x, y in zip(b2, b1):
        assert rel(x, y) < TOL
    for i in range(c.N):  # every token, not only the batch norm
        assert rel(o2[i], o1[i]) < 10 * TOL


@pytest.mark.parametrize("shape", SHAPES)
def test_chain_ar_decode_no_banks(shape):
    """T = 1 with write_final_state and no banks = the AR decode kernel."""
    rng = random.Random(3)
    R = 4 if shape in SMALL else 16
    c = Case(shape, [1] * R, seed=rng.randint(0, 10**6))
    s1, s2 = c.state.clone(), c.state.clone()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, write_final_state=True)
    o1 = ref.chain_verify_ref(*c.inputs(), state=s1, **kw)
    o2 = tc.chain_verify(*c.inputs(), state=s2, **kw)
    assert rel(o2, o1) < TOL and rel(s2, s1) < TOL


@pytest.mark.parametrize("config", [(8, 1, 0, 0), (4, 1, 16, 1)])
@pytest.mark.parametrize("W", [4, 3])
def test_out_slots_write_other_slots(config, W, monkeypatch):
    """AR steps with ``out_slots`` (a draft step onto scratch slots, rows reading one slot twice as
    for W branches): outputs, the state and conv window after the row in the out slots equal the
    reference run in place on copies there; the read slots and every other slot stay as they were.
    Both chain kernel bodies (KI = 0 / 16), the W = 4 and the generic conv kernel, an empty row."""
    monkeypatch.setattr(tc, "CONFIG_OVERRIDE", config, raising=False)
    lens = [1, 1, 1, 0]
    c = Case(SMALL[0], lens, seed=25, S=9, W=W)
    read = torch.tensor([2, 2, 5, 7], device=DEV)  # row 1 reads the same slot as row 0
    out = torch.tensor([0, 4, 6, 8], device=DEV)
    s1, s2 = c.state.clone(), c.state.clone()
    s1.index_copy_(0, out, s1.index_select(0, read))
    kw = dict(scale=c.scale, cu_seqlens=c.cu, write_final_state=True)
    o1 = ref.chain_verify_ref(*c.inputs(), state=s1, slots=out, **kw)
    o2 = tc.chain_verify(*c.inputs(), state=s2, slots=read, out_slots=out, **kw)
    assert rel(o2, o1) < TOL and rel(s2, s1) < TOL
    keep = [i for i in range(9) if i not in out.tolist()]
    assert torch.equal(s2[keep], c.state[keep])  # read slots (2, 5, 7) and the others untouched
    cs1, cs2 = c.conv_state.clone(), c.conv_state.clone()
    cs1.index_copy_(0, out, cs1.index_select(0, read))
    y1 = ref.conv_verify_ref(c.x, c.weight, c.cu, cs1, out, write_final_state=True)
    y2 = tc.conv_verify(c.x, c.weight, c.cu, cs2, read, write_final_state=True, out_slots=out)
    assert rel(y2, y1) < TOL and rel(cs2, cs1) < TOL
    assert torch.equal(cs2[keep], c.conv_state[keep])
    assert torch.equal(cs2[8], c.conv_state[7])  # the empty row's window, copied to its out slot
    with pytest.raises(ValueError, match="write_final_state"):
        tc.chain_verify(*c.inputs(), state=s2, slots=read, out_slots=out, scale=c.scale, cu_seqlens=c.cu)
    with pytest.raises(ValueError, match="factor banks"):
        tc.conv_verify(c.x, c.weight, c.cu, cs2, read, bank_x=c.bank_x, write_bank=c.write_bank,
                       write_final_state=True, out_slots=out)


@pytest.mark.parametrize("config", [(8, 1, 0, 0), (4, 1, 16, 1)])
def test_chain_token_strided_inputs(config, monkeypatch):
    """q/k/v as column slices of one [N, C] conv output and g/beta as slices of one [N, 2*HV]
    tensor (what the fused runtime passes) are read in place and give the contiguous result."""
    monkeypatch.setattr(tc, "CONFIG_OVERRIDE", config)
    shape = SMALL[0]
    c = Case(shape, [3, 1, 4], seed=11)
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
    o1 = tc.chain_verify(q, k, v, g, beta, state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2], **kw)
    o2 = tc.chain_verify(qs.view(q.shape), ks.view(k.shape), vs.view(v.shape), gs, bs, state=s2,
                         bank_k=b2[0], bank_v=b2[1], bank_g=b2[2], **kw)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    for x, y in zip(b1, b2):
        assert torch.equal(x, y)


def test_chain_bf16_inputs():
    shape = SMALL[0] if not HAVE_CUDA else BIG[0]
    c = Case(shape, [5, 1, 9], seed=5, dtype=torch.bfloat16)
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, write_bank=c.write_bank, pending_len=c.pending_len,
              read_bank=c.read_bank)
    o1 = ref.chain_verify_ref(*c.inputs(), state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2], **kw)
    o2 = tc.chain_verify(*c.inputs(), state=s2, bank_k=b2[0], bank_v=b2[1], bank_g=b2[2], **kw)
    assert rel(o2, o1) < TOL and rel(s2, s1) < TOL and rel(b2[1], b1[1]) < TOL


@pytest.mark.parametrize("config", [(8, 1, 0), (8, 1, 8), (4, 1, 16, 1), (16, 2, 8, 1), (8, 1, 32, 0)])
@pytest.mark.parametrize("strong_decay", [False, True])
def test_chain_tile_configs(config, strong_decay, monkeypatch):
    """Every tile layout (KI = 0: [BV, K] kernel; else [K/KI, BV, KI]) and the scaled-state
    renormalisation (strong decay: g down to -100, e^g underflows) against the reference."""
    monkeypatch.setattr(tc, "CONFIG_OVERRIDE", config)
    shape = (2, 4, 32, 48)
    c = Case(shape, [7, 1, 16, 4], seed=61)
    if strong_decay:
        gen = torch.Generator().manual_seed(62)
        c.g = (-torch.rand(c.g.shape, generator=gen) * 40).to(DEV)
        c.g[::3] = -100.0
        c.bank_g = (-torch.rand(c.bank_g.shape, generator=gen) * 40).to(DEV)
    for final in (False, True):
        s1, s2 = c.state.clone(), c.state.clone()
        b1, b2 = c.banks(), c.banks()
        kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, write_bank=c.write_bank, write_final_state=final,
                  pending_len=c.pending_len, read_bank=c.read_bank)
        o1 = ref.chain_verify_ref(*c.inputs(), state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2], **kw)
        o2 = tc.chain_verify(*c.inputs(), state=s2, bank_k=b2[0], bank_v=b2[1], bank_g=b2[2], **kw)
        assert rel(o2, o1) < TOL and rel(s2, s1) < TOL
        for x, y in zip(b2, b1):
            assert rel(x, y) < TOL


@pytest.mark.parametrize("config", [(8, 1, 32, 1), (4, 1, 16, 1)])
@pytest.mark.parametrize("final", [False, True])
def test_chain_rescale_precheck(config, final, monkeypatch):
    """``RESCALE_PRECHECK`` (session 46): programs whose decays (pending, then window) have no prefix below
    ``RESCALE_MIN`` run the loops without the renormalisation test, the others the tested loops. A launch with
    rows of both kinds (a window whose decays underflow e^g, pending factors whose decays do, ordinary rows) and
    one without a bank whose long row's underflowing decays lie past ``TW``: outputs, state and banks match the
    reference and the launches with the test everywhere (bit for bit under the interpreter, 1e-6 on a GPU); the
    launches take the mode asked for, and ``auto`` picks it by shape."""
    monkeypatch.setattr(tc, "CONFIG_OVERRIDE", config)
    seen = []
    real = tc._chain_verify_kernel

    class Kernel:  # records each launch's RESCALE_PRECHECK and TW, then launches
        def __getitem__(self, grid):
            return lambda *a, **kw: (seen.append((kw["RESCALE_PRECHECK"], kw["TW"])), real[grid](*a, **kw))[1]

    monkeypatch.setattr(tc, "_chain_verify_kernel", Kernel())
    c = Case((2, 4, 32, 48), [7, 1, 16, 4, 2], seed=65, Tmax=16)
    c.pending_len = torch.tensor([2, 3, 0, 8, 5], device=DEV)
    c.g[0:7] = -50.0  # row 0: e^g underflows within its window unless renormalised
    c.bank_g[c.slots[3], c.read_bank[3]] = -60.0  # row 3: within its pending factors
    # (rows 1, 2 and 4: ordinary decays, the loops without the test)
    c2 = Case((2, 4, 32, 48), [20, 3], seed=66)
    c2.g[16:20] = -100.0  # no bank: row 0's 20 tokens > TW = 16, its decays past token 16 not read: tested loops
    runs = []
    for mode in ("0", "1"):
        monkeypatch.setattr(tc, "RESCALE_PRECHECK", mode)
        st, b, st2 = c.state.clone(), c.banks(), c2.state.clone()
        o = tc.chain_verify(*c.inputs(), state=st, bank_k=b[0], bank_v=b[1], bank_g=b[2], scale=c.scale, slots=c.slots,
                            cu_seqlens=c.cu, write_bank=c.write_bank, write_final_state=final,
                            pending_len=c.pending_len, read_bank=c.read_bank)
        o2 = tc.chain_verify(*c2.inputs(), state=st2, scale=c2.scale, slots=c2.slots, cu_seqlens=c2.cu,
                             write_final_state=final)
        runs.append((o, st, b, o2, st2))
    assert seen == [(False, 16), (False, 16), (True, 16), (True, 16)]
    (o0, s0, b0, p0, t0), (o1, s1, b1, p1, t1) = runs
    same = torch.equal if INTERPRET else (lambda x, y: rel(x, y) < 1e-6)
    assert same(o1, o0) and same(s1, s0) and same(p1, p0) and same(t1, t0)
    sr, br, sr2 = c.state.clone(), c.banks(), c2.state.clone()
    orf = ref.chain_verify_ref(*c.inputs(), state=sr, bank_k=br[0], bank_v=br[1], bank_g=br[2], scale=c.scale,
                               slots=c.slots, cu_seqlens=c.cu, write_bank=c.write_bank, write_final_state=final,
                               pending_len=c.pending_len, read_bank=c.read_bank)
    orf2 = ref.chain_verify_ref(*c2.inputs(), state=sr2, scale=c2.scale, slots=c2.slots, cu_seqlens=c2.cu,
                                write_final_state=final)
    assert rel(o1, orf) < TOL and rel(s1, sr) < TOL and rel(p1, orf2) < TOL and rel(t1, sr2) < TOL
    for x, y, z in zip(b1, b0, br):
        assert same(x, y) and rel(x, z) < TOL
    monkeypatch.setattr(tc, "RESCALE_PRECHECK", "auto")
    assert tc._rescale_precheck(8, 2, 4) and tc._rescale_precheck(2, 2, 4)  # windows; one-token rows, 8 pairs
    assert not tc._rescale_precheck(3, 3, 4)  # one-token rows, 12 pairs: the test per token


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
@pytest.mark.parametrize("strong_decay", [False, True])
def test_chain_pending_prefetch_depths(depth, strong_decay, monkeypatch):
    """The pending factors' prefetch depth (``PENDING_PREFETCH``) changes only when loads are issued:
    outputs, state and banks are bit for bit those of the default depth (4) and match the reference,
    with pending counts 0, 1, below, at and above the depth, a full bank and more than the bank holds
    (clamped), with and without the state written, under strong decay (the scaled state renormalised
    inside the fold). The launches take the depth asked for (these windows are in the measured regime: more
    tokens than rows, 12 (row, value head) pairs)."""
    monkeypatch.setattr(tc, "CONFIG_OVERRIDE", (4, 1, 16, 1))
    seen = []
    real = tc._chain_verify_kernel

    class Kernel:  # records each launch's PEND_PF, then launches
        def __getitem__(self, grid):
            return lambda *a, **kw: (seen.append(kw["PEND_PF"]), real[grid](*a, **kw))[1]

    monkeypatch.setattr(tc, "_chain_verify_kernel", Kernel())
    c = Case((1, 2, 32, 12), [7, 1, 8, 4, 2, 3], seed=63, Tmax=8)  # GVA 2, 3 V-tiles (few interpreted programs)
    c.pending_len = torch.tensor([0, 1, 3, 4, 8, 11], device=DEV)
    if strong_decay:
        gen = torch.Generator().manual_seed(64)
        c.g = (-torch.rand(c.g.shape, generator=gen) * 40).to(DEV)
        c.bank_g = (-torch.rand(c.bank_g.shape, generator=gen) * 40).to(DEV)
        c.bank_g[..., ::3, :] = -100.0
    for final in (False, True):
        kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, write_bank=c.write_bank, write_final_state=final,
                  pending_len=c.pending_len, read_bank=c.read_bank)
        runs = []
        for d in (4, depth):
            monkeypatch.setattr(tc, "PENDING_PREFETCH", d)
            st, b = c.state.clone(), c.banks()
            runs.append((tc.chain_verify(*c.inputs(), state=st, bank_k=b[0], bank_v=b[1], bank_g=b[2], **kw), st, b))
        (o0, s0, b0), (o1, s1, b1) = runs
        assert torch.equal(o1, o0) and torch.equal(s1, s0)
        sr, br = c.state.clone(), c.banks()
        orf = ref.chain_verify_ref(*c.inputs(), state=sr, bank_k=br[0], bank_v=br[1], bank_g=br[2], **kw)
        assert rel(o1, orf) < TOL and rel(s1, sr) < TOL
        for x, y, z in zip(b1, b0, br):
            assert torch.equal(x, y) and rel(x, z) < TOL
    assert seen == [4, depth] * 2


def test_chain_window_too_long():
    c = Case(SMALL[0], [3, 5], seed=1, Tmax=4)
    with pytest.raises(ValueError):
        tc.chain_verify(*c.inputs(), scale=c.scale, state=c.state, slots=c.slots, cu_seqlens=c.cu,
                        bank_k=c.bank_k, bank_v=c.bank_v, bank_g=c.bank_g, write_bank=c.write_bank)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_accepted_prefix(shape):
    """Verify a T=9 window (K=8 drafts) with factors, then for every accepted count A = 0..9:
    Triton recover == state after A tokens (sequential recurrence) == recover_ref, and the fused
    deferred commit (next verify with pending_len = A) == recover + verify."""
    T = 9
    R = T + 1  # row r accepts A = r
    c = Case(shape, [T] * R, seed=17, Tmax=16)
    st = c.state.clone()
    banks = c.banks()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu)
    tc.chain_verify(*c.inputs(), state=st, bank_k=banks[0], bank_v=banks[1], bank_g=banks[2],
                    write_bank=c.write_bank, **kw)
    assert rel(st, c.state) == 0.0  # verify without pending never writes the state
    A = torch.arange(R, device=DEV)
    s_tr, s_ref = st.clone(), st.clone()
    tr.recover(s_tr, c.slots, *banks, c.write_bank, A)
    ref.recover_ref(s_ref, c.slots, *banks, c.write_bank, A)
    assert rel(s_tr, s_ref) < TOL
    for r in range(R):
        slot = int(c.slots[r])
        if r == 0:
            assert torch.equal(s_tr[slot], st[slot])
            continue
        s0 = r * T
        sub = [x[s0 : s0 + r] for x in c.inputs()]
        _, fin = ref.recurrent_gated_delta_rule_ref(*sub, c.scale, torch.tensor([0, r]), initial_state=st[slot][None])
        assert rel(s_tr[slot], fin[0]) < TOL
    # fused deferred commit: next window (2 tokens per row) with the A accepted factors pending
    c2 = Case(shape, [2] * R, seed=18, Tmax=16)
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c2.cu)
    nb = [b.clone() for b in banks]
    s_fused = st.clone()
    o_f = tc.chain_verify(*c2.inputs(), state=s_fused, bank_k=nb[0], bank_v=nb[1], bank_g=nb[2],
                          write_bank=c.read_bank, pending_len=A, read_bank=c.write_bank, **kw)
    nb2 = [b.clone() for b in banks]
    s_sep = s_tr.clone()
    o_s = tc.chain_verify(*c2.inputs(), state=s_sep, bank_k=nb2[0], bank_v=nb2[1], bank_g=nb2[2],
                          write_bank=c.read_bank, **kw)
    assert rel(s_fused, s_sep) < TOL and rel(o_f, o_s) < TOL
    for x, y in zip(nb, nb2):
        assert rel(x, y) < TOL


@pytest.mark.parametrize("config", [(4, 1), (8, 1), (16, 2), (64, 4)])
def test_recover_tile_configs(config, monkeypatch):
    """The recover kernel's tile config (``bench_kernels.py --recover-configs``) changes only the tiling (grid and
    warps, and the launch takes them): every config matches ``recover_ref`` (TOL) and the default config (1e-6: the
    same serial updates per state element, rounded differently by another num_warps, H200 session 46), with accepted
    counts 0, 1, a few, a full bank and more than the bank holds (clamped), and one (row, head) whose decays
    underflow (-12 per factor, e^-96 at the end); a row accepting nothing and slots outside the batch are untouched.
    A config (given or the default) that is not two positive integers is refused (session 46's third entry, the
    scaled fold, was measured slower on an H100 in session 47 and removed)."""
    seen = []
    real = tr._recover_kernel

    class Kernel:  # records each launch's grid, BV and num_warps, then launches
        def __getitem__(self, grid):
            return lambda *a, **kw: (seen.append((grid, kw["BV"], kw["num_warps"])), real[grid](*a, **kw))[1]

    monkeypatch.setattr(tr, "_recover_kernel", Kernel())
    c = Case((1, 2, 32, 12), [1] * 6, seed=71, Tmax=8)  # GVA 2, 12 values: 1-3 V-tiles (few interpreted programs)
    acc = torch.tensor([0, 1, 3, 5, 8, 11], device=DEV)
    banks = c.banks()
    banks[2][c.slots[4], c.write_bank[4], :, 1] = -12.0  # row 4 (8 accepted), value head 1: decays to e^-96
    s0, s1, sr = c.state.clone(), c.state.clone(), c.state.clone()
    tr.recover(s0, c.slots, *banks, c.write_bank, acc)
    tr.recover(s1, c.slots, *banks, c.write_bank, acc, config=config)
    BV = min(config[0], 16)  # (clamped to next_power_of_2(V))
    assert seen[1] == (((12 + BV - 1) // BV, 2, 6), BV, config[1])
    ref.recover_ref(sr, c.slots, *banks, c.write_bank, acc.clamp(max=8))  # (the reference refuses counts > Tmax)
    assert rel(s1, sr) < TOL
    assert rel(s1, s0) < 1e-6
    assert rel(s1[c.slots[4], 1], sr[c.slots[4], 1]) < TOL  # the underflowing (row, head)
    assert not torch.equal(s1, c.state)  # the factors were folded
    assert torch.equal(s1[c.slots[0]], c.state[c.slots[0]])  # 0 accepted: untouched
    others = torch.ones(c.state.shape[0], dtype=torch.bool, device=DEV)
    others[c.slots] = False
    assert torch.equal(s1[others], c.state[others])
    for bad in [(8, 1, 1), (8,), (0, 1), (8.0, 1)]:
        with pytest.raises(ValueError, match="must be \\(BV, num_warps\\)"):
            tr.recover(s1, c.slots, *banks, c.write_bank, acc, config=bad)
    monkeypatch.setitem(tc.TUNED, "recover", (8, 2, 1))  # a bad default is refused too, not truncated
    with pytest.raises(ValueError, match="must be \\(BV, num_warps\\)"):
        tr.recover(s1, c.slots, *banks, c.write_bank, acc)


def test_snapshot_baseline():
    shape = SMALL[0]
    c = Case(shape, [4, 2], seed=9, Tmax=4)
    snap = torch.randn(2, 4, *c.state.shape[1:], device=DEV)
    s = c.state.clone()
    o = tc.chain_verify_snapshots(*c.inputs(), scale=c.scale, state=s, slots=c.slots, cu_seqlens=c.cu, snap=snap)
    o1 = ref.chain_verify_ref(*c.inputs(), scale=c.scale, state=c.state.clone(), slots=c.slots, cu_seqlens=c.cu)
    assert rel(o, o1) < TOL
    for r, T in enumerate([4, 2]):
        slot = int(c.slots[r])
        for t in range(T):
            sub = [x[r * 4 : r * 4 + t + 1] for x in c.inputs()]
            _, fin = ref.recurrent_gated_delta_rule_ref(*sub, c.scale, torch.tensor([0, t + 1]),
                                                       initial_state=c.state[slot][None])
            assert rel(snap[r, t], fin[0]) < TOL


@pytest.mark.skipif(not HAVE_CUDA, reason="fla needs CUDA")
def test_ar_matches_fla():
    fla = pytest.importorskip("fla.ops.gated_delta_rule")
    shape = BIG[0]
    R = 8
    c = Case(shape, [1] * R, seed=4)
    st = c.state.clone()
    o = tc.chain_verify(*c.inputs(), scale=c.scale, state=st, slots=c.slots, cu_seqlens=c.cu, write_final_state=True)
    h0 = c.state[c.slots.long()].contiguous()
    o_f, ht = fla.fused_recurrent_gated_delta_rule(
        c.q[None], c.k[None], c.v[None], g=c.g[None], beta=c.beta[None], scale=c.scale, initial_state=h0,
        output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True, cu_seqlens=c.cu.long())
    assert rel(o, o_f[0].float()) < TOL
    assert rel(st[c.slots.long()], ht) < TOL


# ------------------------------------------------------------------------------------------------
# conv
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("final", [False, True])
def test_conv_verify_row_strided_input(final):
    """x as a column slice of a wider projection output is read in place, same result."""
    c = Case(SMALL[0], [2, 3, 1], seed=23)
    wide = torch.cat([c.x, torch.randn(c.x.shape[0], 7, device=c.x.device, dtype=c.x.dtype)], 1)
    xs = wide[:, : c.x.shape[1]]
    assert not xs.is_contiguous()
    outs = []
    for x in (c.x, xs):
        cs, bx = c.conv_state.clone(), c.bank_x.clone()
        y = tc.conv_verify(x, c.weight, c.cu, cs, c.slots, bank_x=bx, write_bank=c.write_bank,
                           pending_len=c.pending_len, read_bank=c.read_bank, write_final_state=final)
        outs.append((y, cs, bx))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("cdtype", [torch.float32, torch.bfloat16])
def test_conv_verify_vs_ref(shape, pending, final, cdtype):
    rng = random.Random(21)
    lens = [1, 2, 3] + _lens(rng, 3)
    c = Case(shape, lens, seed=22)
    cs0 = c.conv_state.to(cdtype)
    cs1, cs2 = cs0.clone(), cs0.clone()
    x1, x2 = c.bank_x.clone(), c.bank_x.clone()
    kw = dict(write_bank=c.write_bank, write_final_state=final)
    if pending:
        kw.update(pending_len=c.pending_len, read_bank=c.read_bank)
    y1 = ref.conv_verify_ref(c.x, c.weight, c.cu, cs1, c.slots, bank_x=x1, **kw)
    y2 = tc.conv_verify(c.x, c.weight, c.cu, cs2, c.slots, bank_x=x2, **kw)
    assert rel(y2, y1) < TOL
    tol = STATE_TOL_BF16 if cdtype == torch.bfloat16 else TOL
    assert rel(cs2.float(), cs1.float()) <= tol and torch.equal(x1, x2)


@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("lens,W", [([0, 2, 0, 1], 4), ([1] * 40, 4), ([0, 3, 1, 5], 3), ([2, 0, 4], 2)])
def test_conv_verify_empty_rows_and_many_rows(pending, final, lens, W):
    """Rows without tokens (a zero-draft step) keep or commit their window exactly as the
    reference; 40 one-token rows take the small-channel-tile launch of the W = 4 rolling-window
    kernel; W = 3 and 2 take the generic kernel."""
    c = Case(SMALL[0], lens, seed=24, W=W)
    cs1, cs2 = c.conv_state.clone(), c.conv_state.clone()
    x1, x2 = c.bank_x.clone(), c.bank_x.clone()
    kw = dict(write_bank=c.write_bank, write_final_state=final)
    if pending:
        kw.update(pending_len=c.pending_len, read_bank=c.read_bank)
    y1 = ref.conv_verify_ref(c.x, c.weight, c.cu, cs1, c.slots, bank_x=x1, **kw)
    y2 = tc.conv_verify(c.x, c.weight, c.cu, cs2, c.slots, bank_x=x2, **kw)
    assert rel(y2, y1) < TOL
    assert rel(cs2, cs1) < TOL and torch.equal(x1, x2)
    if pending:
        assert not torch.equal(cs2, c.conv_state)  # the pending commit moved some window


@pytest.mark.parametrize("TB", [1, 2, 4, 8])
@pytest.mark.parametrize("bank,pending,final", [(True, False, False), (True, True, False), (True, True, True),
                                                (False, False, True), (False, False, False)])
def test_conv4_token_chunks(TB, bank, pending, final, monkeypatch):
    """The W = 4 kernel's token chunks of TB (loads of a chunk before its stores): every chunk size
    gives the reference on rows shorter, equal and longer than a chunk (0..13 tokens, so some rows
    take several chunks and end mid-chunk), with and without the factor bank / pending factors /
    final window; without any of them (the last draft step, ``"ar_read"``) nothing is written."""
    monkeypatch.setattr(tc, "_conv4_config", lambda R, C, N: (16, TB, 2))  # several channel tiles too
    c = Case(SMALL[0], [0, 1, 3, 5, 8, 9, 13], seed=27)
    cs1, cs2 = c.conv_state.clone(), c.conv_state.clone()
    x1, x2 = c.bank_x.clone(), c.bank_x.clone()
    kw = dict(write_final_state=final)
    if bank:
        kw.update(bank_x=None, write_bank=c.write_bank)
    if pending:
        kw.update(pending_len=c.pending_len, read_bank=c.read_bank)
    b1, b2 = (dict(bank_x=x1), dict(bank_x=x2)) if bank else ({}, {})
    kw.pop("bank_x", None)
    y1 = ref.conv_verify_ref(c.x, c.weight, c.cu, cs1, c.slots, **b1, **kw)
    y2 = tc.conv_verify(c.x, c.weight, c.cu, cs2, c.slots, **b2, **kw)
    assert rel(y2, y1) < TOL
    assert rel(cs2, cs1) < TOL and torch.equal(x1, x2)
    if not (bank or final):
        assert torch.equal(cs2, c.conv_state)


@pytest.mark.parametrize("TB", [1, 4, 8])
def test_conv4_token_chunks_out_slots(TB, monkeypatch):
    """A draft window onto other slots (``out_slots``) with rows of several chunks: the window after
    each row lands in its out slot, the read slots stay as they were."""
    monkeypatch.setattr(tc, "_conv4_config", lambda R, C, N: (16, TB, 2))
    lens = [0, 1, 3, 5, 9, 13]
    c = Case(SMALL[0], lens, seed=28, S=2 * len(lens) + 1)
    R = len(lens)
    read = torch.arange(R, device=c.x.device)
    out = R + 1 + torch.arange(R, device=c.x.device)
    cs1, cs2 = c.conv_state.clone(), c.conv_state.clone()
    cs1[out] = cs1[read]
    y1 = ref.conv_verify_ref(c.x, c.weight, c.cu, cs1, out, write_final_state=True)
    y2 = tc.conv_verify(c.x, c.weight, c.cu, cs2, read, write_final_state=True, out_slots=out)
    assert rel(y2, y1) < TOL
    assert rel(cs2[out], cs1[out]) < TOL
    assert torch.equal(cs2[: R + 1], c.conv_state[: R + 1])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cdtype", [torch.float32, torch.bfloat16])
def test_conv_commit_every_prefix(shape, cdtype):
    Tmax = 9
    R = Tmax + 1
    c = Case(shape, [1] * R, seed=31, Tmax=Tmax)
    A = torch.arange(R, device=DEV)
    cs1 = c.conv_state.to(cdtype)
    cs2 = cs1.clone()
    ref.conv_commit_ref(cs1, c.slots, c.bank_x, c.read_bank, A)
    tr.conv_commit(cs2, c.slots, c.bank_x, c.read_bank, A)
    if cdtype == torch.bfloat16 and INTERPRET:
        assert rel(cs2.float(), cs1.float()) <= STATE_TOL_BF16
    else:
        assert torch.equal(cs1, cs2)


# ------------------------------------------------------------------------------------------------
# tree
# ------------------------------------------------------------------------------------------------


def _random_tree(T, rng):
    return [-1] + [rng.randint(0, t - 1) for t in range(1, T)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("pending", [False, True])
def test_tree_verify_triton(shape, pending):
    rng = random.Random(41)
    trees = [_random_tree(rng.randint(1, 16), rng) for _ in range(3 if shape in SMALL else 4)]
    trees[0] = _random_tree(16, rng)
    c = Case(shape, [len(t) for t in trees], seed=42)
    parents = torch.tensor([p for t in trees for p in t], device=DEV)
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    kw = dict(scale=c.scale, slots=c.slots, cu_seqlens=c.cu, parents=parents, write_bank=c.write_bank)
    if pending:
        kw.update(pending_len=c.pending_len, read_bank=c.read_bank)
    o1 = tref.tree_verify_sequential_ref(*c.inputs(), state=s1, bank_k=b1[0], bank_v=b1[1], bank_g=b1[2], **kw)
    o2 = tv.tree_verify(*c.inputs(), state=s2, bank_k=b2[0], bank_v=b2[1], bank_g=b2[2], chain=False, **kw)
    assert rel(o2, o1) < TOL and rel(s2, s1) < TOL
    for x, y in zip(b2, b1):
        assert rel(x, y) < TOL
    # chain topology through the dispatcher == chain kernel
    lens = [5, 3]
    c = Case(shape, lens, seed=43)
    parents = torch.tensor([p for n in lens for p in range(-1, n - 1)], device=DEV)
    s1, s2 = c.state.clone(), c.state.clone()
    o1 = tv.tree_verify(*c.inputs(), scale=c.scale, state=s1, slots=c.slots, cu_seqlens=c.cu, parents=parents,
                        max_nodes=8, chain=False)
    o2 = tv.tree_verify(*c.inputs(), scale=c.scale, state=s2, slots=c.slots, cu_seqlens=c.cu, parents=parents)
    assert rel(o1, o2) < TOL


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("cdtype", [torch.float32, torch.bfloat16])
def test_tree_conv_triton(shape, pending, cdtype):
    rng = random.Random(51)
    trees = [_random_tree(rng.randint(1, 12), rng) for _ in range(3)]
    c = Case(shape, [len(t) for t in trees], seed=52)
    parents = torch.tensor([p for t in trees for p in t], device=DEV)
    cs1 = c.conv_state.to(cdtype)
    cs2 = cs1.clone()
    x1, x2 = c.bank_x.clone(), c.bank_x.clone()
    kw = dict(write_bank=c.write_bank)
    if pending:
        kw.update(pending_len=c.pending_len, read_bank=c.read_bank)
    y1 = tref.tree_conv_ref(c.x, c.weight, c.cu, parents, cs1, c.slots, bank_x=x1, **kw)
    y2 = tv.tree_conv(c.x, c.weight, c.cu, parents, cs2, c.slots, bank_x=x2, chain=False, **kw)
    tol = STATE_TOL_BF16 if cdtype == torch.bfloat16 else 0.0
    assert rel(y2, y1) < TOL and rel(cs2.float(), cs1.float()) <= tol and torch.equal(x1, x2)


@pytest.mark.parametrize("W,pending,strided,max_nodes,bank,cdtype", [
    (4, False, False, None, True, torch.float32), (4, True, False, None, True, torch.float32),
    (4, True, True, None, True, torch.float32), (4, False, True, 4, True, torch.float32),
    (4, True, True, 4, True, torch.float32), (4, True, True, None, True, torch.bfloat16),
    (3, True, False, None, True, torch.float32), (3, False, True, 4, True, torch.float32),
    (2, True, True, None, True, torch.float32), (4, False, True, None, False, torch.float32),
    (3, False, False, 8, False, torch.float32)])
def test_tree_conv_triton_direct(W, pending, strided, max_nodes, bank, cdtype):
    """The Triton tree conv itself (also under the interpreter, where ``tree_conv`` would take the
    reference for CPU tensors) vs ``tree_conv_ref``: trees of 1-32 nodes and a forest, x as a
    column slice of a wider bf16 tensor (read in place) or dense fp32, the node chunk from the bank,
    forced small (``max_nodes = 4``: rows of up to 32 nodes in several chunks, ancestors in earlier
    chunks) or the no-bank default; W = 2-4; fp32 or bf16 conv window. y to 1e-4 (fp32 sums in
    another order), bank_x exact, the committed window exact (bf16: to 1 ulp under the interpreter,
    whose fp32 -> bf16 conversion truncates)."""
    rng = random.Random(f"tree-conv-{W}-{pending}-{strided}-{max_nodes}-{bank}-{cdtype}")  # stable seed
    trees = [_random_tree(32, rng), _random_tree(1, rng), _random_tree(rng.randint(2, 12), rng),
             [-1, 0, -1, 2, 1, -1, 5]]  # a forest: every root reads the committed window
    c = Case(SMALL[0], [len(t) for t in trees], seed=rng.randint(0, 999), Tmax=32, W=W)
    parents = torch.tensor([p for t in trees for p in t], device=DEV)
    x = c.x
    if strided:  # columns 5 .. 5 + C of a [N, C + 11] bf16 tensor (the in-projection's layout)
        wide = torch.randn(c.N, c.C + 11, generator=torch.Generator().manual_seed(3)).to(device=DEV,
                                                                                       dtype=torch.bfloat16)
        x = wide[:, 5 : 5 + c.C]
        assert x.stride(0) == c.C + 11
    cs1 = c.conv_state.to(cdtype)
    cs2 = cs1.clone()
    x1, x2 = c.bank_x.clone(), c.bank_x.clone()
    kw = dict(write_bank=c.write_bank) if bank else {}
    if pending:
        kw.update(pending_len=c.pending_len, read_bank=c.read_bank)
    b1, b2 = (dict(bank_x=x1), dict(bank_x=x2)) if bank or pending else ({}, {})
    y1 = tref.tree_conv_ref(x, c.weight, c.cu, parents, cs1, c.slots, **b1, **kw)
    y2 = tv.tree_conv_triton(x, c.weight, c.cu, parents, cs2, c.slots, max_nodes=max_nodes, **b2, **kw)
    assert rel(y2, y1) < TOL
    for i in range(c.N):  # every node
        assert rel(y2[i], y1[i]) < 10 * TOL
    tol = STATE_TOL_BF16 if cdtype == torch.bfloat16 else 0.0
    assert rel(cs2.float(), cs1.float()) <= tol and torch.equal(x2, x1)
    if not pending:  # nothing pending: the committed window is not rewritten
        assert torch.equal(cs2, c.conv_state.to(cdtype))


def test_tree_conv_bank_arguments_need_bank_x():
    """write_bank / pending_len without bank_x is an error naming the field (as conv_verify)."""
    c = Case(SMALL[0], [3, 2], seed=26)
    parents = torch.tensor([-1, 0, 0, -1, 0], device=DEV)
    for kw in (dict(write_bank=c.write_bank), dict(pending_len=c.pending_len, read_bank=c.read_bank)):
        with pytest.raises(ValueError, match="bank_x"):
            tv.tree_conv_triton(c.x, c.weight, c.cu, parents, c.conv_state.clone(), c.slots, **kw)


def test_tree_conv_config():
    """Node chunk = next_pow2(max_nodes) in 2..32; channel tiles of 128 on small grids, 256 on
    large ones, and at most 4096 // BN (the fp32 [BN, BC] tile's registers)."""
    assert tv.tree_conv_config(1, 6144, 9) == (16, 128)
    assert tv.tree_conv_config(64, 6144, 9) == (16, 256)
    assert tv.tree_conv_config(64, 6144, 32) == (32, 128)
    assert tv.tree_conv_config(64, 6144, 100) == (32, 128)
    assert tv.tree_conv_config(1, 40, 1) == (2, 64)


def test_conv_verify_bank_arguments_need_bank_x():
    """write_bank / pending_len without bank_x is an error naming the field (the kernel would
    otherwise record the raw inputs into its output buffer)."""
    c = Case(SMALL[0], [2, 1], seed=25)
    for kw in (dict(write_bank=c.write_bank), dict(pending_len=c.pending_len, read_bank=c.read_bank)):
        with pytest.raises(ValueError, match="bank_x"):
            tc.conv_verify(c.x, c.weight, c.cu, c.conv_state.clone(), c.slots, **kw)


@pytest.mark.parametrize("W", [4, 3])
@pytest.mark.parametrize("R", [3, 270])
@pytest.mark.parametrize("final", [False, True])
def test_conv_verify_edge_inputs(W, R, final):
    """bf16 x as an offset column slice of a wider tensor, bf16 conv windows, slots in random
    order, row lengths 0..Tmax, pending_len 0, Tmax, > Tmax and negative (clamped as the
    reference's slice), C not a multiple of the channel tile; R = 270 rows takes the W = 4 launch
    without the smaller channel tiles (R * cdiv(C, BC) >= 264)."""
    g = torch.Generator().manual_seed(R * 10 + W)
    C, Tmax, S = 333, 3, R + 3  # R = 3: BC 512 -> 128 (3 tiles); R = 270: BC 512, 1 tile
    lens = torch.randint(0, Tmax + 1, (R,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(device=DEV, dtype=torch.int32)
    N = int(lens.sum())
    wide = torch.randn(N, C + 11, generator=g).to(device=DEV, dtype=torch.bfloat16)
    x = wide[:, 5 : 5 + C]
    weight = (torch.randn(C, W, generator=g) * 0.5).to(DEV)
    cs0 = torch.randn(S, W - 1, C, generator=g).to(device=DEV, dtype=torch.bfloat16)
    bank = torch.randn(S, 2, Tmax, C, generator=g).to(DEV)
    slots = torch.randperm(S, generator=g)[:R].to(DEV)
    rb = torch.randint(0, 2, (R,), generator=g).to(DEV)
    pl = torch.tensor([0, Tmax, Tmax + 4, -1] * (R // 4 + 1))[:R].to(DEV)
    kw = dict(write_bank=1 - rb, pending_len=pl, read_bank=rb, write_final_state=final)
    cs1, cs2, b1, b2 = cs0.clone(), cs0.clone(), bank.clone(), bank.clone()
    y1 = ref.conv_verify_ref(x, weight, cu, cs1, slots, bank_x=b1, **kw)
    y2 = tc.conv_verify(x, weight, cu, cs2, slots, bank_x=b2, **kw)
    assert rel(y2, y1) < TOL
    assert rel(cs2.float(), cs1.float()) <= STATE_TOL_BF16 and torch.equal(b1, b2)
    assert not torch.equal(cs2, cs0)
