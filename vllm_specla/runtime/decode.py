"""vLLM-free decode runtime with CUDA graphs: AR, SpecLA chain / tree, per-token-snapshot baseline.

One :class:`DecodeRuntime` holds a fixed batch of ``B`` requests on state slots ``0..B-1`` and
decodes them greedily, one *step* at a time; on CUDA each step (target forward, GPU-side
acceptance, bookkeeping, drafting) is one captured CUDA graph, replayed with no host round trip
(the host reads the outputs once at the end). Modes (ALGORITHMS.md §3, §6, §8, §9b):

* ``"ar"``: one token per row per step (plain autoregressive decoding, the baseline);
* ``"specla"``: verify a window ``[last token, d_1..d_K]`` with the chain kernel (previous step's
  accepted factors folded in first: deferred commit, state written once, factors recorded), accept
  the longest matching prefix ``a`` plus the bonus token, keep ``a + 1`` factors pending;
* ``"snapshot"``: the vLLM-native baseline: ``1 + K`` full states per request, a state written
  after every window token, rollback = read snapshot ``a`` next step;
* ``"specla"`` with ``tree_width = W > 1``: a draft tree of ``W`` branches of ``K`` tokens, verified by
  ``ops/tree_verify.py``; the accepted path's factors are compacted into bank order and kept pending.

Drafting (spec modes) uses the EAGLE-style drafter (``models/drafter.py``) on its own state slots:
it *absorbs* the ``a + 1`` accepted (token, target feature) pairs of the window in one pass of its
block over the window kept at fixed width (padding tokens have ``g = beta = 0``, so they leave the
state unchanged; the conv window is committed with ``conv_commit``), then drafts ``K - 1`` more
tokens autoregressively on scratch slots of its state tensors (the first draft step reads the
committed slot and writes the scratch slot, ``out_slots``: no copy of the state per step). With ``alpha`` set, the drafter still runs (its
cost is real) but its tokens are replaced, independently per draft position, by the target's
greedy token from a recorded AR ``trace`` with probability ``alpha`` and by a different token
otherwise (issue 6: acceptance-controlled drafter; i.i.d. ``alpha`` per position, §9b; trees:
``tree_alpha_model``).

Losslessness: outputs are the target's own greedy tokens (argmax of the verify logits at every
accepted position), so SpecLA output equals AR output up to floating-point ties between the two
forward shapes; :meth:`DecodeRuntime.outputs` lets the caller check it.

This runtime drives the same ops as the vLLM path (``ops/chain_verify.py``, ``ops/recover.py``,
the fused model in :mod:`vllm_specla.runtime.fused_model`) and the same acceptance rule,
:func:`vllm_specla.core.acceptance.greedy_accept_chain`: on CUDA a chain step's bookkeeping after
the verify is one Triton launch (``runtime/step_kernels.py`` ``accept``, whose torch form calls that
rule), and its drafting glue too (``fused.embed``, ``fused.argmax(out=)``, ``step_kernels.control_drafts``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from vllm_specla.ops.tree_reference import compact_path_factors
from vllm_specla.core import is_int, is_real
from vllm_specla.core.state import LayerState, allocate_layer_states, layer_state_shapes, stacked_view
from vllm_specla.ops import _cpp, fused
from vllm_specla.runtime.fused_model import FusedEagle, FusedTarget, StepCtrl
from vllm_specla.runtime import step_kernels
from vllm_specla.runtime.step_kernels import AcceptBuffers

RUNTIME_MODES = ("ar", "specla", "snapshot")
# The drafter's absorb of the accepted window computes past its recurrence only each request's accepted row, the one
# the next draft reads (FusedEagle.hidden(rows=): o_proj and the MLP on B rows, not B * (K + 1)). False: every row,
# then the gather (an A/B switch, benchmarks/bench_e2e.py --absorb-rows)
ABSORB_ACCEPTED_ROWS = True
# Bytes of the temporary plain state a snapshot-mode prefill runs each chunk of rows in (at least one
# row per chunk); the prompt's state then becomes each row's snapshot 0.
SNAPSHOT_PREFILL_BYTES = 1 << 30


def greedy_accept_branches(window: torch.Tensor, argmax: torch.Tensor, W: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance of ``W`` draft branches of depth ``K`` sharing the root (device, no sync).

    Args:
        window: ``[B, 1 + W*K]`` tokens ``[root, branch 0 d_1..d_K, branch 1 ...]``; argmax:
            ``[B, 1 + W*K]`` the target's greedy token after each node.
    Returns:
        ``(a [B], path [B, K+1])``: the longest accepted prefix over the branches (ties: the first
        branch) and the window positions of the accepted path, root first (entries past ``a`` lie on
        the same branch and are ignored). The bonus token is ``argmax[path[a]]`` (the tree rule of
        :func:`vllm_specla.core.acceptance.greedy_accept_tree` for this topology).
    """
    B = window.shape[0]
    toks = window[:, 1:].view(B, W, K)
    parent_am = torch.cat([argmax[:, :1, None].expand(B, W, 1), argmax[:, 1:].view(B, W, K)[:, :, :-1]], 2)
    acc = (toks == parent_am).long().cumprod(2).sum(2)  # [B, W]
    best = acc.argmax(1)  # first maximal branch
    a = acc.gather(1, best[:, None])[:, 0]
    depth = torch.arange(K, device=window.device)[None, :]
    path = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=window.device), 1 + best[:, None] * K + depth], 1)
    return a, path


