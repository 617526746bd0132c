"""Model-runner glue: vLLM's batch -> SpecLA step plan, acceptance -> commit, drafting hook.

A translation table and nothing more (STYLE.md): every SpecLA decision lives in ``core/``.
Three overrides on vLLM's (MRV1) ``GPUModelRunner`` — which vLLM-CPU's ``CPUModelRunner``
subclasses — carry a step:

* ``_model_forward``: build the :class:`~vllm_specla.core.state.StepPlan` from the persistent
  input batch (rows, their state slots = mamba block ids, prefill vs verify rows, initial state)
  and hand it to the model. Verify rows are vLLM's *spec rows*
  (``num_decode_draft_tokens >= 0``: decode rows with drafts, and zero-draft decode rows), so a
  zero-draft step after an accepted step still reads the right state (vLLM #39273 class). A step
  whose verify rows all have zero drafts is planned as AR: pending factors folded in, the state
  written, nothing left pending (counter ``ar_steps``).
* ``_update_states_after_model_execute``: the accepted count per verify row
  (``(output_token_ids != -1).sum(1)``) becomes the slot's pending factors (deferred commit) or
  is committed right away with DeltaConstruct (``deferred_commit: false``); after an AR-planned
  step, nothing (its tokens are in the state already; ``accepted_tokens`` does not count them).
* ``propose_draft_token_ids``: our drafter drafts from the target's hidden states.
* ``sample_tokens``: the step's drafts ride back to the engine core with the sampled tokens
  (``patches.py`` item 5), so the engine core does not spend one more RPC per step on
  ``take_draft_token_ids``.

The GPU runner class is the same mixin on vLLM's ``GPUModelRunner``; it cannot be run on any
machine we have (no vLLM on the GPU machine) and is kept a thin mirror of the tested CPU path.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specla.core.acceptance import greedy_accept_tree
from vllm_specla.core.sampling import accept_tree_residual, apply_sampling_transforms
from vllm_specla.core.state import build_step_plan
from vllm_specla.ops.tree_reference import compact_path_factors
from vllm_specla.worker.settings import INLINE_DRAFTS_ATTR, inline_drafts_enabled, specla_settings


class SpeclaRunnerMixin:
    """Mixed into vLLM's MRV1 model runner (CPU or GPU)."""

    _specla_step: dict | None = None
    _specla_counters: dict | None = None

    def specla_counters(self) -> dict:
        """Counters for tests and debugging: verify rows, zero-draft verify rows, prefill rows,
        accepted tokens, steps, ``ar_steps``: speculative-engine steps whose verify rows had no
        draft token, run as AR steps (:meth:`_specla_build_plan`), and ``plain_sampler_steps``:
        steps with no draft token on any row, sampled by vLLM's plain sampler (:meth:`_sample`);
        ``draft_tokens_proposed``: draft tokens our proposer returned (before any scheduler cut).
        Per engine, unlike ``LLM.get_metrics()`` in a process holding several engines (each new
        engine re-registers vLLM's Prometheus metrics)."""
        if self._specla_counters is None:
            self._specla_counters = dict(steps=0, verify_rows=0, zero_draft_rows=0, prefill_rows=0,
                                         accepted_tokens=0, flushes=0, draft_rpcs=0, ar_steps=0,
                                         plain_sampler_steps=0, draft_tokens_proposed=0)
        tc = getattr(getattr(getattr(self, "drafter", None), "drafter", None), "tree_counts", None)
        if tc:  # tree drafting: candidate / kept nodes -> pruned fraction
            self._specla_counters["tree_candidates"] = tc["candidates"]
            self._specla_counters["tree_kept"] = tc["kept"]
            self._specla_counters["tree_chain_rows"] = getattr(self.drafter, "tree_chain_rows", 0)
        policy = getattr(getattr(self, "drafter", None), "policy", None)
        if policy is not None:  # num_speculative_tokens "auto": K histogram, timed steps, skipped drafter
            self._specla_counters["policy"] = {**policy.summary(), **self.drafter.policy_counts}
        dv = getattr(getattr(self, "drafter", None), "draft_vocab_size", None)
        if dv is not None:  # tokens the drafter scores (draft_vocab_size, or the full vocabulary)
            self._specla_counters["draft_vocab_size"] = dv
        return self._specla_counters

    def _specla_model(self):
        m = self.model
        return getattr(m, "module", m)  # unwrap possible wrappers

    # ---- before forward -------------------------------------------------------------------
    def _specla_clear_fresh_verify_slots(self) -> None:
        """vLLM 0.32 pads a *new* request with a single token to schedule into a ``1 + K`` spec row
        (placeholder drafts), so it arrives as a verify row with nothing computed. Its slot is a
        reused block (vLLM does not zero mamba blocks on CPU): clear the slot's conv window,
        recurrent state and pending factors so the verify starts from zero state."""
        ib = self.input_batch
        n = ib.num_reqs
        if n == 0 or self.speculative_config is None:
            return
        fresh = (self.num_decode_draft_tokens.np[:n] >= 0) & (ib.num_computed_tokens_cpu[:n] == 0)
        if not fresh.any():
            return
        model = self._specla_model()
        book = model.slot_book()
        slots = torch.as_tensor(ib.block_table[0].get_numpy_array()[:n, 0][fresh].astype(np.int64),
                                device=book.pending_len.device)
        for st in model.layers_states():
            st.conv.index_fill_(0, slots, 0)
            st.ssm.index_fill_(0, slots, 0)
        book.reset(slots)

    def _specla_build_plan(self, num_input_tokens: int):
        self._specla_clear_fresh_verify_slots()
        ib = self.input_batch
        n = ib.num_reqs
        qsl = self.query_start_loc.cpu[: n + 1].numpy().astype(np.int64)
        qlen = np.diff(qsl)
        num_computed = ib.num_computed_tokens_cpu[:n].astype(np.int64).copy()
        slots = ib.block_table[0].get_numpy_array()[:n, 0].astype(np.int64).copy()
        settings = specla_settings(self.vllm_config)
        spec = settings is not None
        if spec:
            is_verify = self.num_decode_draft_tokens.np[:n] >= 0
        else:
            is_verify = (qlen == 1) & (num_computed > 0)
        model = self._specla_model()
        book = model.slot_book()
        dev = book.bank_sel.device
        # a prefill continuation must never see pending factors: flush them first (rare: only
        # reachable if a decoding request is rescheduled as a multi-token non-spec row)
        cont = np.nonzero(~is_verify & (num_computed > 0))[0]
        c = self.specla_counters()
        if len(cont):
            model.flush(torch.as_tensor(slots[cont], device=dev))
            c["flushes"] += len(cont)
        c["steps"] += 1
        c["verify_rows"] += int(is_verify.sum())
        c["prefill_rows"] += int((~is_verify).sum())
        # A step whose verify rows all come without a draft token (`"auto"` at K = 0; every row's drafts cut at
        # max_tokens) has nothing to verify: its one token per row is committed whatever is sampled. It runs as an
        # AR step: each slot's pending factors are folded in and the state written (core/state.py build_step_plan,
        # AR verify rows), instead of recording factors for a deferred commit by the next step (RESULTS.md
        # "Session 36"). Steps with drafts on any row keep the speculative plan for all rows.
        as_ar = spec and bool(is_verify.any()) and bool(np.all(qlen[is_verify] == 1))
        if spec:
            c["zero_draft_rows"] += int((is_verify & (qlen == 1)).sum())
            c["ar_steps"] += as_ar
        plan = build_step_plan(qlen.tolist(), slots.tolist(), (~is_verify).tolist(), (num_computed > 0).tolist(),
                               speculative=spec and not as_ar, book=book, device=dev)
        self._specla_step = {
            "spec": spec and not as_ar,
            "deferred": settings.deferred_commit if spec else True,
            "verify_rows": np.nonzero(is_verify)[0],
            "slots": slots,
            "num_computed": num_computed,
            "qsl": qsl,
            "is_verify": is_verify,
        }
        return plan

    def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None, **kw):
        model = self._specla_model()
        settings = specla_settings(self.vllm_config)
        if settings is not None and settings.topology == "tree" and input_ids is not None:
            return self._specla_tree_forward(input_ids, positions, intermediate_tensors, **kw)
        n_tok = (input_ids if input_ids is not None else inputs_embeds).shape[0]
        model.set_step_plan(self._specla_build_plan(n_tok))
        try:
            return super()._model_forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kw)
        finally:
            model.set_step_plan(None)

    # ---- draft trees ----------------------------------------------------------------------------
    def _specla_tree_forward(self, input_ids, positions, intermediate_tensors, **kw):
        """Verify each request's draft tree in one forward (vLLM scheduled only its deepest path).

        The tree replaces the scheduled ``[x0, chain]`` tokens of a verify row; acceptance (greedy,
        or the lossless residual rule under sampling) runs here; the accepted path's factors are
        gathered to the bank front (pending); the returned hidden states hold the path nodes at
        the row's first positions, and :meth:`_sample` reports the emitted tokens, so vLLM's
        scheduler sees an accepted prefix of at most the scheduled drafts.
        """
        model = self._specla_model()
        self._specla_clear_fresh_verify_slots()
        ib = self.input_batch
        n = ib.num_reqs
        qsl = self.query_start_loc.cpu[: n + 1].numpy().astype(np.int64)
        qlen = np.diff(qsl)
        is_verify = self.num_decode_draft_tokens.np[:n] >= 0
        trees = getattr(self.drafter, "trees", {}) or {}
        ids_cpu = input_ids[: int(qsl[-1])].tolist()
        new_ids, new_qlen, parents, row_tree = [], [], [], []
        for i in range(n):
            scheduled = ids_cpu[qsl[i]: qsl[i + 1]]
            tree = trees.get(ib.req_ids[i]) if is_verify[i] else None
            if tree is not None:
                tree = tree.truncated(int(qlen[i]) - 1)  # the scheduler may cut drafts (token budget)
                if tree.tokens[0] != scheduled[0] or tree.num_drafts == 0:
                    tree = None
            row_tree.append(tree)
            toks = tree.tokens if tree is not None else scheduled
            new_ids += toks
            new_qlen.append(len(toks))
            parents.append(tree.parents if tree is not None else None)
        # plan over the tree tokens
        step_qsl = np.concatenate([[0], np.cumsum(new_qlen)]).astype(np.int64)
        num_computed = ib.num_computed_tokens_cpu[:n].astype(np.int64).copy()
        slots = ib.block_table[0].get_numpy_array()[:n, 0].astype(np.int64).copy()
        book = model.slot_book()
        dev = book.bank_sel.device
        plan = build_step_plan(new_qlen, slots.tolist(), (~is_verify).tolist(), (num_computed > 0).tolist(),
                               speculative=True, book=book, device=dev, parents=parents)
        c = self.specla_counters()
        c["steps"] += 1
        c["verify_rows"] += int(is_verify.sum())
        c["prefill_rows"] += int((~is_verify).sum())
        c["zero_draft_rows"] += int((is_verify & (qlen == 1)).sum())
        self._specla_step = {"spec": True, "deferred": specla_settings(self.vllm_config).deferred_commit,
                             "verify_rows": np.nonzero(is_verify)[0], "slots": slots, "num_computed": num_computed,
                             "qsl": qsl, "is_verify": is_verify}
        ids = torch.tensor(new_ids, dtype=input_ids.dtype, device=input_ids.device)
        model.set_step_plan(plan)
        try:
            h = super()._model_forward(ids, positions, intermediate_tensors, None, **kw)
        finally:
            model.set_step_plan(None)
        out = torch.zeros((input_ids.shape[0], h.shape[-1]), dtype=h.dtype, device=h.device)
        emitted: dict[int, list[int]] = {}
        paths, path_rows = [], []
        for i in range(n):
            lo = int(step_qsl[i])
            tree = row_tree[i]
            if tree is None:
                out[qsl[i]: qsl[i + 1]] = h[lo: lo + int(qlen[i])]
                continue
            logits = model.compute_logits(h[lo: lo + len(tree)])
            sp = self.requests[ib.req_ids[i]].sampling_params
            if sp is not None and sp.temperature > 1e-5:
                p = apply_sampling_transforms(logits, sp.temperature, sp.top_k if sp.top_k and sp.top_k > 0 else 0,
                                              sp.top_p).cpu()
                path, e = accept_tree_residual(tree.parents, tree.tokens, p, self._specla_gen())
            else:
                path, e = greedy_accept_tree(tree.parents, tree.tokens, logits.argmax(-1).tolist())
            emitted[i] = e
            idx = torch.tensor(path, device=h.device) + lo
            out[int(qsl[i]): int(qsl[i]) + len(path)] = h[idx]
            paths.append(path)
            path_rows.append(i)
            c["nodes_verified"] = c.get("nodes_verified", 0) + len(tree)
            c["tree_rows"] = c.get("tree_rows", 0) + 1
        if paths:
            P = max(len(p) for p in paths)
            pt = torch.tensor([p + [0] * (P - len(p)) for p in paths], device=dev)
            ps = torch.as_tensor(slots[path_rows], device=dev)
            plen = torch.tensor([len(p) for p in paths], device=dev)
            banks = book.bank_sel[ps]
            for st in model.layers_states():
                compact_path_factors([st.bank_k, st.bank_v, st.bank_g, st.bank_x], ps, banks, pt, plen)
        self._specla_tree_emitted = emitted
        return out

    def _specla_gen(self) -> torch.Generator:
        if getattr(self, "_specla_generator", None) is None:
            self._specla_generator = torch.Generator().manual_seed(self.vllm_config.model_config.seed or 0)
        return self._specla_generator

    def _sample(self, logits, spec_decode_metadata):
        """vLLM's ``_sample``; a step with no draft token on any row (``"auto"`` at K = 0) goes to
        vLLM's plain sampler, as an AR step would, instead of its rejection sampler: with zero
        drafts the rejection sampler's only token per row is its bonus token, drawn by the same
        sampler from the same logits (``vllm/v1/sample/rejection_sampler.py`` ``forward``), so the
        tokens are the same; the empty draft pass is skipped (counter ``plain_sampler_steps``)."""
        if (spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0
                and not getattr(self, "_specla_tree_emitted", None)):
            self.specla_counters()["plain_sampler_steps"] += 1
            spec_decode_metadata = None
        out = super()._sample(logits, spec_decode_metadata)
        emitted = getattr(self, "_specla_tree_emitted", None)
        if emitted:
            ids = out.sampled_token_ids
            for i, e in emitted.items():
                if len(e) > ids.shape[1]:
                    raise RuntimeError(f"tree row {i}: {len(e)} emitted tokens > {ids.shape[1]} sampler slots")
                ids[i] = -1
                ids[i, : len(e)] = torch.tensor(e, dtype=ids.dtype, device=ids.device)
            self._specla_tree_emitted = None
        return out

    # ---- after sampling ---------------------------------------------------------------------
    def _update_states_after_model_execute(self, output_token_ids: torch.Tensor, scheduler_output) -> None:
        super()._update_states_after_model_execute(output_token_ids, scheduler_output)
        step = self._specla_step
        if step is None or not step["spec"] or len(step["verify_rows"]) == 0:
            return
        model = self._specla_model()
        book = model.slot_book()
        rows = torch.as_tensor(step["verify_rows"], device=output_token_ids.device)
        num_accepted = (output_token_ids[rows] != -1).sum(1).to(book.pending_len.device)
        slots = torch.as_tensor(step["slots"][step["verify_rows"]], device=book.pending_len.device)
        self.specla_counters()["accepted_tokens"] += int(num_accepted.sum())
        if step["deferred"]:
            book.set_pending(slots, num_accepted)
        else:
            model.commit(slots, num_accepted)

    # ---- drafts back to the engine core ----------------------------------------------------------
    def sample_tokens(self, grammar_output):
        """vLLM's ``sample_tokens``; with speculation on, the step's drafts (what
        ``take_draft_token_ids`` would return next) are attached to the returned
        ``ModelRunnerOutput`` as ``(DraftTokenIds | None,)`` under ``INLINE_DRAFTS_ATTR``, for the
        executor patch to hand to the scheduler without an RPC. Async-scheduling outputs and
        vLLM's shared empty output are returned untouched."""
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput  # noqa: PLC0415

        out = super().sample_tokens(grammar_output)
        if (self.speculative_config is not None and type(out) is ModelRunnerOutput
                and out is not EMPTY_MODEL_RUNNER_OUTPUT and inline_drafts_enabled()):
            setattr(out, INLINE_DRAFTS_ATTR, (super().take_draft_token_ids(),))
        return out

    def take_draft_token_ids(self):
        """vLLM's RPC for the step's drafts (counted in ``specla_counters()["draft_rpcs"]``: 0 while
        the drafts travel with ``sample_tokens``' output)."""
        self.specla_counters()["draft_rpcs"] += 1
        return super().take_draft_token_ids()

    # ---- drafting -----------------------------------------------------------------------------
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                                sample_hidden_states, aux_hidden_states, spec_decode_metadata,
                                common_attn_metadata, slot_mappings):
        """vLLM's drafting hook: SpecLA's drafter proposes from the target's hidden states of this
        step (the accepted positions' features, EAGLE-style); other drafters take vLLM's path."""
        from vllm_specla.worker.proposer import SpeclaProposer  # noqa: PLC0415

        if not isinstance(self.drafter, SpeclaProposer):
            return super().propose_draft_token_ids(
                scheduler_output, sampled_token_ids, sampling_metadata, hidden_states, sample_hidden_states,
                aux_hidden_states, spec_decode_metadata, common_attn_metadata, slot_mappings)
        drafts = self.drafter.propose_for_batch(self.input_batch, self._specla_step, scheduler_output,
                                                sampled_token_ids, hidden_states, requests=self.requests)
        self.specla_counters()["draft_tokens_proposed"] += sum(len(d) for d in drafts)
        return drafts


def cpu_runner_cls():
    """vLLM-CPU's model runner class with :class:`SpeclaRunnerMixin` (imported lazily)."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner  # noqa: PLC0415

    class SpeclaCPUModelRunner(SpeclaRunnerMixin, CPUModelRunner):
        """vLLM-CPU MRV1 runner with SpecLA glue (tested in CI)."""

    return SpeclaCPUModelRunner


def gpu_runner_cls():
    """vLLM's CUDA model runner class with :class:`SpeclaRunnerMixin` (imported lazily)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: PLC0415

    class SpeclaGPUModelRunner(SpeclaRunnerMixin, GPUModelRunner):
        """CUDA MRV1 runner with SpecLA glue (mirror of the CPU path; not runnable here)."""

    return SpeclaGPUModelRunner
