"""The SpecLA drafter as seen by vLLM (the ``custom_class`` speculative method).

vLLM builds ``SpeclaProposer(vllm_config)`` and calls ``load_model(target)``; our runner then
calls :meth:`SpeclaProposer.propose_for_batch` with the target's hidden states (vLLM's own
``propose`` call carries none). The drafting itself is the vLLM-free
:class:`~vllm_specla.core.drafting.SlotDrafter` (draft model or EAGLE-style drafter) on its own
state slots, one per live request, keyed by request id (vLLM reorders batch rows between steps).

With ``num_speculative_tokens: "auto"`` the proposer asks a
:class:`~vllm_specla.core.policy.DraftLengthPolicy` for one K per step (0..K_max; vLLM was told
K_max) and feeds it back:

* **step time** = wall time from the end of one ``propose_for_batch`` call to the start of the
  next: vLLM's scheduling, input preparation, the target forward, rejection sampling and
  bookkeeping of one step — everything but drafting — keyed by the step's verify rows (B) and
  its widest window (``1 + max scheduled drafts``). Only pure decode steps count (every row a
  verify row of a running request): a step with prefill work, or the first step after idling
  (which always brings a new request), is not a sample. Drafting is timed separately.
* **acceptance** = per row, the drafts this proposer gave the request last step (cut to what the
  scheduler kept) and ``len(sampled tokens) - 1`` accepted.

When the step's K is 0 (no row gets drafts), prefill rows included, the drafter is not run: the
committed inputs (tokens, and for EAGLE the target's features, copied) are held per request and
absorbed with the next drafting pass; a request holding more than ``2 * LAZY_RESYNC_WINDOW`` (64)
inputs (e.g. a long new prompt) keeps only its last ``LAZY_RESYNC_WINDOW`` and its drafter slot
restarts from them (``runtime/engine.py`` ``hold_or_absorb``; only draft quality depends on the
drafter's state). So a K = 0 step does no drafter work, resuming absorbs at most ~64 inputs per
request, and a request that finishes before the next drafting pass is never absorbed. With tensor
parallelism, TP rank 0's K is broadcast (the EAGLE drafter runs collectives through the target's
embedding and LM head, so every rank must draft the same number of steps).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from vllm_specla.config import SpecLAConfigError
from vllm_specla.core.draft_vocab import draft_logits_fn
from vllm_specla.core.drafting import DraftModelDrafter, DraftRow, EagleDrafterRunner, TreeSpec
from vllm_specla.core.policy import DraftLengthPolicy, StepCostModel
from vllm_specla.models.drafter import load_eagle_drafter
from vllm_specla.models.gdn import load_fla_checkpoint
from vllm_specla.runtime.engine import HeldInputs, draft_or_hold
from vllm_specla.worker.settings import specla_settings

# under "vllm.": vLLM configures that namespace's handlers, so these lines reach its log
logger = logging.getLogger("vllm.specla")


def tree_acceptance_serves(sp, num_output_tokens: int) -> bool:
    """Whether the tree path's own acceptance gives exactly what vLLM's sampler would for a request
    with vLLM ``SamplingParams`` ``sp`` that has ``num_output_tokens`` tokens so far.

    The runner accepts a tree itself (``worker/runner.py`` ``_specla_tree_forward``): the raw
    logits' argmax, or under temperature the residual rule over ``temperature`` / ``top_k`` /
    ``top_p`` with one engine-wide generator. That covers neither the logits processors that vLLM
    0.32's rejection sampler applies to draft positions (presence / frequency / repetition
    penalties, ``min_tokens`` while it still masks stop tokens, ``allowed_token_ids``, bad words, a
    thinking budget), nor structured outputs (their grammar mask), nor a per-request ``seed``, nor
    ``logprobs`` (vLLM reports those for the tokens its own sampler picked). Such requests draft a
    greedy chain instead, which vLLM's rejection sampler verifies with those applied. (``min_p`` and
    ``logit_bias`` are refused by vLLM with any speculative method; custom logits processors are
    not applied to draft positions by vLLM 0.32 either way.)
    """
    if sp is None:
        return True
    g = lambda name, default=None: getattr(sp, name, default)  # noqa: E731 (fields differ across vLLM versions)
    return not (
        g("presence_penalty", 0.0) or g("frequency_penalty", 0.0) or g("repetition_penalty", 1.0) != 1.0
        or (g("min_tokens", 0) or 0) > num_output_tokens or g("min_p", 0.0) or g("logit_bias")
        or g("allowed_token_ids") or g("bad_words") or g("_bad_words_token_ids") or g("structured_outputs")
        or g("logprobs") is not None or g("logprob_token_ids")
        or g("thinking_token_budget") is not None or seeded_sampling(sp))


def seeded_sampling(sp) -> bool:
    """Whether vLLM ``SamplingParams`` ``sp`` sample (temperature > 0) from a per-request ``seed``.

    Under ``"auto"`` such a request drafts nothing: the policy's K follows measured step times,
    and vLLM's sampler draws from the request's generator once per draft position verified, so a
    K that varies from run to run would make the seed's output vary too. At K = 0 every step draws
    alike and the seed reproduces its output (a fixed K does too, and speeds the request up).
    """
    g = lambda name, default=None: getattr(sp, name, default)  # noqa: E731
    return sp is not None and (g("temperature", 1.0) or 0.0) > 1e-5 and g("seed") is not None


class SpeclaProposer:
    """Drafter glue for vLLM's ``custom_class`` hook (``speculative_config.model`` points here)."""

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.settings = specla_settings(vllm_config)
        if self.settings is None:
            raise ValueError("SpeclaProposer needs a SpecLA speculative config (method: specla)")
        self.K = self.settings.k_max  # vLLM's num_speculative_tokens (K_max under "auto")
        self.policy: DraftLengthPolicy | None = None
        if self.settings.auto_draft_length:
            self.policy = DraftLengthPolicy(k_max=self.K, costs=StepCostModel(table=self.settings.step_cost_table))
        self._held: dict[str, HeldInputs] = {}  # inputs held back from the drafter (K = 0 steps)
        self._last_drafts: dict[str, int] = {}  # drafts proposed per request last step
        self._t_end: float | None = None  # end of the last propose_for_batch call (perf_counter)
        self.policy_counts = {"steps_timed": 0, "drafter_skipped": 0}
        # one drafter state slot per running request: vLLM runs at most max_num_seqs at once
        # (worker/patches.py reconcile_max_num_seqs made max_num_requests >= it, or set it)
        self.max_requests = vllm_config.scheduler_config.max_num_seqs
        if (self.settings.max_num_requests or self.max_requests) < self.max_requests:
            raise SpecLAConfigError(f"speculative_config.max_num_requests={self.settings.max_num_requests} is below "
                                    f"max_num_seqs={self.max_requests}")
        self.drafter = None
        self.draft_vocab_size = None  # tokens the EAGLE drafter scores (after load_model)
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
            logits_fn = lambda f: target.compute_logits(f)  # noqa: E731
            V, ids = target.config.vocab_size, self.settings.draft_vocab_ids(target.config.vocab_size, kind)
            if ids is not None:  # the draft vocabulary's LM-head rows; under TP / quantization the full head, its ids columns
                head = self._whole_lm_head(target)
                logits_fn = draft_logits_fn(logits_fn, head, ids, V)
                logger.info("SpecLA: draft vocabulary of %d of %d tokens%s", ids.numel(), V, "" if head is not None
                            else " (tensor-parallel or quantized LM head: full logits computed, no saving)")
            self.drafter = EagleDrafterRunner(net, target.embed_input_ids, logits_fn, self.max_requests, ids)
            self.draft_vocab_size = V if ids is None else ids.numel()
        else:
            net = load_fla_checkpoint(self.settings.drafter, dtype=p.dtype, device=p.device)
            self.drafter = DraftModelDrafter(net, self.max_requests)
        self._free = list(range(self.max_requests))
        self.tree_spec = None
        self.trees: dict = {}
        self.tree_chain_rows = 0  # tree topology: rows drafted as a chain (tree_acceptance_serves)
        if self.settings.topology == "tree":
            self.tree_spec = TreeSpec(top_k=self.settings.tree_top_k, max_depth=self.K,
                                      node_budget=self.settings.tree_node_budget, tau=self.settings.prune_tau)
            self.drafter.enable_trees(self.tree_spec.top_k)
        logger.info("SpecLA: %s drafter from %s, K=%s, deferred_commit=%s", kind, self.settings.drafter,
                    f"auto (max {self.K})" if self.policy is not None else self.K, self.settings.deferred_commit)

    def _whole_lm_head(self, target):
        """The target's LM-head weight when this process holds all of it unquantized (no tensor
        parallelism), else None."""
        head = getattr(target, "lm_head", None)
        quant = type(getattr(head, "quant_method", None)).__name__
        if self.vllm_config.parallel_config.tensor_parallel_size != 1 or not quant.startswith(("Unquantized", "NoneType")):
            return None
        return getattr(head, "weight", None)

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
        self._held.pop(req_id, None)
        self._last_drafts.pop(req_id, None)
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

        Under ``"auto"`` the step's K comes from the draft-length policy (see the module doc).

        Returns ``list[list[int]]`` in the input batch's row order (``[]`` for rows that did not
        sample, e.g. a partial prefill chunk).
        """
        t_start = time.perf_counter()
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
        pure_decode = n > 0 and bool(np.all(step["is_verify"][:n])) and bool(np.all(num_computed[:n] > 0))
        k_step = self.K
        if self.policy is not None:
            self._feed_policy(input_batch, step, sampled_token_ids, t_start, pure_decode)
            k_step = self._choose(sum(1 for i in range(n) if i < len(sampled_token_ids) and len(sampled_token_ids[i])))
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
            k = k_step if len(sampled) else 0
            st = requests.get(rid) if requests else None
            if k and st is not None and st.sampling_params is not None and st.sampling_params.max_tokens:
                remaining = st.sampling_params.max_tokens - len(st.output_token_ids)
                k = max(0, min(k, remaining - 1))
            if k and self.policy is not None and st is not None and seeded_sampling(st.sampling_params):
                k = 0  # "auto" and a seed: reproducible output (seeded_sampling)
            rows.append(DraftRow(slot, toks, feats, fresh=fresh, num_drafts=k))
            row_of.append(i)
        drafts: list[list[int]] = [[] for _ in range(n)]
        if self.tree_spec is not None:
            return self._draft_trees(input_batch, rows, row_of, drafts, requests)
        if self.policy is not None:
            return self._draft_with_policy(input_batch, rows, row_of, drafts, pure_decode)
        outs = self.drafter.step(rows)
        for i, d in zip(row_of, outs):
            drafts[i] = d
        return drafts

    def _draft_trees(self, input_batch, rows: list[DraftRow], row_of: list[int], drafts, requests):
        """Tree topology: a tree per row whose sampling the runner's tree acceptance serves
        (:func:`tree_acceptance_serves`), kept in ``self.trees`` for the runner, its deepest path
        returned (what the scheduler reserves); the other rows draft a greedy chain that vLLM's
        rejection sampler verifies. Each row is absorbed once, by one of the two calls."""
        self.trees = {}
        plain = []
        for i in row_of:
            st = requests.get(input_batch.req_ids[i]) if requests else None
            plain.append(st is None or tree_acceptance_serves(st.sampling_params, len(st.output_token_ids)))
        tree_j = [j for j, p in enumerate(plain) if p]
        chain_j = [j for j, p in enumerate(plain) if not p]
        for j, tree in zip(tree_j, self.drafter.step_tree([rows[j] for j in tree_j], self.tree_spec)):
            if tree.num_drafts > 0:
                self.trees[input_batch.req_ids[row_of[j]]] = tree
                drafts[row_of[j]] = tree.deepest_path()
        if chain_j:  # (the tree pass is done with its scratch slots, which the chain pass reuses)
            for j, d in zip(chain_j, self.drafter.step([rows[j] for j in chain_j])):
                drafts[row_of[j]] = d
                self.tree_chain_rows += bool(d)
        return drafts

    # ---- draft-length policy ("auto") -------------------------------------------------------------
    def _feed_policy(self, input_batch, step: dict, sampled_token_ids, t_start: float, pure_decode: bool) -> None:
        """Acceptance outcomes of the step that just ran, and its time when it was pure decode."""
        n = input_batch.num_reqs
        qlen = np.diff(step["qsl"])
        nd, na = [], []
        for i, rid in enumerate(input_batch.req_ids[:n]):
            proposed = self._last_drafts.get(rid, 0)
            if not step["is_verify"][i] or proposed == 0 or i >= len(sampled_token_ids):
                continue
            d = min(proposed, int(qlen[i]) - 1)  # the scheduler may have cut drafts (token budget)
            if d > 0 and len(sampled_token_ids[i]):
                nd.append(d)
                na.append(min(d, len(sampled_token_ids[i]) - 1))
        self.policy.observe_acceptance(nd, na)
        if pure_decode and self._t_end is not None:
            self.policy.observe_step(n, int(qlen[:n].max()), t_start - self._t_end)
            self.policy_counts["steps_timed"] += 1

    def _choose(self, batch_size: int) -> int:
        k = self.policy.choose(batch_size) if batch_size else 0
        tp = self.vllm_config.parallel_config.tensor_parallel_size
        if tp > 1:  # every TP rank must draft the same K (the EAGLE drafter runs collectives)
            from vllm.distributed import get_tp_group  # noqa: PLC0415

            k = int(get_tp_group().broadcast_object(k, src=0))
        return max(0, min(self.K, k))

    def _draft_with_policy(self, input_batch, rows: list[DraftRow], row_of: list[int], drafts, pure_decode: bool):
        """Run the drafter, or on a K = 0 step hold the inputs back (:func:`draft_or_hold`); feed a
        pure-decode step's drafting time back."""
        rids = [input_batch.req_ids[i] for i in row_of]
        held, outs, seconds, backlog = draft_or_hold(self.drafter, [self._held.pop(rid, None) for rid in rids], rows)
        self._t_end = time.perf_counter()
        for rid, h in zip(rids, held):
            if h is not None:
                self._held[rid] = h
        if seconds is None:
            self.policy_counts["drafter_skipped"] += all(h is not None for h in held)
        k = max((r.num_drafts for r in rows), default=0)
        if pure_decode and seconds is not None and k > 0:
            self.policy.observe_draft(len(rows), k, seconds, backlog)
        for i, d in zip(row_of, outs):
            drafts[i] = d
        self._last_drafts = {rid: len(d) for rid, d in zip(rids, outs) if d}
        return drafts


__all__ = ["SpeclaProposer", "np", "seeded_sampling", "tree_acceptance_serves"]
