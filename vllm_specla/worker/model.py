"""vLLM model class for fla ``gated_deltanet`` checkpoints (pure GDN, no attention layers).

A thin vLLM shell around the core mixer math (:func:`vllm_specla.models.gdn.gdn_mix`): vLLM's
parallel linear layers do the projections (heads split across tensor-parallel ranks), each GDN
layer is a ``MambaBase`` whose state page holds conv window + recurrent state (+ the SpecLA factor
banks when speculation is on), and the per-step :class:`~vllm_specla.core.state.StepPlan` is set by
our model runner (``worker/runner.py``) before each forward.

vLLM integration facts this relies on (VLLM_NOTES.md §14, vLLM 0.32): the model declares
``IsHybrid`` (an attention-free out-of-tree model trips the mamba block-size setup and skips the
accepted-token bookkeeping); layer names contain exactly one integer; ``self.kv_cache`` is a tuple
of per-state views ``[num_blocks, *shape]`` bound by the runner; profile and dummy runs come with
no attention metadata (and on CPU with no bound cache), so the mixer is skipped then.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader, sharded_weight_loader
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
from vllm.model_executor.utils import set_weight_attrs
from vllm.sequence import IntermediateTensors
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from vllm_specla.core.state import LayerState, SlotBook, StepPlan, layer_state_shapes
from vllm_specla.models.config import as_gdn_config, check_supported
from vllm_specla.models.gdn import GDNDims, gdn_mix, rms_norm
from vllm_specla.ops.recover import conv_commit, recover
from vllm_specla.worker.settings import specla_settings


def _max_window(vllm_config: VllmConfig) -> int:
    s = specla_settings(vllm_config)
    return s.max_window if s is not None else 0


# fla's separate projections -> (merged layer, shard index), in the order of the merged layers' output_sizes:
# in_proj_qkvg = q | k | v (| g), in_proj_ab = a | b, gate_up_proj = gate | up. As vLLM's Qwen3-Next keeps its
# in_proj_qkvz and in_proj_ba apart: the tiny a / b shards (num_v_heads rows) stay out of the big merged layer, whose
# every shard but the last a block-quantized checkpoint needs a multiple of its block size.
STACKED_PARAMS = ((".attn.in_proj_qkvg.", ".attn.q_proj.", 0), (".attn.in_proj_qkvg.", ".attn.k_proj.", 1),
                  (".attn.in_proj_qkvg.", ".attn.v_proj.", 2), (".attn.in_proj_qkvg.", ".attn.g_proj.", 3),
                  (".attn.in_proj_ab.", ".attn.a_proj.", 0), (".attn.in_proj_ab.", ".attn.b_proj.", 1),
                  (".mlp.gate_up_proj.", ".mlp.gate_proj.", 0), (".mlp.gate_up_proj.", ".mlp.up_proj.", 1))


class _ShardedParam(nn.Module):
    """A parameter split along dim 0 across TP ranks (conv weights)."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shape), requires_grad=False)
        set_weight_attrs(self.weight, {"weight_loader": sharded_weight_loader(0)})


