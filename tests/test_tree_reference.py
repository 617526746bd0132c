"""CPU tests of the tree-verify references (ALGORITHMS.md §4, §10.1-10.4).

Random draft trees (parent pointers, topological order), random inputs (never zeros):
* the ancestor-masked UT form equals the per-node sequential recurrence at every node;
* every node equals the plain chain recurrence along its own root path (AR on that path);
* DeltaConstruct over the node's path factors (compaction + recover) equals its sequential state;
* tree conv uses only ancestors (sibling isolation) and equals the chain conv of the node's path;
* relabelling the tree with another topological order (siblings permuted) changes nothing;
* the dispatcher sends a chain topology to chain verify.
"""

from __future__ import annotations

import random

import pytest
import torch

from vllm_specla.ops.reference import (
    chain_verify_ref,
    conv_verify_ref,
    l2norm,
    recover_ref,
    recurrent_gated_delta_rule_ref,
    conv_commit_ref,
)
from vllm_specla.ops.tree_reference import (
    ancestor_mask,
    compact_path_factors,
    is_chain,
    path_of,
    tree_conv_ref,
    tree_conv_sequential_ref,
    tree_verify_sequential_ref,
    tree_verify_ut_ref,
)
from vllm_specla.ops.chain_verify import chain_verify
from vllm_specla.ops.tree_verify import tree_conv, tree_verify

TOL = 2e-5  # relative (norm-wise) error between fp32 forms


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def random_tree(T: int, rng: random.Random, forest: bool = False) -> list[int]:
    par = [-1]
    for t in range(1, T):
        lo = -1 if forest else 0
        par.append(rng.randint(lo, t - 1))
    return par


def random_reorder(par: list[int], rng: random.Random) -> tuple[list[int], list[int]]:
    """Another topological order of the same tree: returns (new parents, new_pos[old node])."""
    T = len(par)
    children = [[] for _ in range(T)]
    for t, p in enumerate(par):
        if p >= 0:
            children[p].append(t)
    avail = [t for t in range(T) if par[t] < 0]
    order = []
    while avail:
        t = avail.pop(rng.randrange(len(avail)))
        order.append(t)
        avail.extend(children[t])
    new_pos = [0] * T
    for i, t in enumerate(order):
        new_pos[t] = i
    new_par = [-1 if par[t] < 0 else new_pos[par[t]] for t in order]
    return new_par, new_pos


class Case:
    """Random verify inputs for R rows of trees on random slots, with pending factors."""

    def __init__(self, H, HV, K, V, trees, seed=0, Tmax=None, pending=True, W=4):
        g_ = torch.Generator().manual_seed(seed)
        self.H, self.HV, self.K, self.V, self.W = H, HV, K, V, W
        self.trees = trees
        lens = [len(t) for t in trees]
        self.cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int64)
        N = sum(lens)
        R = len(trees)
        S = R + 3
        self.Tmax = Tmax or max(lens)
        rn = lambda *s: torch.randn(*s, generator=g_)  # noqa: E731
        ru = lambda *s: torch.rand(*s, generator=g_)  # noqa: E731
        self.q, self.k, self.v = rn(N, H, K), rn(N, H, K), rn(N, HV, V)
        self.g = -(ru(N, HV) * 0.6 + 0.01)
        self.beta = ru(N, HV) * 0.9 + 0.05
        self.scale = K ** -0.5
        self.state = rn(S, HV, V, K) * 0.2
        self.slots = torch.randperm(S, generator=g_)[:R]
        self.bank_k = l2norm(rn(S, 2, self.Tmax, H, K))
        self.bank_v = rn(S, 2, self.Tmax, HV, V) * 0.2
        self.bank_g = -ru(S, 2, self.Tmax, HV) * 0.5
        self.read_bank = torch.randint(0, 2, (R,), generator=g_)
        self.write_bank = 1 - self.read_bank
        self.pending_len = torch.randint(0, self.Tmax + 1, (R,), generator=g_) if pending else None
        C = 2 * H * K + HV * V
        self.C = C
        self.x = rn(N, C)
        self.weight = rn(C, W) * 0.5
        self.conv_state = rn(S, W - 1, C)
        self.bank_x = rn(S, 2, self.Tmax, C)
        self.parents = torch.tensor([p for t in trees for p in t], dtype=torch.int64)

    def banks(self):
        return [self.bank_k.clone(), self.bank_v.clone(), self.bank_g.clone()]

    def kw(self, state, banks, pending=True):
        return dict(
            scale=self.scale, state=state, slots=self.slots, cu_seqlens=self.cu, bank_k=banks[0],
            bank_v=banks[1], bank_g=banks[2], write_bank=self.write_bank,
            pending_len=self.pending_len if pending else None, read_bank=self.read_bank if pending else None,
        )

    def inputs(self):
        return self.q, self.k, self.v, self.g, self.beta


