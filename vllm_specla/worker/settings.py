"""Where the SpecLA settings live inside a vLLM config (``additional_config["specla"]``)."""

from __future__ import annotations

import os
from typing import Any

from vllm_specla.config import SpecLAConfig

ADDITIONAL_CONFIG_KEY = "specla"
PROPOSER_QUALNAME = "vllm_specla.worker.proposer.SpeclaProposer"
# ModelRunnerOutput attribute carrying a step's drafts to the engine core (runner.py, patches.py)
INLINE_DRAFTS_ATTR = "specla_draft_token_ids"


def inline_drafts_enabled() -> bool:
    """Drafts travel with ``sample_tokens``' output (default); ``VLLM_SPECLA_INLINE_DRAFTS=0``
    restores vLLM's separate ``take_draft_token_ids`` RPC per step."""
    return os.environ.get("VLLM_SPECLA_INLINE_DRAFTS", "1").strip().lower() not in ("0", "false", "no", "off")


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
