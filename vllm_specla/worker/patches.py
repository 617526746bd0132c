"""The small, version-guarded changes the plugin makes to vLLM (all installed by ``register()``).

1. ``EngineArgs.create_speculative_config``: accept a JSON file path (vLLM takes only a dict /
   inline JSON), and translate ``"method": "specla"`` into vLLM's ``custom_class`` method
   (``model = vllm_specla.worker.proposer.SpeclaProposer``) before vLLM's ``SpeculativeConfig``
   validates, carrying the SpecLA fields in ``additional_config["specla"]``. Other methods pass
   through untouched (a file path still works for them), except on a ``gated_deltanet`` target, where
   they are refused with one line: vLLM's own methods do not roll its recurrent state back after a
   rejected draft token (``ngram`` gave output that differed from AR, ``draft_model`` failed to start).
   vLLM's ``--spec-method`` / ``--spec-model`` / ``--spec-tokens`` flags are merged in first, as vLLM
   merges them (``fold_spec_flags``). ``async_scheduling=True`` with SpecLA is refused with one line
   (vLLM's own refusal is a multi-line pydantic error: it schedules asynchronously only for some of its methods).
2. The ``--speculative-config`` CLI argument parses a file path as well as inline JSON,
   ``--spec-method`` takes ``specla`` (any letter case; vLLM 0.32's choices are its own methods), and
   processes that build vLLM's CLI parser (``vllm serve``, the OpenAI api_server module) end with
   one line ``Error: ...`` (exit status 1) on a bad SpecLA config or an unsupported checkpoint,
   instead of a traceback.
3. ``MODELS_CONFIG_MAP["GatedDeltaNetForCausalLM"]``: for our architecture only, select our worker
   when ``worker_cls`` is ``"auto"`` and turn prefix caching off with one log line (the state
   pages hold SpecLA factor banks, and vLLM's mamba "align" copies are Triton-only on CPU).
4. Opt-in (``VLLM_SPECLA_CPU_RAY=1``): Ray on the vLLM-CPU platform (``worker/ray_cpu.py``).
5. Drafts without an extra RPC: without async scheduling vLLM's engine core asks the workers for
   the step's drafts with one more RPC (``take_draft_token_ids``) after ``sample_tokens``. Our
   runner attaches those drafts to ``sample_tokens``' output (``runner.py``), and the executor
   classes' ``take_draft_token_ids`` returns them when the last blocking ``sample_tokens``
   since the last ``execute_model`` carried them, else makes the RPC as before. Applies to
   ``MultiprocExecutor`` and the Ray executors (``UniProcExecutor``, vLLM's choice for one GPU,
   calls its worker in-process: no RPC to save); ``VLLM_SPECLA_INLINE_DRAFTS=0`` turns it off.

6. ``SamplingParams._validate_spec_decode``: under SpecLA a request with ``logprob_token_ids`` is refused
   (vLLM's ``VLLMValidationError`` naming the field: HTTP 400 from ``vllm serve``, raised by ``LLM.generate``) as vLLM
   refuses ``min_p`` / ``logit_bias``. vLLM 0.32's rejection sampler fails on it (its bonus-token logprobs come
   back already gathered to the requested ids, ``_get_logprobs_tensors``), which killed the engine for every
   request; ``logprobs=N`` works.

(``vllm serve`` on vLLM-CPU itself is made to start by ``vllm_specla/compat.py``, a
``vllm.platform_plugins`` entry point, because the failing lookup happens before general plugins
load.)

Each patch is applied once per process (``register()`` runs in every vLLM process) and checks
the vLLM version range it was written for.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from vllm_specla.config import (SpecLAConfig, SpecLAConfigError, drafter_alias, is_inline_json, load_json_file,
                                normalize_method, parse_inline_json, resolve_file_paths)
from vllm_specla.worker.settings import (ADDITIONAL_CONFIG_KEY, INLINE_DRAFTS_ATTR, PROPOSER_QUALNAME,
                                         inline_drafts_enabled)

# under "vllm.": vLLM configures that namespace's handlers, so these lines reach its log
logger = logging.getLogger("vllm.specla")

ARCH = "GatedDeltaNetForCausalLM"
SUPPORTED_VLLM = ((0, 32), (0, 33))
_applied = False


def _vllm_version() -> tuple[int, int]:
    import vllm  # noqa: PLC0415

    parts = vllm.__version__.split(".")
    return int(parts[0]), int(parts[1])


def load_spec_file(path: str) -> dict:
    """Read a speculative-config JSON file; for SpecLA, a relative ``drafter`` (or ``step_cost_table``)
    path is resolved against the file's folder where it exists there
    (:func:`vllm_specla.config.resolve_file_paths`) and documentation keys (``"_doc"``: any key
    starting with ``_``) are dropped, so vLLM's start-up line of non-default arguments does not
    print them. Other methods' files are returned as read."""
    spec = load_json_file(path)
    if str(spec.get("method", "specla")).strip().lower() == "specla":  # (any letter case, as normalize_method)
        spec = {k: v for k, v in spec.items() if not (isinstance(k, str) and k.startswith("_"))}
        resolve_file_paths(spec, os.path.dirname(os.path.abspath(path)))
    return spec


