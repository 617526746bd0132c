"""Target-aligned EAGLE-style drafter (ALGORITHMS.md §8; EAGLE-1, arXiv 2401.15077).

One decoder block fed with ``fc([embed(x_{t+1}); f_t])`` where ``f_t`` is the target's final
hidden feature (after its final norm, the LM head's input) and ``x_{t+1}`` the token that
followed it; it predicts ``f_{t+1}``, read out through the target's frozen LM head. The
embedding and LM head are the target's (not stored in the drafter checkpoint).

Layer type: a Gated DeltaNet block (the target's own block class). It keeps the drafter
stateful-linear like the target: O(1) memory per request and the same state-slot machinery
(conv window + recurrent state), so drafting never needs a KV cache, and rolling back to the
accepted prefix is done by recomputing the few accepted positions from the committed drafter
state (``vllm_specla/core/drafting.py``).

Checkpoint directory: ``config.json`` (a ``gated_deltanet`` config with ``num_hidden_layers: 1``
and ``"specla_drafter": "eagle"``) and safetensors with ``fc.weight [D, 2D]``,
``layers.0.*`` (fla GDN block names), ``norm.weight``.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn as nn

from vllm_specla.core.state import LayerState, StepPlan
from vllm_specla.models.config import GatedDeltaNetConfig
from vllm_specla.models.gdn import GatedDeltaNetBlock, RMSNormParams, iter_safetensors, resolve_dtype


class EagleDrafter(nn.Module):
    """EAGLE-style one-block GDN drafter.

    ``forward(tokens [N], feats [N, D], embed, plan, states) -> f_hat [N, D]`` on state slots;
    ``forward_sequence(tokens [B, T], feats [B, T, D], embed) -> f_hat [B, T, D]`` from zero
    state (training). Logits: ``target.lm_head(f_hat)``.
    """

    def __init__(self, config: GatedDeltaNetConfig):
        super().__init__()
        self.config = config
        D = config.hidden_size
        self.fc = nn.Linear(2 * D, D, bias=False)
        self.layers = nn.ModuleList(GatedDeltaNetBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNormParams(D, config.norm_eps)

    def _inp(self, tokens: torch.Tensor, feats: torch.Tensor, embed: nn.Embedding) -> torch.Tensor:
        return self.fc(torch.cat([embed(tokens), feats.to(self.fc.weight.dtype)], -1))

    def forward(self, tokens, feats, embed, plan: StepPlan, states: list[LayerState]) -> torch.Tensor:
        h = self._inp(tokens, feats, embed)
        for layer, st in zip(self.layers, states):
            h = layer(h, plan, st)
        return self.norm(h)

    def forward_sequence(self, tokens, feats, embed) -> torch.Tensor:
        h = self._inp(tokens, feats, embed)
        for layer in self.layers:
            h = layer.forward_sequence(h)
        return self.norm(h)

    def init_weights(self, seed: int = 0, std: float = 0.02) -> "EagleDrafter":
        from vllm_specla.models.gdn import GatedDeltaNetForCausalLM  # noqa: PLC0415

        GatedDeltaNetForCausalLM.init_weights(self, seed=seed, std=std)  # same name-based rules
        return self


def drafter_config_from_target(target: GatedDeltaNetConfig, **overrides) -> GatedDeltaNetConfig:
    """A one-block drafter config with the target's hidden size and vocabulary."""
    d = target.to_dict()
    for k in ("model_type", "architectures", "transformers_version"):
        d.pop(k, None)
    d.update(num_hidden_layers=1, specla_drafter="eagle")
    d.update(overrides)
    return GatedDeltaNetConfig(**d)


def load_eagle_drafter(path: str, dtype: torch.dtype | str = torch.float32, device="cpu") -> EagleDrafter:
    """Load an EAGLE drafter checkpoint directory (format in the module docstring).

    ``dtype``: a ``torch.dtype`` or a name :func:`~vllm_specla.models.gdn.resolve_dtype` takes (``"bf16"``, ...),
    as :func:`~vllm_specla.models.gdn.load_fla_checkpoint`.

    Raises:
        ValueError: the config is not an EAGLE drafter; ``dtype`` not a float32 / bfloat16 / float16 dtype or name.
        KeyError: parameter names do not match.
    """
    dtype = resolve_dtype(dtype)
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    if raw.get("specla_drafter") != "eagle":
        raise ValueError(f"{path!r}: config.json has no \"specla_drafter\": \"eagle\" (not an EAGLE drafter)")
    cfg = GatedDeltaNetConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    model = EagleDrafter(cfg)
    params = dict(model.named_parameters())
    seen = set()
    for name, t in iter_safetensors(path):
        if name not in params:
            raise KeyError(f"unexpected parameter {name!r} in drafter checkpoint {path!r}")
        with torch.no_grad():
            params[name].copy_(t.reshape(params[name].shape))
        seen.add(name)
    if set(params) - seen:
        raise KeyError(f"drafter checkpoint {path!r} lacks parameters: {sorted(set(params) - seen)[:5]}")
    return model.to(device=device, dtype=dtype).eval()


def is_eagle_drafter_dir(path: str) -> bool:
    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f).get("specla_drafter") == "eagle"
    except (OSError, ValueError):
        return False
