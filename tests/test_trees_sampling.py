"""Draft trees and lossless sampling in the vLLM-free core.

* greedy tree decoding == AR token for token (trees of several shapes, pruning on/off, deferred
  commit on/off, batch > 8, slot reuse);
* stochastic acceptance reproduces the target's JOINT distribution of the first K+1 tokens
  (chain point-mass rule, tree residual rule), and named wrong rules fail the same test.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import assert_greedy_equal
from vllm_specla.core.drafting import DraftModelDrafter, EagleDrafterRunner, TreeSpec
from vllm_specla.core.sampling import accept_chain_pointmass, accept_tree_residual, specinfer_tree_rule_wrong
from vllm_specla.core.topology import DraftTree, prune_tree
from vllm_specla.models.drafter import load_eagle_drafter
from vllm_specla.models.gdn import load_fla_checkpoint
from vllm_specla.runtime.engine import SpecLAEngine

LENS = [3, 9, 1, 17, 5, 12, 2, 7, 30, 4]
MAX_TOKENS = [20, 5, 13, 1, 9, 24, 16, 3, 11, 18]


@pytest.fixture(scope="module")
def models(tiny_dir):
    return {"target": load_fla_checkpoint(tiny_dir["target"]), "same": load_fla_checkpoint(tiny_dir["same"]),
            "perturbed": load_fla_checkpoint(tiny_dir["perturbed"]),
            "random": load_eagle_drafter(tiny_dir["random_eagle"])}


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(8)
    return [torch.randint(3, 96, (n,), generator=g).tolist() for n in LENS]


@pytest.fixture(scope="module")
def ar_out(models, prompts):
    return SpecLAEngine(models["target"], max_batch=16).generate(prompts, MAX_TOKENS)


def test_topology_basics():
    t = DraftTree([5, 1, 2, 3, 4, 6], [-1, 0, 0, 1, 1, 3], [0, -0.1, -2.0, -0.3, -0.5, -0.2])
    assert t.children(1) == [3, 4] and t.depth(5) == 3 and t.path(5) == [0, 1, 3, 5]
    assert math.isclose(t.score(5), -0.6)
    m = t.ancestor_mask()
    assert m[5].tolist() == [True, True, False, True, False, True]
    assert t.dfs_order() == [0, 1, 3, 5, 4, 2]
    chains = t.heavy_light_chains()
    assert chains[0] == (0, [0, 1, 3, 5]) and sorted(c for _, c in chains[1:]) == [[2], [4]]
    assert max(w for w, _ in chains) <= int(math.log2(len(t))) + 1
    p = prune_tree(t, tau=0.45, node_budget=None)  # keeps scores >= -0.55: nodes 1 (-0.1), 3 (-0.4)
    assert p.tokens == [5, 1, 3] and p.parents == [-1, 0, 1]
    p = prune_tree(t, tau=0.55, node_budget=None)  # adds 4 (-0.6) and 5 (-0.6), drops 2 (-2.0)
    assert p.tokens == [5, 1, 3, 4, 6] and p.parents == [-1, 0, 1, 1, 2]
    p = prune_tree(t, tau=None, node_budget=2)
    assert p.tokens == [5, 1, 3] and p.parents == [-1, 0, 1]
    with pytest.raises(ValueError):
        DraftTree([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="tokens: a draft tree has at least its root"):
        DraftTree([], [])  # used to be accepted, then fail in max_depth
    with pytest.raises(ValueError, match=r"logp: 1 values for 2 nodes"):
        DraftTree([1, 2], [-1, 0], [0.0])


@pytest.mark.parametrize(
    "kind,spec,deferred",
    [
        ("perturbed", TreeSpec(top_k=4, max_depth=2, node_budget=12), True),  # wide
        ("perturbed", TreeSpec(top_k=2, max_depth=4, node_budget=10), False),  # deep
        ("same", TreeSpec(top_k=3, max_depth=3, node_budget=7, tau=1.0), True),  # pruned, unbalanced
        ("random", TreeSpec(top_k=2, max_depth=3, node_budget=8, tau=3.0), False),
    ],
)
def test_greedy_tree_equals_ar(models, prompts, ar_out, kind, spec, deferred):
    slots = 8 if deferred else 4  # 8 concurrent requests, or 4 slots reused by 10 requests
    d = (EagleDrafterRunner.for_target(models["random"], models["target"], slots) if kind == "random"
         else DraftModelDrafter(models[kind], slots))
    eng = SpecLAEngine(models["target"], d, num_speculative_tokens=4, deferred_commit=deferred, max_batch=slots,
                       tree=spec)
    out = eng.generate(prompts, MAX_TOKENS)
    assert assert_greedy_equal(models["target"], prompts, ar_out, out) == 0
    assert eng.tree_stats["nodes_verified"] > eng.tree_stats["rows_verified"] >= eng.stats.verify_steps
    assert max(eng.stats.num_drafts) <= spec.node_budget
    if kind == "same":
        assert eng.stats.mean_acceptance_length > 1.5  # the greedy path is always kept (best-first)


def test_tree_budget_goes_to_the_confident_depth():
    """Best-first selection over the whole candidate pool (EAGLE-2 style). With vLLM's defaults at
    K = 4 (top-4, 16 nodes), filling level by level spent the whole budget on depths 1-2 (4 + 16
    candidates), so draft positions 3-4 were never accepted. With the embedded trained pair (a
    confident drafter) trees now reach depth 3-4; depth stays capped by each row's ``num_drafts``;
    and not expanding hopeless frontier nodes changes nothing: the trees equal ``prune_tree`` of
    the fully expanded pool."""
    import os

    from transformers import AutoTokenizer

    from vllm_specla.core.drafting import DraftRow

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "specla-gdn-tiny")
    target = load_fla_checkpoint(os.path.join(root, "target"))
    drafter = load_eagle_drafter(os.path.join(root, "drafter"))
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "target"))
    texts = ["The capital of France is", "def fibonacci(n):\n    if n", "Once upon a time, there was a",
             "Write a short poem about the sea."]
    prompts = [tok(t)["input_ids"] for t in texts]
    rows = []  # EAGLE absorb pairs: (token t + 1, feature t) over the prompt, then the target's next token
    for i, (p, n) in enumerate(zip(prompts, [4, 4, 4, 2])):
        with torch.no_grad():
            f = target.hidden_sequence(torch.tensor([p]))[0]
        rows.append(DraftRow(slot=i, tokens=p[1:] + [int(target.compute_logits(f[-1:]).argmax())], feats=f,
                             fresh=True, num_drafts=n))

    def draft(spec):
        d = EagleDrafterRunner.for_target(drafter, target, 4)
        d.enable_trees(spec.top_k)
        return d.step_tree(rows, spec), d.tree_counts

    trees, counts = draft(TreeSpec(top_k=4, max_depth=4, node_budget=16))
    for t, r in zip(trees, rows):
        assert 0 < t.num_drafts <= 16 and t.max_depth <= r.num_drafts
    assert trees[3].max_depth == 2  # num_drafts caps the depth
    assert max(t.max_depth for t in trees[:3]) >= 3, [t.max_depth for t in trees]  # level filling: <= 2
    assert counts["kept"] < counts["candidates"]
    for top_k, budget, tau in [(4, 16, None), (2, 5, None), (3, 12, 1.5), (4, 64, 3.0)]:
        got, _ = draft(TreeSpec(top_k=top_k, max_depth=4, node_budget=budget, tau=tau))
        pools, _ = draft(TreeSpec(top_k=top_k, max_depth=4, node_budget=None, tau=None))
        want = [prune_tree(p, tau, budget) for p in pools]
        assert [(t.tokens, t.parents) for t in got] == [(t.tokens, t.parents) for t in want]


def test_tree_beats_chain_acceptance_at_equal_depth(models, prompts):
    """Perturbed drafter: a top-4 tree of depth 4 accepts at least as much as the depth-4 chain."""
    chain = SpecLAEngine(models["target"], DraftModelDrafter(models["perturbed"], 4), num_speculative_tokens=4,
                         max_batch=4)
    chain.generate(prompts, MAX_TOKENS)
    tree = SpecLAEngine(models["target"], DraftModelDrafter(models["perturbed"], 4), num_speculative_tokens=4,
                        max_batch=4, tree=TreeSpec(top_k=4, max_depth=4, node_budget=16))
    tree.generate(prompts, MAX_TOKENS)
    assert tree.stats.mean_acceptance_length >= chain.stats.mean_acceptance_length


# ----------------------------------------------------------------------------------------------
# Sampling: joint distribution of the first K+1 tokens on a toy target (exact p known)
# ----------------------------------------------------------------------------------------------

V = 4


def _table(seed, sharp=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V, V, V, generator=g) * sharp, -1)  # p(x | prev2, prev1)


P_T, Q_T = _table(1), _table(2, sharp=2.5)


def _p(ctx):
    return P_T[ctx[-2], ctx[-1]]


def _q(ctx):
    return Q_T[ctx[-2], ctx[-1]]


def _exact_joint(prompt, n):
    probs = {}

    def rec(ctx, pr, depth):
        if depth == n:
            probs[tuple(ctx[len(prompt):])] = pr
            return
        p = _p(ctx)
        for x in range(V):
            rec(ctx + [x], pr * float(p[x]), depth + 1)

    rec(list(prompt), 1.0, 0)
    return probs


def _greedy_chain(ctx, K):
    out = []
    for _ in range(K):
        out.append(int(_q(ctx + out).argmax()))
    return out


def _topk_tree(ctx, depth, k):
    toks, pars = [ctx[-1]], [-1]
    level = [(0, [])]
    for _ in range(depth):
        nxt = []
        for node, path in level:
            q = _q(ctx + path)
            for t in torch.topk(q, k).indices.tolist():
                toks.append(t)
                pars.append(node)
                nxt.append((len(toks) - 1, path + [t]))
        level = nxt
    return DraftTree(toks, pars)


def _sample_joint(rule, n_tokens, K, N, seed):
    gen = torch.Generator().manual_seed(seed)
    prompt = [0, 1]
    counts: dict = {}
    for _ in range(N):
        ctx, out = list(prompt), []
        while len(out) < n_tokens:
            e = rule(ctx, K, gen)
            out += e
            ctx += e
        key = tuple(out[:n_tokens])
        counts[key] = counts.get(key, 0) + 1
    return counts


def _chi2_ok(counts, exact, N):
    """Pearson chi-square vs the exact joint; critical value at p = 1e-3 (Wilson-Hilferty)."""
    stat = sum((counts.get(k, 0) - N * p) ** 2 / (N * p) for k, p in exact.items())
    df = len(exact) - 1
    z = 3.09
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat < crit, stat, crit


def _paths_to_positions(tree, ctx):
    """Target probabilities at every tree node (node context = ctx + path tokens)."""
    rows = []
    for i in range(len(tree)):
        path = [tree.tokens[j] for j in tree.path(i)[1:]]
        rows.append(_p(ctx + path))
    return torch.stack(rows)


def chain_rule(ctx, K, gen):
    d = _greedy_chain(ctx, K)
    p = torch.stack([_p(ctx + d[:i]) for i in range(K + 1)])
    return accept_chain_pointmass(p, d, gen)


def chain_rule_wrong_resample_from_p(ctx, K, gen):
    d = _greedy_chain(ctx, K)
    out = []
    for i, t in enumerate(d):
        p = _p(ctx + out)
        if torch.rand((), generator=gen).item() < float(p[t]):
            out.append(t)
            continue
        out.append(int(torch.multinomial(p, 1, generator=gen)))  # WRONG: p instead of the residual
        return out
    return out + [int(torch.multinomial(_p(ctx + out), 1, generator=gen))]


def tree_rule(ctx, K, gen):
    tree = _topk_tree(ctx, 2, 2)
    return accept_tree_residual(tree.parents, tree.tokens, _paths_to_positions(tree, ctx), gen)[1]


def tree_rule_wrong_specinfer(ctx, K, gen):
    tree = _topk_tree(ctx, 2, 2)
    q = torch.stack([_q(ctx + [tree.tokens[j] for j in tree.path(i)[1:]]) for i in range(len(tree))])
    return specinfer_tree_rule_wrong(tree.parents, tree.tokens, _paths_to_positions(tree, ctx), q, gen)[1]


N_SAMPLES = 12000


@pytest.mark.parametrize("rule,lossless", [(chain_rule, True), (chain_rule_wrong_resample_from_p, False),
                                          (tree_rule, True), (tree_rule_wrong_specinfer, False)])
def test_joint_distribution_of_first_k_plus_1_tokens(rule, lossless):
    K = 2
    exact = _exact_joint([0, 1], K + 1)
    counts = _sample_joint(rule, K + 1, K, N_SAMPLES, seed=123)
    ok, stat, crit = _chi2_ok(counts, exact, N_SAMPLES)
    assert ok == lossless, f"chi2={stat:.1f} crit={crit:.1f} ({rule.__name__})"


def test_engine_sampling_runs_and_is_reproducible(models, prompts):
    """Sampling through the engine (chain and tree) with a fixed seed is reproducible."""
    def run(tree):
        eng = SpecLAEngine(models["target"], DraftModelDrafter(models["perturbed"], 4), num_speculative_tokens=3,
                           max_batch=4, temperature=0.8, top_p=0.95, seed=7, tree=tree)
        return eng.generate(prompts[:4], 10)

    for tree in (None, TreeSpec(top_k=2, max_depth=3, node_budget=6)):
        a, b = run(tree), run(tree)
        assert a == b and all(len(x) == 10 for x in a)


@pytest.mark.parametrize("tree", [None, TreeSpec(top_k=2, max_depth=2, node_budget=4)])
def test_engine_joint_distribution_tiny_vocab_gdn(tmp_path, tree):
    """End to end through the engine (drafter, verify, acceptance, commit) on a 4-token-vocabulary
    GDN target: the joint distribution of the first 3 sampled tokens matches AR's exact one."""
    from helpers import make_tiny_pair

    d = make_tiny_pair(tmp_path, vocab_size=4, hidden_size=32, num_heads=2, num_v_heads=2, head_dim=16)
    target, drafter = load_fla_checkpoint(d["target"]), load_fla_checkpoint(d["perturbed"])
    prompt = [1, 3, 0, 2]
    # exact AR joint of the first 3 tokens at temperature 1
    exact = {}
    with torch.no_grad():
        for a in range(4):
            pa = torch.softmax(target.forward_sequence(torch.tensor([prompt]))[0, -1], -1)[a]
            for b in range(4):
                pb = torch.softmax(target.forward_sequence(torch.tensor([prompt + [a]]))[0, -1], -1)[b]
                pc = torch.softmax(target.forward_sequence(torch.tensor([prompt + [a, b]]))[0, -1], -1)
                for c in range(4):
                    exact[(a, b, c)] = float(pa * pb * pc[c])
    N = 2000
    eng = SpecLAEngine(target, DraftModelDrafter(drafter, N), num_speculative_tokens=2, max_batch=N,
                       temperature=1.0, seed=11, tree=tree)
    outs = eng.generate([prompt] * N, 3)
    counts: dict = {}
    for o in outs:
        counts[tuple(o)] = counts.get(tuple(o), 0) + 1
    ok, stat, crit = _chi2_ok(counts, exact, N)
    assert ok, f"chi2={stat:.1f} >= {crit:.1f}"
    assert sum(eng.stats.num_accepted) > 0  # drafts were actually accepted along the way


