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
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, ValidationInfo, field_validator

SPECLA_METHOD = "specla"
AUTO = "auto"
DEFAULT_MAX_AUTO_K = 8  # max_num_speculative_tokens when num_speculative_tokens is "auto"
MAX_K = 16
MAX_REQUESTS = 65536  # max_num_requests: a sanity bound (each request holds a drafter state slot)


class SpecLAConfigError(ValueError):
    """A SpecLA speculative config is invalid; the message names the field and allowed values."""


class _NamesInput(ValueError):
    """A validator's message that already names the offending input (a path, a table entry):
    :func:`format_validation_error` adds no ``(got ...)`` to it."""


class SpecLAConfig(BaseModel):
    """SpecLA speculative decoding settings (every field of ``examples/specla.json``).

    Fields:
        method: must be ``"specla"``.
        num_speculative_tokens: K in 1..16, draft tokens per verify step (window = 1 + K tokens);
            or ``"auto"``: K is chosen per step in 0..``max_num_speculative_tokens`` by the
            draft-length policy (``core/policy.py``) from measured step times and acceptance, so
            that SpecLA does not run slower than AR (chains only).
        max_num_speculative_tokens: with ``"auto"``: the largest K (1..16, default 8); it sizes the
            factor banks and is the K vLLM's scheduler is told. Only valid with ``"auto"``.
        step_cost_table: with ``"auto"``: seed step costs ``{"B": {"T": seconds}}`` (a JSON file
            path, relative to the config file, or an object) measured offline on the serving
            machine; the policy starts from it and keeps learning. Only valid with ``"auto"``.
        drafter: path to the drafter checkpoint directory: an EAGLE-style drafter
            (``config.json`` with ``"specla_drafter": "eagle"``) or any fla ``gated_deltanet``
            causal LM sharing the target's tokenizer (a draft model).
        drafter_kind: ``"auto"`` (detect from the drafter's config.json), ``"eagle"`` or
            ``"draft_model"``.
        topology: ``"chain"`` or ``"tree"`` (top-k draft trees of depth <= K, verified in one pass
            with each node's state and conv history taken from its own ancestors).
        tree_top_k: children per expanded node and nodes expanded per level (tree only; paper: 4).
        tree_node_budget: most draft nodes per tree (tree only): the best candidates by cumulative
            drafter log-prob at any depth up to K (``core/drafting.py`` ``step_tree``); the state
            page's factor banks hold ``1 + max(K, tree_node_budget)`` window positions.
        prune_tau: confidence pruning (tree only): drop nodes whose cumulative drafter log-prob is
            below the best draft's minus ``prune_tau``; null = no pruning.
        deferred_commit: fold the accepted factors into the state at the start of the next
            verify (fused, ALGORITHMS.md §6) instead of a separate commit right after acceptance.
        recovery: ``"factors"`` (DeltaConstruct from per-token factors). ``"snapshot"`` and
            ``"replay"`` exist only as baselines in ``benchmarks/`` and are refused by the vLLM
            path.
        max_num_requests: the most requests decoding at once per engine (data-parallel rank),
            1..65536: the drafter keeps a state slot per running request. Caps vLLM's
            ``max_num_seqs`` (its default is lowered to it); below a ``max_num_seqs`` the user gave
            it is an error (``worker/patches.py``). None: ``max_num_seqs``.
        draft_vocab_size: EAGLE drafters only: draft over this many most frequent tokens
            (frequency-ranked draft vocabulary, FR-Spec arXiv 2502.14856; counts from the drafter
            directory's ``token_counts.json``, ``core/draft_vocab.py``), 1..vocab size. Its LM-head
            read shrinks by ``vocab / draft_vocab_size``; verification stays full-vocabulary, so
            output is unchanged and only acceptance can drop. None = the full vocabulary.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["specla"] = SPECLA_METHOD
    num_speculative_tokens: int | Literal["auto"]
    max_num_speculative_tokens: int | None = Field(default=None, ge=1, le=MAX_K)
    step_cost_table: str | dict | None = None
    drafter: str
    drafter_kind: Literal["auto", "eagle", "draft_model"] = "auto"
    topology: Literal["chain", "tree"] = "chain"
    tree_top_k: int = Field(default=4, ge=1, le=8)
    tree_node_budget: int = Field(default=16, ge=1, le=64)
    prune_tau: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    deferred_commit: StrictBool = True
    recovery: Literal["factors", "snapshot", "replay"] = "factors"
    max_num_requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    draft_vocab_size: int | None = Field(default=None, ge=1)

    @field_validator("num_speculative_tokens", mode="before")
    @classmethod
    def _k_or_auto(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == AUTO:
            return AUTO
        if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():  # "4", not "٣"
            v = int(v.strip())
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_K:
            raise ValueError(f"must be an integer 1..{MAX_K} or \"auto\"")
        return v

    @field_validator("max_num_speculative_tokens", "step_cost_table")
    @classmethod
    def _auto_only(cls, v: Any, info: ValidationInfo) -> Any:
        k = info.data.get("num_speculative_tokens")
        if v is not None and k is not None and k != AUTO:
            raise ValueError(f"only used with num_speculative_tokens=\"auto\" (num_speculative_tokens is {k})")
        if v is not None and info.field_name == "step_cost_table":
            from vllm_specla.core.policy import load_cost_table  # noqa: PLC0415

            # a file is read here, so every worker process gets the table itself, not a path; a path is reported
            # absolute (as the drafter's), where a relative one was looked for
            try:
                table = load_cost_table(os.path.abspath(v) if isinstance(v, str) else v)
            except ValueError as e:  # (its message names the file or the entry, with what it got)
                raise _NamesInput(str(e)) from None
            v = {str(b): {str(t): s for t, s in row.items()} for b, row in table.items()}
        return v

    @field_validator("draft_vocab_size", "max_num_requests", "max_num_speculative_tokens", "tree_top_k",
                     "tree_node_budget", mode="before")
    @classmethod
    def _int_not_bool(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, bool):  # pydantic would take true as 1
            raise ValueError(f"must be {_allowed_range(info.field_name)}, not a boolean")
        return v

    @field_validator("drafter")
    @classmethod
    def _drafter_exists(cls, v: str) -> str:
        if not v:
            raise ValueError(_DRAFTER_WANTED)
        return v

    @field_validator("topology")
    @classmethod
    def _auto_chain_only(cls, v: str, info: ValidationInfo) -> str:
        if v == "tree" and info.data.get("num_speculative_tokens") == AUTO:
            raise ValueError('num_speculative_tokens="auto" supports topology "chain" only')
        return v

    @field_validator("topology", "drafter_kind", "recovery", mode="before")
    @classmethod
    def _lower_case(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v  # "Tree", "EAGLE": as "method" is read

    @field_validator("prune_tau", mode="before")
    @classmethod
    def _float_not_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # pydantic would take true as 1.0
            raise ValueError(f"must be {_allowed_range('prune_tau')}, not a boolean")
        return v

    @field_validator("step_cost_table", mode="before")
    @classmethod
    def _table_type(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, (str, dict)):
            raise ValueError('must be a JSON file path or an object {"B": {"T": seconds}}')
        return v

    @field_validator("tree_top_k", "tree_node_budget", "prune_tau")
    @classmethod
    def _tree_only(cls, v: Any, info: ValidationInfo) -> Any:
        topo = info.data.get("topology")
        if topo == "chain" and v != cls.model_fields[info.field_name].default:
            raise ValueError('only used with topology "tree" (topology is "chain")')
        return v

    @property
    def auto_draft_length(self) -> bool:
        """True when K is chosen per step by the draft-length policy (``"auto"``)."""
        return self.num_speculative_tokens == AUTO

    @property
    def k_max(self) -> int:
        """The largest K: ``num_speculative_tokens``, or ``max_num_speculative_tokens`` (default
        8) with ``"auto"``. vLLM's ``SpeculativeConfig.num_speculative_tokens`` gets this value."""
        if self.auto_draft_length:
            return self.max_num_speculative_tokens or DEFAULT_MAX_AUTO_K
        return self.num_speculative_tokens

    @property
    def max_window(self) -> int:
        """Window positions per factor bank: ``1 + K`` (chain) or ``1 + max(K, node budget)``."""
        if self.topology == "tree":
            return 1 + max(self.k_max, self.tree_node_budget)
        return 1 + self.k_max

    # ------------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, obj: Any, base_dir: str | None = None) -> "SpecLAConfig":
        """Build from a dict, a JSON string, a path to a JSON file, or a SpecLAConfig.

        A relative ``drafter`` path in a JSON file is resolved against the file's folder when it
        exists there (else against the working directory). ``model`` (vLLM's name for the draft
        model) is taken as ``drafter`` (:func:`drafter_alias`).

        Raises:
            SpecLAConfigError: missing file, invalid JSON, unknown field, bad value, both ``model``
            and ``drafter`` — one line naming the field and the allowed values.
        """
        if isinstance(obj, SpecLAConfig):
            return obj
        if isinstance(obj, str):
            s = obj.strip()
            if is_inline_json(s):
                obj = parse_inline_json(s)
            else:
                obj, base_dir = load_json_file(s), os.path.dirname(os.path.abspath(s))
        if not isinstance(obj, dict):
            raise SpecLAConfigError(f"speculative_config: expected a JSON object of fields, got {type(obj).__name__} "
                                    f"{obj!r:.60}")
        bad_keys = [k for k in obj if not isinstance(k, str)]
        if bad_keys:
            raise SpecLAConfigError(f"speculative_config: field names must be strings, got {bad_keys[0]!r} "
                                    f"(allowed: {', '.join(cls.model_fields)})")
        # keys starting with "_" are documentation (JSON has no comments), e.g. "_doc" in examples/specla.json
        d = normalize_method({k: v for k, v in obj.items() if not (isinstance(k, str) and k.startswith("_"))},
                             missing_is_specla=True)
        if d.get("method") == SPECLA_METHOD:
            d = drafter_alias(d)
        if base_dir:
            resolve_file_paths(d, base_dir)
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
        if self.draft_vocab_size is not None:
            self.draft_vocab_ids(raw.get("vocab_size"), kind)
        return kind

    def draft_vocab_ids(self, vocab_size: int | None, kind: str):
        """The draft vocabulary's ``[draft_vocab_size]`` int64 token ids (ascending), or None when
        ``draft_vocab_size`` is unset or the whole vocabulary (``core/draft_vocab.py``).

        Raises:
            SpecLAConfigError: a draft model (not EAGLE), no or bad ``token_counts.json``, or a size
            outside 1..vocab size.
        """
        if self.draft_vocab_size is None:
            return None
        from vllm_specla.core.draft_vocab import draft_vocab_ids, load_token_counts  # noqa: PLC0415

        if kind != "eagle":
            raise SpecLAConfigError("speculative_config.draft_vocab_size: only EAGLE drafters (which read the "
                                    "target's LM head) take a draft vocabulary; remove it for a draft model")
        if self.topology == "tree" and self.draft_vocab_size < self.tree_top_k:
            raise SpecLAConfigError(f"speculative_config.draft_vocab_size={self.draft_vocab_size} is below "
                                    f"tree_top_k={self.tree_top_k}: a tree level needs tree_top_k distinct draft "
                                    f"tokens (raise draft_vocab_size or lower tree_top_k)")
        try:
            counts = load_token_counts(self.drafter, vocab_size)
            ids = draft_vocab_ids(counts, self.draft_vocab_size)
            return None if ids.numel() == len(counts) else ids
        except (OSError, ValueError) as e:
            raise SpecLAConfigError(f"speculative_config.draft_vocab_size: {e}") from None