@dataclass
class RunResult:
    """What :meth:`DecodeRuntime.run` measured: ``steps`` replays in ``seconds``, ``tokens`` emitted
    (all rows), ``mean_acceptance_length`` = tokens per row per step (τ, includes the bonus)."""

    steps: int
    seconds: float
    tokens: int
    mean_acceptance_length: float
    batch: int = 1

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def ms_per_token(self, batch: int | None = None) -> float:
        """Milliseconds per output token of one request (step time / τ)."""
        return 1e3 * self.seconds / (self.tokens / (batch or self.batch))


def _is_real(x) -> bool:
    """:func:`~vllm_specla.core.is_real`, or a one-element real tensor (e.g. from ``torch.linspace``)."""
    if isinstance(x, torch.Tensor):
        return x.numel() == 1 and not x.is_complex() and x.dtype != torch.bool
    return is_real(x)


class DecodeRuntime:
    """Fixed-batch greedy decoding on state slots; see the module docstring.

    Args:
        target: packed target (:class:`FusedTarget`); one instance can serve many runtimes.
        batch_size: ``B`` requests (state slots ``0..B-1``).
        mode: ``"ar"``, ``"specla"`` or ``"snapshot"``.
        num_speculative_tokens: ``K >= 1`` for the spec modes (ignored for ``"ar"``).
        drafter: packed EAGLE drafter (:class:`FusedEagle`), required for the spec modes.
        output_capacity: tokens stored per request, at least (a benchmark runtime: no stop tokens; a
            step that starts below the capacity stores its whole window, so up to ``capacity + W * K + 1``
            tokens may be stored; tokens emitted past that are counted by :meth:`run` but not stored).
        alpha: acceptance-controlled drafting (needs ``trace``); None = the drafter's own tokens.
        trace: ``[B, L]`` int64 greedy AR continuation of the same prompts (``out`` of an AR run).
        use_cuda_graphs: capture the step (default: on CUDA).
        tree_width: ``W >= 2`` with mode ``"specla"``: verify a draft *tree* of ``W`` branches of depth
            ``K`` sharing the root (the drafter's top-``W`` first tokens, each continued greedily;
            ``1 + W*K`` nodes), accept the branch with the longest matching prefix, gather its
            factors into path order (``compact_path_factors``, over banks stacked across layers:
            8 launches per step) and keep them pending like a chain. 1 = chain.
        tree_alpha_model: how ``alpha`` controls a tree's drafts (:func:`controlled_tree_tau`):
            ``"siblings"`` (default): the W first-level tokens are distinct, as a real top-W is, so
            at most one matches the target: candidate j does with probability ``alpha`` given that
            0..j-1 did not, and only that branch continues, i.i.d. ``alpha`` per deeper node.
            ``"iid"``: every node independently (sessions 3-13's model; it lets several branches
            match and overstates a real drafter's tree acceptance, RESULTS.md "Session 10").
    Raises:
        ValueError: unknown mode, ``batch_size`` < 1, ``output_capacity`` < 0, K not an int >= 1 or no drafter for a
            spec mode, ``tree_width`` not an int >= 1, alpha without trace or
            outside [0, 1], alpha/trace with mode "ar", a trace that is not ``[B, L]`` int64.
    """

    LOG_STEPS = 256

    def __init__(self, target: FusedTarget, batch_size: int, mode: str = "ar", num_speculative_tokens: int = 0,
                 drafter: FusedEagle | None = None, output_capacity: int = 256, alpha: float | None = None,
                 trace: torch.Tensor | None = None, use_cuda_graphs: bool | None = None, tree_width: int = 1,
                 tree_alpha_model: str = "siblings"):
        if mode not in RUNTIME_MODES:
            raise ValueError(f"mode must be one of {RUNTIME_MODES}, got {mode!r}")
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: must be an int >= 1")
        if not is_int(output_capacity) or output_capacity < 0:
            raise ValueError(f"output_capacity={output_capacity!r}: must be an int >= 0")
        spec = mode != "ar"
        if tree_alpha_model not in TREE_ALPHA_MODELS:
            raise ValueError(f"tree_alpha_model must be one of {TREE_ALPHA_MODELS}, got {tree_alpha_model!r}")
        if not is_int(tree_width):  # (before the comparisons: tree_width="2" was a TypeError)
            raise ValueError(f"tree_width={tree_width!r}: must be an int >= 1")
        if tree_width < 1 or (tree_width > 1 and mode != "specla"):
            raise ValueError(f'tree_width must be >= 1, and > 1 only with mode "specla" (got {tree_width}, {mode!r})')
        if spec and drafter is not None and tree_width > drafter.draft_vocab_size:
            raise ValueError(f"tree_width={tree_width} exceeds the drafter's draft vocabulary "
                             f"({drafter.draft_vocab_size} tokens): the first level needs W distinct tokens")
        k = num_speculative_tokens
        if spec and not is_int(k):
            raise ValueError(f"num_speculative_tokens={k!r}: must be an int >= 1 for mode {mode!r}")
        if spec and (num_speculative_tokens < 1 or drafter is None):
            raise ValueError(f"mode {mode!r} needs num_speculative_tokens >= 1 and a drafter")
        if alpha is not None and (not _is_real(alpha) or trace is None or not 0.0 <= float(alpha) <= 1.0):
            raise ValueError(f"alpha={alpha!r}: must be a number in [0, 1] and comes with a trace (the AR run's "
                             "outputs)")
        if not spec and (alpha is not None or trace is not None):
            raise ValueError('alpha and trace (acceptance-controlled drafting) need mode "specla" or "snapshot"')
        if trace is not None and not isinstance(trace, torch.Tensor):
            raise ValueError(f"trace: must be a [batch_size={batch_size}, L] int64 tensor, got {type(trace).__name__}")
        if trace is not None and (trace.dim() != 2 or trace.shape[0] != batch_size or trace.dtype != torch.long):
            raise ValueError(f"trace must be [batch_size={batch_size}, L] int64, got {tuple(trace.shape)} {trace.dtype}")
        if target.embed.device.type == "cuda":  # the CUDA csrc kernels, built on first use (before any capture)
            _cpp.load_cuda_kernels()
        self.tgt, self.dr = target, drafter
        self.B, self.mode = batch_size, mode
        self.K = num_speculative_tokens if spec else 0
        self.W = tree_width
        self.tree_alpha_model = tree_alpha_model
        self.T = self.W * self.K + 1  # window nodes: root + W branches of K drafts
        self.dev = target.embed.device
        self.alpha = None if alpha is None else float(alpha)
        self.alpha_t = torch.tensor(self.alpha or 0.0, device=target.embed.device)
        self.trace = trace.to(self.dev).contiguous() if trace is not None else None
        # the Triton coins' key (step_kernels.control_drafts): from torch's generator, so torch.manual_seed
        # before building the runtime picks them; every run of this runtime draws the same coins per step
        self.coin_seed = int(torch.randint(0, 2**31 - 1, (1,))) if alpha is not None else 0
        self.use_graphs = (self.dev.type == "cuda") if use_cuda_graphs is None else use_cuda_graphs
        B, T, dev, cfg = self.B, self.T, self.dev, target.config
        self.Lout = output_capacity + T + 1  # last column = dump for rejected positions
        self.out = torch.zeros(B, self.Lout, dtype=torch.long, device=dev)
        self.n = torch.zeros(B, dtype=torch.long, device=dev)
        self.window = torch.zeros(B, T, dtype=torch.long, device=dev)
        self.ctrl = StepCtrl.uniform(B, T, dev)
        self.ctrl1 = StepCtrl.uniform(B, 1, dev)
        if self.W > 1:  # branch j, depth i (1-based) at position 1 + j*K + i - 1; parent = previous or root
            Kd = self.K
            par = [-1] + [0 if i == 0 else 1 + j * Kd + i - 1 for j in range(self.W) for i in range(Kd)]
            self.ctrl.parents = torch.tensor(par * B, dtype=torch.long, device=dev)
            if dev.type == "cuda":  # static tree: the heavy-light schedule is built once, on the host
                from vllm_specla.ops.triton_tree_hld import hld_plan  # noqa: PLC0415

                self.ctrl.hld_plan = hld_plan(torch.tensor(par * B), torch.arange(B + 1) * T, max_nodes=T, device=dev)
        self.rows = torch.arange(B, device=dev)
        self.row_base = self.rows * (self.K + 1)  # (row b's first token in the drafter's absorb window of K + 1)
        self.pos = torch.arange(T, device=dev)
        # ---- target state ----
        self.snaps = None
        if mode == "ar":
            self.states = allocate_layer_states(cfg, B, 0, dev)
        elif mode == "specla":  # trees: banks stacked over layers, so a step compacts them in 8 launches
            self.states = allocate_layer_states(cfg, B, T, dev, stacked=self.W > 1)
        else:  # snapshot: 1 + K full states per request; conv window via bank_x (same as specla)
            conv_s, ssm_s, _, _, _, x_s = layer_state_shapes(cfg, T)
            shapes = dict(conv=conv_s, x=x_s, s=ssm_s)
            z = lambda *s: torch.zeros(*s, dtype=torch.float32, device=dev)  # noqa: E731
            self.states = [LayerState(z(B, *shapes["conv"]), z(1, *shapes["s"]), bank_x=z(B, *shapes["x"]))
                           for _ in range(cfg.num_hidden_layers)]
            self.snaps = [z(B, T, *shapes["s"]) for _ in range(cfg.num_hidden_layers)]
        if mode == "specla" and self.W > 1:
            self.bank_stacks = [stacked_view([getattr(st, f) for st in self.states])
                                for f in ("bank_k", "bank_v", "bank_g", "bank_x")]
        # ---- drafter state: committed slots 0..B-1 (bank_x for the conv commit) and scratch slots
        # B..B+B*W-1 in the same tensors: the first draft step reads a committed slot and writes its
        # scratch slot (out_slots), so the state is not copied to the scratch first ----
        if spec:
            dcfg = drafter_config(drafter)
            BW = B * self.W
            # only bank_x of the banks is used (by the committed slots; sized for all, as the ops check)
            self.dstates = [LayerState(st.conv, st.ssm, bank_x=st.bank_x)
                            for st in allocate_layer_states(dcfg, B + BW, self.K + 1, dev)]
            self.dctrl = StepCtrl.uniform(B, self.K + 1, dev)
            scratch = B + torch.arange(BW, device=dev)
            # first draft step: branch rows of row b read its committed slot b, write scratch slots
            self.dctrl_first = StepCtrl.uniform(BW, 1, dev, slots=torch.arange(B, device=dev).repeat_interleave(self.W))
            self.dctrl_first.out_slots = scratch
            self.dctrl_next = StepCtrl.uniform(BW, 1, dev, slots=scratch)  # later steps: on the scratch slots
        self.acc_sum = torch.zeros((), dtype=torch.long, device=dev)
        # per-step accepted drafts per row (ring of LOG_STEPS steps) for acceptance estimators
        self.acc_log = torch.zeros(self.LOG_STEPS, B, dtype=torch.long, device=dev)
        self.step_i = torch.zeros(1, dtype=torch.long, device=dev)
        # the step's bookkeeping after the verify (chains and AR; trees keep their torch ops)
        if spec and self.W == 1:
            self.acc_a = torch.zeros(B, dtype=torch.long, device=dev)
            self.nxt = torch.zeros(B, T, dtype=torch.long, device=dev)
            # the drafter's own tokens under acceptance control (the window gets the controlled ones)
            self.drafts = torch.zeros(B, self.K, dtype=torch.long, device=dev)
            # the drafter's normed features between its passes (FusedEagle.draft_from_hidden)
            self.fbuf = torch.zeros(B, cfg.hidden_size, dtype=self.dr.dtype, device=dev)
            self.abuf = AcceptBuffers(self.out, self.n, self.window, self.acc_a, self.nxt, self.acc_sum, self.acc_log,
                                      self.step_i, self.ctrl.pending_len, self.ctrl.read_bank, self.ctrl.write_bank,
                                      self.dctrl.valid_len,
                                      self.ctrl.snap_slots if mode == "snapshot" else torch.zeros_like(self.acc_a))
        else:
            self.abuf = AcceptBuffers(self.out, self.n, self.window)
        # (step_kernels.accept: one Triton launch on CUDA instead of ~35 torch kernels, USE_TRITON_ACCEPT)
        self._accept = step_kernels.accept
        self.graph = None
        self.steps_done = 0
        self.prefilled = False

    def set_alpha(self, alpha: float) -> None:
        """Change the controlled acceptance (kept on the device: no re-capture needed)."""
        if self.alpha is None or not _is_real(alpha) or not 0.0 <= float(alpha) <= 1.0:
            raise ValueError(f"set_alpha needs a runtime built with alpha and trace, and alpha a number in [0, 1], "
                             f"got {alpha!r}")
        self.alpha = float(alpha)
        self.alpha_t.fill_(self.alpha)

    # ------------------------------------------------------------------ memory
    def state_bytes_per_request(self) -> dict[str, int]:
        """Bytes of target state per request: ``{"state", "factors", "snapshots", "total"}``."""
        st = self.states[0]
        per = lambda t: 0 if t is None else t[0].numel() * t.element_size()  # noqa: E731
        L = len(self.states)
        conv, ssm = per(st.conv), per(st.ssm)
        factors = sum(per(t) for t in (st.bank_k, st.bank_v, st.bank_g, st.bank_x))
        snaps = 0
        if self.snaps is not None:
            ssm, snaps = 0, self.snaps[0][0].numel() * 4
        out = {"state": L * (conv + ssm), "factors": L * factors, "snapshots": L * snaps}
        out["total"] = sum(out.values())
        return out

    # ------------------------------------------------------------------ steps
    def _argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        return fused.argmax(self.tgt.logits(hidden))

    def _speculate_chain(self, h: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """A chain's drafts into ``window[:, 1:]`` from the drafter's un-normed output ``h`` (rows
        ``rows`` of it, int64 ``[B]``, or ``h [B, D]`` itself): each draft token's argmax is stored
        where the next drafter pass reads it (the window's column; with acceptance control,
        ``self.drafts``), so no stack or copy; on the row GEMV the drafter's final norm is its LM
        head's prologue and the normed features go to ``self.fbuf``, which the next pass's ``fc``
        reads (``FusedEagle.draft_from_hidden``); with ``alpha`` the window then gets the controlled drafts
        (``step_kernels.control_drafts``). Same drafts as :meth:`_speculate` with ``W = 1``."""
        K = self.K
        cols = self.window[:, 1:] if self.alpha is None else self.drafts
        f = self.dr.draft_from_hidden(h, cols[:, 0], self.fbuf, rows)
        for i in range(K - 1):  # the first step reads the committed slots, writes the scratch slots;
            # the last one writes nothing (no later step reads its state)
            ctrl = self.dctrl_first if i == 0 else self.dctrl_next
            hw = self.dr.hidden(cols[:, i : i + 1], f, self.dstates, "ar_read" if i == K - 2 else "ar", ctrl,
                                norm=False)
            f = self.dr.draft_from_hidden(hw, cols[:, i + 1], self.fbuf)
        if self.alpha is not None:
            step_kernels.control_drafts(self.trace, self.n, self.alpha_t, self.step_i, self.window,
                                        self.tgt.config.vocab_size, self.coin_seed)

    def _speculate(self, f: torch.Tensor) -> torch.Tensor:
        """Drafts from feature ``f [B, D]``: the first token (top-``W`` for a tree), then ``K - 1``
        more per branch on the scratch slots. Returns ``[B, W*K]`` (branch-major)."""
        B, W, K = self.B, self.W, self.K
        d = self.dr.draft_tokens(f, W)
        levels = [d]
        if K > 1:
            fw = f.repeat_interleave(W, 0) if W > 1 else f
            for i in range(K - 1):  # the first step reads the committed slots, writes the scratch slots;
                # the last one writes nothing (no later step reads its state)
                ctrl = self.dctrl_first if i == 0 else self.dctrl_next
                fw = self.dr.hidden(d[:, None], fw, self.dstates, "ar_read" if i == K - 2 else "ar", ctrl)
                d = self.dr.draft_tokens(fw)
                levels.append(d)
        drafts = torch.stack(levels, 1).view(B, W, K)
        if self.alpha is not None:  # acceptance-controlled (tree_alpha_model; a chain: i.i.d. per position)
            L = self.trace.shape[1]
            idx = (self.n[:, None] - 1 + self.pos[None, 1 : K + 1]).clamp(max=L - 1)
            true = self.trace.gather(1, idx)[:, None, :].expand(B, W, K)
            coin = torch.rand(drafts.shape, device=self.dev) < self.alpha_t
            branch = torch.arange(W, device=self.dev)[None, :, None]
            if W > 1 and self.tree_alpha_model == "siblings":
                # the first candidate whose level-1 coin came up is the one true sibling (W: none);
                # only its branch keeps its deeper coins
                hit = coin[:, :, 0]
                first = torch.where(hit.any(1), hit.to(torch.int8).argmax(1), W)
                mine = branch == first[:, None, None]
                coin = mine & torch.cat([torch.ones_like(coin[:, :, :1]), coin[:, :1, 1:].expand(B, W, K - 1)], 2)
            wrong = (true + 1 + branch) % self.tgt.config.vocab_size
            drafts = torch.where(coin, true, wrong)
        return drafts.reshape(B, W * K)

    def _emit(self, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Append ``tokens[:, :count]`` (``[B, T]``, ``count [B]``) to each row's output."""
        T = tokens.shape[1]
        ar = self.pos[:T][None]
        pos = torch.where(ar < count[:, None], self.n[:, None] + ar, self.Lout - 1).clamp(max=self.Lout - 1)
        self.out.scatter_(1, pos, tokens)
        self.n += count

    def _step(self) -> None:
        """One step: verify the window, accept on the device, keep the accepted factors pending,
        let the drafter absorb the accepted path and draft the next window. A chain is the
        one-branch case (its accepted path is the window prefix, no compaction needed)."""
        B, T, K = self.B, self.T, self.K
        if self.mode == "ar":
            F = self.tgt.hidden(self.window, self.states, "ar", self.ctrl1)
            self._accept(self._argmax(F)[:, None], self.abuf)  # emit, n += 1, the token into the window
            return
        ctrl = self.ctrl
        mode = "tree" if self.W > 1 else ("verify" if self.mode == "specla" else "snapshot")
        F = self.tgt.hidden(self.window, self.states, mode, ctrl, self.snaps)
        am = self._argmax(F).view(B, T)
        if self.W == 1:
            # accept, emit, count, pending = a + 1, swap banks, the absorb window and the bonus token into
            # window[:, 0] (step_kernels.accept_advance_ref); then the drafter absorbs the accepted prefix:
            # (token i+1, feature i) for i <= a, the pair at i = a carrying the bonus token
            self._accept(am, self.abuf)
            if ABSORB_ACCEPTED_ROWS:  # past the recurrence only row b * T + a of each request
                fh = self.dr.hidden(self.nxt, F, self.dstates, "commit", self.dctrl, norm=False, rows=self.abuf.flat_a)
                self._speculate_chain(fh)
            else:
                fh = self.dr.hidden(self.nxt, F, self.dstates, "commit", self.dctrl, norm=False)
                self._speculate_chain(fh, self.abuf.flat_a)  # row b * T + a of [B * T, D]
            return
        # a tree: the accepted path's factors to bank positions 0..a, then it is pending like a chain
        a, path = greedy_accept_branches(self.window, am, self.W, K)
        bonus = am.gather(1, path.gather(1, a[:, None]))[:, 0]
        compact_path_factors(self.bank_stacks, ctrl.slots, ctrl.write_bank, path, a + 1, stacked=True)
        self._emit(am.gather(1, path), a + 1)
        self.acc_sum += a.sum()
        self.acc_log.index_copy_(0, self.step_i % self.LOG_STEPS, a[None])
        self.step_i += 1
        # deferred commit bookkeeping: a + 1 factors pending in the bank just written; swap banks
        ctrl.pending_len.copy_(a + 1)
        rb = ctrl.read_bank.clone()
        ctrl.read_bank.copy_(ctrl.write_bank)
        ctrl.write_bank.copy_(rb)
        # drafter: absorb (token of path node i+1, feature of path node i) for i <= a; the pair at
        # i = a carries the bonus token
        D = F.shape[-1]
        nxt_tok = self.window.gather(1, path[:, 1:])
        feats = F.view(B, T, D).gather(1, path[:, :, None].expand(B, K + 1, D)).reshape(B * (K + 1), D)
        nxt = torch.cat([nxt_tok, bonus[:, None]], 1).scatter(1, a[:, None], bonus[:, None])
        self.dctrl.valid_len.copy_(a + 1)
        if ABSORB_ACCEPTED_ROWS:  # past the recurrence only the accepted row of each request
            f = self.dr.hidden(nxt, feats, self.dstates, "commit", self.dctrl, rows=self.row_base + a)
        else:
            fh = self.dr.hidden(nxt, feats, self.dstates, "commit", self.dctrl).view(B, K + 1, D)
            f = fh.gather(1, a[:, None, None].expand(B, 1, D))[:, 0]
        self.window[:, 0].copy_(bonus)
        self.window[:, 1:].copy_(self._speculate(f))

    # ------------------------------------------------------------------ driver
    def reset(self) -> None:
        """Zero every state, bank, output and counter (slots are reused from scratch); a
        :meth:`prefill` must follow before stepping."""
        tensors = [t for st in self.states for t in st if t is not None]
        if self.snaps is not None:
            tensors += self.snaps
        if self.mode != "ar":
            tensors += [t for st in self.dstates for t in st if t is not None]
        for t in tensors + [self.out, self.n, self.window, self.acc_sum, self.acc_log, self.step_i]:
            t.zero_()
        for c in (self.ctrl,) + ((self.dctrl,) if self.mode != "ar" else ()):
            c.pending_len.zero_()
            c.read_bank.zero_()
            c.write_bank.fill_(1)
            c.snap_slots.copy_(self.rows * self.T)
        self.steps_done = 0
        self.prefilled = False

    def _prefill_rows(self, prompts: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill ``prompts [R, P]`` into slots ``rows``; returns (first tokens ``[R]``, drafter
        feature ``[R, D]`` after absorbing the prompt, or None for AR)."""
        R, P = prompts.shape
        cP = StepCtrl.uniform(R, P, self.dev, slots=rows)
        if self.mode == "snapshot":  # prefill into a plain state, then it becomes snapshot 0
            # in chunks of rows, so that the plain state is a bounded temporary beside the snapshots
            # (a whole batch's would be 13 GB at map's batch 256, and did not fit beside them on an
            # 80 GB card, benchmarks/RESULTS.md session 37)
            per_row = sum(st.conv[0].numel() * st.conv.element_size() + sn[0, 0].numel() * sn.element_size()
                          for st, sn in zip(self.states, self.snaps))
            n = max(1, min(R, SNAPSHOT_PREFILL_BYTES // per_row))
            Fs = []
            for i in range(0, R, n):
                m = min(n, R - i)
                tmp = allocate_layer_states(self.tgt.config, m, 0, self.dev)
                Fs.append(self.tgt.hidden(prompts[i : i + m], tmp, "ar", StepCtrl.uniform(m, P, self.dev)))
                for t, st, sn in zip(tmp, self.states, self.snaps):
                    st.conv.index_copy_(0, rows[i : i + m], t.conv)
                    sn[rows[i : i + m], 0] = t.ssm
                del tmp
            F = Fs[0] if len(Fs) == 1 else torch.cat(Fs)
        else:
            F = self.tgt.hidden(prompts, self.states, "ar", cP)
        first = self._argmax(F.view(R, P, -1)[:, -1])
        if self.mode == "ar":
            return first, None
        nxt = torch.cat([prompts[:, 1:], first[:, None]], 1)
        fh = self.dr.hidden(nxt, F, self.dstates, "ar", cP, norm=False).view(R, P, -1)
        return first, fh[:, -1]  # (un-normed: _speculate_chain / FusedEagle.norm)

    @torch.no_grad()
    def prefill(self, prompts: torch.Tensor | list[list[int]]) -> None:
        """Reset, run the prompts (eager) and set up the first window.

        ``prompts``: ``[B, P]`` int64 (P >= 1; one batched prefill) or ``B`` non-empty token lists
        of any lengths (one prefill per request); token ids in ``[0, vocab_size)``.

        Raises:
            ValueError: wrong batch size, empty prompts, non-integer or out-of-range token ids.
        """
        V = self.tgt.config.vocab_size
        if isinstance(prompts, torch.Tensor):
            ok = prompts.dim() == 2 and prompts.shape[0] == self.B and prompts.shape[1] >= 1
            if not ok or prompts.is_floating_point() or prompts.is_complex() or prompts.dtype == torch.bool:
                raise ValueError(f"prompts: expected an integer tensor [batch_size={self.B}, P >= 1], got "
                                 f"{tuple(prompts.shape)} {prompts.dtype}")
            if int(prompts.min()) < 0 or int(prompts.max()) >= V:
                raise ValueError(f"prompts: token ids must be in [0, {V}), got [{int(prompts.min())}, {int(prompts.max())}]")
        else:
            if len(prompts) != self.B or any(len(p) == 0 for p in prompts):
                raise ValueError(f"prompts: expected {self.B} non-empty token lists, got lengths {[len(p) for p in prompts]}")
            if any(not is_int(t) or not 0 <= t < V
                   for p in prompts for t in p):
                raise ValueError(f"prompts: token ids must be ints in [0, {V})")
        self.reset()
        if isinstance(prompts, torch.Tensor):  # (int64: a uint8 tensor would index as a mask)
            first, f = self._prefill_rows(prompts.to(device=self.dev, dtype=torch.long), self.rows)
        else:
            parts = [self._prefill_rows(torch.tensor([p], device=self.dev), self.rows[r : r + 1])
                     for r, p in enumerate(prompts)]
            first = torch.cat([p[0] for p in parts])
            f = None if self.mode == "ar" else torch.cat([p[1] for p in parts])
        self._emit(first[:, None], torch.ones_like(self.n))
        self.window[:, 0].copy_(first)
        if self.mode != "ar" and self.W == 1:
            self._speculate_chain(f.contiguous())
        elif self.mode != "ar":
            self.window[:, 1:].copy_(self._speculate(self.dr.norm(f)))
        self.prefilled = True

    @torch.no_grad()
    def capture(self) -> None:
        """Warm up (compiles the Triton kernels) and capture one step as a CUDA graph.

        Warm-up steps change the state, so a :meth:`prefill` is required afterwards."""
        if not self.use_graphs:
            return
        self.prefilled = False
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        torch.cuda.synchronize()

    @torch.no_grad()
    def step(self) -> None:
        """One decode / verify step (graph replay when captured).

        Raises:
            RuntimeError: no :meth:`prefill` since construction, :meth:`reset` or :meth:`capture`.
        """
        if not self.prefilled:
            raise RuntimeError("DecodeRuntime.step: call prefill(prompts) first (after capture() too)")
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()
        self.steps_done += 1

    @torch.no_grad()
    def run(self, steps: int) -> RunResult:
        """``steps >= 1`` steps, timed (CUDA events on GPU, wall clock on CPU).

        Raises:
            ValueError: ``steps`` not an int >= 1 (a float such as 2.0 included: it used to fail in ``range``).
        """
        if isinstance(steps, torch.Tensor) and steps.numel() == 1 and not steps.is_floating_point() \
                and steps.dtype != torch.bool:
            steps = int(steps)  # (a one-element integer tensor)
        if not (is_int(steps) and steps >= 1):
            raise ValueError(f"run: steps must be an int >= 1, got {steps!r}")
        steps = int(steps)
        n0 = int(self.n.sum())
        acc0 = int(self.acc_sum)
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(steps):
                self.step()
            e1.record()
            torch.cuda.synchronize()
            sec = e0.elapsed_time(e1) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                self.step()
            sec = time.perf_counter() - t0
        tokens = int(self.n.sum()) - n0
        if self.mode == "ar":
            tau = 1.0
        else:
            tau = (int(self.acc_sum) - acc0) / (steps * self.B) + 1.0
        return RunResult(steps=steps, seconds=sec, tokens=tokens, mean_acceptance_length=tau, batch=self.B)

    def acceptance_outcomes(self) -> list[list[int]]:
        """Accepted drafts per row for each of the last ``min(steps, LOG_STEPS)`` spec steps since
        :meth:`prefill` (oldest first): what an acceptance estimator consumes."""
        n = int(self.step_i)
        log = self.acc_log.cpu()
        idx = [i % self.LOG_STEPS for i in range(max(0, n - self.LOG_STEPS), n)]
        return [log[i].tolist() for i in idx]

    def outputs(self) -> list[list[int]]:
        """Each row's emitted tokens so far (host copy; the first is the token after the prompt)."""
        n = self.n.tolist()
        out = self.out.cpu()
        return [out[b, : min(n[b], self.Lout - 1)].tolist() for b in range(self.B)]


TREE_ALPHA_MODELS = ("siblings", "iid")


def controlled_tree_tau(alpha: float, k: int, width: int, model: str = "siblings") -> float:
    """Expected tokens per verify step (bonus included) of a ``width``-branch, depth-``k`` draft
    tree under :class:`DecodeRuntime`'s acceptance control (``tree_alpha_model``):

    * ``"siblings"``: ``1 + (1 - (1 - alpha)^W) * sum_{i<k} alpha^i`` (one branch can match);
    * ``"iid"``: ``1 + sum_{i=1..k} 1 - (1 - alpha^i)^W`` (branches independent).

    ``width = 1`` gives :func:`~vllm_specla.core.policy.chain_tau` under both.
    """
    if model == "iid":
        return 1.0 + sum(1.0 - (1.0 - alpha ** i) ** width for i in range(1, k + 1))
    return 1.0 + (1.0 - (1.0 - alpha) ** width) * sum(alpha ** i for i in range(k))


def drafter_config(drafter: FusedEagle):
    """The drafter stack's :class:`GatedDeltaNetConfig` with its number of layers."""
    cfg = drafter.stack.config
    if cfg.num_hidden_layers != len(drafter.stack.layers):
        d = cfg.to_dict()
        for k in ("model_type", "architectures", "transformers_version"):
            d.pop(k, None)
        d["num_hidden_layers"] = len(drafter.stack.layers)
        cfg = type(cfg)(**d)
    return cfg