def _legacy(runner_cls):
    """``runner_cls`` with the drafting step of session 8 (the oracle): absorb, copy the committed
    state to the scratch slot, run every draft step there with the state written."""
    from vllm_specla.core.state import build_step_plan

    class Legacy(runner_cls):
        @torch.no_grad()
        def step(self, rows):
            all_rows, rows = rows, [r for r in rows if len(r.tokens) > 0]
            out = {r.slot: [] for r in all_rows}
            toks = torch.tensor([t for r in rows for t in r.tokens], dtype=torch.int64)
            feats = torch.cat([r.feats for r in rows]) if rows[0].feats is not None else None
            plan = build_step_plan([len(r.tokens) for r in rows], [r.slot for r in rows], [True] * len(rows),
                                   [not r.fresh for r in rows], speculative=False)
            last = torch.tensor([len(r.tokens) for r in rows]).cumsum(0) - 1
            f, logits = self._run(toks, feats, plan, last)
            cur_tok = logits.argmax(-1)
            live = [i for i, r in enumerate(rows) if r.num_drafts > 0]
            for i in live:
                out[rows[i].slot].append(int(cur_tok[i]))
            steps = max((rows[i].num_drafts for i in live), default=0) - 1
            if steps > 0:
                scratch = torch.tensor([rows[i].slot + self.max_requests for i in live])
                src = torch.tensor([rows[i].slot for i in live])
                for st in self.states:
                    st.conv.index_copy_(0, scratch, st.conv.index_select(0, src))
                    st.ssm.index_copy_(0, scratch, st.ssm.index_select(0, src))
                tok = cur_tok[torch.tensor(live)]
                feat = f[last][torch.tensor(live)] if f is not None else None
                for s in range(steps):
                    plan = build_step_plan([1] * len(live), scratch, [False] * len(live), [True] * len(live),
                                           speculative=False)
                    feat, logits = self._run(tok, feat, plan)
                    tok = logits.argmax(-1)
                    for j, i in enumerate(live):
                        if rows[i].num_drafts > s + 1:
                            out[rows[i].slot].append(int(tok[j]))
            return [out[r.slot] for r in all_rows]

    return Legacy


