"""vLLM-free checks of ``worker/cpu_fixes.py``'s fix 3: seeded requests whose prompt is prefilled in
chunks on vLLM-CPU (the engine-level run is in test_vllm_e2e.py's chunked-prefill engine).

vLLM 0.32 samples a token for a row whose prompt is still being prefilled, discards it, and rewinds the
request's generator with ``gen.set_offset(gen.get_offset() - 4)`` (``GPUModelRunner._bookkeeping_sync``):
torch's CPU generator has no offset, so that line raised and the engine died. The fix restores the
generator's state instead. A fake runner with vLLM's attribute names stands in for the model runner.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_specla.worker import cpu_fixes


def _runner(generators: dict, discard: list[bool]):
    return SimpleNamespace(input_batch=SimpleNamespace(generators=generators, num_reqs=len(discard)),
                           discard_request_mask=SimpleNamespace(np=np.array(discard + [True, True])))


def _vllm_sample(runner, logits, spec_decode_metadata):
    """What vLLM's sampler does with the generators: one draw per seeded row (``exponential_`` there)."""
    return {i: torch.rand(4, generator=g) for i, g in runner.input_batch.generators.items()}


def _vllm_bookkeeping(runner, *args):
    """vLLM 0.32's rewind loop of ``_bookkeeping_sync``, as written there."""
    for i in np.nonzero(runner.discard_request_mask.np[: runner.input_batch.num_reqs])[0]:
        gen = runner.input_batch.generators.get(int(i))
        if gen is not None:
            gen.set_offset(gen.get_offset() - 4)
    return "bookkeeping done"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_cpu_generator_has_no_offset():
    """The bug's precondition on this torch (the fix applies only where it holds)."""
    if cpu_fixes.cpu_generator_has_offset():
        pytest.skip("this torch's CPU generator has an offset: vLLM's rewind works, fix 3 is not applied")
    runner = _runner({0: _gen(1)}, [True])
    with pytest.raises(RuntimeError, match="offset"):
        _vllm_bookkeeping(runner)


def test_discarded_rows_draw_nothing_and_bookkeeping_does_not_raise():
    sample = cpu_fixes._rewinding_sample(_vllm_sample)
    bookkeeping = cpu_fixes._offsetless_bookkeeping(_vllm_bookkeeping)
    g0, g2, g3 = _gen(10), _gen(20), _gen(30)
    # row 0 decodes (its draw is kept), row 1 (no generator) and rows 2 / 3 are prefilling prompt chunks
    gens = {0: g0, 2: g2, 3: g3}
    runner = _runner(gens, [False, True, True, True])
    drawn = sample(runner, None, None)
    assert torch.equal(drawn[0], torch.rand(4, generator=_gen(10)))
    assert bookkeeping(runner, None) == "bookkeeping done"
    assert runner.input_batch.generators is gens and gens == {0: g0, 2: g2, 3: g3}  # same objects, all back
    # the discarded rows' next draws are their first (nothing consumed); row 0 moved on
    assert torch.equal(torch.rand(4, generator=g2), torch.rand(4, generator=_gen(20)))
    assert torch.equal(torch.rand(4, generator=g3), torch.rand(4, generator=_gen(30)))
    fresh = _gen(10)
    torch.rand(4, generator=fresh)
    assert torch.equal(torch.rand(4, generator=g0), torch.rand(4, generator=fresh))


def test_seeded_draws_do_not_depend_on_the_number_of_prompt_chunks():
    """A seeded request's tokens must not depend on how its prompt was chunked (vLLM's intent with the
    rewind): 0, 1 or 3 discarded prefill steps before its first kept draw give the same draws."""
    sample = cpu_fixes._rewinding_sample(_vllm_sample)
    bookkeeping = cpu_fixes._offsetless_bookkeeping(_vllm_bookkeeping)
    runs = []
    for chunks in (1, 2, 4):
        gens = {0: _gen(7)}
        out = []
        for step in range(chunks + 3):
            runner = _runner(gens, [step < chunks - 1])
            d = sample(runner, None, None)
            bookkeeping(runner)
            if step >= chunks - 1:
                out.append(d[0])
        runs.append(torch.stack(out))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_cuda_generators_keep_vllms_rewind(monkeypatch):
    """Only CPU generators are taken out of vLLM's loop: another device's generator (whose offset vLLM
    rewinds itself) stays in it."""
    seen = []

    class Fake:
        device = torch.device("cuda")

        def get_offset(self):
            return 8

        def set_offset(self, o):
            seen.append(o)

        def get_state(self):
            raise AssertionError("a CUDA generator's state is not saved")

    runner = _runner({0: Fake()}, [True])
    cpu_fixes._rewinding_sample(lambda *a: None)(runner, None, None)
    cpu_fixes._offsetless_bookkeeping(_vllm_bookkeeping)(runner)
    assert seen == [4]


def test_generators_come_back_when_bookkeeping_raises():
    """An exception inside vLLM's bookkeeping still puts the held generators back (try / finally)."""

    def failing(runner, *args):
        assert 2 not in runner.input_batch.generators  # held out while it runs
        raise ValueError("boom")

    g0, g2 = _gen(1), _gen(2)
    gens = {0: g0, 2: g2}
    runner = _runner(gens, [False, False, True])
    with pytest.raises(ValueError, match="boom"):
        cpu_fixes._offsetless_bookkeeping(failing)(runner)
    assert gens == {0: g0, 2: g2}