SHAPES = [(2, 2, 16, 24), (2, 4, 32, 48), (1, 3, 8, 12)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ut_matches_sequential_every_node(shape, seed):
    rng = random.Random(seed)
    trees = [random_tree(rng.randint(1, 12), rng, forest=(seed == 2)) for _ in range(3)]
    c = Case(*shape, trees, seed=seed)
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    o1 = tree_verify_sequential_ref(*c.inputs(), parents=c.parents, **c.kw(s1, b1))
    o2 = tree_verify_ut_ref(*c.inputs(), parents=c.parents, **c.kw(s2, b2))
    assert rel(o2, o1) < TOL
    assert rel(s2, s1) < TOL
    for x, y in zip(b2, b1):
        assert rel(x, y) < TOL
    # every node individually (not only the norm over the batch)
    for i in range(o1.shape[0]):
        assert rel(o2[i], o1[i]) < 1e-4


@pytest.mark.parametrize("seed", [0, 1])
def test_every_node_equals_path_recurrence_and_deltaconstruct(seed):
    rng = random.Random(100 + seed)
    trees = [random_tree(9, rng), random_tree(5, rng)]
    c = Case(2, 4, 16, 20, trees, seed=seed, Tmax=10)
    st = c.state.clone()
    banks = c.banks()
    node_states: list = []
    o = tree_verify_ut_ref(*c.inputs(), parents=c.parents, **c.kw(st, banks))
    # the pending commit (serial flush) was applied to the durable state
    s_ref = c.state.clone()
    chain_verify_ref(*(x[:0] for x in c.inputs()), scale=c.scale, state=s_ref, slots=c.slots,
                     cu_seqlens=torch.zeros(len(trees) + 1, dtype=torch.int64), bank_k=c.bank_k.clone(),
                     bank_v=c.bank_v.clone(), bank_g=c.bank_g.clone(), pending_len=c.pending_len,
                     read_bank=c.read_bank)
    assert rel(st, s_ref) < TOL
    s_seq = st.clone()
    tree_verify_sequential_ref(*c.inputs(), parents=c.parents, scale=c.scale, state=s_seq, slots=c.slots,
                               cu_seqlens=c.cu, node_states=node_states)
    for r, tree in enumerate(trees):
        s0 = int(c.cu[r])
        slot = int(c.slots[r])
        for t in range(len(tree)):
            path = path_of(tree, t)
            idx = torch.tensor([s0 + u for u in path])
            sub = [x[idx] for x in c.inputs()]
            o_p, fin = recurrent_gated_delta_rule_ref(*sub, c.scale, torch.tensor([0, len(path)]),
                                                       initial_state=st[slot][None])
            assert rel(o[s0 + t], o_p[-1]) < 1e-4
            assert rel(node_states[r][t], fin[0]) < 1e-4
            # DeltaConstruct: gather the path's factors to the front, fold them into a copy
            bk = [b.clone() for b in banks]
            ppath = torch.full((1, c.Tmax), -1, dtype=torch.int64)
            ppath[0, : len(path)] = torch.tensor(path)
            compact_path_factors(bk, c.slots[r : r + 1], c.write_bank[r : r + 1], ppath, torch.tensor([len(path)]))
            s_rec = st.clone()
            recover_ref(s_rec, c.slots[r : r + 1], *bk, c.write_bank[r : r + 1], torch.tensor([len(path)]))
            assert rel(s_rec[slot], fin[0]) < 1e-4


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sibling_permutation_invariance(seed):
    rng = random.Random(200 + seed)
    tree = random_tree(11, rng)
    new_par, new_pos = random_reorder(tree, rng)
    c = Case(2, 2, 16, 24, [tree], seed=seed)
    perm = torch.tensor(new_pos)  # old -> new
    inv = torch.argsort(perm)  # new -> old
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    o1 = tree_verify_ut_ref(*c.inputs(), parents=c.parents, **c.kw(s1, b1))
    o2 = tree_verify_ut_ref(*(x[inv] for x in c.inputs()), parents=torch.tensor(new_par), **c.kw(s2, b2))
    assert rel(o2[perm], o1) < TOL
    wb, slot = int(c.write_bank[0]), int(c.slots[0])
    assert rel(b2[1][slot, wb, perm], b1[1][slot, wb, : len(tree)]) < TOL
    # conv
    cs1, cs2 = c.conv_state.clone(), c.conv_state.clone()
    y1 = tree_conv_ref(c.x, c.weight, c.cu, c.parents, cs1, c.slots)
    y2 = tree_conv_ref(c.x[inv], c.weight, c.cu, torch.tensor(new_par), cs2, c.slots)
    assert rel(y2[perm], y1) < TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_conv_ancestors_only(seed):
    rng = random.Random(300 + seed)
    trees = [random_tree(rng.randint(1, 10), rng, forest=(seed == 1)) for _ in range(3)]
    c = Case(2, 2, 8, 8, trees, seed=seed)
    y = tree_conv_ref(c.x, c.weight, c.cu, c.parents, c.conv_state.clone(), c.slots)
    y_seq = tree_conv_sequential_ref(c.x, c.weight, c.cu, c.parents, c.conv_state, c.slots)
    assert rel(y, y_seq) < 1e-6
    # isolation: perturbing a node's input changes exactly the outputs of its descendants-or-self
    for r, tree in enumerate(trees):
        s0 = int(c.cu[r])
        mi = ancestor_mask(tree)
        t = rng.randrange(len(tree))
        x2 = c.x.clone()
        x2[s0 + t] += 1.0
        y2 = tree_conv_ref(x2, c.weight, c.cu, c.parents, c.conv_state.clone(), c.slots)
        for u in range(len(tree)):
            depth_gap = len(path_of(tree, u)) - len(path_of(tree, t))
            affected = bool(mi[u, t]) and depth_gap < c.W
            assert (not torch.equal(y2[s0 + u], y[s0 + u])) == affected, (tree, t, u)


def test_tree_conv_pending_and_bank():
    rng = random.Random(7)
    trees = [random_tree(6, rng), [-1, 0, 1, 2], [-1]]
    c = Case(2, 2, 8, 8, trees, seed=3, Tmax=8)
    cs1, cs2 = c.conv_state.clone(), c.conv_state.clone()
    bx1, bx2 = c.bank_x.clone(), c.bank_x.clone()
    kw = dict(write_bank=c.write_bank, pending_len=c.pending_len, read_bank=c.read_bank)
    y1 = tree_conv_ref(c.x, c.weight, c.cu, c.parents, cs1, c.slots, bank_x=bx1, **kw)
    # committed window == conv_verify_ref's pending commit; sequential oracle on the committed window
    y2 = conv_verify_ref(c.x, c.weight, c.cu, cs2, c.slots, bank_x=bx2, **kw)
    assert torch.equal(cs1, cs2) and torch.equal(bx1, bx2)
    y_seq = tree_conv_sequential_ref(c.x, c.weight, c.cu, c.parents, cs1, c.slots)
    assert rel(y1, y_seq) < 1e-6
    # the chain row equals the chain conv
    s, e = int(c.cu[1]), int(c.cu[2])
    assert rel(y1[s:e], y2[s:e]) < 1e-6
    # accepted path -> compaction -> conv_commit == window of AR along that path
    tree = trees[0]
    t = len(tree) - 1
    path = path_of(tree, t)
    pp = torch.tensor([path + [0] * (c.Tmax - len(path))])
    bx = bx1.clone()
    compact_path_factors([bx], c.slots[:1], c.write_bank[:1], pp, torch.tensor([len(path)]))
    cs = cs1.clone()
    conv_commit_ref(cs, c.slots[:1], bx, c.write_bank[:1], torch.tensor([len(path)]))
    slot = int(c.slots[0])
    expect = torch.cat([cs1[slot], c.x[torch.tensor(path)]], 0)[-(c.W - 1):]
    assert torch.equal(cs[slot], expect)


def test_dispatcher_chain_topology():
    trees = [[-1, 0, 1, 2, 3], [-1], [-1, 0, 1]]
    c = Case(2, 4, 16, 24, trees, seed=11)
    assert is_chain(c.parents, c.cu)
    assert not is_chain(torch.tensor([-1, 0, 0]), torch.tensor([0, 3]))
    s1, s2 = c.state.clone(), c.state.clone()
    b1, b2 = c.banks(), c.banks()
    o1 = chain_verify(*c.inputs(), **c.kw(s1, b1))  # the chain dispatcher (C++ op on CPU when built)
    o2 = tree_verify(*c.inputs(), parents=c.parents, **c.kw(s2, b2))
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    # and the UT form agrees with chain verify on a chain
    s3, b3 = c.state.clone(), c.banks()
    o3 = tree_verify_ut_ref(*c.inputs(), parents=c.parents, **c.kw(s3, b3))
    assert rel(o3, o1) < TOL and rel(b3[1], b1[1]) < TOL
    # non-chain on CPU: the UT reference
    rng = random.Random(5)
    trees = [random_tree(7, rng), random_tree(4, rng)]
    c = Case(2, 2, 16, 16, trees, seed=12)
    s1, s2 = c.state.clone(), c.state.clone()
    o1 = tree_verify(*c.inputs(), parents=c.parents, **c.kw(s1, c.banks()))
    o2 = tree_verify_sequential_ref(*c.inputs(), parents=c.parents, **c.kw(s2, c.banks()))
    assert rel(o1, o2) < TOL
    y1 = tree_conv(c.x, c.weight, c.cu, c.parents, c.conv_state.clone(), c.slots)
    y2 = tree_conv_sequential_ref(c.x, c.weight, c.cu, c.parents, c.conv_state, c.slots)
    assert rel(y1, y2) < 1e-6


def test_bad_parents_and_window():
    with pytest.raises(ValueError):
        is_chain(torch.tensor([-1, 1]), torch.tensor([0, 2]))
    c = Case(1, 1, 8, 8, [[-1, 0, 0, 1]], seed=1, Tmax=4)
    c.bank_k, c.bank_v, c.bank_g = c.bank_k[:, :, :3], c.bank_v[:, :, :3], c.bank_g[:, :, :3]
    with pytest.raises(ValueError):
        tree_verify_ut_ref(*c.inputs(), parents=c.parents, **c.kw(c.state.clone(), c.banks(), pending=False))


def test_compact_path_factors_stacked_equals_per_layer():
    """Stacked banks (``allocate_layer_states(stacked=True)`` viewed by ``stacked_view``): one
    compaction over all layers equals per-layer compaction; rows on other slots / the other bank and
    positions past each path are untouched; ``stacked_view`` refuses tensors of separate storages."""
    from vllm_specla.core.state import allocate_layer_states, stacked_view
    from vllm_specla.models.config import GatedDeltaNetConfig

    cfg = GatedDeltaNetConfig(hidden_size=32, num_heads=2, head_dim=8, expand_v=2, num_hidden_layers=3,
                              vocab_size=16, intermediate_size=64)
    gen = torch.Generator().manual_seed(5)
    a = allocate_layer_states(cfg, 4, 6, stacked=True)
    b = allocate_layer_states(cfg, 4, 6)
    fields = ("bank_k", "bank_v", "bank_g", "bank_x")
    for sa, sb in zip(a, b):
        for f in fields:
            getattr(sa, f).copy_(torch.randn(getattr(sa, f).shape, generator=gen))
            getattr(sb, f).copy_(getattr(sa, f))
    stacks = [stacked_view([getattr(st, f) for st in a]) for f in fields]
    assert stacks[1].shape == (3, *a[0].bank_v.shape) and stacks[1][2].data_ptr() == a[2].bank_v.data_ptr()
    before = [s.clone() for s in stacks]
    slots, bank = torch.tensor([2, 0]), torch.tensor([1, 0])
    path = torch.tensor([[0, 2, 3, 5, -1, -1], [0, 1, 4, -1, -1, -1]])
    plen = torch.tensor([4, 3])
    compact_path_factors(stacks, slots, bank, path, plen, stacked=True)
    compact_path_factors([getattr(st, f) for st in b for f in fields], slots, bank, path, plen)
    for i, f in enumerate(fields):
        for l in range(3):
            assert torch.equal(stacks[i][l], getattr(b[l], f))
        # the path moved to the front; the rest of the window and the other slots / banks unchanged
        assert torch.equal(stacks[i][:, 2, 1, :4], before[i][:, 2, 1, [0, 2, 3, 5]])
        assert torch.equal(stacks[i][:, 2, 1, 4:], before[i][:, 2, 1, 4:])
        assert torch.equal(stacks[i][:, 0, 0, :3], before[i][:, 0, 0, [0, 1, 4]])
        assert torch.equal(stacks[i][:, [1, 3]], before[i][:, [1, 3]])
        assert torch.equal(stacks[i][:, 2, 0], before[i][:, 2, 0])
    with pytest.raises(ValueError, match="stacked=True"):
        stacked_view([st.bank_k for st in b])


@pytest.mark.parametrize("change,message", [
    ({"slots": torch.tensor([-1])}, r"slots must be in \[0, 3\], got -1"),
    ({"read_bank": torch.tensor([2])}, r"read_bank must be in \[0, 1\], got 2"),
    ({"cu_seqlens": torch.tensor([0, 5])}, r"cu_seqlens must be non-decreasing within \[0, 4\]"),
])
def test_tree_references_refuse_bad_rows(change, message):
    """Every tree reference (sequential, UT, heavy-light, tree conv) checks its per-row arguments as the chain
    references do, before it commits pending factors or writes a bank: a padding slot -1 used to commit into the
    last slot."""
    from vllm_specla.ops.tree_reference import tree_verify_hld_ref

    c = Case(1, 2, 8, 8, [[-1, 0, 0, 1]], seed=3, Tmax=4)
    c.pending_len, c.read_bank = torch.tensor([2]), torch.tensor([0])
    for n, t in change.items():
        setattr(c, "cu" if n == "cu_seqlens" else n, t)
    for ref in (tree_verify_sequential_ref, tree_verify_ut_ref, tree_verify_hld_ref):
        state, banks = c.state.clone(), c.banks()
        with pytest.raises(ValueError, match=message):
            ref(*c.inputs(), parents=c.parents, **c.kw(state, banks))
        assert torch.equal(state, c.state) and all(torch.equal(a, b) for a, b in zip(banks, c.banks()))
    conv = c.conv_state.clone()
    with pytest.raises(ValueError, match=message):
        tree_conv_ref(c.x, c.weight, c.cu, c.parents, conv, c.slots, bank_x=c.bank_x.clone(),
                      write_bank=c.write_bank, pending_len=c.pending_len, read_bank=c.read_bank)
    assert torch.equal(conv, c.conv_state)