def _parse_spec_string(spec: str) -> dict:
    """A ``speculative_config`` string as a dict: inline JSON, else a JSON file path (:func:`load_spec_file`).

    Raises:
        SpecLAConfigError: invalid JSON, JSON that is not an object, or a file that cannot be read."""
    s = spec.strip()
    return parse_inline_json(s) if is_inline_json(s) else load_spec_file(s)


def _is_gdn(model_config) -> bool:
    """Whether vLLM's ``ModelConfig`` is a ``gated_deltanet`` checkpoint (the models this plugin serves)."""
    return getattr(model_config.hf_config, "model_type", None) == "gated_deltanet"


def translate_speculative_config(spec, target_model_config=None) -> tuple[dict | None, dict | None]:
    """Return ``(vllm_speculative_config_dict, specla_fields_or_None)``.

    ``spec`` may be None, a dict, inline JSON or a path to a JSON file.

    Raises:
        SpecLAConfigError: bad file/JSON, invalid SpecLA fields, a drafter that does not exist or
        has another vocabulary, both ``model`` (vLLM's name for the drafter, taken as ``drafter``)
        and ``drafter``, ``specla`` on a target that is not ``gated_deltanet``, or another
        method (vLLM's ``ngram``, ``draft_model``, ...) on a ``gated_deltanet`` target.
    """
    if spec is None:
        return None, None
    if isinstance(spec, str):
        spec = _parse_spec_string(spec)
    if not isinstance(spec, dict):
        if isinstance(spec, (list, tuple, int, float, bool)):  # (vLLM failed on these with an AttributeError)
            raise SpecLAConfigError(f"speculative_config: must be a dict, inline JSON or a path to a JSON file, "
                                    f"got {type(spec).__name__} {spec!r:.60}")
        return spec, None
    bad_keys = [k for k in spec if not isinstance(k, str)]
    if bad_keys:
        raise SpecLAConfigError(f"speculative_config: field names must be strings, got {bad_keys[0]!r}")
    spec = normalize_method({k.replace("-", "_"): v for k, v in spec.items()})
    if spec.get("method") == "specla":
        spec = {k: v for k, v in spec.items() if not k.startswith("_")}
        spec = drafter_alias(spec)  # vLLM's "model" (the draft model; what --spec-model sets) as "drafter"
        if isinstance(spec.get("drafter"), str) and spec["drafter"]:
            # absolute, so that every process (engine core, workers, Ray actors in other working
            # directories) finds the same drafter
            spec["drafter"] = os.path.abspath(spec["drafter"])
    if spec.get("method") != "specla":
        if target_model_config is not None and _is_gdn(target_model_config) and spec.get("model") != PROPOSER_QUALNAME:
            # vLLM's own methods verify drafts on our model without restoring its recurrent state after a rejected
            # draft token (ngram: greedy output left AR's; draft_model: the engine failed to start; session 48)
            raise SpecLAConfigError(
                f"speculative_config.method={spec.get('method')!r} (--speculative-config or --spec-method): "
                "a gated_deltanet target supports 'specla' only "
                "(vLLM's other methods cannot roll its recurrent state back after a rejected draft token); use "
                '{"method": "specla", "num_speculative_tokens": K, "drafter": <path>}, or no speculative_config')
        return spec, None
    cfg = SpecLAConfig.parse(spec)
    if cfg.recovery != "factors":
        raise SpecLAConfigError(
            f"speculative_config.recovery={cfg.recovery!r}: the vLLM path supports 'factors' only "
            "('snapshot' and 'replay' are benchmark baselines)"
        )
    if target_model_config is not None:
        hf = target_model_config.hf_config
        if not _is_gdn(target_model_config):
            raise SpecLAConfigError(
                f"speculative_config.method='specla' needs a gated_deltanet target; "
                f"{target_model_config.model!r} is model_type={getattr(hf, 'model_type', None)!r}"
            )
        cfg.check_drafter(hf.vocab_size)
    # "auto": vLLM's scheduler is told K_max (it sizes the spec rows); the proposer proposes 0..K_max
    vllm_spec = {"method": "custom_class", "model": PROPOSER_QUALNAME,
                 "num_speculative_tokens": cfg.k_max}
    return vllm_spec, cfg.model_dump()


