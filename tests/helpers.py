"""Test helpers: tiny checkpoints and the tie-aware greedy comparison (ALGORITHMS.md §10.6)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vllm_specla.models.config import GatedDeltaNetConfig
from vllm_specla.models.drafter import EagleDrafter, drafter_config_from_target
from vllm_specla.models.gdn import GatedDeltaNetForCausalLM

TIE_TOL = 1e-4  # fp32: a divergence counts only where AR's top-2 logit gap exceeds this

TINY = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, num_v_heads=4, head_dim=32, expand_v=1.0,
            vocab_size=96, hidden_ratio=2, eos_token_id=2, bos_token_id=1, tie_word_embeddings=False,
            max_position_embeddings=4096)


def save_checkpoint(model: torch.nn.Module, config: GatedDeltaNetConfig, path: Path, extra: dict | None = None) -> Path:
    """Write config.json + model.safetensors (fla parameter names)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    d = config.to_dict()
    d["model_type"] = "gated_deltanet"
    d["architectures"] = ["GatedDeltaNetForCausalLM"]
    d.update(extra or {})
    (path / "config.json").write_text(json.dumps(d, indent=1))
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(sd, str(path / "model.safetensors"))
    return path


def make_tiny_pair(root: Path, **overrides) -> dict[str, str]:
    cfg = GatedDeltaNetConfig(**{**TINY, **overrides})
    target = GatedDeltaNetForCausalLM(cfg).init_weights(seed=7, std=0.1)
    out = {"target": str(save_checkpoint(target, cfg, root / "target"))}
    out["same"] = str(save_checkpoint(target, cfg, root / "same"))
    pert = GatedDeltaNetForCausalLM(cfg)
    pert.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in pert.named_parameters():
            if p.dim() == 2 and "embeddings" not in n and "lm_head" not in n:
                p.add_(torch.randn(p.shape, generator=g) * p.std() * 0.2)
    out["perturbed"] = str(save_checkpoint(pert, cfg, root / "perturbed"))
    dcfg = drafter_config_from_target(cfg)
    eagle = EagleDrafter(dcfg).init_weights(seed=11, std=0.1)
    out["random_eagle"] = str(save_checkpoint(eagle, dcfg, root / "random_eagle", {"specla_drafter": "eagle"}))
    # token frequencies for draft_vocab_size (core/draft_vocab.py): a fixed random ranking
    from vllm_specla.core.draft_vocab import save_token_counts  # noqa: PLC0415

    counts = torch.randint(0, 1000, (dcfg.vocab_size,), generator=torch.Generator().manual_seed(13)).tolist()
    save_token_counts(out["random_eagle"], counts, "tests/helpers.py: random")
    return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(model: GatedDeltaNetForCausalLM, tokens: list[int]) -> float:
    """AR's top-2 logit gap for the next token after ``tokens`` (full-sequence reference)."""
    with torch.no_grad():
        lg = model.forward_sequence(torch.tensor([tokens]))[0, -1]
    t2 = lg.topk(2).values
    return float(t2[0] - t2[1])


def assert_greedy_equal(model, prompts, ar_outs, spec_outs, tol: float = TIE_TOL) -> int:
    """Assert spec == AR per request, allowing a divergence only at an AR near-tie (gap < tol).

    Returns the number of tie-flips (reported by tests).
    """
    flips = 0
    for i, (p, a, s) in enumerate(zip(prompts, ar_outs, spec_outs)):
        j = first_divergence(a, s)
        if j is None:
            continue
        if j >= min(len(a), len(s)):
            raise AssertionError(f"request {i}: lengths differ ({len(a)} AR vs {len(s)} spec) with equal prefix")
        gap = top2_gap(model, list(p) + a[:j])
        assert gap < tol, f"request {i}: diverges at output {j} (AR {a[j]} vs spec {s[j]}), top-2 gap {gap:.2e} >= {tol}"
        flips += 1
    return flips


def runtime_ar_outputs(tgt, prompts: torch.Tensor, steps: int, capacity: int) -> list[list[int]]:
    """The vLLM-free decode runtime's AR tokens for ``prompts [B, P]`` after ``steps`` steps (the
    lossless reference of the runtime tests); ``tgt``: a ``runtime.fused_model.FusedTarget``."""
    from vllm_specla.runtime.decode import DecodeRuntime

    ar = DecodeRuntime(tgt, prompts.shape[0], "ar", output_capacity=capacity)
    ar.prefill(prompts)
    ar.run(steps)
    return ar.outputs()