class _Replicated(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        set_weight_attrs(self.weight, {"weight_loader": default_weight_loader})


class SpeclaGDNAttention(nn.Module, MambaBase):
    """The GDN token mixer as a vLLM ``MambaBase`` layer (fla parameter names)."""

    def __init__(self, config, layer_idx: int, prefix: str, max_window: int, quant_config=None):
        super().__init__()
        self.config = config
        self.prefix = prefix
        self.layer_idx = layer_idx
        self.tp_size = get_tensor_model_parallel_world_size()
        for name, n in (("num_heads", config.num_heads), ("num_v_heads", config.n_v_heads)):
            if n % self.tp_size:
                raise ValueError(f"{name}={n} is not divisible by tensor_parallel_size={self.tp_size}")
        d = self.dims = GDNDims(config, self.tp_size)
        self.max_window = max_window
        D = config.hidden_size

        # the checkpoint's q / k / v (/ g) and a / b projections as two GEMMs (vLLM's merged layers, as Llama's
        # qkv_proj; load_weights maps their names onto the shards: STACKED_PARAMS); each rank holds its heads' columns
        sizes = [config.key_dim, config.key_dim, config.value_dim] + ([config.value_dim] if config.use_gate else [])
        self.in_proj_qkvg = MergedColumnParallelLinear(D, sizes, bias=False, quant_config=quant_config,
                                                       prefix=f"{prefix}.in_proj_qkvg")
        self.in_proj_ab = MergedColumnParallelLinear(D, [config.n_v_heads] * 2, bias=False, quant_config=quant_config,
                                                     prefix=f"{prefix}.in_proj_ab")
        self.conv_channels = (2 * config.key_dim + config.value_dim) // self.tp_size  # q | k | v on this rank
        self.A_log = nn.Parameter(torch.empty(d.HV), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(d.HV), requires_grad=False)
        set_weight_attrs(self.A_log, {"weight_loader": sharded_weight_loader(0)})
        set_weight_attrs(self.dt_bias, {"weight_loader": sharded_weight_loader(0)})
        if config.use_short_conv:
            self.q_conv1d = _ShardedParam((d.key_dim, 1, d.W))
            self.k_conv1d = _ShardedParam((d.key_dim, 1, d.W))
            self.v_conv1d = _ShardedParam((d.value_dim, 1, d.W))
        self.o_norm = _Replicated(d.V)
        self.o_proj = RowParallelLinear(config.value_dim, D, bias=False, input_is_parallel=True,
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj")
        ctx = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in ctx:
            raise ValueError(f"Duplicate layer name: {prefix}")
        ctx[prefix] = self

    # ---- MambaBase ---------------------------------------------------------------------------
    def get_state_shape(self) -> tuple[tuple[int, ...], ...]:
        return tuple(layer_state_shapes(self.config, self.max_window, self.tp_size))

    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        return (torch.float32,) * len(self.get_state_shape())

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.GDN_ATTN

    def get_kv_cache_spec(self, vllm_config: VllmConfig):
        # one state page per request (+ the factor banks inside it), never 1 + K pages
        spec = super().get_kv_cache_spec(vllm_config)
        return dataclasses.replace(spec, num_speculative_blocks=0)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        """Lay the layer's states out as one contiguous ``[B, *shape]`` tensor each (``LayerState``: conv window,
        recurrent state, factor banks; ``B`` state slots = vLLM blocks), in the layer's own page region.

        vLLM's ``MambaBase.bind_kv_cache`` slices each state out of every block's page, which gives strided views
        (block stride = the page); the Triton kernels of the GPU path index slots as contiguous rows and assert it
        (a new user's review, session 54). A pure GDN model has one KV-cache group, so a contiguous ``[B, 1, 1, C]``
        page view is this layer's alone (no other group overlays its bytes), and nothing in vLLM reads the states
        by page (no prefix caching; KV connectors and offloading are refused at start,
        ``patches._check_no_kv_transfer``; its block zeroer skips mamba pages), so the region can be re-laid out:
        state ``i`` of slot ``b`` sits at ``offset_i + b * size_i``. A non-contiguous page view (a block-outermost
        layout, ``VLLM_KV_CACHE_LAYOUT``) keeps vLLM's strided views on the CPU, which the C++ CPU ops and the
        references take, and is refused on CUDA.
        """
        if not kv_cache.is_contiguous():
            if kv_cache.is_cuda:  # the Triton kernels need one contiguous tensor per state
                raise RuntimeError("vllm_specla: a block-outermost KV cache layout gives gated_deltanet layers "
                                   "strided state pages, which its GPU kernels cannot take; leave "
                                   "VLLM_KV_CACHE_LAYOUT unset (or a layer-outermost layout)")
            super().bind_kv_cache(kv_cache)
            return
        raw, B, off = kv_cache.reshape(-1), kv_cache.shape[0], 0
        states = []
        for shape, dtype in zip(self.get_state_shape(), self.get_state_dtype(), strict=True):
            item = torch.empty((), dtype=dtype).element_size()
            n = B * math.prod(shape) * item
            if off % item:
                raise RuntimeError(f"state offset {off} is not a multiple of {dtype}'s {item} bytes")
            states.append(raw[off:off + n].view(dtype).view(B, *shape))
            off += n
        if off > raw.numel():
            raise RuntimeError(f"the layer's states need {off} bytes, its page region has {raw.numel()}")
        self.kv_cache = tuple(states)

    def layer_state(self) -> LayerState:
        return LayerState(*self.kv_cache)

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, h: torch.Tensor, plan: StepPlan | None) -> torch.Tensor:
        if plan is None:  # profile / dummy run: no state yet; keep shapes and weight traffic
            return self.o_proj(torch.zeros(h.shape[0], self.dims.value_dim, dtype=h.dtype, device=h.device))[0]
        y = self.in_proj_qkvg(h)[0]
        x, gate = (y[:, :self.conv_channels], y[:, self.conv_channels:]) if self.config.use_gate else (y, None)
        a, b = self.in_proj_ab(h)[0].chunk(2, -1)
        conv_w = (torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight], 0)[:, 0, :]
                  if self.config.use_short_conv else None)
        o = gdn_mix(x, a, b, gate, dims=self.dims, conv_weight=conv_w,
                    A_log=self.A_log, dt_bias=self.dt_bias, o_norm_weight=self.o_norm.weight,
                    norm_eps=self.config.norm_eps, gate_act=self.config.output_gate_activation,
                    allow_neg_eigval=self.config.allow_neg_eigval, plan=plan, state=self.layer_state())
        return self.o_proj(o)[0]


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class _MLP(nn.Module):
    def __init__(self, config, prefix: str, quant_config=None):
        super().__init__()
        D, I = config.hidden_size, config.mlp_intermediate_size
        # gate_proj | up_proj as one GEMM (load_weights: STACKED_PARAMS)
        self.gate_up_proj = MergedColumnParallelLinear(D, [I, I], bias=False, quant_config=quant_config,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(I, D, bias=False, input_is_parallel=True, quant_config=quant_config,
                                           prefix=f"{prefix}.down_proj")

    def forward(self, x):
        gate, up = self.gate_up_proj(x)[0].chunk(2, -1)
        return self.down_proj(F.silu(gate) * up)[0]


class _Block(nn.Module):
    def __init__(self, config, layer_idx: int, prefix: str, max_window: int, quant_config=None):
        super().__init__()
        self.attn_norm = _RMSNorm(config.hidden_size, config.norm_eps)
        self.attn = SpeclaGDNAttention(config, layer_idx, f"{prefix}.attn", max_window, quant_config)
        self.mlp_norm = _RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = _MLP(config, f"{prefix}.mlp", quant_config)

    def forward(self, h, plan):
        h = h + self.attn(self.attn_norm(h), plan)
        return h + self.mlp(self.mlp_norm(h))


class _Model(nn.Module):
    def __init__(self, config, prefix: str, max_window: int, quant_config=None):
        super().__init__()
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size, prefix=f"{prefix}.embeddings")
        self.layers = nn.ModuleList(
            _Block(config, i, f"{prefix}.layers.{i}", max_window, quant_config) for i in range(config.num_hidden_layers)
        )
        self.norm = _RMSNorm(config.hidden_size, config.norm_eps)