def reconcile_max_num_seqs(engine_args, max_num_requests: int | None) -> None:
    """Check ``max_num_requests`` against a ``max_num_seqs`` the user gave (``EngineArgs``, before
    vLLM fills in its defaults) and remember it for :func:`cap_max_num_seqs`. The drafter keeps one
    state slot per running request of an engine (a data-parallel rank).

    Raises:
        SpecLAConfigError: ``max_num_requests`` below the given ``max_num_seqs``.
    """
    engine_args._specla_max_num_requests = max_num_requests
    given = getattr(engine_args, "max_num_seqs", None)
    if max_num_requests is not None and given is not None and given > max_num_requests:
        raise SpecLAConfigError(
            f"speculative_config.max_num_requests={max_num_requests} is below max_num_seqs={given}: the drafter "
            f"keeps a state slot per running request; raise max_num_requests to >= {given} (or leave it out), "
            f"or lower --max-num-seqs")


def cap_max_num_seqs(engine_args) -> None:
    """After vLLM's defaults: ``max_num_seqs = min(max_num_seqs, max_num_requests)`` (lowering it
    keeps vLLM's ``max_num_batched_tokens >= max_num_seqs``)."""
    n = getattr(engine_args, "_specla_max_num_requests", None)
    if n is not None and engine_args.max_num_seqs is not None and engine_args.max_num_seqs > n:
        logger.info("SpecLA: max_num_seqs %d -> %d (speculative_config.max_num_requests)", engine_args.max_num_seqs, n)
        engine_args.max_num_seqs = n


_SPEC_FLAGS = (("spec_method", "--spec-method", "method"), ("spec_model", "--spec-model", "model"),
               ("spec_tokens", "--spec-tokens", "num_speculative_tokens"))


def fold_spec_flags(engine_args) -> None:
    """Merge vLLM's ``--spec-method`` / ``--spec-model`` / ``--spec-tokens`` (``EngineArgs.spec_*``, vLLM 0.32) into
    ``engine_args.speculative_config`` (a string parsed first: inline JSON or a file path) and clear them, as vLLM's
    own ``create_speculative_config`` merges them, but before the plugin translates and checks the config (so
    ``--spec-method ngram`` on a gated_deltanet target is refused like ``{"method": "ngram"}``). Nothing changes
    when no flag is set.

    Raises:
        SpecLAConfigError: a flag and the same key in ``speculative_config`` (vLLM's message and what to do; a
            ``ValueError``, as vLLM raises, that ``vllm serve`` ends with one line), or a ``speculative_config``
            string that is neither valid JSON nor a readable file."""
    flags = [(attr, flag, key, getattr(engine_args, attr, None)) for attr, flag, key in _SPEC_FLAGS]
    if all(value is None for *_, value in flags):
        return
    spec = engine_args.speculative_config
    spec = (_parse_spec_string(spec) if isinstance(spec, str) else spec) or {}
    if not isinstance(spec, dict):  # (translate_speculative_config names the type)
        engine_args.speculative_config = spec
        return
    spec = dict(spec)
    for attr, flag, key, value in flags:
        if value is None:
            continue
        if key in spec:
            raise SpecLAConfigError(f"{flag} and --speculative-config['{key}'] are mutually exclusive: give "
                                    f"{key} one way")
        spec[key] = value
        setattr(engine_args, attr, None)
    engine_args.speculative_config = spec


