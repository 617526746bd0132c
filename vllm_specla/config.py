"""``SpecLAConfig``: the parsed, validated content of ``specla.json`` (pydantic, vLLM-free).

Users write ``{"method": "specla", "num_speculative_tokens": 4, "drafter": "path/to/drafter"}``
inline (``LLM(..., speculative_config={...})``, ``--speculative-config '{...}'``) or as a file
path (``speculative_config="specla.json"``, ``--speculative-config specla.json``). vLLM's own
``SpeculativeConfig`` rejects unknown methods and keys, so the plugin translates a SpecLA config
into vLLM's ``custom_class`` method before vLLM validates (``vllm_specla/worker/patches.py``)
and carries the SpecLA fields in ``additional_config["specla"]``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SPECLA_METHOD = "specla"


class SpecLAConfigError(ValueError):
    """A SpecLA speculative config is invalid; the message names the field and allowed values."""


class SpecLAConfig(BaseModel):
    """SpecLA speculative decoding settings (every field of ``examples/specla.json``).

    Fields:
        method: must be ``"specla"``.
        num_speculative_tokens: K >= 1, draft tokens per verify step (window = 1 + K tokens).
        drafter: path to the drafter checkpoint directory: an EAGLE-style drafter
            (``config.json`` with ``"specla_drafter": "eagle"``) or any fla ``gated_deltanet``
            causal LM sharing the target's tokenizer (a draft model).
        drafter_kind: ``"auto"`` (detect from the drafter's config.json), ``"eagle"`` or
            ``"draft_model"``.
        topology: ``"chain"`` or ``"tree"`` (top-k draft trees of depth <= K, verified in one pass
            with each node's state and conv history taken from its own ancestors).
        tree_top_k: children per expanded node and beam width per level (tree only; paper: 4).
        tree_node_budget: most draft nodes per tree (tree only); the state page's factor banks
            hold ``1 + max(K, tree_node_budget)`` window positions.
        prune_tau: confidence pruning (tree only): drop nodes whose cumulative drafter log-prob is
            below the best draft's minus ``prune_tau``; null = no pruning.
        deferred_commit: fold the accepted factors into the state at the start of the next
            verify (fused, ALGORITHMS.md §6) instead of a separate commit right after acceptance.
        recovery: ``"factors"`` (DeltaConstruct from per-token factors). ``"snapshot"`` and
            ``"replay"`` exist only as baselines in ``benchmarks/`` and are refused by the vLLM
            path.
        max_num_requests: drafter state slots (None: vLLM's ``max_num_seqs``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["specla"] = SPECLA_METHOD
    num_speculative_tokens: int = Field(ge=1, le=16)
    drafter: str
    drafter_kind: Literal["auto", "eagle", "draft_model"] = "auto"
    topology: Literal["chain", "tree"] = "chain"
    tree_top_k: int = Field(default=4, ge=1, le=8)
    tree_node_budget: int = Field(default=16, ge=1, le=64)
    prune_tau: float | None = Field(default=None, ge=0)
    deferred_commit: bool = True
    recovery: Literal["factors", "snapshot", "replay"] = "factors"
    max_num_requests: int | None = Field(default=None, ge=1)

    @field_validator("drafter")
    @classmethod
    def _drafter_exists(cls, v: str) -> str:
        if not v:
            raise ValueError("drafter must be a path to a drafter checkpoint directory")
        return v

    @property
    def max_window(self) -> int:
        """Window positions per factor bank: ``1 + K`` (chain) or ``1 + max(K, node budget)``."""
        if self.topology == "tree":
            return 1 + max(self.num_speculative_tokens, self.tree_node_budget)
        return 1 + self.num_speculative_tokens

    # ------------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, obj: Any, base_dir: str | None = None) -> "SpecLAConfig":
        """Build from a dict, a JSON string, a path to a JSON file, or a SpecLAConfig.

        A relative ``drafter`` path in a JSON file is resolved against the file's folder when it
        exists there (else against the working directory).

        Raises:
            SpecLAConfigError: missing file, invalid JSON, unknown field, bad value — one line
            naming the field and the allowed values.
        """
        if isinstance(obj, SpecLAConfig):
            return obj
        if isinstance(obj, str):
            s = obj.strip()
            if s.startswith("{"):
                try:
                    obj = json.loads(s)
                except json.JSONDecodeError as e:
                    raise SpecLAConfigError(f"speculative_config: invalid JSON: {e}") from None
            else:
                obj, base_dir = load_json_file(s), os.path.dirname(os.path.abspath(s))
        if not isinstance(obj, dict):
            raise SpecLAConfigError(f"speculative_config: expected a JSON object, got {type(obj).__name__}")
        # keys starting with "_" are documentation (JSON has no comments), e.g. "_doc" in examples/specla.json
        d = {k: v for k, v in obj.items() if not (isinstance(k, str) and k.startswith("_"))}
        if base_dir and isinstance(d.get("drafter"), str) and not os.path.isabs(d["drafter"]):
            cand = os.path.join(base_dir, d["drafter"])
            if os.path.exists(cand) and not os.path.exists(d["drafter"]):
                d["drafter"] = cand
        try:
            return cls(**d)
        except ValidationError as e:
            raise SpecLAConfigError(format_validation_error(e)) from None

    def check_drafter(self, target_vocab_size: int | None = None) -> str:
        """Check the drafter directory and vocabulary; return the resolved kind.

        Raises:
            SpecLAConfigError: drafter folder or config.json missing, wrong kind, or a vocabulary
            different from the target's.
        """
        path = self.drafter
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isdir(path):
            raise SpecLAConfigError(f"speculative_config.drafter: {path!r} is not a directory")
        if not os.path.isfile(cfg_path):
            raise SpecLAConfigError(f"speculative_config.drafter: {path!r} has no config.json")
        try:
            with open(cfg_path) as f:
                raw = json.load(f)
        except json.JSONDecodeError as e:
            raise SpecLAConfigError(f"speculative_config.drafter: {cfg_path!r} is not valid JSON: {e}") from None
        kind = "eagle" if raw.get("specla_drafter") == "eagle" else "draft_model"
        if raw.get("model_type") != "gated_deltanet" and kind == "draft_model":
            raise SpecLAConfigError(
                f"speculative_config.drafter: {path!r} is neither an EAGLE drafter nor a gated_deltanet model "
                f"(model_type={raw.get('model_type')!r})"
            )
        if self.drafter_kind != "auto" and self.drafter_kind != kind:
            raise SpecLAConfigError(
                f"speculative_config.drafter_kind={self.drafter_kind!r} but {path!r} is a {kind!r} checkpoint"
            )
        if target_vocab_size is not None and raw.get("vocab_size") != target_vocab_size:
            raise SpecLAConfigError(
                f"speculative_config.drafter: vocab_size {raw.get('vocab_size')} != target vocab_size {target_vocab_size}"
            )
        return kind


def load_json_file(path: str) -> dict:
    """Read a JSON object from ``path``. Raises SpecLAConfigError naming the file."""
    if not os.path.isfile(path):
        raise SpecLAConfigError(f"speculative_config: file {path!r} does not exist")
    try:
        with open(path) as f:
            obj = json.load(f)
    except json.JSONDecodeError as e:
        raise SpecLAConfigError(f"speculative_config: {path!r} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise SpecLAConfigError(f"speculative_config: {path!r} must hold a JSON object")
    return obj


def format_validation_error(e: ValidationError) -> str:
    """One line per problem: ``speculative_config.<field>: <message>`` (names allowed values)."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(SpecLAConfig.model_fields)
            parts.append(f"speculative_config.{loc}: unknown field (allowed: {allowed})")
        elif err["type"] == "missing":
            parts.append(f"speculative_config.{loc}: required field is missing")
        else:
            parts.append(f"speculative_config.{loc}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)


def is_specla_config(obj: Any) -> bool:
    """True when ``obj`` (dict, JSON string or JSON file path) asks for ``method: specla``."""
    if isinstance(obj, SpecLAConfig):
        return True
    if isinstance(obj, dict):
        return obj.get("method") == SPECLA_METHOD
    if isinstance(obj, str):
        s = obj.strip()
        if s.startswith("{"):
            try:
                return json.loads(s).get("method") == SPECLA_METHOD
            except (json.JSONDecodeError, AttributeError):
                return False
        if os.path.isfile(s):
            try:
                return load_json_file(s).get("method") == SPECLA_METHOD
            except SpecLAConfigError:
                return True  # parse() reports the invalid file clearly
        return s.endswith(".json")  # a missing .json path: parse() reports it
    return False
