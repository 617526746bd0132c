"""The decode runtime on CUDA with the embedded trained pair and its *real* drafts (no acceptance
control), fp32, CUDA graphs: the GPU kernels of a draft step (``"ar"`` onto scratch slots with
``out_slots``, the last step ``"ar_read"`` writing nothing) must draft what the CPU reference path
drafts. The acceptance-controlled benchmarks replace the drafts and so cannot show a wrong draft.

Skipped without CUDA. Tolerance: greedy tokens from fp32 logits on two devices; the mean
acceptance length may differ by a near-tie flip of a draft (0.1 allowed, over 3 rows x 12 steps).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def models():
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint

    return load_fla_checkpoint("models/specla-gdn-tiny/target"), load_eagle_drafter("models/specla-gdn-tiny/drafter")


@pytest.mark.parametrize("csrc", [False, True])
@pytest.mark.parametrize("K", [2, 4])
def test_real_drafts_on_cuda_match_cpu(models, K, csrc, monkeypatch):
    """``csrc``: with the CUDA csrc op built (``_cpp.load_cuda``), as the benchmarks run, or Triton only."""
    from vllm_specla.ops import _cpp
    from vllm_specla.ops import chain_verify as cv
    from vllm_specla.runtime.decode import DecodeRuntime
    from vllm_specla.runtime.fused_model import FusedEagle, FusedTarget

    if csrc and not _cpp.load_cuda():
        pytest.skip("the CUDA csrc op did not build")
    monkeypatch.setattr(cv, "USE_CUDA_CSRC", csrc)

    tm, dm = models
    B, steps = 3, 12
    prompts = torch.randint(3, 8000, (B, 8), generator=torch.Generator().manual_seed(5))
    res = {}
    for dev in ("cpu", "cuda"):
        tgt = FusedTarget(tm, torch.float32, dev)
        dr = FusedEagle(dm, tgt, torch.float32, dev)
        ar = DecodeRuntime(tgt, B, "ar", output_capacity=80)
        ar.prefill(prompts)
        ar.run(60)
        rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=80)
        if dev == "cuda":
            rt.capture()
        rt.prefill(prompts)
        r = rt.run(steps)
        res[dev] = (ar.outputs(), rt.outputs(), r.mean_acceptance_length)
    for dev in res:
        for a, s in zip(res[dev][0], res[dev][1]):
            n = min(len(a), len(s))
            assert n >= steps and a[:n] == s[:n]  # lossless on each device
    tau_cpu, tau_gpu = res["cpu"][2], res["cuda"][2]
    assert tau_cpu > 1.3  # the trained drafter is accepted (a wrong draft step would not be)
    assert abs(tau_gpu - tau_cpu) <= 0.1, (tau_gpu, tau_cpu)