ASYNC_SCHEDULING_ERROR = ("async_scheduling=True is not supported with SpecLA speculative decoding (vLLM schedules "
                          "asynchronously only for some of its own methods: EAGLE / MTP, draft_model, ngram_gpu, "
                          "DSpark, DFlash): allowed: false or unset (drop --async-scheduling)")


def _patch_create_speculative_config() -> None:
    from vllm.engine.arg_utils import EngineArgs  # noqa: PLC0415

    orig = EngineArgs.create_speculative_config
    if getattr(orig, "_specla", False):
        return

    def create_speculative_config(self, target_model_config, target_parallel_config):
        fold_spec_flags(self)
        spec, specla = translate_speculative_config(self.speculative_config, target_model_config)
        self.speculative_config = spec
        reconcile_max_num_seqs(self, specla.get("max_num_requests") if specla is not None else None)
        if specla is not None:
            if getattr(self, "async_scheduling", None):
                raise SpecLAConfigError(ASYNC_SCHEDULING_ERROR)
            if not isinstance(self.additional_config, dict):
                self.additional_config = dict(self.additional_config or {})
            self.additional_config[ADDITIONAL_CONFIG_KEY] = specla
        elif isinstance(self.additional_config, dict):
            self.additional_config.pop(ADDITIONAL_CONFIG_KEY, None)
        return orig(self, target_model_config, target_parallel_config)

    create_speculative_config._specla = True
    EngineArgs.create_speculative_config = create_speculative_config

    set_defaults = getattr(EngineArgs, "_set_default_max_num_seqs_and_batched_tokens_args", None)
    if set_defaults is not None and not getattr(set_defaults, "_specla", False):
        def set_default_max_num_seqs(self, *args, **kwargs):
            out = set_defaults(self, *args, **kwargs)
            cap_max_num_seqs(self)
            return out

        set_default_max_num_seqs._specla = True
        EngineArgs._set_default_max_num_seqs_and_batched_tokens_args = set_default_max_num_seqs


def json_or_path(value: str):
    """argparse type for ``--speculative-config``: inline JSON, or a path to a JSON file.

    A value that cannot be read here (missing file, invalid JSON) is passed on unchanged, so that
    ``create_speculative_config`` reports it in one line (:func:`cli_excepthook`) instead of
    argparse printing its usage and a generic "invalid value".
    """
    if value is None:
        return None
    s = value.strip()
    try:
        if s.startswith("{"):
            return json.loads(s)
        if s.startswith("["):
            return value  # not an object: create_speculative_config reports it
        return load_spec_file(s)
    except (json.JSONDecodeError, SpecLAConfigError):
        return value


def config_error_line(exc: BaseException | None) -> str | None:
    """The one-line message of a SpecLA config / unsupported-checkpoint error in ``exc``'s
    cause chain, or None."""
    from vllm_specla.models.config import UnsupportedConfigError  # noqa: PLC0415

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (SpecLAConfigError, UnsupportedConfigError)):
            lines = str(exc).strip().splitlines()
            return lines[0] if lines else type(exc).__name__
        errors = getattr(exc, "errors", None)  # pydantic ValidationError (e.g. VllmConfig hooks)
        if callable(errors):
            try:
                for err in errors():
                    inner = (err.get("ctx") or {}).get("error")
                    if isinstance(inner, BaseException) and id(inner) not in seen:
                        msg = config_error_line(inner)
                        if msg is not None:
                            return msg
            except Exception:  # noqa: BLE001
                pass
        exc = exc.__cause__ or exc.__context__
    return None


def _install_cli_excepthook() -> None:
    """In vLLM CLI processes (``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``) a bad
    SpecLA config or an unsupported checkpoint ends the command with ``Error: <one line>`` on
    stderr and exit status 1, not a traceback. Other exceptions keep the previous hook."""
    prev = sys.excepthook
    if getattr(prev, "_specla", False):
        return

    def specla_cli_excepthook(exc_type, exc, tb):
        msg = config_error_line(exc)
        if msg is None:
            return prev(exc_type, exc, tb)
        print(f"Error: {msg}", file=sys.stderr, flush=True)

    specla_cli_excepthook._specla = True
    sys.excepthook = specla_cli_excepthook