def resolve_file_paths(spec: dict, base_dir: str) -> dict:
    """Resolve a config file's relative ``drafter`` / ``step_cost_table`` paths (in place) against
    ``base_dir``, the file's folder, where they exist there, even where the working directory holds
    a same-named folder (otherwise they stay relative to the working directory). ``model``, vLLM's
    name for the drafter (the plugin's alias of ``drafter``), too, where ``method`` is ``specla``
    itself (a file without ``method`` may be one of vLLM's, whose ``model`` stays as written).
    Returns ``spec``."""
    specla = str(spec.get("method", "")).strip().lower() == SPECLA_METHOD
    for key in ("drafter", "step_cost_table") + (("model",) if specla else ()):
        v = spec.get(key)
        if isinstance(v, str) and v and not os.path.isabs(v):
            cand = os.path.join(base_dir, v)
            if os.path.exists(cand):
                spec[key] = cand
    return spec


def is_inline_json(s: str) -> bool:
    """Whether a ``speculative_config`` string is inline JSON (an object or, by mistake, an array)
    rather than a file path."""
    return s.lstrip().startswith(("{", "["))


def parse_inline_json(s: str) -> dict:
    """An inline ``speculative_config`` JSON string as a dict.

    Raises:
        SpecLAConfigError: invalid JSON, or JSON that is not an object.
    """
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        raise SpecLAConfigError(f"speculative_config: invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise SpecLAConfigError(f"speculative_config: expected a JSON object of fields, got {type(obj).__name__} "
                                f"{s.strip()!r:.60}")
    return obj