@pytest.mark.parametrize("kind", ["eagle", "draft_model"])
def test_draft_steps_onto_scratch_equal_copy_then_draft(models, prompts, kind):
    """The drafter's first draft step reads the committed slot and writes the scratch slot
    (``out_slots``), its last draft step writes nothing (``write_state=False``): the drafts and
    the committed drafter states equal those of copying the state to the scratch slot first and
    writing every step (the session 8 scheme), over steps with 0-4 drafts per row."""
    from vllm_specla.core.drafting import DraftRow

    tgt = models["target"]
    if kind == "eagle":
        make = lambda cls: cls.for_target(models["random"], tgt, max_requests=6)  # noqa: E731
        cls = EagleDrafterRunner
    else:
        make = lambda cls: cls(models["same"], max_requests=6)  # noqa: E731
        cls = DraftModelDrafter
    new, old = make(cls), make(_legacy(cls))
    g = torch.Generator().manual_seed(3)
    D = tgt.config.hidden_size
    slots = [4, 0, 2, 5]
    for step in range(5):  # the last step drafts at most 2 tokens: its one draft step reads the committed slot
        rows = []
        for i, s in enumerate(slots):
            n = len(prompts[i]) if step == 0 else 1 + (step + i) % 3
            toks = prompts[i][:n] if step == 0 else torch.randint(3, 96, (n,), generator=g).tolist()
            feats = torch.randn(n, D, generator=g) if kind == "eagle" else None
            nd = (i + step) % 5 if step < 4 else i % 3
            rows.append(DraftRow(slot=s, tokens=toks, feats=feats, fresh=step == 0, num_drafts=nd))
        d_new, d_old = new.step(rows), old.step(rows)
        assert d_new == d_old
        assert any(len(d) >= (3 if step < 4 else 2) for d in d_new)
        for a, b in zip(new.states, old.states):
            torch.testing.assert_close(a.ssm[slots], b.ssm[slots], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(a.conv[slots], b.conv[slots], rtol=1e-6, atol=1e-6)


def test_step_plan_out_slots_and_read_only_are_ar_only():
    """``out_slots`` / ``write_state=False`` name AR verify rows; with speculative rows or prefill
    rows in the step they are refused with the field named."""
    from vllm_specla.core.state import build_step_plan

    plan = build_step_plan([1, 1], [0, 1], [False, False], [True, True], speculative=False, out_slots=[4, 5])
    assert plan.verify.out_slots.tolist() == [4, 5] and plan.verify.write_state
    assert not build_step_plan([1], [0], [False], [True], speculative=False, write_state=False).verify.write_state
    with pytest.raises(ValueError, match="AR verify rows only"):
        build_step_plan([1], [0], [True], [True], speculative=False, out_slots=[3])
    with pytest.raises(ValueError, match="AR verify rows only"):
        build_step_plan([1], [0], [False], [True], speculative=True, write_state=False)
    # a slot with pending factors: refused before they are taken (nothing lost)
    from vllm_specla.core.state import SlotBook

    book = SlotBook(4)
    book.pending_len[0] = 3
    with pytest.raises(ValueError, match="pending factors"):
        build_step_plan([1], [0], [False], [True], speculative=False, book=book, write_state=False)
    assert int(book.pending_len[0]) == 3


def test_step_plan_refuses_a_prefill_continuation_on_pending_factors():
    """A prefill continuation (``has_initial_state``) on a slot whose factors are still pending is the caller's
    error (worker/runner.py flushes such slots first): a ValueError naming the slot (it was a RuntimeError), raised
    before the book changes (a fresh row's slot in the same step is not reset either). A fresh prefill drops the
    slot's stale pending factors."""
    from vllm_specla.core.state import SlotBook, build_step_plan

    book = SlotBook(4)
    book.pending_len[1], book.pending_len[2] = 3, 2
    with pytest.raises(ValueError, match=r"prefill continuation on a slot with pending factors \(slots \[1\]\)"):
        build_step_plan([4, 4], [2, 1], [True, True], [False, True], speculative=True, book=book)
    assert book.pending_len.tolist() == [0, 3, 2, 0]
    plan = build_step_plan([4], [2], [True], [False], speculative=True, book=book)
    assert plan.prefill.slots.tolist() == [2] and book.pending_len.tolist() == [0, 3, 0, 0]


def test_step_plan_refuses_bad_parents_before_the_book_changes():
    """A tree row whose parent array does not match its token count is refused before the step takes the slot's
    pending factors (and before a fresh row's slot is reset): the refused step loses nothing."""
    from vllm_specla.core.state import SlotBook, build_step_plan

    book = SlotBook(4)
    book.pending_len[1], book.pending_len[3], book.bank_sel[1] = 3, 2, 1
    with pytest.raises(ValueError, match=r"row 1: 2 parents for 3 tokens"):
        build_step_plan([4, 3], [3, 1], [True, False], [False, True], speculative=True, book=book,
                        parents=[None, [-1, 0]])
    assert book.pending_len.tolist() == [0, 3, 0, 2] and book.bank_sel.tolist() == [0, 1, 0, 0]
    plan = build_step_plan([3], [1], [False], [True], speculative=True, book=book, parents=[[-1, 0, 0]])
    assert plan.verify.parents.tolist() == [-1, 0, 0] and plan.verify.pending_len.tolist() == [3]


def test_tree_draft_steps_onto_scratch_equal_copy_then_step(models, prompts):
    """Tree drafting's per-level steps read the parent's slot and write the node's scratch slot
    (``out_slots``, siblings reading one slot): the trees equal those of copying each parent's state
    to the node's slot first and stepping there (the session 8 scheme, as a ``_run`` wrapper), and
    the committed slots keep the state the absorb gave them."""
    from vllm_specla.core.drafting import DraftRow

    class Copying(EagleDrafterRunner):
        def _run(self, tokens, feats, plan, pick=None):
            vf = plan.verify
            if vf is not None and vf.out_slots is not None:
                for st in self.states:
                    st.conv.index_copy_(0, vf.out_slots, st.conv.index_select(0, vf.slots))
                    st.ssm.index_copy_(0, vf.out_slots, st.ssm.index_select(0, vf.slots))
                vf.slots, vf.out_slots = vf.out_slots, None
            return super()._run(tokens, feats, plan, pick)

    tgt = models["target"]
    spec = TreeSpec(top_k=3, max_depth=4, node_budget=12)
    new = EagleDrafterRunner.for_target(models["random"], tgt, max_requests=4)
    old = Copying.for_target(models["random"], tgt, max_requests=4)
    absorb_only = EagleDrafterRunner.for_target(models["random"], tgt, max_requests=4)
    for d in (new, old, absorb_only):
        d.enable_trees(spec.top_k)
    g = torch.Generator().manual_seed(5)
    D = tgt.config.hidden_size
    for step in range(3):
        rows = []
        for i, s in enumerate([3, 1, 0]):
            n = len(prompts[i]) if step == 0 else 1 + (i + step) % 3
            toks = prompts[i][:n] if step == 0 else torch.randint(3, 96, (n,), generator=g).tolist()
            rows.append(DraftRow(slot=s, tokens=toks, feats=torch.randn(n, D, generator=g), fresh=step == 0,
                                 num_drafts=4))
        t_new, t_old = new.step_tree(rows, spec), old.step_tree(rows, spec)
        absorb_only.step([DraftRow(r.slot, r.tokens, r.feats, r.fresh, 0) for r in rows])
        assert [(t.tokens, t.parents) for t in t_new] == [(t.tokens, t.parents) for t in t_old]
        assert all(len(t) > 4 for t in t_new)
        # the draft steps leave the committed slots as the absorb left them
        for a, b in zip(new.states, absorb_only.states):
            torch.testing.assert_close(a.ssm[[3, 1, 0]], b.ssm[[3, 1, 0]], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(a.conv[[3, 1, 0]], b.conv[[3, 1, 0]], rtol=1e-6, atol=1e-6)