_SC_HELP = (" (vllm_specla: or a path to a JSON file such as specla.json; "
            '"method": "specla" selects SpecLA for gated_deltanet models)')


def _specla_method_type(orig):
    """``--spec-method``'s argparse type: ``specla`` in any letter case (as ``"method"`` in a config) is
    ``"specla"``; anything else goes to vLLM's own type (``orig``; None: the string as given)."""

    def spec_method(value: str):
        if isinstance(value, str) and value.strip().lower() == "specla":
            return "specla"
        return orig(value) if orig is not None else value

    return spec_method


def _patch_cli() -> None:
    from vllm.engine.arg_utils import EngineArgs  # noqa: PLC0415

    orig = EngineArgs.__dict__["add_cli_args"]
    fn = orig.__func__ if isinstance(orig, staticmethod) else orig
    if getattr(fn, "_specla", False):
        return

    def add_cli_args(parser, *a, **kw):
        parser = fn(parser, *a, **kw)
        act = parser._option_string_actions.get("--speculative-config")
        if act is not None:
            act.type = json_or_path
            if act.help and "vllm_specla" not in act.help:
                act.help = act.help.rstrip() + _SC_HELP
        act = parser._option_string_actions.get("--spec-method")  # (vLLM 0.32: its choices are its own methods)
        if act is not None and act.choices is not None and "specla" not in act.choices:
            act.choices = [*act.choices, "specla"]
            act.type = _specla_method_type(act.type)
        _install_cli_excepthook()  # only processes that build vLLM's CLI parser get here
        return parser

    add_cli_args._specla = True
    EngineArgs.add_cli_args = staticmethod(add_cli_args)


def _check_no_kv_transfer(vllm_config) -> None:
    """KV connectors (prefill / decode disaggregation, LMCache, ...) and KV offloading move a mamba layer's state
    page by page; a SpecLA state page region is laid out per state (``SpeclaGDNAttention.bind_kv_cache``) and holds
    factor banks, so a page would carry other slots' bytes (a review, session 54). Refused at start.

    Raises:
        UnsupportedConfigError: naming ``kv_transfer_config`` or ``kv_offloading_size`` (allowed: unset).
    """
    from vllm_specla.models.config import UnsupportedConfigError  # noqa: PLC0415

    kv = getattr(vllm_config, "kv_transfer_config", None)
    if kv is not None and getattr(kv, "kv_connector", None):
        raise UnsupportedConfigError(f"kv_transfer_config: KV connector {kv.kv_connector!r} is not supported for "
                                     "gated_deltanet models with vllm_specla (allowed: unset)")
    size = getattr(vllm_config.cache_config, "kv_offloading_size", None)
    if size is not None:
        raise UnsupportedConfigError(f"kv_offloading_size={size}: KV offloading is not supported for gated_deltanet "
                                     "models with vllm_specla (allowed: unset)")


def _gpu_runner_settings(model_config) -> None:
    """On a GPU platform, what the SpecLA runner needs of vLLM 0.32 (a new user's review of the GPU path, session 54;
    the GPU worker has not run on a GPU, see README "Limitations"):

    * **eager mode** (``enforce_eager``): the GDN mixer plans each step on the host (``gdn_mix``: rows, slots,
      pending factors), which a CUDA graph replay would not redo; vLLM captures its graphs through ``_dummy_run``,
      which calls the model without a step plan, so the graphs would hold a step without the recurrence. vLLM then
      also turns torch.compile off.
    * **the V1 model runner** (``VLLM_USE_V2_MODEL_RUNNER=0`` unless set): the SpecLA runner subclasses vLLM's V1
      ``GPUModelRunner``; vLLM 0.32 picks V2 on GPU for a run without speculation (AR), whose worker and scheduler
      calls the V1 runner lacks. Set before the engine core starts, so its processes inherit it.
    """
    if not model_config.enforce_eager:
        model_config.enforce_eager = True
        logger.info("vllm_specla: gated_deltanet models run in eager mode (enforce_eager=True): the SpecLA runner "
                    "plans each step's state slots on the host, which CUDA graph replay would skip")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")