def load_json_file(path: str) -> dict:
    """Read a JSON object from ``path``.

    Raises:
        SpecLAConfigError: naming the file: it does not exist, is a directory, is not valid JSON or not an object.
    """
    if os.path.isdir(path):
        raise SpecLAConfigError(f"speculative_config: {path!r} is a directory, not a JSON file")
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


_DRAFTER_WANTED = "must be a path to a drafter checkpoint directory"


def _allowed_values(name: str) -> str | None:
    """``"one of 'chain', 'tree'"`` (``"'specla'"`` for one value) for a field typed ``Literal[...]``; None for a
    name that is not such a field."""
    field = SpecLAConfig.model_fields.get(name)
    ann = getattr(field, "annotation", None)
    if typing.get_origin(ann) is not Literal:
        return None
    values = ", ".join(repr(v) for v in typing.get_args(ann))
    return values if len(typing.get_args(ann)) == 1 else f"one of {values}"


def _allowed_range(name: str) -> str | None:
    """``"an integer 1..16 or null"`` / ``"a number >= 0"`` from a field's ``Field(ge=, le=, ...)`` bounds
    (``or null`` where the field's default is None); None for a name that is not a bounded field."""
    field = SpecLAConfig.model_fields.get(name)
    if field is None:
        return None
    lo = hi = None
    lo_op, hi_op = ">=", "<="
    for m in field.metadata:
        for attr, op in (("ge", ">="), ("gt", ">")):
            if getattr(m, attr, None) is not None:
                lo, lo_op = getattr(m, attr), op
        for attr, op in (("le", "<="), ("lt", "<")):
            if getattr(m, attr, None) is not None:
                hi, hi_op = getattr(m, attr), op
    if lo is None and hi is None:
        return None
    ann = field.annotation
    kind = "an integer" if ann is int or int in typing.get_args(ann) else "a number"
    if kind == "a number" and any(getattr(m, "allow_inf_nan", True) is False for m in field.metadata):
        kind = "a finite number"
    if lo is not None and hi is not None and lo_op == ">=" and hi_op == "<=":
        rng = f"{kind} {lo}..{hi}"
    else:
        bounds = [f"{lo_op} {lo}"] if lo is not None else []
        bounds += [f"{hi_op} {hi}"] if hi is not None else []
        rng = f"{kind} {' and '.join(bounds)}"
    return rng + (" or null" if field.default is None else "")


