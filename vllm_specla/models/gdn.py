"""Plain-torch Gated DeltaNet causal LM on state slots (vLLM-free core).

Parameter names are fla 0.6.0's (``fla/models/gated_deltanet/modeling_gated_deltanet.py``,
``fla/layers/gated_deltanet.py``), so an fla checkpoint loads 1:1 with :func:`load_fla_checkpoint`.
The token mixer math after the projections (:func:`gdn_mix`) is shared with the vLLM model class
(``vllm_specla/worker/model.py``): one implementation of conv, gating, prefill, verify and output
norm on state slots, used by vLLM, by the vLLM-free runtime and by the tests.

Layer math (ALGORITHMS.md §1): ``x = [W_q h; W_k h; W_v h]``; ``q,k,v = SiLU(causal conv(x))``;
``g = -exp(A_log) softplus(W_a h + dt_bias)``; ``beta = sigmoid(W_b h)``; gated delta rule with
q/k l2norm; ``o = RMSNorm(o) * act(W_g h)`` per value head; ``o_proj``.
"""

from __future__ import annotations

import json
import os
from typing import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from vllm_specla.core.state import LayerState, StepPlan
from vllm_specla.models.config import GatedDeltaNetConfig, UnsupportedConfigError, check_supported
from vllm_specla.ops import fused
from vllm_specla.ops.chain_verify import chain_verify, conv_verify
from vllm_specla.ops.prefill import causal_conv1d_prefill, chunk_prefill
from vllm_specla.ops.tree_verify import tree_conv, tree_verify
from vllm_specla.ops.reference import (
    chunk_gated_delta_rule_ref,
    gdn_gating_ref,
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, cast back to ``x.dtype`` (fla ``RMSNorm``; :func:`ops.fused.rms_norm_ref`,
    differentiable: training and the model's norms use it)."""
    return fused.rms_norm_ref(x, weight, eps)


class GDNDims:
    """Local (per tensor-parallel rank) head sizes of one GDN layer."""

    def __init__(self, config: GatedDeltaNetConfig, tp_size: int = 1):
        self.H = config.num_heads // tp_size
        self.HV = config.n_v_heads // tp_size
        self.K = config.head_k_dim
        self.V = config.head_v_dim
        self.W = config.conv_size
        self.key_dim = self.H * self.K
        self.value_dim = self.HV * self.V
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.scale = self.K**-0.5


def gdn_mix(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor | None,
    *,
    dims: GDNDims,
    conv_weight: torch.Tensor | None,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    o_norm_weight: torch.Tensor,
    norm_eps: float,
    gate_act: str,
    allow_neg_eigval: bool,
    plan: StepPlan,
    state: LayerState,
) -> torch.Tensor:
    """The GDN token mixer between in- and out-projections, on state slots.

    Args:
        x: ``[N, C]`` raw conv input (q|k|v projections); a, b: ``[N, HV]``; gate: ``[N, HV*V]``
        or None (``use_gate=False``). conv_weight: ``[C, W]`` or None (``use_short_conv=False``:
        plain SiLU). plan: this step's :class:`StepPlan`; state: this layer's :class:`LayerState`.
    Returns:
        ``[N, HV*V]`` normed, gated mixer output in ``x.dtype`` (the input of ``o_proj``).
    """
    N = x.shape[0]
    if N > plan.num_tokens:  # padded batch (e.g. CUDA-graph sizes): padding rows get zeros
        out = torch.zeros(N, dims.HV * dims.V, dtype=x.dtype, device=x.device)
        n = plan.num_tokens
        out[:n] = gdn_mix(x[:n], a[:n], b[:n], gate[:n] if gate is not None else None, dims=dims,
                          conv_weight=conv_weight, A_log=A_log, dt_bias=dt_bias, o_norm_weight=o_norm_weight,
                          norm_eps=norm_eps, gate_act=gate_act, allow_neg_eigval=allow_neg_eigval,
                          plan=plan, state=state)
        return out
    H, HV, K, V = dims.H, dims.HV, dims.K, dims.V
    y = torch.empty(N, dims.conv_dim, dtype=torch.float32, device=x.device)
    o = torch.empty(N, HV, V, dtype=torch.float32, device=x.device)
    g_all, beta_all = fused.gdn_gating(a, b, A_log, dt_bias, allow_neg_eigval)  # Triton on CUDA

    def pick(t, idx):
        return t if idx is None else t.index_select(0, idx)

    def put(dst, idx, val):
        if idx is None:
            dst.copy_(val)
        else:
            dst.index_copy_(0, idx, val)

    pf, vf = plan.prefill, plan.verify
    # ---- short conv -----------------------------------------------------------------------
    if conv_weight is None:
        y = F.silu(x.float())
        if vf is not None and vf.speculative:
            xv = pick(x, vf.token_idx).float()
            for r, (s, e) in enumerate(zip(vf.cu_seqlens[:-1].tolist(), vf.cu_seqlens[1:].tolist())):
                state.bank_x[int(vf.slots[r]), int(vf.write_bank[r]), : e - s] = xv[s:e]
    else:
        if pf is not None:
            put(y, pf.token_idx, causal_conv1d_prefill(  # CUDA: the Triton verify-window conv on whole prompts; CPU: per row
                pick(x, pf.token_idx), conv_weight, pf.cu_seqlens, state.conv, pf.slots, pf.has_initial_state))
        if vf is not None and vf.parents is not None:
            put(y, vf.token_idx, tree_conv(
                pick(x, vf.token_idx), conv_weight, vf.cu_seqlens, vf.parents, state.conv, vf.slots,
                bank_x=state.bank_x, write_bank=vf.write_bank, pending_len=vf.pending_len,
                read_bank=vf.read_bank, chain=False))
        elif vf is not None:
            outs = vf.out_slots if vf.write_state else None  # (AR rows: no banks in use)
            put(y, vf.token_idx, conv_verify(
                pick(x, vf.token_idx), conv_weight, vf.cu_seqlens, state.conv, vf.slots,
                bank_x=state.bank_x if outs is None else None, write_bank=vf.write_bank, pending_len=vf.pending_len,
                read_bank=vf.read_bank, write_final_state=not vf.speculative and vf.write_state, out_slots=outs))
    q, k, v = torch.split(y, [dims.key_dim, dims.key_dim, dims.value_dim], dim=-1)
    q, k, v = q.reshape(N, H, K), k.reshape(N, H, K), v.reshape(N, HV, V)
    # ---- gated delta rule -----------------------------------------------------------------
    if pf is not None:
        idx = pf.token_idx
        init = state.ssm.index_select(0, pf.slots)
        # fresh slots may hold garbage (vLLM does not zero new blocks): select, never multiply
        init = torch.where(pf.has_initial_state[:, None, None, None], init, torch.zeros_like(init))
        o_pf, final = chunk_prefill(  # fla's chunk kernel on CUDA, the torch reference elsewhere
            pick(q, idx), pick(k, idx), pick(v, idx), pick(g_all, idx), pick(beta_all, idx),
            dims.scale, pf.cu_seqlens, initial_state=init)
        state.ssm.index_copy_(0, pf.slots, final)
        put(o, idx, o_pf)
    if vf is not None and vf.parents is not None:
        idx = vf.token_idx
        o_vf = tree_verify(
            pick(q, idx), pick(k, idx), pick(v, idx), pick(g_all, idx), pick(beta_all, idx),
            scale=dims.scale, state=state.ssm, slots=vf.slots, cu_seqlens=vf.cu_seqlens, parents=vf.parents,
            bank_k=state.bank_k, bank_v=state.bank_v, bank_g=state.bank_g, write_bank=vf.write_bank,
            pending_len=vf.pending_len, read_bank=vf.read_bank, chain=False)
        put(o, idx, o_vf)
    elif vf is not None:
        idx = vf.token_idx
        outs = vf.out_slots if vf.write_state else None
        banks = dict(bank_k=state.bank_k, bank_v=state.bank_v, bank_g=state.bank_g) if outs is None else {}
        o_vf = chain_verify(
            pick(q, idx), pick(k, idx), pick(v, idx), pick(g_all, idx), pick(beta_all, idx),
            scale=dims.scale, state=state.ssm, slots=vf.slots, cu_seqlens=vf.cu_seqlens, **banks,
            write_bank=vf.write_bank if vf.speculative else None,
            pending_len=vf.pending_len, read_bank=vf.read_bank,
            write_final_state=not vf.speculative and vf.write_state, out_slots=outs)
        put(o, idx, o_vf)
    # ---- output norm + gate (fused kernel on CUDA, the reference elsewhere) -----------------
    return fused.gated_rms_norm(o, gate, o_norm_weight, norm_eps, gate_act, x.dtype)


def gdn_mix_sequence(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor | None,
    *,
    dims: GDNDims,
    conv_weight: torch.Tensor | None,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    o_norm_weight: torch.Tensor,
    norm_eps: float,
    gate_act: str,
    allow_neg_eigval: bool,
) -> torch.Tensor:
    """Stateless full-sequence mixer for ``[B, T, *]`` inputs (training and references).

    Uses ``F.conv1d`` with causal padding and the chunked UT form from zero state; differentiable.
    """
    B, T, _ = x.shape
    H, HV, K, V = dims.H, dims.HV, dims.K, dims.V
    if conv_weight is not None:
        W = conv_weight.shape[-1]
        y = F.conv1d(F.pad(x.float().transpose(1, 2), (W - 1, 0)), conv_weight.float()[:, None, :],
                     groups=dims.conv_dim)
        y = F.silu(y).transpose(1, 2)
    else:
        y = F.silu(x.float())
    q, k, v = torch.split(y, [dims.key_dim, dims.key_dim, dims.value_dim], dim=-1)
    g, beta = gdn_gating_ref(A_log, a, dt_bias, b, allow_neg_eigval)
    cu = torch.arange(0, (B + 1) * T, T, device=x.device)
    o, _ = chunk_gated_delta_rule_ref(
        q.reshape(B * T, H, K), k.reshape(B * T, H, K), v.reshape(B * T, HV, V),
        g.reshape(B * T, HV), beta.reshape(B * T, HV), dims.scale, cu)
    gv = gate.reshape(B * T, HV * V) if gate is not None else None
    out = fused.gated_rms_norm_ref(o, gv, o_norm_weight, norm_eps, gate_act, x.dtype)  # differentiable
    return out.reshape(B, T, HV * V)


class ShortConv(nn.Module):
    """Holds an fla ``ShortConvolution`` weight ``[C, 1, W]`` (depthwise, no bias)."""

    def __init__(self, channels: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, width))


class GatedRMSNormParams(nn.Module):
    """Holds fla ``FusedRMSNormGated`` / ``RMSNorm`` weight ``[V]``."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class GatedDeltaNetMixer(nn.Module):
    """fla ``GatedDeltaNet`` layer (same parameter names) running on state slots."""

    def __init__(self, config: GatedDeltaNetConfig, layer_idx: int = 0):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        d = self.dims = GDNDims(config)
        D = config.hidden_size
        self.q_proj = nn.Linear(D, d.key_dim, bias=False)
        self.k_proj = nn.Linear(D, d.key_dim, bias=False)
        self.v_proj = nn.Linear(D, d.value_dim, bias=False)
        self.a_proj = nn.Linear(D, d.HV, bias=False)
        self.b_proj = nn.Linear(D, d.HV, bias=False)
        self.A_log = nn.Parameter(torch.empty(d.HV))
        self.dt_bias = nn.Parameter(torch.empty(d.HV))
        if config.use_short_conv:
            self.q_conv1d = ShortConv(d.key_dim, d.W)
            self.k_conv1d = ShortConv(d.key_dim, d.W)
            self.v_conv1d = ShortConv(d.value_dim, d.W)
        if config.use_gate:
            self.g_proj = nn.Linear(D, d.value_dim, bias=False)
        self.o_norm = GatedRMSNormParams(d.V)
        self.o_proj = nn.Linear(d.value_dim, D, bias=False)

    def conv_weight(self) -> torch.Tensor | None:
        """The q / k / v depthwise conv weights as one ``[conv_dim, W]`` tensor (channels in q, k, v
        order, as the fused in-projection lays them out); None without a short conv."""
        if not self.config.use_short_conv:
            return None
        return torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight], 0)[:, 0, :]

    def _proj(self, h: torch.Tensor):
        x = torch.cat([self.q_proj(h), self.k_proj(h), self.v_proj(h)], -1)
        gate = self.g_proj(h) if self.config.use_gate else None
        return x, self.a_proj(h), self.b_proj(h), gate

    def _kw(self) -> dict:
        c = self.config
        return dict(dims=self.dims, conv_weight=self.conv_weight(), A_log=self.A_log, dt_bias=self.dt_bias,
                    o_norm_weight=self.o_norm.weight, norm_eps=c.norm_eps, gate_act=c.output_gate_activation,
                    allow_neg_eigval=c.allow_neg_eigval)

    def forward(self, h: torch.Tensor, plan: StepPlan, state: LayerState) -> torch.Tensor:
        """``h [N, D]`` -> ``[N, D]`` on state slots."""
        x, a, b, gate = self._proj(h)
        return self.o_proj(gdn_mix(x, a, b, gate, plan=plan, state=state, **self._kw()))

    def forward_sequence(self, h: torch.Tensor) -> torch.Tensor:
        """``h [B, T, D]`` -> ``[B, T, D]`` from zero state (training / references)."""
        x, a, b, gate = self._proj(h)
        return self.o_proj(gdn_mix_sequence(x, a, b, gate, **self._kw()))


class GatedMLP(nn.Module):
    """fla ``GatedMLP`` (swish): ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RMSNormParams(nn.Module):
    """fla ``RMSNorm`` (weight only, no bias): ``x / rms(x) * weight`` over the last dim, in the
    input's dtype (``ops.reference.rms_norm``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class GatedDeltaNetBlock(nn.Module):
    """fla ``GatedDeltaNetBlock``: pre-norm mixer + pre-norm gated MLP, residuals."""

    def __init__(self, config: GatedDeltaNetConfig, layer_idx: int = 0):
        super().__init__()
        self.attn_norm = RMSNormParams(config.hidden_size, config.norm_eps)
        self.attn = GatedDeltaNetMixer(config, layer_idx)
        self.mlp_norm = RMSNormParams(config.hidden_size, config.norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.mlp_intermediate_size)

    def forward(self, h: torch.Tensor, plan: StepPlan, state: LayerState) -> torch.Tensor:
        h = h + self.attn(self.attn_norm(h), plan, state)
        return h + self.mlp(self.mlp_norm(h))

    def forward_sequence(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn.forward_sequence(self.attn_norm(h))
        return h + self.mlp(self.mlp_norm(h))


class GatedDeltaNetModel(nn.Module):
    """fla ``GatedDeltaNetModel``'s parameters (``embeddings``, ``layers``, final ``norm``), kept
    under fla's names so checkpoints load as they are; :class:`GatedDeltaNetForCausalLM` runs them."""

    def __init__(self, config: GatedDeltaNetConfig):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GatedDeltaNetBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNormParams(config.hidden_size, config.norm_eps)


class GatedDeltaNetForCausalLM(nn.Module):
    """fla-compatible GDN causal LM on state slots (vLLM-free).

    ``forward(input_ids [N], plan, states) -> hidden [N, D]`` (after the final norm: the feature the
    LM head and the EAGLE drafter consume); ``compute_logits(hidden) -> [N, vocab]`` float32.
    ``forward_sequence(input_ids [B, T]) -> logits [B, T, vocab]`` from zero state (training, oracle).
    """

    def __init__(self, config: GatedDeltaNetConfig):
        super().__init__()
        check_supported(config)
        self.config = config
        self.model = GatedDeltaNetModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embeddings.weight

    def forward(self, input_ids: torch.Tensor, plan: StepPlan, states: list[LayerState]) -> torch.Tensor:
        h = self.model.embeddings(input_ids)
        for layer, st in zip(self.model.layers, states):
            h = layer(h, plan, st)
        return self.model.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def hidden_sequence(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids [B, T]`` -> final-normed features ``[B, T, D]`` from zero state."""
        h = self.model.embeddings(input_ids)
        for layer in self.model.layers:
            h = layer.forward_sequence(h)
        return self.model.norm(h)

    def forward_sequence(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(self.hidden_sequence(input_ids))

    def init_weights(self, seed: int = 0, std: float = 0.02) -> "GatedDeltaNetForCausalLM":
        """fla-style random init (normal(std) linears/embeddings, A ~ U(0,16), dt in [1e-3, 0.1])."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("A_log"):
                    p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
                elif name.endswith("dt_bias"):
                    dt = torch.exp(torch.rand(p.shape, generator=gen) * (torch.log(torch.tensor(0.1)) - torch.log(torch.tensor(0.001))) + torch.log(torch.tensor(0.001))).clamp(min=1e-4)
                    p.copy_(dt + torch.log(-torch.expm1(-dt)))
                elif "norm" in name:
                    p.fill_(1.0)
                elif "conv1d" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / p.shape[-1]) ** 0.5)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self