class SpeclaGDNConfigHook:
    """``MODELS_CONFIG_MAP`` entry for our architecture (runs before vLLM's mamba config)."""

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        from vllm.platforms import current_platform  # noqa: PLC0415

        from vllm_specla.models.config import check_supported, check_tensor_parallel  # noqa: PLC0415

        check_supported(vllm_config.model_config.hf_config)  # refuse unsupported fields in the front end
        check_tensor_parallel(vllm_config.model_config.hf_config, vllm_config.parallel_config.tensor_parallel_size)
        cache = vllm_config.cache_config
        if cache.enable_prefix_caching:
            cache.enable_prefix_caching = False
            logger.info("vllm_specla: prefix caching is off for gated_deltanet models (state pages hold SpecLA "
                        "factor banks; vLLM's mamba 'align' state copies are not supported by this plugin)")
        _check_no_kv_transfer(vllm_config)
        par = vllm_config.parallel_config
        _check_cpu_ray(par, current_platform)
        if par.worker_cls == "auto":
            if current_platform.is_cpu():
                par.worker_cls = "vllm_specla.worker.worker.SpeclaCPUWorker"
            elif current_platform.is_cuda_alike():
                par.worker_cls = "vllm_specla.worker.worker.SpeclaGPUWorker"
        if current_platform.is_cuda_alike():
            _gpu_runner_settings(vllm_config.model_config)

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        return


def cpu_ray_requested() -> bool:
    """``VLLM_SPECLA_CPU_RAY=1``: enable Ray on the vLLM-CPU platform (``worker/ray_cpu.py``)."""
    return os.environ.get("VLLM_SPECLA_CPU_RAY", "0").strip().lower() in ("1", "true", "yes", "on")


def _check_cpu_ray(par, platform) -> None:
    """A Ray executor or Ray data-parallel backend on vLLM-CPU without ``VLLM_SPECLA_CPU_RAY=1`` fails at start, in
    one line saying what to set (vLLM-CPU's own refusal, "current platform cpu does not support ray", came as an
    engine-core traceback ~20 s later: a new user's review, session 52). A Ray executor is what vLLM's
    ``ParallelConfig.use_ray`` says: ``"ray"`` or an executor class with ``uses_ray``.

    Raises:
        UnsupportedConfigError: naming ``data_parallel_backend`` (where it asked for Ray: vLLM then sets the
            executor from it) or ``distributed_executor_backend``.
    """
    from vllm_specla.models.config import UnsupportedConfigError  # noqa: PLC0415

    if not platform.is_cpu() or cpu_ray_requested():
        return
    backend = getattr(par, "distributed_executor_backend", None)
    use_ray = getattr(par, "use_ray", backend == "ray")
    dp_ray = getattr(par, "data_parallel_backend", None) == "ray"
    if dp_ray and (use_ray or getattr(par, "data_parallel_size", 1) > 1):
        field, value, others = "data_parallel_backend", "'ray'", "'mp'"
    elif use_ray:
        field, others = "distributed_executor_backend", "'mp', 'uni'"
        value = repr(backend) if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))
    else:
        return
    raise UnsupportedConfigError(
        f"{field}={value} on vLLM-CPU needs VLLM_SPECLA_CPU_RAY=1 in the environment that starts vLLM and one "
        "'vllm_cpu' Ray resource per worker (ray start --resources '{\"vllm_cpu\": N}'; README \"Ray\"); allowed "
        f"without it: {others} or unset")


_INLINE_EXECUTORS = (("vllm.v1.executor.multiproc_executor", "MultiprocExecutor"),
                     ("vllm.v1.executor.ray_executor", "RayDistributedExecutor"),
                     ("vllm.v1.executor.ray_executor_v2", "RayExecutorV2"))