def format_validation_error(e: ValidationError) -> str:
    """One line per problem: ``speculative_config.<field>: <message>`` (names allowed values)."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        if err["type"] == "value_error":  # our validators: the message names the allowed values
            msg = str(err["msg"]).removeprefix("Value error, ")
            got = "" if isinstance(err.get("ctx", {}).get("error"), _NamesInput) else f" (got {err.get('input')!r})"
            parts.append(f"speculative_config.{loc}: {msg}{got}")
        elif err["type"] == "extra_forbidden":
            allowed = ", ".join(SpecLAConfig.model_fields)
            parts.append(f"speculative_config.{loc}: unknown field (allowed: {allowed})")
        elif err["type"] == "missing":
            hint = " (the drafter checkpoint's path; vLLM's \"model\" / --spec-model set it too)" \
                if loc == "drafter" else ""
            parts.append(f"speculative_config.{loc}: required field is missing{hint}")
        elif _allowed_range(loc):  # out of range, or not a number at all: name the range either way
            parts.append(f"speculative_config.{loc}: must be {_allowed_range(loc)} (got {err.get('input')!r})")
        elif _allowed_values(loc):  # a Literal field: pydantic's "Input should be 'chain' or 'tree'"
            parts.append(f"speculative_config.{loc}: must be {_allowed_values(loc)} (got {err.get('input')!r})")
        elif loc == "drafter":  # (not a string)
            parts.append(f"speculative_config.{loc}: {_DRAFTER_WANTED} (got {err.get('input')!r})")
        elif getattr(SpecLAConfig.model_fields.get(loc), "annotation", None) is bool:
            parts.append(f"speculative_config.{loc}: must be true or false (got {err.get('input')!r})")
        else:
            parts.append(f"speculative_config.{loc}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)


# fields only SpecLA knows: with another ``method`` they mean a misspelled "specla" (vLLM would reject
# them with a long pydantic trace); ``method`` and ``num_speculative_tokens`` are vLLM's own too
SPECLA_ONLY_FIELDS = frozenset(SpecLAConfig.model_fields) - {"method", "num_speculative_tokens"}


def _asks_specla(d: Any) -> bool:
    """``method`` is ``specla`` in any letter case (``"SpecLA"`` is how the project writes its name)."""
    m = d.get("method") if isinstance(d, dict) else None
    return isinstance(m, str) and m.strip().lower() == SPECLA_METHOD


def drafter_alias(spec: dict) -> dict:
    """A SpecLA ``spec`` with vLLM's ``model`` (the draft model; what ``--spec-model`` sets) taken as ``drafter``.

    Raises:
        SpecLAConfigError: both ``model`` and ``drafter`` given, or a ``model`` that is not a non-empty path string.
    """
    if "model" not in spec:
        return spec
    spec = dict(spec)
    if "drafter" in spec:
        raise SpecLAConfigError("speculative_config: 'model' and 'drafter' both name the drafter; give one "
                                "(--spec-model sets 'model')")
    v = spec.pop("model")
    if not (isinstance(v, str) and v.strip()):
        raise SpecLAConfigError(f"speculative_config.model (--spec-model, taken as 'drafter'): must be a path to a "
                                f"drafter checkpoint directory, got {v!r}")
    spec["drafter"] = v
    return spec


def normalize_method(spec: dict, missing_is_specla: bool = False) -> dict:
    """``spec`` with ``method`` spelled ``"specla"`` when it asks for SpecLA in any letter case
    (or has no ``method`` and ``missing_is_specla``: :meth:`SpecLAConfig.parse`, whose default it is).

    Raises:
        SpecLAConfigError: ``method`` is something else (a vLLM method, a typo) while the config
            has fields only SpecLA knows (``drafter``, ``topology``, ...): the message names
            ``speculative_config.method``, the value, those fields and the allowed value.
    """
    if _asks_specla(spec) or (missing_is_specla and "method" not in spec):
        return {**spec, "method": SPECLA_METHOD}
    own = sorted(set(spec) & SPECLA_ONLY_FIELDS)
    if own:
        raise SpecLAConfigError(
            f"speculative_config.method: {spec.get('method')!r} is not 'specla', but the config has SpecLA "
            f"fields {own}; set method to 'specla' for SpecLA, or drop those fields to use one of vLLM's methods")
    return spec


def is_specla_config(obj: Any) -> bool:
    """True when ``obj`` (dict, JSON string or JSON file path) asks for ``method: specla`` (any
    letter case), or has SpecLA-only fields under another method (parse then reports that)."""
    def asks(d):
        return _asks_specla(d) or (isinstance(d, dict) and bool(set(d) & SPECLA_ONLY_FIELDS))

    if isinstance(obj, SpecLAConfig):
        return True
    if isinstance(obj, dict):
        return asks(obj)
    if isinstance(obj, str):
        s = obj.strip()
        if s.startswith("{"):
            try:
                return asks(json.loads(s))
            except (json.JSONDecodeError, AttributeError):
                return False
        if os.path.isfile(s):
            try:
                return asks(load_json_file(s))
            except SpecLAConfigError:
                return True  # parse() reports the invalid file clearly
        return s.endswith(".json")  # a missing .json path: parse() reports it
    return False
