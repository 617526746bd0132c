"""A uniform-batch GDN forward with fused projections, for the CUDA-graph decode runtime.

:class:`FusedGDN` packs the weights of a :class:`~vllm_specla.models.gdn.GatedDeltaNetForCausalLM`
(or of an :class:`~vllm_specla.models.drafter.EagleDrafter`'s blocks) so one layer of a decode /
verify step is 9-11 launches: [RMSNorm +] one in-projection GEMM (q|k|v|gate|a|b), gating, conv
window, chain verify, gated RMSNorm, ``o_proj`` GEMM with the residual add in the epilogue,
[RMSNorm +] one gate|up GEMM, SwiGLU, ``down_proj`` GEMM with the residual add. The GEMMs
(``ops/fused.py`` ``linear`` / ``gated_norm_linear`` / ``silu_mul_linear``) are cuBLAS after the
norm / SwiGLU kernels, except on CUDA: one-row GEMMs (the AR step and the drafter's passes at batch
1; small weights up to ``GEMV_ROWS_SMALL_MAX_M`` rows) run the Triton row GEMV with the RMSNorm, gated
RMSNorm and SwiGLU as its prologues and the gating as the in-projection's epilogue (6 launches per
layer; with programmatic dependent launch the AR step at batch 1 takes 1.011 ms against 1.383 with
cuBLAS, flame, benchmarks/RESULTS.md sessions 11-12, 25), and 2-8-row bf16 / fp16 GEMMs (batch-1 verify
windows) the CUDA skinny GEMM once ``ops/_cpp.py`` ``load_cuda_gemm()`` has built it (session 15). The recurrent and conv math are the
same ops the vLLM path uses (``ops/chain_verify.py``, ``ops/recover.py``); q/k/v, gate, a and b are
column slices of the one projection output, read in place by the kernels (no copies).

Every batch is *uniform*: ``B`` rows of ``T`` tokens each (AR: T = 1; chain verify: T = 1 + K;
drafter absorb: T = 1 + K with ``valid_len`` real tokens). Row ``r`` uses state slot
``ctrl.slots[r]``. All per-step control lives in device tensors (:class:`StepCtrl`), so a step is
graph-capturable and replays with new values.

Modes (one captured graph each):
  * ``"ar"``: write the state and conv window after the T tokens (decode; prefill with T = prompt).
  * ``"ar_read"``: like ``"ar"`` but nothing is written: the state and conv window are only read
    (the last draft step of a window, whose state no later step reads: one state pass, not two).
  * ``"verify"``: SpecLA chain verify: fold ``pending_len`` accepted factors of bank
    ``read_bank`` into the state (written once), run the window without writing the state, record
    factors into bank ``write_bank`` (ALGORITHMS.md §3, §6).
  * ``"commit"``: like ``"ar"`` but only the first ``valid_len[r]`` tokens of each row count:
    padding tokens get ``g = beta = 0`` (the state passes unchanged) and the conv window is
    committed with ``conv_commit(valid_len)`` from the raw inputs recorded in bank 0. Used by the
    drafter to absorb the accepted tokens of a window of fixed width.
  * ``"snapshot"``: the vLLM-native baseline: the state is read from snapshot ``snap_slots[r]``
    and a full state is written after every window token (rollback = pick a snapshot); the conv
    window uses the same deferred conv commit as ``"verify"``.
  * ``"tree"``: like ``"verify"`` for a draft tree per row (``ctrl.parents``, row-local parent
    positions, topological): tree conv + tree verify (each node from its own ancestors,
    ALGORITHMS.md §4-5), factors per node.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from vllm_specla.core.draft_vocab import draft_head
from vllm_specla.core.state import LayerState
from vllm_specla.models.gdn import GDNDims, GatedDeltaNetBlock, GatedDeltaNetForCausalLM, resolve_dtype
from vllm_specla.ops import fused
from vllm_specla.ops.chain_verify import chain_verify, chain_verify_snapshots, conv_chain_step, conv_verify
from vllm_specla.ops.recover import conv_commit
from vllm_specla.ops.tree_verify import tree_conv, tree_verify

MODES = ("ar", "ar_read", "verify", "commit", "snapshot", "tree")


@dataclass
class StepCtrl:
    """Device-side control of one uniform step (all ``[B]`` int64 unless noted).

    slots: state slot per row; cu_seqlens ``[B+1]``: ``arange(B+1) * T``; pending_len,
    read_bank, write_bank: deferred commit (``"verify"`` / ``"snapshot"`` conv); valid_len: real
    tokens per row (``"commit"``); snap_slots: snapshot read index per row (``"snapshot"``,
    ``r * Tmax + accepted``); out_slots: ``"ar"`` rows write their state and conv window there
    instead of to ``slots`` (a first draft step onto scratch slots, no copy of the state first).
    """

    slots: torch.Tensor
    cu_seqlens: torch.Tensor
    pending_len: torch.Tensor | None = None
    read_bank: torch.Tensor | None = None
    write_bank: torch.Tensor | None = None
    valid_len: torch.Tensor | None = None
    snap_slots: torch.Tensor | None = None
    zeros: torch.Tensor | None = None
    parents: torch.Tensor | None = None  # [B*T] row-local parent positions ("tree" mode)
    out_slots: torch.Tensor | None = None  # "ar": write the state after the row here, not to slots
    hld_plan: object | None = None  # heavy-light schedule of the (static) tree, shared by all layers

    @classmethod
    def uniform(cls, B: int, T: int, device, slots: torch.Tensor | None = None) -> "StepCtrl":
        """Rows ``0..B-1`` on slots ``0..B-1`` (or ``slots``), ``T`` tokens each, no pending."""
        z = torch.zeros(B, dtype=torch.long, device=device)
        return cls(
            slots=torch.arange(B, device=device) if slots is None else slots,
            cu_seqlens=torch.arange(B + 1, device=device) * T,
            pending_len=z.clone(), read_bank=z.clone(), write_bank=z + 1,
            valid_len=z + T, snap_slots=torch.arange(B, device=device) * T, zeros=z.clone(),
        )


class _Layer:
    """Packed weights of one GDN block (fla parameter layout, see ``models/gdn.py``)."""

    def __init__(self, blk: GatedDeltaNetBlock, dtype: torch.dtype, device):
        m, c = blk.attn, blk.attn.config
        d: GDNDims = m.dims
        self.dims, self.config = d, c
        ws = [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]
        self.G = d.value_dim if c.use_gate else 0
        if c.use_gate:
            ws.append(m.g_proj.weight)
        ws += [m.a_proj.weight, m.b_proj.weight]
        cast = dict(device=device, dtype=dtype)
        w_in = torch.cat(ws, 0).detach().to(**cast)
        # rows padded to a multiple of 8 with zeros: the projection output's row stride is then a
        # multiple of 16 bytes, which cuBLAS needs for its sm90 kernels (flame's 9228 outputs fell
        # back to a CUTLASS sm80 kernel; benchmarks/RESULTS.md, session 4). Kernels read the q/k/v,
        # gate, a, b column slices in place, so the padding columns are never read.
        pad = -w_in.shape[0] % 8
        self.w_in = torch.nn.functional.pad(w_in, (0, 0, 0, pad)).contiguous()
        cw = m.conv_weight()
        if cw is None:
            raise ValueError("use_short_conv=False is not supported by the decode runtime (allowed: true, as in "
                             "every fla GDN checkpoint); the state-slot model of models/gdn.py supports it")
        self.conv_w = cw.detach().to(device=device, dtype=torch.float32).contiguous()
        f32 = dict(device=device, dtype=torch.float32)
        self.A_log = m.A_log.detach().to(**f32)
        self.dt_bias = m.dt_bias.detach().to(**f32)
        self.o_norm_w = m.o_norm.weight.detach().to(**f32)
        self.w_o = m.o_proj.weight.detach().to(**cast).contiguous()
        self.attn_norm_w = blk.attn_norm.weight.detach().to(**f32)
        self.mlp_norm_w = blk.mlp_norm.weight.detach().to(**f32)
        self.w_gu = torch.cat([blk.mlp.gate_proj.weight, blk.mlp.up_proj.weight], 0).detach().to(**cast).contiguous()
        self.w_down = blk.mlp.down_proj.weight.detach().to(**cast).contiguous()
        self.eps = c.norm_eps


class FusedGDN:
    """Fused uniform-batch forward over a stack of GDN blocks.

    Args:
        blocks: the blocks (``model.model.layers`` of a target, ``drafter.layers`` of a drafter).
        dtype: weight / activation dtype (bf16 on GPU; fp32 for exact tests). States are fp32.
        device: where the packed weights live.
    Raises:
        ValueError: a block without the short convolution (``use_short_conv=False``).
    """

    def __init__(self, blocks, dtype: torch.dtype, device):
        self.layers = [_Layer(b, dtype, device) for b in blocks]
        self.dtype = dtype
        self.device = torch.device(device)
        self.dims = self.layers[0].dims
        self.config = self.layers[0].config

    def quantized(self) -> FusedGDN:
        """The same stack with its four GEMM weights per layer (in-projection, ``o_proj``, gate|up,
        ``down_proj``) as per-row float8 :class:`~vllm_specla.ops.fused.Fp8Weight` (``quantize_fp8``;
        activations stay in :attr:`dtype`). Norm, conv and gating parameters are shared, not copied."""
        new = copy.copy(self)
        new.layers = []
        for L in self.layers:
            q = copy.copy(L)
            q.w_in, q.w_o, q.w_gu, q.w_down = (fused.quantize_fp8(w) for w in (L.w_in, L.w_o, L.w_gu, L.w_down))
            new.layers.append(q)
        return new

    def layer_forward(self, h: torch.Tensor, L: _Layer, st: LayerState, mode: str, ctrl: StepCtrl, T: int,
                      snap: torch.Tensor | None = None, next_w: torch.Tensor | None = None,
                      out_rows: torch.Tensor | None = None, tail: _Layer | None = None) -> torch.Tensor:
        """One block on ``h [B*T, D]`` (the residual stream, ``dtype``); returns the new stream.
        It is ``h`` itself: the two residual adds accumulate into it in place (cuBLAS ``addmm_`` or
        the row GEMV's in-place residual; no copy of the stream per add), so callers pass a tensor
        they no longer need. Each GEMM names the next one's weight (``fused.linear(prefetch=)``, an L2
        hint of the skinny GEMM); ``next_w``: the weight of the GEMM after the block's last.

        ``out_rows``: int64 ``[M]`` rows of the stream, or None: the state and conv window advance
        over all ``B*T`` tokens as ``mode`` says, but only these rows go on past the recurrence
        (``o_proj``, the MLP; ``fused.gated_norm_linear(rows=)``): the returned stream is a new
        ``[M, D]`` (the last block of a pass whose other rows nobody reads: the drafter's absorb of
        the accepted window, where only each request's accepted row feeds the next draft). ``tail``:
        the layer whose ``o_proj`` / gate|up / ``down_proj`` weights those rows use (the float8 copy
        of ``L`` for one-row-per-request passes, :class:`FusedEagle`); default ``L``."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        d, c = L.dims, L.config
        C, G = d.conv_dim, L.G
        p, g, beta = fused.linear_gating(h, L.w_in, L.attn_norm_w, L.eps, C + G, L.A_log, L.dt_bias,
                                         c.allow_neg_eigval, ctrl.valid_len if mode == "commit" else None, T,
                                         prefetch=L.w_o)
        xc = p[:, :C]
        gate = p[:, C : C + G] if G else None
        # ---- short conv (+ SiLU) ----
        out = dict(out_slots=ctrl.out_slots) if mode == "ar" and ctrl.out_slots is not None else {}
        if mode in ("ar", "ar_read") and T == 1:  # one token per row: conv + recurrence (one launch with CONV_STEP)
            o = conv_chain_step(xc, L.conv_w, st.conv, g, beta, scale=d.scale, state=st.ssm, slots=ctrl.slots,
                                cu_seqlens=ctrl.cu_seqlens, write=mode == "ar", **out)
            return self._tail(h, o, gate, L, tail, out_rows, next_w)
        if mode == "ar":
            y = conv_verify(xc, L.conv_w, ctrl.cu_seqlens, st.conv, ctrl.slots, write_final_state=True, **out)
        elif mode == "ar_read":  # no bank, no pending, no final state: the window is only read
            y = conv_verify(xc, L.conv_w, ctrl.cu_seqlens, st.conv, ctrl.slots)
        elif mode == "commit":
            y = conv_verify(xc, L.conv_w, ctrl.cu_seqlens, st.conv, ctrl.slots, bank_x=st.bank_x,
                            write_bank=ctrl.zeros)
            conv_commit(st.conv, ctrl.slots, st.bank_x, ctrl.zeros, ctrl.valid_len)
        elif mode == "tree":
            y = tree_conv(xc, L.conv_w, ctrl.cu_seqlens, ctrl.parents, st.conv, ctrl.slots, bank_x=st.bank_x,
                          write_bank=ctrl.write_bank, pending_len=ctrl.pending_len, read_bank=ctrl.read_bank,
                          chain=False)
        else:  # verify / snapshot: deferred conv commit through bank_x
            y = conv_verify(xc, L.conv_w, ctrl.cu_seqlens, st.conv, ctrl.slots, bank_x=st.bank_x,
                            write_bank=ctrl.write_bank, pending_len=ctrl.pending_len, read_bank=ctrl.read_bank)
        N = y.shape[0]
        q = y[:, : d.key_dim].view(N, d.H, d.K)
        k = y[:, d.key_dim : 2 * d.key_dim].view(N, d.H, d.K)
        v = y[:, 2 * d.key_dim :].view(N, d.HV, d.V)
        # ---- gated delta rule ----
        kw = dict(scale=d.scale, slots=ctrl.slots, cu_seqlens=ctrl.cu_seqlens)
        if mode in ("ar", "commit"):
            o = chain_verify(q, k, v, g, beta, state=st.ssm, write_final_state=True, **kw, **out)
        elif mode == "ar_read":  # outputs only: no factors, the state is read once and not written
            o = chain_verify(q, k, v, g, beta, state=st.ssm, **kw)
        elif mode == "verify":
            o = chain_verify(q, k, v, g, beta, state=st.ssm, bank_k=st.bank_k, bank_v=st.bank_v,
                             bank_g=st.bank_g, write_bank=ctrl.write_bank, pending_len=ctrl.pending_len,
                             read_bank=ctrl.read_bank, **kw)
        elif mode == "tree":
            o = tree_verify(q, k, v, g, beta, state=st.ssm, parents=ctrl.parents, bank_k=st.bank_k, bank_v=st.bank_v,
                            bank_g=st.bank_g, write_bank=ctrl.write_bank, pending_len=ctrl.pending_len,
                            read_bank=ctrl.read_bank, chain=False, hld_plan=ctrl.hld_plan, **kw)
        elif mode == "snapshot":
            kw["slots"] = ctrl.snap_slots
            o = chain_verify_snapshots(q, k, v, g, beta, state=snap.view(-1, *snap.shape[2:]), snap=snap, **kw)
        else:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        return self._tail(h, o, gate, L, tail, out_rows, next_w)

    @staticmethod
    def _tail(h: torch.Tensor, o: torch.Tensor, gate: torch.Tensor | None, L: _Layer, tail: _Layer | None,
              out_rows: torch.Tensor | None, next_w: torch.Tensor | None) -> torch.Tensor:
        """The block past its recurrence (``o [N, HV, V]``): gated RMSNorm + ``o_proj`` with the residual
        add, [RMSNorm +] gate|up, SwiGLU + ``down_proj`` with the residual add (:meth:`layer_forward`)."""
        c = L.config
        Lt = L if tail is None else tail
        if out_rows is not None:  # only the rows read later: a new [M, D] stream
            h = fused.gated_norm_linear(o, gate, L.o_norm_w, L.eps, c.output_gate_activation, Lt.w_o, residual=h,
                                        prefetch=Lt.w_gu, rows=out_rows)
        else:
            h = fused.gated_norm_linear(o, gate, L.o_norm_w, L.eps, c.output_gate_activation, Lt.w_o, residual=h,
                                        residual_inplace=True, prefetch=Lt.w_gu)
        gu = fused.linear(h, Lt.w_gu, L.mlp_norm_w, L.eps, prefetch=Lt.w_down)
        return fused.silu_mul_linear(gu, Lt.w_down, residual=h, residual_inplace=True, prefetch=next_w)

    def forward(self, h: torch.Tensor, states: list[LayerState], mode: str, ctrl: StepCtrl, T: int,
                snaps: list[torch.Tensor] | None = None, tail_w: torch.Tensor | None = None,
                out_rows: torch.Tensor | None = None, tail: FusedGDN | None = None) -> torch.Tensor:
        """All blocks on ``h [B*T, D]`` (``snaps``: per-layer ``[B, Tmax, HV, V, K]`` for ``"snapshot"``);
        ``h`` is consumed (the residual adds run in place, :meth:`layer_forward`). ``tail_w``: the
        weight of the GEMM after the stack (an LM head), the last block's prefetch. ``out_rows``
        (int64 ``[M]``): the last block keeps only these rows past its recurrence, on ``tail``'s
        last-layer weights (default this stack's; :meth:`layer_forward`), and ``[M, D]`` is returned."""
        n = len(self.layers)
        for i, (L, st) in enumerate(zip(self.layers, states)):
            last = i + 1 == n
            h = self.layer_forward(h, L, st, mode, ctrl, T, snaps[i] if snaps is not None else None,
                                   next_w=tail_w if last else self.layers[i + 1].w_in,
                                   out_rows=out_rows if last else None,
                                   tail=tail.layers[i] if last and out_rows is not None and tail is not None else None)
        return h


class FusedTarget:
    """A target LM for the runtime: embedding, :class:`FusedGDN` blocks, final norm, LM head.

    ``hidden(tokens [B, T], ...) -> [B*T, D]`` final-normed features (``dtype``);
    ``logits(hidden) -> [N, vocab]`` in ``dtype`` (bf16 on GPU: argmax over bf16 logits).
    ``dtype``: a ``torch.dtype`` or a name (``"bf16"``, ``"float32"``, ...; ``models/gdn.py`` ``resolve_dtype``).

    Raises:
        ValueError: ``dtype`` not a float32 / bfloat16 / float16 dtype or name.
    """

    def __init__(self, model: GatedDeltaNetForCausalLM, dtype: torch.dtype | str, device):
        dtype = resolve_dtype(dtype)
        self.config = model.config
        self.stack = FusedGDN(model.model.layers, dtype, device)
        self.embed = model.model.embeddings.weight.detach().to(device=device, dtype=dtype)
        self.norm_w = model.model.norm.weight.detach().to(device=device, dtype=torch.float32)
        self.lm_head = model.lm_head.weight.detach().to(device=device, dtype=dtype).contiguous()
        self.eps = model.config.norm_eps
        self.dtype = dtype

    def hidden(self, tokens: torch.Tensor, states, mode: str, ctrl: StepCtrl, snaps=None) -> torch.Tensor:
        B, T = tokens.shape
        h = fused.embed(self.embed, tokens)
        h = self.stack.forward(h, states, mode, ctrl, T, snaps, tail_w=self.lm_head)
        return fused.rms_norm(h, self.norm_w, self.eps, self.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return fused.linear(hidden, self.lm_head)


DRAFT_WEIGHTS = ("model", "fp8")
# With draft_weights="fp8": drafter passes of at most this many tokens per row read the float8 weights (1: the draft
# passes only; K + 1 and more: also the absorb window). A measured choice (benchmarks/RESULTS.md "Session 27"; and
# "Session 29": the float8 window costs the trained pair more acceptance than it saves in step time)
FP8_MAX_TOKENS = 1
# With draft_weights="fp8": only passes of at most this many rows (requests; requests x branches for a tree's branch
# passes; with FP8_MAX_TOKENS > 1 a window pass's requests, each of up to FP8_MAX_TOKENS tokens) read the float8
# weights; larger passes read the model weights, as with draft_weights="model". On CUDA the float8 GEMMs run the row
# GEMV, whose cost grows with its rows: on the H100 (benchmarks/RESULTS.md "Session 36", s35b) float8 draft passes
# made a K = 4 SpecLA step 7 % faster at batch 1, 0.3-0.5 % at batch 2, 10 % slower at batch 4 and 1.8x slower at
# batch 16. CPU scripts that measure a float8 format's acceptance at a larger batch raise it
# (benchmarks/draft_format_acceptance.py)
FP8_MAX_BATCH = 2
# With draft_weights="fp8": the absorb pass's GEMMs past its recurrence, which run on each request's accepted row only
# (FusedEagle.hidden(rows=)), read the float8 weights as the draft passes do (one token row per request; at most
# FP8_MAX_BATCH requests); 0.1-0.3 % of
# the trained pair's acceptance (RESULTS.md "Session 29"; with their o_proj in one launch they were 3-9 us per batch-1
# step faster than the model weights, s29e; as shipped their o_proj gathers and norms first). False: the absorb pass's own weights (the model dtype, unless FP8_MAX_TOKENS gives the window float8
# too; an A/B switch, benchmarks/bench_e2e.py --absorb-rows)
ABSORB_ROWS_FP8 = True


class FusedEagle:
    """The EAGLE-style drafter (``models/drafter.py``) on :class:`FusedGDN`: ``fc([embed(x); f])``,
    its block(s), final norm; logits through the target's LM head, or through the rows of a
    frequency-ranked draft vocabulary (``draft_vocab``: ``[Vd]`` ascending token ids,
    ``core/draft_vocab.py``; None = the full vocabulary).

    ``draft_weights``: ``"model"`` (the model dtype everywhere) or ``"fp8"``: the one-token passes
    of at most :data:`FP8_MAX_BATCH` rows (every such draft pass: ``hidden`` with ``T <=``
    :data:`FP8_MAX_TOKENS`, 1 by default, and the draft logits of :meth:`draft_tokens` /
    :meth:`draft_from_hidden`) read
    float8 copies of the drafter's GEMM weights and of its LM head rows, one float32 scale per
    output row (``ops/fused.py`` ``quantize_fp8``, W8A16: activations, norms, states stay as they
    were). At batch 1 a draft pass streams its weights once, so it streams half the bytes
    (benchmarks/RESULTS.md "Session 27"). The drafter's multi-token passes (its absorb of the
    accepted window, its prefill) keep the model dtype, except the absorb's GEMMs past its
    recurrence where they run on each request's accepted row only (:meth:`hidden` ``rows=``,
    ``ABSORB_ROWS_FP8``: one token row per request, as a draft pass; "Session 29"). The row limit (2:
    requests, or requests x branches in a tree's branch passes; larger passes read the model weights)
    is a speed rule: the row GEMV's float8 passes cost more than they save from batch 4 on
    ("Session 36"). Verification
    is untouched, so output is unchanged (lossless); only which tokens get drafted can change (the
    trained pair's acceptance in RESULTS.md). On CUDA the float8 GEMMs run the row GEMV (no
    tensor-core float8 GEMM here), hence the batch limit; off CUDA the torch reference
    (``Fp8Weight.ref_linear``).

    Raises:
        ValueError: ``dtype`` not the target's; ``draft_weights`` not in :data:`DRAFT_WEIGHTS`;
            ``"fp8"`` on a CUDA GPU below compute capability 8.9 (Triton's float8 needs it).
    """

    def __init__(self, drafter, target: FusedTarget, dtype: torch.dtype | str, device,
                 draft_vocab: torch.Tensor | None = None, draft_weights: str = "model"):
        dtype = resolve_dtype(dtype)
        if dtype != target.dtype:  # the drafter's input [embed(x); f] is built in the target's embedding dtype
            raise ValueError(f"dtype must be the target's ({target.dtype}), got {dtype}")
        self.stack = FusedGDN(drafter.layers, dtype, device)
        self.fc = drafter.fc.weight.detach().to(device=device, dtype=dtype).contiguous()
        self.norm_w = drafter.norm.weight.detach().to(device=device, dtype=torch.float32)
        self.eps = drafter.config.norm_eps
        self.target = target
        self.dtype = dtype
        self.head = draft_head(target.lm_head, draft_vocab, target.lm_head.shape[0])
        self.draft_weights = "model"
        self.stack8 = self.fc8 = self.head8 = None
        self._set_draft_weights(draft_weights)

    def _set_draft_weights(self, draft_weights: str) -> None:
        if draft_weights not in DRAFT_WEIGHTS:
            raise ValueError(f"draft_weights must be one of {DRAFT_WEIGHTS}, got {draft_weights!r}")
        if draft_weights == "model":
            self.draft_weights = draft_weights
            self.stack8 = self.fc8 = self.head8 = None
            return
        dev = self.fc.device
        if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (8, 9):
            raise ValueError(f"draft_weights='fp8' needs a GPU with float8 support (compute capability 8.9+: Ada, "
                             f"Hopper or newer), got {torch.cuda.get_device_name(dev)} "
                             f"({'.'.join(map(str, torch.cuda.get_device_capability(dev)))}); use 'model'")
        if self.draft_weights == "fp8" and self.head8 is not None:
            return  # (already float8: nothing to redo)
        self.draft_weights = draft_weights
        if self.stack8 is None:
            self.stack8, self.fc8 = self.stack.quantized(), fused.quantize_fp8(self.fc)
        self.head8 = fused.quantize_fp8(self.target.lm_head if self.head is None else self.head.weight)

    def with_draft_vocab(self, draft_vocab: torch.Tensor | None) -> "FusedEagle":
        """The same drafter (weights shared) with another draft vocabulary (None = full)."""
        new = copy.copy(self)
        new.head = draft_head(self.target.lm_head, draft_vocab, self.target.lm_head.shape[0])
        if new.draft_weights == "fp8":
            new.head8 = fused.quantize_fp8(new.target.lm_head if new.head is None else new.head.weight)
        return new

    def with_draft_weights(self, draft_weights: str) -> FusedEagle:
        """The same drafter and draft vocabulary with other draft-pass weights (``"model"`` /
        ``"fp8"``; the block weights are shared, float8 copies made on first use).

        Raises:
            ValueError: as the constructor's ``draft_weights``."""
        new = copy.copy(self)
        new._set_draft_weights(draft_weights)
        return new

    @property
    def draft_vocab_size(self) -> int:
        """Tokens the drafter scores (the target's vocabulary without a draft vocabulary)."""
        return self.target.lm_head.shape[0] if self.head is None else self.head.size

    def draft_tokens(self, f: torch.Tensor, width: int = 1, out: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy draft tokens from drafter features ``f [N, D]``: ``[N]`` int64 target ids (written
        into ``out``, ``[N]`` int64 of any stride, when given: ``fused.argmax`` maps the draft
        vocabulary's ids and stores in its one launch), or the top-``width`` ``[N * width]``
        (row-major) for a tree's first level (``out`` must then be None)."""
        if self.head8 is not None and f.shape[0] <= FP8_MAX_BATCH:
            logits = fused.linear(f, self.head8)
        else:
            logits = self.target.logits(f) if self.head is None else fused.linear(f, self.head.weight)
        if width == 1:
            return fused.argmax(logits, out=out, ids=None if self.head is None else self.head.ids)
        if out is not None:
            raise ValueError(f"draft_tokens: out is for width 1, got width {width}")
        idx = logits.topk(width, -1).indices.reshape(-1)
        return idx if self.head is None else self.head.to_target(idx)

    def hidden(self, tokens: torch.Tensor, feats: torch.Tensor, states, mode: str, ctrl: StepCtrl,
               norm: bool = True, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens [B, T]``, ``feats [B*T, D]`` -> predicted next features ``[B*T, D]`` (the float8
        weights for ``T <= FP8_MAX_TOKENS`` and ``B <= FP8_MAX_BATCH`` with ``draft_weights="fp8"``).
        ``norm=False``: the block's
        output before the drafter's final norm (:meth:`draft_from_hidden` applies it with the LM head).
        The embedding gather is the ``fc`` GEMM's prologue where the row GEMV runs it
        (``fused.embed_linear``).

        ``rows``: int64 ``[M]`` rows of the ``B*T`` or None: the state advances over every token as
        ``mode`` says, but only these rows' features are computed and returned, ``[M, D]`` (the
        absorb of an accepted window: each request's accepted row; ``FusedGDN.forward(out_rows=)``).
        Past the last recurrence these are one-row-per-request GEMMs, so with
        ``draft_weights="fp8"`` they read the float8 weights, as the draft passes do (``M <=
        FP8_MAX_BATCH``)."""
        B, T = tokens.shape
        q = self.stack8 is not None and T <= FP8_MAX_TOKENS and B <= FP8_MAX_BATCH
        stack, fc = (self.stack8, self.fc8) if q else (self.stack, self.fc)
        h = fused.embed_linear(self.target.embed, tokens, feats, fc, prefetch=stack.layers[0].w_in)
        tail = (self.stack8 if rows is not None and ABSORB_ROWS_FP8 and rows.shape[0] <= FP8_MAX_BATCH
                else None)  # (None: this pass's own weights)
        h = stack.forward(h, states, mode, ctrl, T,
                          tail_w=self.target.lm_head if self.head is None else self.head.weight, out_rows=rows,
                          tail=tail)
        return self.norm(h) if norm else h

    def norm(self, h: torch.Tensor) -> torch.Tensor:
        """The drafter's final norm: features ``[N, D]`` in :attr:`dtype` from :meth:`hidden`'s
        ``norm=False`` output."""
        return fused.rms_norm(h, self.norm_w, self.eps, self.dtype)

    def draft_from_hidden(self, h: torch.Tensor, out: torch.Tensor, f_out: torch.Tensor | None = None,
                          rows: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy draft tokens of rows ``rows`` (int64 ``[N]``, or all) of the un-normed drafter output
        ``h [R, D]`` (:meth:`hidden` with ``norm=False``) into ``out [N]`` int64; returns the features
        ``f = norm(h[rows]) [N, D]`` (``dtype``; the next pass's input): ``f_out`` where the final norm
        runs as the LM head's prologue (``fused.norm_rows_linear``: one launch on the row GEMV, where
        the norm and the row gather were launches of their own), else the norm's own tensor. The same
        tokens and features as ``hidden(norm=True)`` then :meth:`draft_tokens` up to float32
        summation order (the normed features within one ulp; a draft may then differ at a near-tie,
        the output cannot: verification decides)."""
        n = h.shape[0] if rows is None else rows.shape[0]
        w = (self.head8 if self.head8 is not None and n <= FP8_MAX_BATCH
             else self.target.lm_head if self.head is None else self.head.weight)
        logits, f = fused.norm_rows_linear(h, self.norm_w, self.eps, w, rows, f_out)
        fused.argmax(logits, out=out, ids=None if self.head is None else self.head.ids)
        return f
