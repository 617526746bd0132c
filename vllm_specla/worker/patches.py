"""The small, version-guarded changes the plugin makes to vLLM (all installed by ``register()``).

1. ``EngineArgs.create_speculative_config``: accept a JSON file path (vLLM takes only a dict /
   inline JSON), and translate ``"method": "specla"`` into vLLM's ``custom_class`` method
   (``model = vllm_specla.worker.proposer.SpeclaProposer``) before vLLM's ``SpeculativeConfig``
   validates, carrying the SpecLA fields in ``additional_config["specla"]``. Other methods pass
   through untouched (a file path still works for them).
2. The ``--speculative-config`` CLI argument parses a file path as well as inline JSON.
3. ``MODELS_CONFIG_MAP["GatedDeltaNetForCausalLM"]``: for our architecture only, select our worker
   when ``worker_cls`` is ``"auto"`` and turn prefix caching off with one log line (the state
   pages hold SpecLA factor banks, and vLLM's mamba "align" copies are Triton-only on CPU).

Each patch is applied once per process (``register()`` runs in every vLLM process) and checks
the vLLM version range it was written for.
"""

from __future__ import annotations

import json
import logging
import os

from vllm_specla.config import SpecLAConfig, SpecLAConfigError, load_json_file
from vllm_specla.worker.settings import ADDITIONAL_CONFIG_KEY, PROPOSER_QUALNAME

logger = logging.getLogger("vllm_specla")

ARCH = "GatedDeltaNetForCausalLM"
SUPPORTED_VLLM = ((0, 32), (0, 33))
_applied = False


def _vllm_version() -> tuple[int, int]:
    import vllm  # noqa: PLC0415

    parts = vllm.__version__.split(".")
    return int(parts[0]), int(parts[1])


def translate_speculative_config(spec, target_model_config=None) -> tuple[dict | None, dict | None]:
    """Return ``(vllm_speculative_config_dict, specla_fields_or_None)``.

    ``spec`` may be None, a dict, inline JSON or a path to a JSON file.

    Raises:
        SpecLAConfigError: bad file/JSON, invalid SpecLA fields, a drafter that does not exist or
        has another vocabulary, or ``specla`` on a target that is not ``gated_deltanet``.
    """
    if spec is None:
        return None, None
    if isinstance(spec, str):
        s = spec.strip()
        if s.startswith("{"):
            try:
                spec = json.loads(s)
            except json.JSONDecodeError as e:
                raise SpecLAConfigError(f"speculative_config: invalid JSON: {e}") from None
        else:
            base = os.path.dirname(os.path.abspath(s))
            spec = load_json_file(s)
            if spec.get("method") == "specla" and isinstance(spec.get("drafter"), str):
                cand = os.path.join(base, spec["drafter"])
                if not os.path.isabs(spec["drafter"]) and not os.path.exists(spec["drafter"]) and os.path.exists(cand):
                    spec["drafter"] = cand
    if not isinstance(spec, dict):
        return spec, None
    spec = {k.replace("-", "_"): v for k, v in spec.items()}
    if spec.get("method") == "specla":
        spec = {k: v for k, v in spec.items() if not k.startswith("_")}
    if spec.get("method") != "specla":
        return spec, None
    cfg = SpecLAConfig.parse(spec)
    if cfg.recovery != "factors":
        raise SpecLAConfigError(
            f"speculative_config.recovery={cfg.recovery!r}: the vLLM path supports 'factors' only "
            "('snapshot' and 'replay' are benchmark baselines)"
        )
    if target_model_config is not None:
        hf = target_model_config.hf_config
        if getattr(hf, "model_type", None) != "gated_deltanet":
            raise SpecLAConfigError(
                f"speculative_config.method='specla' needs a gated_deltanet target; "
                f"{target_model_config.model!r} is model_type={getattr(hf, 'model_type', None)!r}"
            )
        cfg.check_drafter(hf.vocab_size)
    vllm_spec = {"method": "custom_class", "model": PROPOSER_QUALNAME,
                 "num_speculative_tokens": cfg.num_speculative_tokens}
    return vllm_spec, cfg.model_dump()


def _patch_create_speculative_config() -> None:
    from vllm.engine.arg_utils import EngineArgs  # noqa: PLC0415

    orig = EngineArgs.create_speculative_config
    if getattr(orig, "_specla", False):
        return

    def create_speculative_config(self, target_model_config, target_parallel_config):
        spec, specla = translate_speculative_config(self.speculative_config, target_model_config)
        self.speculative_config = spec
        if specla is not None:
            if not isinstance(self.additional_config, dict):
                self.additional_config = dict(self.additional_config or {})
            self.additional_config[ADDITIONAL_CONFIG_KEY] = specla
        elif isinstance(self.additional_config, dict):
            self.additional_config.pop(ADDITIONAL_CONFIG_KEY, None)
        return orig(self, target_model_config, target_parallel_config)

    create_speculative_config._specla = True
    EngineArgs.create_speculative_config = create_speculative_config


def json_or_path(value: str):
    """argparse type for ``--speculative-config``: inline JSON, or a path to a JSON file."""
    if value is None:
        return None
    s = value.strip()
    if s.startswith("{"):
        return json.loads(s)
    return load_json_file(s)


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
        return parser

    add_cli_args._specla = True
    EngineArgs.add_cli_args = staticmethod(add_cli_args)


class SpeclaGDNConfigHook:
    """``MODELS_CONFIG_MAP`` entry for our architecture (runs before vLLM's mamba config)."""

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        from vllm.platforms import current_platform  # noqa: PLC0415

        from vllm_specla.models.config import check_supported  # noqa: PLC0415

        check_supported(vllm_config.model_config.hf_config)  # refuse unsupported fields in the front end
        cache = vllm_config.cache_config
        if cache.enable_prefix_caching:
            cache.enable_prefix_caching = False
            logger.info("vllm_specla: prefix caching is off for gated_deltanet models (state pages hold SpecLA "
                        "factor banks; vLLM's mamba 'align' state copies are not supported by this plugin)")
        par = vllm_config.parallel_config
        if par.worker_cls == "auto":
            if current_platform.is_cpu():
                par.worker_cls = "vllm_specla.worker.worker.SpeclaCPUWorker"
            elif current_platform.is_cuda_alike():
                par.worker_cls = "vllm_specla.worker.worker.SpeclaGPUWorker"

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        return


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
    _applied = True