def patch_executor_inline_drafts(cls) -> bool:
    """Item 5 on one executor class (idempotent; returns whether it patched now).

    ``execute_model`` forgets any stashed drafts; a blocking ``sample_tokens`` whose output
    carries ``INLINE_DRAFTS_ATTR`` stashes them; ``take_draft_token_ids`` returns the stash once,
    else calls the original (the RPC). A ``sample_tokens`` future (batch queue) carries no stash.
    """
    if cls.__dict__.get("_specla_inline_drafts", False):
        return False
    orig_execute, orig_sample, orig_take = cls.execute_model, cls.sample_tokens, cls.take_draft_token_ids

    def execute_model(self, *args, **kwargs):
        self._specla_drafts = None
        return orig_execute(self, *args, **kwargs)

    def sample_tokens(self, *args, **kwargs):
        out = orig_sample(self, *args, **kwargs)
        self._specla_drafts = getattr(out, INLINE_DRAFTS_ATTR, None)
        return out

    def take_draft_token_ids(self):
        carried, self._specla_drafts = getattr(self, "_specla_drafts", None), None
        if isinstance(carried, tuple) and len(carried) == 1:
            return carried[0]
        return orig_take(self)

    for f, orig in ((execute_model, orig_execute), (sample_tokens, orig_sample), (take_draft_token_ids, orig_take)):
        f.__wrapped__, f.__doc__, f.__name__ = orig, orig.__doc__, orig.__name__
    cls.execute_model, cls.sample_tokens, cls.take_draft_token_ids = execute_model, sample_tokens, take_draft_token_ids
    cls._specla_inline_drafts = True
    return True


def _patch_inline_drafts() -> None:
    """Item 5: on the executor classes this process has loaded, and on whatever class
    ``Executor.get_class`` picks from now on (a forked engine core inherits the patched class;
    a spawned one imports its executor class before it loads plugins). Importing Ray's executors
    here would import Ray in every process."""
    if not inline_drafts_enabled():
        return
    import vllm.v1.executor.multiproc_executor  # noqa: F401, PLC0415 (the default executor; cheap)
    from vllm.v1.executor.abstract import Executor  # noqa: PLC0415

    for mod, name in _INLINE_EXECUTORS:
        cls = getattr(sys.modules.get(mod), name, None)
        if cls is not None:
            patch_executor_inline_drafts(cls)
    orig_get_class = Executor.get_class
    if getattr(orig_get_class, "_specla", False):
        return

    def get_class(vllm_config):
        cls = orig_get_class(vllm_config)
        if cls.__name__ in {name for _, name in _INLINE_EXECUTORS}:
            patch_executor_inline_drafts(cls)
        return cls

    get_class._specla = True
    get_class.__wrapped__, get_class.__doc__ = orig_get_class, orig_get_class.__doc__
    Executor.get_class = staticmethod(get_class)


LOGPROB_TOKEN_IDS_ERROR = ("logprob_token_ids is not supported with SpecLA speculative decoding (vLLM's rejection "
                           "sampler fails on it); ask for logprobs=N instead")


def _patch_logprob_token_ids() -> None:
    """Item 6."""
    from vllm.sampling_params import SamplingParams  # noqa: PLC0415

    orig = getattr(SamplingParams, "_validate_spec_decode", None)
    if orig is None or getattr(orig, "_specla", False):
        return

    def _validate_spec_decode(self, speculative_config):
        orig(self, speculative_config)
        if (getattr(self, "logprob_token_ids", None) is not None
                and getattr(speculative_config, "model", None) == PROPOSER_QUALNAME):
            from vllm.exceptions import VLLMValidationError  # noqa: PLC0415

            raise VLLMValidationError(LOGPROB_TOKEN_IDS_ERROR, parameter="logprob_token_ids",
                                      value=list(self.logprob_token_ids))

    _validate_spec_decode._specla = True
    _validate_spec_decode.__wrapped__, _validate_spec_decode.__doc__ = orig, orig.__doc__
    SamplingParams._validate_spec_decode = _validate_spec_decode


def apply_patches() -> None:
    """Install every patch once (idempotent; called from ``vllm_specla.register``)."""
    global _applied
    if _applied:
        return
    ver = _vllm_version()
    if not (SUPPORTED_VLLM[0] <= ver <= SUPPORTED_VLLM[1]):
        logger.warning("vllm_specla was written for vLLM 0.32-0.33, found %s.%s: patches may not apply", *ver)
    _patch_create_speculative_config()
    _patch_cli()
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP  # noqa: PLC0415

    MODELS_CONFIG_MAP[ARCH] = SpeclaGDNConfigHook
    _patch_inline_drafts()
    _patch_logprob_token_ids()
    if cpu_ray_requested():  # opt-in Ray on vLLM-CPU (worker/ray_cpu.py)
        from vllm_specla.worker.ray_cpu import install  # noqa: PLC0415

        install()
    _applied = True