class SpeclaGDNForCausalLM(nn.Module, HasInnerState, IsHybrid):
    """vLLM model for fla ``GatedDeltaNetForCausalLM`` checkpoints, with SpecLA state pages.

    ``forward`` returns the final-normed hidden states ``[num_tokens, D]`` (the LM head's input,
    also the EAGLE drafter's feature). The runner sets the step plan with :meth:`set_step_plan`.
    """

    # the checkpoint's names of the merged layers' parts (STACKED_PARAMS): vLLM's quantization configs match ignore
    # lists written with them (``is_layer_skipped``), as for its own models
    packed_modules_mapping = {"in_proj_qkvg": ["q_proj", "k_proj", "v_proj", "g_proj"],
                              "in_proj_ab": ["a_proj", "b_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        check_supported(config)
        config = as_gdn_config(config)
        self.config = config
        self.vllm_config = vllm_config
        self.max_window = _max_window(vllm_config)
        quant_config = vllm_config.quant_config
        self.model = _Model(config, "model", self.max_window, quant_config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix="lm_head")
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embeddings)
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self._plan: StepPlan | None = None
        self.book: SlotBook | None = None

    # ---- IsHybrid ------------------------------------------------------------------------------
    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        cfg = as_gdn_config(vllm_config.model_config.hf_config)
        return tuple(layer_state_shapes(cfg, _max_window(vllm_config), vllm_config.parallel_config.tensor_parallel_size))

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig):
        return (torch.float32,) * len(cls.get_mamba_state_shape_from_config(vllm_config))

    @classmethod
    def get_mamba_state_copy_func(cls):
        raise NotImplementedError(
            "vllm_specla runs GDN models with prefix caching off (state pages hold SpecLA factor banks)"
        )

    # ---- step plan / slot book ---------------------------------------------------------------
    def layers_states(self) -> list[LayerState]:
        return [blk.attn.layer_state() for blk in self.model.layers]

    def slot_book(self) -> SlotBook:
        """Per-slot SpecLA bookkeeping, sized to the bound state pool (created on first use)."""
        if self.book is None:
            n = self.model.layers[0].attn.kv_cache[0].shape[0]
            self.book = SlotBook(n, device=self.model.layers[0].attn.kv_cache[0].device)
        return self.book

    def set_step_plan(self, plan: StepPlan | None) -> None:
        """The SpecLA plan (prefill / verify rows, slots, windows, banks) the next ``forward`` runs
        on; set by the model runner before each step, None for plain vLLM batches."""
        self._plan = plan

    def commit(self, slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Fold the first ``num_accepted`` factors of each slot's latest bank into its state
        (DeltaConstruct + conv window), i.e. immediate commit or a flush."""
        banks = self.slot_book().bank_sel[slots]
        for st in self.layers_states():
            recover(st.ssm, slots, st.bank_k, st.bank_v, st.bank_g, banks, num_accepted)
            conv_commit(st.conv, slots, st.bank_x, banks, num_accepted)

    def flush(self, slots: torch.Tensor) -> None:
        """Commit any pending factors of ``slots`` now (before anything else reads the state)."""
        book = self.slot_book()
        pending = book.pending_len[slots]
        if bool((pending > 0).any()):
            self.commit(slots, pending)
            book.reset(slots)

    # ---- vLLM model API ------------------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embeddings(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        h = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        plan = self._plan
        if get_forward_context().attn_metadata is None:
            plan = None  # profile / dummy run
        elif plan is not None and plan.num_tokens > h.shape[0]:
            raise RuntimeError(f"step plan covers {plan.num_tokens} tokens, the batch has {h.shape[0]}")
        for blk in self.model.layers:
            h = blk(h, plan)
        return self.model.norm(h)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load fla checkpoint tensors; the separate projections go into their merged layer's shards (vLLM's
        ``stacked_params_mapping`` pattern, e.g. ``vllm/model_executor/models/llama.py``). Returns the loaded
        parameter names. Raises KeyError on a tensor the model has no parameter for."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, w in weights:
            if name.endswith(".attn.D"):  # legacy m-a-p scalars that current fla ignores
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            shard = None
            for merged, part, shard_id in STACKED_PARAMS:
                if part in name and (part != ".attn.g_proj." or self.config.use_gate):  # (a stray g_proj: KeyError)
                    name, shard = name.replace(part, merged), shard_id
                    break
            if name not in params:
                raise KeyError(f"unexpected parameter {name!r} in the checkpoint")
            p = params[name]
            loader = getattr(p, "weight_loader", default_weight_loader)
            if shard is None:
                loader(p, w)
            else:
                loader(p, w, shard)
            loaded.add(name)
        if self.config.tie_word_embeddings:
            loaded.add("lm_head.weight")
        return loaded