def iter_safetensors(path: str) -> Iterable[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` from every ``*.safetensors`` file of a checkpoint directory."""
    from safetensors.torch import load_file  # noqa: PLC0415

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path!r}")
    for f in files:
        yield from load_file(os.path.join(path, f)).items()


IGNORED_CHECKPOINT_SUFFIXES = (".attn.D",)  # legacy m-a-p scalars that current fla ignores


DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
               "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
               "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def resolve_dtype(dtype, field: str = "dtype") -> torch.dtype:
    """A model dtype given as a ``torch.dtype`` or a name (``"bf16"``, ``"bfloat16"``, ``"torch.bfloat16"``,
    ``"fp32"``, ``"float32"``, ``"fp16"``, ``"float16"``, ...; case-insensitive) -> the ``torch.dtype``.

    Raises:
        ValueError: naming ``field`` and the allowed values, for anything else (float8 and integer
            dtypes included: weights are loaded in float32 / bfloat16 / float16).
    """
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        if name in DTYPE_NAMES:
            return DTYPE_NAMES[name]
    elif dtype in (torch.float32, torch.bfloat16, torch.float16):
        return dtype
    raise ValueError(f"{field}={dtype!r}: must be torch.float32 / torch.bfloat16 / torch.float16 "
                     f"or one of {sorted(DTYPE_NAMES)}")


def load_fla_checkpoint(path: str, dtype: torch.dtype | str = torch.float32,
                        device: str | torch.device = "cpu") -> GatedDeltaNetForCausalLM:
    """Load an fla ``gated_deltanet`` checkpoint directory into :class:`GatedDeltaNetForCausalLM`.

    ``dtype``: a ``torch.dtype`` or a name :func:`resolve_dtype` takes (``"bf16"``, ``"float32"``, ...).

    Raises:
        ValueError: ``dtype`` not a float32 / bfloat16 / float16 dtype or name, or ``path`` an EAGLE drafter
            checkpoint (``config.json`` ``"specla_drafter": "eagle"``: ``models.drafter.load_eagle_drafter`` loads it).
        UnsupportedConfigError: a ``model_type`` other than ``gated_deltanet``, or config fields we do not implement.
        KeyError: for missing or unexpected parameter names.
    """
    dtype = resolve_dtype(dtype)
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    if raw.get("specla_drafter") == "eagle":  # (its fc.weight was a KeyError "unexpected parameter")
        raise ValueError(f"{path!r} is an EAGLE drafter checkpoint (config.json \"specla_drafter\": \"eagle\"): load "
                         "it with vllm_specla.models.drafter.load_eagle_drafter")
    if raw.get("model_type", "gated_deltanet") != "gated_deltanet":  # (a mamba2 config loaded silently, a llama one
        # ended in KeyError "unexpected parameter": a new user's review, session 53)
        raise UnsupportedConfigError(f"{path!r}: model_type={raw['model_type']!r}: vllm_specla loads 'gated_deltanet' "
                                     "checkpoints only")
    cfg = GatedDeltaNetConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    model = GatedDeltaNetForCausalLM(cfg)
    params = dict(model.named_parameters())
    seen = set()
    for name, t in iter_safetensors(path):
        if name.endswith(IGNORED_CHECKPOINT_SUFFIXES):
            continue
        if name not in params:
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            raise KeyError(f"unexpected parameter {name!r} in checkpoint {path!r}")
        with torch.no_grad():
            params[name].copy_(t.reshape(params[name].shape))
        seen.add(name)
    missing = set(params) - seen
    if cfg.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise KeyError(f"checkpoint {path!r} lacks parameters: {sorted(missing)[:5]}")
    return model.to(device=device, dtype=dtype).eval()
