"""Heavy-light (chain-decomposed) tree verify (ALGORITHMS.md §5, §10.1): schedule and Triton kernel.

* Schedule (plain Python, runs everywhere): heavy child = largest subtree (ties -> earliest), every
  node in exactly one chain, chains follow heavy pointers, light children start chains one wave
  after their parent's chain, waves <= floor(log2 N) + 1 for trees, the per-wave chain bound used
  for launch grids holds (and is exact for all forests up to 7 nodes), same chains as
  ``DraftTree.heavy_light_chains``; the torch execution of the schedule equals the sequential
  reference.
* Kernels (CUDA, or the CPU through Triton's interpreter with ``TRITON_INTERPRET=1``; skipped
  otherwise): the device schedule kernel equals the packed reference schedule bit for bit; the HLD
  verify kernel equals ``tree_verify_ref`` (sequential per-node recurrence) on random trees of
  2..32 nodes and on degenerate ones (chain, star, binary, caterpillar, beams, max-wave trees,
  forests), with and without pending factors, in its three launch modes (one launch, one launch per
  wave with parallel chain lanes, host-built plan), for every node's output and factors, the state
  (pending fold written once, else untouched) and the materialised boundary states (only boundary
  nodes, nothing else written to the scratch); shapes (H, HV, K, V) = (2, 4, 32, 48),
  (1, 3, 16, 20) and one GDN-1.3B head shape 6x256x512 with a small tree.

Tolerances: norm-wise relative error ``||x - ref|| / ||ref||`` per node below ``TOL = 1e-4`` for
outputs, ``v~`` and the state (the kernel steps the same fp32 recurrence as the reference, errors
measured ~1e-7; the margin covers reduction order over K = 256); ``g`` is copied exactly, ``k^`` to
1e-6 (the kernel's rsqrt vs torch's). Interpreter run: about 1-2 minutes.
"""

from __future__ import annotations

import math
import os
import random

import pytest
import torch

