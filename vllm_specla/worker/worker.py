"""vLLM workers that install the SpecLA model runner.

``SpeclaCPUWorker``: vLLM-CPU's ``CPUWorker`` builds its runner inline in ``init_device`` (no
factory hook), so we swap the module-level runner class for the duration of that call.
``SpeclaGPUWorker``: the CUDA ``Worker`` has the documented ``_make_model_runner`` hook. (The GPU
worker cannot be run on any machine we have: no vLLM on the GPU machine.)

Both are selected automatically for ``gated_deltanet`` checkpoints (``patches.py``) when
``worker_cls`` is left at ``"auto"``.
"""

from __future__ import annotations

from vllm.v1.worker import cpu_worker as _cpu_worker_mod
from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_specla.worker.runner import cpu_runner_cls


class _SpeclaWorkerMixin:
    def specla_counters(self) -> dict:
        """Runner counters (``collective_rpc("specla_counters")``), for tests and debugging."""
        return dict(self.model_runner.specla_counters())

    def specla_state_page(self) -> dict:
        """State page facts of the first GDN layer: per-state shapes, bytes, num_speculative_blocks."""
        from vllm_specla.worker.model import SpeclaGDNAttention  # noqa: PLC0415

        layer = next(m for m in self.model_runner.model.modules() if isinstance(m, SpeclaGDNAttention))
        spec = layer.get_kv_cache_spec(self.vllm_config)
        return {"shapes": [list(s) for s in spec.shapes], "page_size_bytes": spec.page_size_bytes,
                "num_speculative_blocks": spec.num_speculative_blocks,
                "max_memory_usage_bytes": spec.max_memory_usage_bytes(self.vllm_config)}


class SpeclaCPUWorker(_SpeclaWorkerMixin, CPUWorker):
    def init_device(self):
        original = _cpu_worker_mod.CPUModelRunner
        _cpu_worker_mod.CPUModelRunner = cpu_runner_cls()
        try:
            return super().init_device()
        finally:
            _cpu_worker_mod.CPUModelRunner = original


def _gpu_worker_cls():
    from vllm.v1.worker.gpu_worker import Worker  # noqa: PLC0415

    from vllm_specla.worker.runner import gpu_runner_cls  # noqa: PLC0415

    class SpeclaGPUWorker(_SpeclaWorkerMixin, Worker):
        def _make_model_runner(self):
            return gpu_runner_cls()(self.vllm_config, self.device)

    return SpeclaGPUWorker


def __getattr__(name):
    if name == "SpeclaGPUWorker":
        return _gpu_worker_cls()
    raise AttributeError(name)
