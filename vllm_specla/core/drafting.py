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
2. **speculate** ``K-1`` more drafts autoregressively on a *scratch* slot (a copy of the committed
   slot), which is simply overwritten next step.

So rejected drafts never touch the committed drafter state, and nothing needs undoing: the
drafter recomputes over the accepted tokens (at most ``K+1`` per step) instead of keeping
factors. The drafter is small (one block for EAGLE), so this costs one short chunk per step.
Drafts are greedy (point-mass), which is what the acceptance rules assume (ALGORITHMS.md §9).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


class SlotDrafter:
    """Common absorb + speculate loop over the drafter's own state slots.

    Slots ``[0, max_requests)`` hold committed drafter states; ``[max_requests, 2*max_requests)``
    are the matching scratch slots.
    """

    def __init__(self, config, max_requests: int, device: torch.device | str, dtype: torch.dtype):
        self.config = config
        self.max_requests = max_requests
        self.device = torch.device(device)
        self.states = allocate_layer_states(config, 2 * max_requests, 0, device=device)

    # subclasses: run the network on a plan; return (features-or-None, logits) at every position
    def _run(self, tokens: torch.Tensor, feats: torch.Tensor | None, plan) -> tuple[torch.Tensor, torch.Tensor]:
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
        f, logits = self._run(toks, feats, plan)
        last = torch.tensor([len(r.tokens) for r in rows], device=self.device).cumsum(0) - 1
        cur_tok = logits[last].argmax(-1)
        cur_feat = f[last] if f is not None else None
        live = [i for i, r in enumerate(rows) if r.num_drafts > 0]
        for i in live:
            out[rows[i].slot].append(int(cur_tok[i]))
        steps = max((rows[i].num_drafts for i in live), default=0) - 1
        if steps > 0:
            scratch = torch.tensor([rows[i].slot + self.max_requests for i in live], device=self.device)
            src = torch.tensor([rows[i].slot for i in live], device=self.device)
            for st in self.states:
                st.conv.index_copy_(0, scratch, st.conv.index_select(0, src))
                st.ssm.index_copy_(0, scratch, st.ssm.index_select(0, src))
            idx = torch.tensor(live, device=self.device)
            tok = cur_tok[idx]
            feat = cur_feat[idx] if cur_feat is not None else None
            for s in range(steps):
                plan = build_step_plan([1] * len(live), scratch, [False] * len(live), [True] * len(live),
                                       speculative=False, device=self.device)
                f, logits = self._run(tok, feat, plan)
                tok = logits.argmax(-1)
                feat = f
                for j, i in enumerate(live):
                    if rows[i].num_drafts > s + 1:
                        out[rows[i].slot].append(int(tok[j]))
        return [out[r.slot] for r in all_rows]


class DraftModelDrafter(SlotDrafter):
    """A separate GDN causal LM as drafter (same tokenizer as the target).

    Per step, ``DraftRow.tokens`` are the committed tokens not yet absorbed (the whole prompt plus
    first sampled token at the start; afterwards the tokens emitted by the last verify).
    """

    def __init__(self, model: GatedDeltaNetForCausalLM, max_requests: int):
        p = next(model.parameters())
        super().__init__(model.config, max_requests, p.device, p.dtype)
        self.model = model

    def _run(self, tokens, feats, plan):
        h = self.model(tokens, plan, self.states)
        return None, self.model.compute_logits(h)


class EagleDrafterRunner(SlotDrafter):
    """The EAGLE-style drafter, reading the target's embedding and LM head.

    Per step, ``DraftRow.tokens[i]`` is the committed token that followed target feature
    ``DraftRow.feats[i]`` (pairs ``(x_{t+1}, f_t)`` for every newly committed position).
    """

    def __init__(self, drafter: EagleDrafter, embed_fn, logits_fn, max_requests: int):
        """``embed_fn(tokens [N]) -> [N, D]`` and ``logits_fn(feats [N, D]) -> [N, vocab]`` are the
        target's (frozen) embedding and LM head."""
        p = next(drafter.parameters())
        super().__init__(drafter.config, max_requests, p.device, p.dtype)
        self.drafter = drafter
        self.embed_fn = embed_fn
        self.logits_fn = logits_fn

    @classmethod
    def for_target(cls, drafter: EagleDrafter, target: GatedDeltaNetForCausalLM, max_requests: int):
        return cls(drafter, target.model.embeddings, target.compute_logits, max_requests)

    def _run(self, tokens, feats, plan):
        f = self.drafter(tokens, feats, self.embed_fn, plan, self.states)
        return f, self.logits_fn(f).float()