from vllm_specla.core.topology import DraftTree
from vllm_specla.ops import reference as ref
from vllm_specla.ops import tree_reference as tref

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAVE_CUDA = torch.cuda.is_available()
needs_triton = pytest.mark.skipif(not (HAVE_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)")
DEV = "cuda" if HAVE_CUDA else "cpu"
TOL = 1e-4

if HAVE_CUDA or INTERPRET:
    from vllm_specla.ops import tree_verify as tv  # noqa: E402
    from vllm_specla.ops import triton_tree_hld as th  # noqa: E402

SMALL = [(2, 4, 32, 48), (1, 3, 16, 20)]
BIG = [(6, 6, 256, 512), (8, 8, 256, 256)]
# Under the interpreter every program runs serially in Python: a wider V tile (fewer programs)
# keeps the run short; still 2-3 V-tiles for the small shapes (V = 48, 20: one partial tile).
INTERPRET_BV = {20: 16, 24: 32, 48: 16, 512: 128}
TINY = (1, 2, 16, 24) if INTERPRET and not HAVE_CUDA else SMALL[1]  # one V-tile of 32 (24 valid)


@pytest.fixture(autouse=True)
def _interpret_tiles(monkeypatch):
    if INTERPRET and not HAVE_CUDA:
        from vllm_specla.ops import triton_chain as tc  # noqa: PLC0415

        real = tc.pick_config

        def pick(num_rows, HV, V, K, tokens_per_row=1.0):
            cfg = real(num_rows, HV, V, K, tokens_per_row)
            return (INTERPRET_BV.get(V, cfg[0]),) + tuple(cfg[1:])

        monkeypatch.setattr(tc, "pick_config", pick)
    yield


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all(), "non-finite output"
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------------------------
# trees
# ------------------------------------------------------------------------------------------------


def t_chain(n):
    return list(range(-1, n - 1))


def t_star(n):
    return [-1] + [0] * (n - 1)


def t_binary(n):
    return [-1] + [(t - 1) // 2 for t in range(1, n)]


def t_caterpillar(n):  # a spine with one leaf per spine node
    par, spine = [-1], 0
    while len(par) < n:
        par.append(spine)  # leaf
        if len(par) < n:
            par.append(spine)
            spine = len(par) - 1
    return par


def t_beams(n, width=4):  # top-k beam-like: `width` chains from the root
    par, tails = [-1], [0] * width
    for t in range(1, n):
        b = (t - 1) % width
        par.append(tails[b])
        tails[b] = t
    return par


def t_maxwave(n):
    """Recursive smallest tree with the most waves: T(w) = root + T(w-1) (heavy) + T(w-1) (light)."""
    def build(sz):
        if sz <= 0:
            return []
        if sz == 1:
            return [-1]
        half = (sz - 1) // 2
        a, b = build(sz - 1 - half), build(half)
        par = [-1] + [p + 1 if p >= 0 else 0 for p in a]
        off = len(par)
        par += [p + off if p >= 0 else 0 for p in b]
        return par
    return build(n)


def t_random(n, rng, forest=False):
    return [-1] + [rng.randint(-1 if forest else 0, t - 1) for t in range(1, n)]


DEGENERATE = {"chain": t_chain, "star": t_star, "binary": t_binary, "caterpillar": t_caterpillar,
              "beams": t_beams, "maxwave": t_maxwave}


def all_trees(rng, n_random=150, nmax=64):
    out = [(name, f(n)) for name, f in DEGENERATE.items() for n in (1, 2, 3, 5, 8, 16, 31, 32, 64) if n <= nmax]
    for _ in range(n_random):
        n = rng.randint(1, nmax)
        out.append(("random", t_random(n, rng)))
        out.append(("forest", t_random(n, rng, forest=True)))
    return out


# ------------------------------------------------------------------------------------------------
# schedule (plain Python)
# ------------------------------------------------------------------------------------------------


def test_schedule_properties():
    rng = random.Random(0)
    for name, par in all_trees(rng):
        n = len(par)
        row = tref.HLDRow(par)
        mask = tref.ancestor_mask(par)
        size = mask.sum(0).tolist()  # size(u) = #nodes having u as ancestor-or-self
        assert row.size == size, name
        for u in range(n):
            ch = [c for c in range(n) if par[c] == u]
            if not ch:
                assert row.heavy[u] == -1
            else:  # largest subtree, ties -> earliest
                assert row.heavy[u] == min(ch, key=lambda c: (-size[c], c)), (name, par, u)
        roots = [t for t in range(n) if par[t] < 0]
        assert row.heavy_root == min(roots, key=lambda c: (-size[c], c))
        # every node in exactly one chain; chains follow heavy pointers from a head to a leaf
        seen = sorted(u for _, nodes in row.chains for u in nodes)
        assert seen == list(range(n)), name
        heads = []
        for w, nodes in row.chains:
            h = nodes[0]
            heads.append(h)
            assert all(row.heavy[a] == b for a, b in zip(nodes, nodes[1:])) and row.heavy[nodes[-1]] == -1
            assert all(row.wave[u] == w for u in nodes)
            p = par[h]
            if p < 0:
                assert w == (0 if h == row.heavy_root else 1)
            else:
                assert row.heavy[p] != h and w == row.wave[p] + 1
        assert heads == sorted(heads, key=lambda h: (row.wave[h], h))
        # boundaries: exactly the nodes with a light child; scratch slots 0..nb-1 in node order
        bnd = [u for u in range(n) if any(par[c] == u and row.heavy[u] != c for c in range(n))]
        assert row.boundary == bnd and all(row.bslot[u] == i for i, u in enumerate(bnd))
        assert len(bnd) <= (n - 1) // 2
        # waves
        if len(roots) == 1:
            assert row.num_waves <= math.floor(math.log2(n)) + 1, (name, par)
            assert sorted(row.chains) == sorted(DraftTree(list(range(n)), par).heavy_light_chains())
        else:
            assert row.num_waves <= math.floor(math.log2(n + 1)) + 1
        bound = tref.hld_max_chains_per_wave(n)
        cpw = row.chains_per_wave()
        assert len(cpw) <= len(bound) and all(c <= b for c, b in zip(cpw, bound)), (name, par, cpw, bound)
        if len(roots) == 1:
            tb = tref.hld_max_chains_per_wave(n, forest=False)
            assert len(cpw) <= len(tb) and all(c <= b for c, b in zip(cpw, tb))
        assert row.serial_depth <= n


def test_maxwave_trees_reach_the_log_bound():
    for w in range(1, 6):
        n = 2 ** w - 1  # the smallest tree with w waves
        assert tref.HLDRow(t_maxwave(n)).num_waves == w
        assert len(tref.hld_max_chains_per_wave(n, forest=False)) == w


def test_wave_bound_exact_small():
    """The per-wave chain bound (launch grids) is the true maximum over all forests / trees <= 7."""
    def rec(pre, n):
        if len(pre) == n:
            yield pre
            return
        for p in range(-1, len(pre)):
            yield from rec(pre + [p], n)

    for n in range(1, 8):
        best_f, best_t = [], []
        for par in rec([-1], n):
            cpw = tref.HLDRow(par).chains_per_wave()
            tgt = [best_f] + ([best_t] if par.count(-1) == 1 else [])
            for b in tgt:
                b.extend([0] * (len(cpw) - len(b)))
                for w, c in enumerate(cpw):
                    b[w] = max(b[w], c)
        assert best_f == tref.hld_max_chains_per_wave(n), n
        assert best_t == tref.hld_max_chains_per_wave(n, forest=False), n


class Case:
    """Rows of draft trees on random distinct slots; random inputs, banks, pending."""

    def __init__(self, shape, trees, seed=0, Tmax=32, dev=DEV):
        H, HV, K, V = shape
        gen = torch.Generator().manual_seed(seed)
        rn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
        ru = lambda *s: torch.rand(*s, generator=gen)  # noqa: E731
        self.trees = trees
        lens = [len(t) for t in trees]
        R, N, S = len(trees), sum(lens), len(trees) + 2
        self.shape, self.R, self.N, self.Tmax, self.lens = shape, R, N, Tmax, lens
        d = lambda x: x.to(dev)  # noqa: E731
        self.cu = d(torch.tensor([0] + lens).cumsum(0).to(torch.int32))
        self.parents = d(torch.tensor([p for t in trees for p in t], dtype=torch.int32))
        self.q, self.k, self.v = d(rn(N, H, K)), d(rn(N, H, K)), d(rn(N, HV, V))
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
        self.pending_len = d(torch.randint(0, 6, (R,), generator=gen))

    def inputs(self):
        return self.q, self.k, self.v, self.g, self.beta

    def kw(self, pending, bank=True):
        kw = dict(scale=self.scale, slots=self.slots, cu_seqlens=self.cu, parents=self.parents)
        if bank:
            kw["write_bank"] = self.write_bank
        if pending:
            kw.update(pending_len=self.pending_len, read_bank=self.read_bank)
        return kw

    def run(self, fn, pending, bank=True, **extra):
        st = self.state.clone()
        banks = [self.bank_k.clone(), self.bank_v.clone(), self.bank_g.clone()]
        o = fn(*self.inputs(), state=st, bank_k=banks[0], bank_v=banks[1], bank_g=banks[2],
               **self.kw(pending, bank), **extra)
        return o, st, banks


def check_against_ref(c: Case, got, exp, pending):
    o2, s2, b2 = got
    o1, s1, b1 = exp
    for i in range(c.N):  # every node's output
        assert rel(o2[i], o1[i]) < TOL, f"node {i}: {rel(o2[i], o1[i]):.2e}"
    assert rel(s2, s1) < TOL
    if not pending:
        assert torch.equal(s2, c.state), "the tree's node states must never be written to the state"
    bos = c.cu.tolist()
    for r in range(c.R):  # every node's factors, at its own window position of the write bank
        slot, wb = int(c.slots[r]), int(c.write_bank[r])
        for t in range(c.lens[r]):
            assert rel(b2[1][slot, wb, t], b1[1][slot, wb, t]) < TOL, (r, t)
            torch.testing.assert_close(b2[0][slot, wb, t], b1[0][slot, wb, t], atol=1e-6, rtol=1e-6)
            assert torch.equal(b2[2][slot, wb, t], b1[2][slot, wb, t])
        assert bos[r + 1] - bos[r] == c.lens[r]
    for x, y in zip(b2, b1):  # and nothing else in the banks changed
        assert rel(x, y) < TOL


def test_hld_torch_reference_matches_sequential():
    rng = random.Random(3)
    for pending in (False, True):
        trees = [t_random(rng.randint(1, 20), rng, forest=f) for f in (False, True, False)]
        trees += [t_star(7), t_caterpillar(9), t_binary(12)]
        c = Case((2, 4, 8, 12), trees, seed=5, dev="cpu")
        log = []
        got = c.run(lambda *a, **kw: tref.tree_verify_hld_ref(*a, boundary_log=log, **kw), pending)
        exp = c.run(tref.tree_verify_ref, pending)
        check_against_ref(c, got, exp, pending)
        expect_log = [(r, u) for r, t in enumerate(trees) for u in tref.HLDRow(t).boundary]
        assert sorted(log) == expect_log


# ------------------------------------------------------------------------------------------------
# device schedule + HLD kernel (Triton)
# ------------------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("nmax", [8, 32])
def test_device_schedule_matches_reference(nmax):
    rng = random.Random(nmax)
    trees = [f(n) for f in DEGENERATE.values() for n in (1, 2, nmax)]
    trees += [t_random(rng.randint(1, nmax), rng, forest=bool(i % 2)) for i in range(6)]
    cu = torch.tensor([0] + [len(t) for t in trees]).cumsum(0).to(torch.int32).to(DEV)
    par = torch.tensor([p for t in trees for p in t], dtype=torch.int32, device=DEV)
    sched = th.hld_device_schedule(par, cu, nmax)
    BN = th._bn(nmax)
    expect = tref.hld_pack(tref.hld_schedule_ref(par.cpu(), cu.cpu()), BN, len(tref.hld_max_chains_per_wave(nmax)))
    assert torch.equal(sched.cpu(), expect)
    # a host plan packs the same rows (exact wave count instead of the bound)
    plan = th.hld_plan(par.cpu(), cu.cpu(), max_nodes=nmax)
    assert plan.NW == max(tref.HLDRow(t).num_waves for t in trees)
    assert plan.NB == max(len(tref.HLDRow(t).boundary) for t in trees)


MODES = {"one_launch": dict(parallel=1), "waves": dict(parallel=3), "plan_waves": dict(parallel=4, plan=True),
         "plan_one_launch": dict(parallel=1, plan=True)}


def _hld(c: Case, mode: str, **extra):
    opts = dict(MODES[mode])
    if opts.pop("plan", False):
        opts["plan"] = th.hld_plan(c.parents.cpu(), c.cu.cpu(), max_nodes=c.Tmax, device=DEV)
    return lambda *a, **kw: th.tree_verify_hld(*a, **opts, **extra, **kw)


@needs_triton
@pytest.mark.parametrize("mode,pending", [("one_launch", False), ("one_launch", True), ("waves", True),
                                          ("plan_waves", False), ("plan_one_launch", True)])
def test_hld_kernel_vs_ref(mode, pending):
    """Degenerate and random trees (and forests), 2..32 nodes, small odd GVA shape."""
    rng = random.Random(hash((mode, pending)) % 1000)
    names = ["chain", "star", "binary", "caterpillar", "beams", "maxwave"]
    trees = [DEGENERATE[names[i]](rng.choice([2, 3, 9, 17, 32])) for i in range(len(names))]
    trees += [t_random(rng.randint(2, 32), rng), t_random(rng.randint(2, 32), rng, forest=True)]
    rng.shuffle(trees)
    c = Case(SMALL[0], trees, seed=rng.randrange(10**6))
    got = c.run(_hld(c, mode), pending)
    exp = c.run(tref.tree_verify_ref, pending)
    check_against_ref(c, got, exp, pending)


@needs_triton
@pytest.mark.parametrize("kernel", ["hld", "walk"])
@pytest.mark.parametrize("pending", [False, True])
def test_tree_kernels_read_token_strided_inputs(kernel, pending):
    """q / k / v as column slices of one conv output row (the runtime's layout: [N, 2 H K + HV V],
    read in place, no copies) and g / beta as column slices of one [N, 2 HV + 3] tensor, through
    the heavy-light and ancestor-walk kernels: every node, the state and the banks as the
    reference on the same (dense) values."""
    rng = random.Random(f"strided-{kernel}-{pending}")  # a stable seed (str hashes are randomised)
    trees = [t_binary(9), t_random(rng.randint(2, 17), rng), t_random(12, rng, forest=True), t_beams(9, 2)]
    c = Case(SMALL[0], trees, seed=rng.randrange(10**6))
    H, HV, K, V = c.shape
    N, KD = c.N, H * K
    y = torch.cat([c.q.reshape(N, KD), c.k.reshape(N, KD), c.v.reshape(N, HV * V)], 1)
    gb = torch.cat([torch.zeros(N, 1, device=DEV), c.g, c.beta, torch.zeros(N, 2, device=DEV)], 1)
    strided = (y[:, :KD].view(N, H, K), y[:, KD : 2 * KD].view(N, H, K), y[:, 2 * KD :].view(N, HV, V),
               gb[:, 1 : 1 + HV], gb[:, 1 + HV : 1 + 2 * HV])
    assert strided[0].stride(0) == y.shape[1] and strided[3].stride(0) == gb.shape[1]
    fn = th.tree_verify_hld if kernel == "hld" else tv.tree_verify_triton
    got = c.run(lambda *a, **kw: fn(*strided, **kw), pending)
    exp = c.run(tref.tree_verify_ref, pending)
    check_against_ref(c, got, exp, pending)


@needs_triton
def test_hld_kernel_every_size_2_to_32():
    """One random tree of every size 2..32 in one batch (no banks: outputs only; int64 parents; a
    tiny GVA shape under the interpreter, the other small shape on the GPU)."""
    rng = random.Random(11)
    trees = [t_random(n, rng) for n in range(2, 33)]
    c = Case(TINY, trees, seed=12)
    c.parents = c.parents.long()  # int64 parent pointers work too
    o2, s2, _ = c.run(th.tree_verify_hld, False, bank=False, max_nodes=32, parallel=1)
    o1, s1, _ = c.run(tref.tree_verify_ref, False, bank=False)
    assert torch.equal(s2, c.state)
    for i in range(c.N):
        assert rel(o2[i], o1[i]) < TOL, i


@needs_triton
@pytest.mark.parametrize("mode", ["one_launch", "plan_waves"])
def test_scratch_holds_exactly_the_boundary_states(mode):
    """Boundary states are materialised (== the sequential node state), nothing else is written."""
    trees = [t_binary(11), t_caterpillar(8), t_chain(5), [-1, 0, -1, 2, 2, 0]]
    c = Case(SMALL[0], trees, seed=21, Tmax=16)
    H, HV, K, V = c.shape
    opts = dict(parallel=1)
    NB = th.hld_scratch_slots(16)
    if mode == "plan_waves":
        opts = dict(parallel=4, plan=th.hld_plan(c.parents.cpu(), c.cu.cpu(), device=DEV))
        NB = opts["plan"].NB  # exact: the most boundaries of any row
        assert NB == 5
    scratch = torch.full((c.R * NB * HV * V * K,), float("nan"), device=DEV)
    c.run(lambda *a, **kw: th.tree_verify_hld(*a, scratch=scratch, **opts, **kw), True)
    states = []
    st = c.state.clone()
    tref.tree_verify_sequential_ref(*c.inputs(), state=st, bank_k=c.bank_k.clone(), bank_v=c.bank_v.clone(),
                                    bank_g=c.bank_g.clone(), node_states=states, **c.kw(True))
    scr = scratch.view(c.R, NB, HV, V, K)
    for r, t in enumerate(trees):
        bnd = tref.HLDRow(t).boundary
        for i, u in enumerate(bnd):
            assert rel(scr[r, i], states[r][u]) < TOL, (r, u)
        assert torch.isnan(scr[r, len(bnd):]).all(), f"row {r}: scratch written beyond its boundaries"


@needs_triton
def test_big_head_shape_small_tree():
    """GDN-1.3B head shape 6x256x512 (default tile config, 64 V-tiles), a small tree, pending fold."""
    trees = [[-1, 0, 0, 1, 1, 2]]
    c = Case(BIG[0], trees, seed=31, Tmax=8)
    got = c.run(_hld(c, "waves"), True)
    exp = c.run(tref.tree_verify_ref, True)
    check_against_ref(c, got, exp, True)


def test_dispatch_rule():
    """The kernel choices by shape (pure Python: runs on the CPU too), and the UT kernel's one config at every batch
    (session 37: launches under 4 x 132 programs had taken a slower, unswept one)."""
    pytest.importorskip("triton")
    from vllm_specla.ops import tree_verify as tv  # noqa: PLC0415
    from vllm_specla.ops import triton_chain_ut as ut  # noqa: PLC0415

    for HV, V in ((6, 512), (8, 256)):
        assert {ut.pick_config_ut(R, HV, V, 256) for R in (1, 2, 8, 128)} == {ut.TUNED_UT["large"]} == {(32, 2, 16, 3)}
    old = tv.TREE_KERNEL
    try:
        tv.TREE_KERNEL = "auto"
        assert tv.pick_tree_kernel(1, 6, 512, 256, nmax=4) == "walk"  # short windows
        assert tv.pick_tree_kernel(1, 6, 512, 256, nmax=15) == "hld"  # 7 x 3 MiB scratch
        assert tv.pick_tree_kernel(128, 6, 512, 256, nmax=15) == "ut"  # <= 16 nodes, many rows
        assert tv.pick_tree_kernel(8, 6, 512, 256, nmax=8) == "ut"
        assert tv.pick_tree_kernel(2, 6, 512, 256, nmax=15) == "hld"  # 2 x 7 x 3 MiB scratch
        assert tv.pick_tree_kernel(128, 6, 512, 256, nmax=32) == "ut"  # <= 32 nodes: UT with BT = 32
        assert tv.pick_tree_kernel(1, 6, 512, 256, nmax=32) == "ut"  # 16-32 nodes: UT at any batch
        assert tv.pick_tree_kernel(1, 6, 512, 256, nmax=16) == "ut"
        assert tv.pick_tree_kernel(4, 6, 512, 256, nmax=25) == "ut"
        assert tv.pick_tree_kernel(1, 6, 512, 256, nmax=32, scratch_slots=1, host_plan=True) == "hld"  # host plan
        assert tv.pick_tree_kernel(1, 6, 512, 256, nmax=16, scratch_slots=3, host_plan=True) == "hld"
        assert tv.pick_tree_kernel(1, 6, 512, 256, nmax=32, scratch_slots=15) == "ut"  # a device plan's bound
        assert tv.pick_tree_kernel(8, 6, 512, 256, nmax=32, scratch_slots=1, host_plan=True) == "ut"  # >= 8 rows
        assert tv.pick_tree_kernel(1, 6, 512, 256, nmax=12) == "hld"  # batch 1: 5 x 3 MiB scratch
        assert tv.pick_tree_kernel(4, 6, 512, 256, nmax=15) == "walk"  # 4 x 7 x 3 MiB > 64 MiB
        assert tv.pick_tree_kernel(128, 6, 512, 256, nmax=33) == "walk"  # 6 GB scratch
        assert tv.pick_tree_kernel(128, 6, 512, 256, nmax=33, scratch_slots=0) == "hld"  # plan: no boundary
        tv.TREE_KERNEL = "hld"
        assert tv.pick_tree_kernel(128, 6, 512, 256, nmax=4) == "hld"
    finally:
        tv.TREE_KERNEL = old


@needs_triton
def test_hld_plan_kinds():
    """tree_verify passes host_plan only for host-built plans (a device plan's counts are bounds); the launch mode."""
    par, cu = torch.tensor([-1, 0, 0, 1], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32)
    assert th.hld_plan(par, cu, device=DEV).host
    assert not th.hld_device_plan(par.to(DEV), cu.to(DEV), 4).host
    assert th.hld_parallelism(1, 6, 64) == max(1, min(th.HLD_MAX_PARALLEL, th.HLD_TARGET_PROGRAMS // 384))
    assert th.hld_parallelism(128, 6, 64) == 1


# ------------------------------------------------------------------------------------------------
# CUDA only: dispatcher on device tensors, CUDA-graph capture (no host sync), big shapes
# ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", BIG)
@pytest.mark.parametrize("kernel", ["hld", "walk", "ut"])
def test_cuda_dispatcher_both_tree_kernels(shape, kernel):
    rng = random.Random(41)
    trees = [t_binary(16), t_beams(17), t_caterpillar(12), t_random(32, rng), t_random(9, rng, forest=True)]
    if kernel == "ut":  # windows of <= 16 nodes
        trees = [t_binary(16), t_beams(16), t_caterpillar(12), t_random(16, rng), t_random(9, rng, forest=True)]
    c = Case(shape, trees, seed=42)
    got = c.run(lambda *a, **kw: tv.tree_verify(*a, chain=False, tree_kernel=kernel, **kw), True)
    exp = c.run(tref.tree_verify_ref, True)
    check_against_ref(c, got, exp, True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("parallel", [1, 4])
def test_cuda_graph_capture(parallel):
    """The device schedule + wave launches capture into a CUDA graph and replay correctly."""
    rng = random.Random(51)
    trees = [t_binary(16), t_random(16, rng), t_beams(13)]
    c = Case(BIG[1], trees, seed=52, Tmax=16)
    st = c.state.clone()
    banks = [c.bank_k.clone(), c.bank_v.clone(), c.bank_g.clone()]
    kw = dict(state=st, bank_k=banks[0], bank_v=banks[1], bank_g=banks[2], parallel=parallel, **c.kw(True))
    th.tree_verify_hld(*c.inputs(), **kw)  # compile outside the graph
    st.copy_(c.state)
    for b, b0 in zip(banks, (c.bank_k, c.bank_v, c.bank_g)):
        b.copy_(b0)
    gph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gph):  # a host sync inside would raise here
        o = th.tree_verify_hld(*c.inputs(), **kw)
    st.copy_(c.state)  # capture does not run the kernels, but reset anyway
    for b, b0 in zip(banks, (c.bank_k, c.bank_v, c.bank_g)):
        b.copy_(b0)
    gph.replay()
    torch.cuda.synchronize()
    exp = c.run(tref.tree_verify_ref, True)
    check_against_ref(c, (o, st, banks), exp, True)
