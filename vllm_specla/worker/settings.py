"""Where the SpecLA settings live inside a vLLM config (``additional_config["specla"]``)."""

from __future__ import annotations

from typing import Any

from vllm_specla.config import SpecLAConfig

ADDITIONAL_CONFIG_KEY = "specla"
PROPOSER_QUALNAME = "vllm_specla.worker.proposer.SpeclaProposer"


def specla_settings(vllm_config: Any) -> SpecLAConfig | None:
    """The run's :class:`SpecLAConfig`, or None when SpecLA is not active."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    raw = extra.get(ADDITIONAL_CONFIG_KEY) if isinstance(extra, dict) else None
    if raw is None:
        return None
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or getattr(spec, "model", None) != PROPOSER_QUALNAME:
        return None
    return SpecLAConfig.parse(raw)
