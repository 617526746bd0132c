"""Drafters on their own state slots, with rollback by recomputation (vLLM-free).

Two drafter kinds share one mechanism (:class:`SlotDrafter`):

* :class:`DraftModelDrafter` — any fla GDN causal LM with the target's tokenizer;
* :class:`EagleDrafterRunner` — the target-aligned EAGLE-style drafter (``models/drafter.py``),
  fed with the target's final features.

Rollback choice (issue 3): a drafter's *committed* state only ever absorbs committed inputs
(tokens the target emitted, and for EAGLE the target's own features of them). Each step:

1. **absorb** the inputs committed since the last step (prompt on the first step; afterwards the
   ``a+1`` tokens emitted by the last verify) into the committed drafter slot, as a prefill
   chunk with initial state — the output at the last position gives the first draft;
2. **speculate** ``K-1`` more drafts autoregressively on a *scratch* slot (the first draft step
   reads the committed slot and writes the scratch slot, ``out_slots``; the last one writes
   nothing), which is simply overwritten next step.

So rejected drafts never touch the committed drafter state, and nothing needs undoing: the
drafter recomputes over the accepted tokens (at most ``K+1`` per step) instead of keeping
factors. The drafter is small (one block for EAGLE), so this costs one short chunk per step.
Drafts are greedy (point-mass), which is what the acceptance rules assume (ALGORITHMS.md §9).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_specla.core import is_int, is_real
from vllm_specla.core.draft_vocab import check_ids, draft_logits_fn, is_full_vocab
from vllm_specla.core.state import allocate_layer_states, build_step_plan
from vllm_specla.models.drafter import EagleDrafter
from vllm_specla.models.gdn import GatedDeltaNetForCausalLM


@dataclass
class DraftRow:
    """One request's drafting input for a step.

    slot: the request's drafter slot (``0 <= slot < max_requests``). tokens: ``[n]`` committed
    tokens to absorb (EAGLE: the tokens *following* each feature). feats: ``[n, D]`` target
    features (EAGLE only). fresh: first absorb for this request (no initial state).
    num_drafts: how many draft tokens to return (0 allowed).
    """

    slot: int
    tokens: list[int]
    feats: torch.Tensor | None = None
    fresh: bool = False
    num_drafts: int = 0


@dataclass
class TreeSpec:
    """Tree drafting shape (ALGORITHMS.md §7): ``top_k`` children per expanded node (also the nodes
    expanded per level), depth at most ``max_depth`` (<= K), at most ``node_budget`` drafts chosen
    best-first by cumulative drafter log-prob (:meth:`SlotDrafter.step_tree`), and nodes whose score
    is below ``best - tau`` are pruned (None: no pruning)."""

    top_k: int = 4
    max_depth: int = 4
    node_budget: int = 16
    tau: float | None = None

    def __post_init__(self):
        """Raises ValueError naming a field outside its range (ints >= 1; ``node_budget`` may also be
        None, no budget: the drafter's whole pool, for :meth:`SlotDrafter.step_tree` only; ``tau``
        None or >= 0)."""
        for name in ("top_k", "max_depth", "node_budget"):
            v = getattr(self, name)
            if name == "node_budget" and v is None:
                continue
            if not (is_int(v) and v >= 1):
                raise ValueError(f"TreeSpec.{name}={v!r}: must be an int >= 1" + (" or None" if name == "node_budget" else ""))
        t = self.tau
        if t is not None and (not is_real(t) or not t >= 0):
            raise ValueError(f"TreeSpec.tau={t!r}: must be None (no pruning) or a number >= 0")


class SlotDrafter:
    """Common absorb + speculate loop over the drafter's own state slots.

    Slots ``[0, max_requests)`` hold committed drafter states; ``[max_requests, 2*max_requests)``
    are the matching scratch slots.

    Raises:
        ValueError: ``max_requests`` not an int >= 1.
    """

    def __init__(self, config, max_requests: int, device: torch.device | str, dtype: torch.dtype):
        if not (is_int(max_requests) and max_requests >= 1):
            raise ValueError(f"max_requests={max_requests!r}: must be an int >= 1 (drafter slots)")
        self.config = config
        self.max_requests = int(max_requests)
        self.device = torch.device(device)
        self.states = allocate_layer_states(config, 2 * max_requests, 0, device=device)
        # a draft vocabulary (core/draft_vocab.py): ``_run``'s logits are over these ``[Vd]``
        # ascending token ids, and draft indices map back through them; None = the full vocabulary
        self.draft_ids: torch.Tensor | None = None

    def _tokens(self, idx: torch.Tensor) -> torch.Tensor:
        """Indices into ``_run``'s logits -> token ids."""
        return idx if self.draft_ids is None else self.draft_ids[idx]

    # subclasses: run the network on a plan; return (features-or-None at every position, logits at
    # positions ``pick`` -- every position when None; over ``draft_ids`` when set). Absorbing a
    # prompt needs only the last position's logits, so ``pick`` saves the LM head over the rest.
    def _run(self, tokens: torch.Tensor, feats: torch.Tensor | None, plan,
             pick: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def release(self, slot: int) -> None:
        """Nothing to free: the next ``fresh`` absorb on the slot starts from zero state."""

    @torch.no_grad()
    def step(self, rows: list[DraftRow]) -> list[list[int]]:
        """Absorb each row's committed inputs, then draft ``num_drafts`` greedy tokens per row."""
        all_rows = rows
        rows = [r for r in rows if len(r.tokens) > 0]
        out: dict[int, list[int]] = {r.slot: [] for r in all_rows}
        if not rows:
            return [[] for _ in all_rows]
        toks = torch.tensor([t for r in rows for t in r.tokens], dtype=torch.int64, device=self.device)
        feats = torch.cat([r.feats for r in rows]).to(self.device) if rows[0].feats is not None else None
        plan = build_step_plan(
            [len(r.tokens) for r in rows], [r.slot for r in rows], [True] * len(rows),
            [not r.fresh for r in rows], speculative=False, device=self.device)
        last = torch.tensor([len(r.tokens) for r in rows], device=self.device).cumsum(0) - 1
        f, logits = self._run(toks, feats, plan, last)
        cur_tok = self._tokens(logits.argmax(-1))
        cur_feat = f[last] if f is not None else None
        live = [i for i, r in enumerate(rows) if r.num_drafts > 0]
        for i in live:
            out[rows[i].slot].append(int(cur_tok[i]))
        steps = max((rows[i].num_drafts for i in live), default=0) - 1
        if steps > 0:
            scratch = torch.tensor([rows[i].slot + self.max_requests for i in live], device=self.device)
            src = torch.tensor([rows[i].slot for i in live], device=self.device)
            idx = torch.tensor(live, device=self.device)
            tok = cur_tok[idx]
            feat = cur_feat[idx] if cur_feat is not None else None
            for s in range(steps):
                # the first step reads the committed slot and writes the scratch slot (out_slots: no
                # copy of the state first); later ones run on the scratch slot; the last one only
                # reads (nothing reads its state) -- as the decode runtime's draft steps
                first, last = s == 0, s == steps - 1
                plan = build_step_plan([1] * len(live), src if first else scratch, [False] * len(live),
                                       [True] * len(live), speculative=False, device=self.device,
                                       out_slots=scratch if first and not last else None, write_state=not last)
                f, logits = self._run(tok, feat, plan)
                tok = self._tokens(logits.argmax(-1))
                feat = f
                for j, i in enumerate(live):
                    if rows[i].num_drafts > s + 1:
                        out[rows[i].slot].append(int(tok[j]))
        return [out[r.slot] for r in all_rows]

    # ---- trees -------------------------------------------------------------------------------
    def enable_trees(self, top_k: int) -> None:
        """Reserve scratch drafter slots for tree drafting (before any request starts): per
        request, two banks of ``top_k`` frontier slots (the parents' and the children's level)."""
        need = self.max_requests * (1 + 2 * top_k)
        if self.states[0].ssm.shape[0] < need:
            self.states = allocate_layer_states(self.config, need, 0, device=self.device)
        self._tree_width = top_k
        self.tree_counts = {"candidates": 0, "kept": 0}  # pruned fraction = 1 - kept / candidates

    @torch.no_grad()
    def step_tree(self, rows: list[DraftRow], spec: TreeSpec):
        """Absorb each row's committed inputs, then draft one tree per row (ALGORITHMS.md §7; the
        EAGLE-2 dynamic tree, arXiv 2406.16858 §4).

        Expansion, level by level up to ``max_depth`` (capped per row by ``DraftRow.num_drafts``:
        never draft past max_tokens): the frontier (the level's ``top_k`` best nodes by cumulative
        drafter log-prob) proposes ``top_k`` children each, all of which join the row's candidate
        pool. Selection, best-first over the whole pool: :func:`~vllm_specla.core.topology.prune_tree`
        keeps the ``node_budget`` best candidates whose score is within ``tau`` of the best draft
        (ancestor-closed: a child never scores above its parent). So the budget goes where the
        drafter is confident, at any depth, rather than filling the first levels. A frontier node
        whose children can no longer be kept (it is below ``best - tau``, or ``node_budget`` pool
        nodes, the root counted, score above it) is not expanded: the result equals selecting from
        the fully expanded pool. A frontier node's drafter state lives in a scratch slot
        (its parent's state, then one step on its token).
        Returns one :class:`~vllm_specla.core.topology.DraftTree` per row (root = last absorbed).
        """
        from vllm_specla.core.topology import DraftTree, prune_tree  # noqa: PLC0415

        if getattr(self, "_tree_width", None) != spec.top_k:
            raise RuntimeError(f"call enable_trees({spec.top_k}) before tree drafting")
        pools = [DraftTree([r.tokens[-1]], [-1]) for r in rows]
        if not rows:
            return pools
        scores = [[0.0] for _ in rows]  # cumulative drafter log-prob per pool node
        toks = torch.tensor([t for r in rows for t in r.tokens], dtype=torch.int64, device=self.device)
        feats = torch.cat([r.feats for r in rows]).to(self.device) if rows[0].feats is not None else None
        plan = build_step_plan([len(r.tokens) for r in rows], [r.slot for r in rows], [True] * len(rows),
                               [not r.fresh for r in rows], speculative=False, device=self.device)
        last = torch.tensor([len(r.tokens) for r in rows], device=self.device).cumsum(0) - 1
        f, logits = self._run(toks, feats, plan, last)
        lp0 = torch.log_softmax(logits.float(), -1)
        # frontier entries: (row, node, child log-probs, feature after node, drafter slot of node)
        frontier = [(i, 0, lp0[i], f[last[i]] if f is not None else None, rows[i].slot)
                    for i, r in enumerate(rows) if r.num_drafts > 0]
        width = spec.top_k
        for depth in range(1, spec.max_depth + 1):
            cands_by_row: dict[int, list] = {}
            for i, node, lp, feat, dslot in frontier:
                top = torch.topk(lp, min(spec.top_k, lp.shape[-1]))  # (a draft vocabulary may be smaller)
                for val, tok in zip(top.values.tolist(), self._tokens(top.indices).tolist()):
                    cands_by_row.setdefault(i, []).append((scores[i][node] + val, node, tok, val, feat, dslot))
            nxt = []
            for i, cands in cands_by_row.items():
                pool, sc_i = pools[i], scores[i]
                cands.sort(key=lambda c: -c[0])
                added = []
                for sc, parent, tok, val, feat, dslot in cands:
                    pool.tokens.append(tok)
                    pool.parents.append(parent)
                    pool.logp.append(val)
                    sc_i.append(sc)
                    added.append((len(pool) - 1, sc, feat, dslot))
                if depth >= min(spec.max_depth, rows[i].num_drafts):
                    continue
                best = max(sc_i[1:])  # at depth 1: scores only fall along a path
                for rank, (node, sc, feat, dslot) in enumerate(added[:width]):
                    if spec.tau is not None and sc < best - spec.tau:
                        break  # (sorted: the rest score lower)
                    if spec.node_budget is not None and sum(x > sc for x in sc_i) >= spec.node_budget:
                        break
                    scratch = self.max_requests + rows[i].slot * 2 * width + (depth % 2) * width + rank
                    nxt.append((i, node, feat, dslot, scratch))
            if not nxt:
                break
            # one drafter step per new frontier node, from its parent's drafter state: it reads the
            # parent's slot and writes the node's scratch slot (out_slots: siblings read one slot,
            # the two frontier banks alternate by depth, so no slot is both read and written)
            src = torch.tensor([x[3] for x in nxt], device=self.device)
            dst = torch.tensor([x[4] for x in nxt], device=self.device)
            tok = torch.tensor([pools[x[0]].tokens[x[1]] for x in nxt], device=self.device)
            feat = torch.stack([x[2] for x in nxt]) if nxt[0][2] is not None else None
            plan = build_step_plan([1] * len(nxt), src, [False] * len(nxt), [True] * len(nxt),
                                   speculative=False, device=self.device, out_slots=dst)
            f2, lg2 = self._run(tok, feat, plan)
            lp2 = torch.log_softmax(lg2.float(), -1)
            frontier = [(x[0], x[1], lp2[j], f2[j] if f2 is not None else None, x[4]) for j, x in enumerate(nxt)]
        trees = [prune_tree(pool, spec.tau, spec.node_budget) for pool in pools]
        self.tree_counts["candidates"] += sum(len(p) - 1 for p in pools)
        self.tree_counts["kept"] += sum(len(t) - 1 for t in trees)
        return trees


class DraftModelDrafter(SlotDrafter):
    """A separate GDN causal LM as drafter (same tokenizer as the target).

    Per step, ``DraftRow.tokens`` are the committed tokens not yet absorbed (the whole prompt plus
    first sampled token at the start; afterwards the tokens emitted by the last verify).
    """

    def __init__(self, model: GatedDeltaNetForCausalLM, max_requests: int):
        p = next(model.parameters())
        super().__init__(model.config, max_requests, p.device, p.dtype)
        self.model = model

    def _run(self, tokens, feats, plan, pick=None):
        h = self.model(tokens, plan, self.states)
        return None, self.model.compute_logits(h if pick is None else h[pick])


class EagleDrafterRunner(SlotDrafter):
    """The EAGLE-style drafter, reading the target's embedding and LM head.

    Per step, ``DraftRow.tokens[i]`` is the committed token that followed target feature
    ``DraftRow.feats[i]`` (pairs ``(x_{t+1}, f_t)`` for every newly committed position).
    """

    def __init__(self, drafter: EagleDrafter, embed_fn, logits_fn, max_requests: int,
                 draft_ids: torch.Tensor | None = None):
        """``embed_fn(tokens [N]) -> [N, D]`` and ``logits_fn(feats [N, D]) -> [N, vocab]`` are the
        target's (frozen) embedding and LM head; with ``draft_ids`` (``[Vd]`` ascending token ids of
        a draft vocabulary) ``logits_fn`` returns ``[N, Vd]`` logits over them
        (:func:`~vllm_specla.core.draft_vocab.draft_logits_fn`)."""
        p = next(drafter.parameters())
        super().__init__(drafter.config, max_requests, p.device, p.dtype)
        self.drafter = drafter
        self.embed_fn = embed_fn
        self.logits_fn = logits_fn
        self.draft_ids = None if draft_ids is None else draft_ids.to(self.device)

    @classmethod
    def for_target(cls, drafter: EagleDrafter, target: GatedDeltaNetForCausalLM, max_requests: int,
                   draft_vocab: torch.Tensor | None = None):
        """On a :class:`GatedDeltaNetForCausalLM` target; ``draft_vocab``: ``[Vd]`` ascending token
        ids of a frequency-ranked draft vocabulary (``core/draft_vocab.py``; a list or numpy array of ints is
        taken too), None = full vocabulary.

        Raises:
            ValueError: ``max_requests`` not an int >= 1; ``draft_vocab`` not strictly ascending integer ids in
                ``0..vocab_size-1`` (:func:`~vllm_specla.core.draft_vocab.check_ids`).
        """
        logits_fn = target.compute_logits
        if draft_vocab is not None:  # (a list / numpy array is taken; floats, bools and bad ids are refused)
            draft_vocab = check_ids(draft_vocab, target.config.vocab_size)
        if draft_vocab is not None and is_full_vocab(draft_vocab, target.config.vocab_size):
            draft_vocab = None
        if draft_vocab is not None:
            logits_fn = draft_logits_fn(logits_fn, target.lm_head.weight, draft_vocab, target.config.vocab_size)
        return cls(drafter, target.model.embeddings, logits_fn, max_requests, draft_vocab)

    def _run(self, tokens, feats, plan, pick=None):
        f = self.drafter(tokens, feats, self.embed_fn, plan, self.states)
        return f, self.logits_fn(f if pick is None else f[pick]).float()

