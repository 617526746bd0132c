"""The SpecLA drafter as seen by vLLM (the ``custom_class`` speculative method).

vLLM builds ``SpeclaProposer(vllm_config)`` and calls ``load_model(target)``; our runner then
calls :meth:`SpeclaProposer.propose_for_batch` with the target's hidden states (vLLM's own
``propose`` call carries none). The drafting itself is the vLLM-free
:class:`~vllm_specla.core.drafting.SlotDrafter` (draft model or EAGLE-style drafter) on its own
state slots, one per live request, keyed by request id (vLLM reorders batch rows between steps).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from vllm_specla.core.drafting import DraftModelDrafter, DraftRow, EagleDrafterRunner, TreeSpec
from vllm_specla.models.drafter import load_eagle_drafter
from vllm_specla.models.gdn import load_fla_checkpoint
from vllm_specla.worker.settings import specla_settings

logger = logging.getLogger("vllm_specla")


class SpeclaProposer:
    """Drafter glue for vLLM's ``custom_class`` hook (``speculative_config.model`` points here)."""

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.settings = specla_settings(vllm_config)
        if self.settings is None:
            raise ValueError("SpeclaProposer needs a SpecLA speculative config (method: specla)")
        self.K = self.settings.num_speculative_tokens
        self.max_requests = self.settings.max_num_requests or vllm_config.scheduler_config.max_num_seqs
        self.drafter = None
        self.kind = None
        self._slot_of: dict[str, int] = {}
        self._free: list[int] = []
        self._absorbed: dict[str, int] = {}

    def load_model(self, target_model) -> None:
        """Load the drafter next to the target (vLLM calls this once after the target is built)."""
        target = getattr(target_model, "module", target_model)
        p = next(target.parameters())
        kind = self.settings.check_drafter(target.config.vocab_size)
        self.kind = kind
        if kind == "eagle":
            net = load_eagle_drafter(self.settings.drafter, dtype=p.dtype, device=p.device)
            self.drafter = EagleDrafterRunner(net, target.embed_input_ids,
                                              lambda f: target.compute_logits(f), self.max_requests)
        else:
            net = load_fla_checkpoint(self.settings.drafter, dtype=p.dtype, device=p.device)
            self.drafter = DraftModelDrafter(net, self.max_requests)
        self._free = list(range(self.max_requests))
        self.tree_spec = None
        self.trees: dict = {}
        if self.settings.topology == "tree":
            self.tree_spec = TreeSpec(top_k=self.settings.tree_top_k, max_depth=self.K,
                                      node_budget=self.settings.tree_node_budget, tau=self.settings.prune_tau)
            self.drafter.enable_trees(self.tree_spec.top_k)
        logger.info("SpecLA: %s drafter from %s, K=%d, deferred_commit=%s", kind, self.settings.drafter,
                    self.K, self.settings.deferred_commit)

    # vLLM's own entry point (unused: our runner calls propose_for_batch with hidden states)
    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        raise RuntimeError("SpeclaProposer is driven by vllm_specla's model runner (worker_cls not ours?)")

    def _slot(self, req_id: str) -> tuple[int, bool]:
        if req_id in self._slot_of:
            return self._slot_of[req_id], False
        if not self._free:
            raise RuntimeError(f"SpecLA drafter has no free state slot ({self.max_requests} in use)")
        s = self._free.pop()
        self._slot_of[req_id] = s
        self._absorbed[req_id] = 0
        return s, True

    def _release(self, req_id: str) -> None:
        s = self._slot_of.pop(req_id, None)
        self._absorbed.pop(req_id, None)
        if s is not None:
            self._free.append(s)
            self.drafter.release(s)

    @torch.no_grad()
    def propose_for_batch(self, input_batch, step: dict, scheduler_output, sampled_token_ids, hidden_states,
                          requests: dict | None = None):
        """Absorb this step's committed inputs per request and return up to K drafts per row.

        A row gets ``min(K, remaining - 1)`` drafts, ``remaining = max_tokens - outputs so far``:
        a verify step emits at most drafts + 1 tokens, so drafting past ``max_tokens`` is wasted
        work (this also yields zero-draft steps right after accepted steps, which the state
        handling must get right, vLLM #39273 class).

        Returns ``list[list[int]]`` in the input batch's row order (``[]`` for rows that did not
        sample, e.g. a partial prefill chunk).
        """
        gone = (getattr(scheduler_output, "finished_req_ids", None) or set()) | (
            getattr(scheduler_output, "preempted_req_ids", None) or set())
        if requests is not None:  # the runner's live requests (scheduled or waiting for their turn)
            gone = gone | {rid for rid in self._slot_of if rid not in requests}
        for rid in gone:
            self._release(rid)
        n = input_batch.num_reqs
        tok_ids = input_batch.token_ids_cpu
        n_no_spec = input_batch.num_tokens_no_spec
        qsl, num_computed = step["qsl"], step["num_computed"]
        rows: list[DraftRow] = []
        row_of: list[int] = []
        for i, rid in enumerate(input_batch.req_ids[:n]):
            slot, new = self._slot(rid)
            fresh = new or num_computed[i] == 0  # (re)started from scratch, e.g. after preemption
            if fresh:
                self._absorbed[rid] = 0
            sampled = sampled_token_ids[i] if i < len(sampled_token_ids) else []
            q = int(qsl[i + 1] - qsl[i])
            if self.kind == "eagle":
                # pairs (x_{t+1}, f_t) for every position of this row whose successor is known
                n_pairs = len(sampled) if step["is_verify"][i] else q
                p0 = int(num_computed[i])
                toks = tok_ids[i, p0 + 1 : p0 + 1 + n_pairs].tolist()
                feats = hidden_states[int(qsl[i]) : int(qsl[i]) + len(toks)]
            else:
                start = self._absorbed[rid]
                toks = tok_ids[i, start : int(n_no_spec[i])].tolist()
                feats = None
            self._absorbed[rid] = int(n_no_spec[i])
            k = self.K if len(sampled) else 0
            st = requests.get(rid) if requests else None
            if k and st is not None and st.sampling_params is not None and st.sampling_params.max_tokens:
                remaining = st.sampling_params.max_tokens - len(st.output_token_ids)
                k = max(0, min(k, remaining - 1))
            rows.append(DraftRow(slot, toks, feats, fresh=fresh, num_drafts=k))
            row_of.append(i)
        drafts: list[list[int]] = [[] for _ in range(n)]
        if self.tree_spec is not None:
            self.trees = {}
            for i, tree in zip(row_of, self.drafter.step_tree(rows, self.tree_spec)):
                rid = input_batch.req_ids[i]
                if tree.num_drafts > 0:
                    self.trees[rid] = tree
                    drafts[i] = tree.deepest_path()  # what the scheduler reserves; the tree is ours
            return drafts
        outs = self.drafter.step(rows)
        for i, d in zip(row_of, outs):
            drafts[i] = d
        return drafts


__all__ = ["SpeclaProposer", "np"]
