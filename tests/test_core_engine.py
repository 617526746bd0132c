"""Greedy losslessness of SpecLA chain decoding in the vLLM-free core (fp32, full matrix).

K in {1, 2, 4, 8} x deferred commit on/off x three drafters (identical draft model: every draft
accepted; perturbed draft model: partial acceptance; random EAGLE drafter: almost all rejected),
batch 1 and 12 requests of different lengths and max_tokens through 4 or 16 slots (slot reuse).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from helpers import assert_greedy_equal
from vllm_specla.core.drafting import DraftModelDrafter, EagleDrafterRunner
from vllm_specla.core.state import state_bytes_per_slot
from vllm_specla.models.drafter import load_eagle_drafter
from vllm_specla.models.gdn import load_fla_checkpoint
from vllm_specla.runtime.engine import SpecLAEngine

MAX_TOKENS = [24, 5, 13, 1, 9, 30, 16, 3, 11, 20, 7, 2]
LENS = [3, 9, 1, 17, 5, 12, 2, 7, 40, 4, 6, 25]


@pytest.fixture(scope="module")
def models(tiny_dir):
    t = load_fla_checkpoint(tiny_dir["target"])
    return {
        "target": t,
        "same": load_fla_checkpoint(tiny_dir["same"]),
        "perturbed": load_fla_checkpoint(tiny_dir["perturbed"]),
        "random": load_eagle_drafter(tiny_dir["random_eagle"]),
    }


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(42)
    return [torch.randint(3, 96, (n,), generator=g).tolist() for n in LENS]


@pytest.fixture(scope="module")
def ar_out(models, prompts):
    return SpecLAEngine(models["target"], max_batch=16).generate(prompts, MAX_TOKENS)


def _drafter(models, kind, slots):
    if kind == "random":
        return EagleDrafterRunner.for_target(models["random"], models["target"], slots)
    return DraftModelDrafter(models[kind], slots)


def test_ar_engine_matches_full_sequence_reference(models, prompts, ar_out):
    """AR through state slots (prefill + T=1 decode) == argmax of a full-sequence forward."""
    t = models["target"]
    ref = []
    for p, m in zip(prompts, MAX_TOKENS):
        seq = list(p)
        for _ in range(m):
            with torch.no_grad():
                seq.append(int(t.forward_sequence(torch.tensor([seq]))[0, -1].argmax()))
        ref.append(seq[len(p):])
    assert_greedy_equal(t, prompts, ref, ar_out)


def test_same_prompt_alone_and_in_batch(models, prompts, ar_out):
    alone = SpecLAEngine(models["target"], max_batch=1).generate([prompts[5]], [MAX_TOKENS[5]])
    assert alone[0] == ar_out[5]


@pytest.mark.parametrize("K", [1, 2, 4, 8])
@pytest.mark.parametrize("deferred", [True, False])
@pytest.mark.parametrize("kind", ["same", "perturbed", "random"])
@pytest.mark.parametrize("slots", [4, 16])
def test_greedy_spec_equals_ar(models, prompts, ar_out, K, deferred, kind, slots):
    eng = SpecLAEngine(models["target"], _drafter(models, kind, slots), num_speculative_tokens=K,
                       deferred_commit=deferred, max_batch=slots)
    out = eng.generate(prompts, MAX_TOKENS)
    flips = assert_greedy_equal(models["target"], prompts, ar_out, out)
    assert flips == 0, f"{flips} tie-flips"
    tau = eng.stats.mean_acceptance_length
    if kind == "same":
        # every draft is accepted; windows are only cut by max_tokens
        assert sum(eng.stats.num_accepted) == sum(eng.stats.num_drafts)
    elif kind == "random":
        assert tau < 1.3
    else:
        assert 1.1 < tau < K + 1


@pytest.mark.parametrize("K", [1, 3])
def test_batch_of_one(models, prompts, ar_out, K):
    eng = SpecLAEngine(models["target"], _drafter(models, "perturbed", 1), num_speculative_tokens=K, max_batch=1)
    out = eng.generate(prompts[:3], MAX_TOKENS[:3])
    assert_greedy_equal(models["target"], prompts[:3], ar_out[:3], out)


@pytest.mark.parametrize("deferred", [True, False])
def test_zero_draft_step_after_accepted_step(models, prompts, ar_out, deferred):
    """vLLM #39273 class: a row gets 0 drafts right after a step that accepted drafts."""
    eng = SpecLAEngine(models["target"], _drafter(models, "same", 8), num_speculative_tokens=4,
                       deferred_commit=deferred, max_batch=8,
                       draft_budget=lambda step, rid: 0 if (step + rid) % 2 else 4)
    out = eng.generate(prompts, MAX_TOKENS)
    assert 0 in eng.stats.num_drafts and max(eng.stats.num_accepted) == 4
    assert_greedy_equal(models["target"], prompts, ar_out, out)
    # the zero-draft rows are AR steps: the acceptance length counts the rows that verified drafts (as vLLM's
    # metrics do), so the identical drafter's stays near 1 + K instead of halving
    drafted = [(d, a) for d, a in zip(eng.stats.num_drafts, eng.stats.num_accepted) if d > 0]
    assert eng.stats.verify_steps == len(drafted) < len(eng.stats.num_drafts)
    assert eng.stats.mean_acceptance_length == (sum(a for _, a in drafted) + len(drafted)) / len(drafted) > 3.5


def test_eos_mid_window_and_max_tokens(models, prompts, ar_out):
    """Accepted tokens that run past EOS or max_tokens are cut, exactly as AR stops."""
    eos = ar_out[0][6]
    ar = SpecLAEngine(models["target"], max_batch=4, eos_token_id=eos).generate(prompts, MAX_TOKENS)
    eng = SpecLAEngine(models["target"], _drafter(models, "same", 4), num_speculative_tokens=8, max_batch=4,
                       eos_token_id=eos)
    out = eng.generate(prompts, MAX_TOKENS)
    assert out == ar
    assert out[0][-1] == eos and len(out[0]) == 7
    assert all(len(o) <= m for o, m in zip(out, MAX_TOKENS))


def test_slot_reuse_leaks_nothing(models, prompts):
    """A request run in a slot previously used (and left with pending factors) equals a fresh run."""
    t = models["target"]
    fresh = SpecLAEngine(t, max_batch=1).generate([prompts[3]], [12])
    eng = SpecLAEngine(t, _drafter(models, "perturbed", 1), num_speculative_tokens=4, max_batch=1)
    out = eng.generate([prompts[8], prompts[3]], [10, 12])  # same slot, one after the other
    assert out[1] == fresh[0]
    assert int(eng.book.pending_len.sum()) == 0


def test_state_memory_is_one_state_plus_factors(models):
    cfg = models["target"].config
    ar = state_bytes_per_slot(cfg, 0)
    for K in (1, 4, 8):
        sp = state_bytes_per_slot(cfg, K + 1)
        assert sp["state"] == ar["state"]  # one recurrent state + conv window, independent of K
        # factor banks grow linearly in K but stay far below one extra state per draft token
        assert sp["factors"] < K * ar["state"]


@pytest.mark.parametrize("accepted", [1, 3, 4])
def test_ar_step_folds_pending_factors(models, accepted):
    """A speculative verify step, then steps planned as AR on the same slot (what vLLM's runner does
    when no row of a step has a draft token, ``worker/runner.py`` ``_specla_build_plan``): the AR
    step folds the pending factors of the accepted prefix into the state before its token, so its
    logits equal a plain AR run's over the same tokens (fp32: rel < 1e-5), the pending factors are
    gone, and the bank selection is kept for the next speculative step. A later speculative step on
    that slot has nothing pending to fold. Two slots step together: slot 1 with pending factors,
    slot 0 without (its AR tokens from the start), as a batch folds them. ``accepted`` = 4: more
    pending tokens than the conv window's 3."""
    from vllm_specla.core.state import SlotBook, allocate_layer_states, build_step_plan

    t = models["target"]
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(3, 96, (7,), generator=g).tolist()
    window = torch.randint(3, 96, (4,), generator=g).tolist()  # the verify window (token + 3 drafts)
    tail = torch.randint(3, 96, (3,), generator=g).tolist()  # the AR steps' tokens after the accepted prefix
    prompt0 = torch.randint(3, 96, (5,), generator=g).tolist()  # slot 0: AR throughout
    tail0 = torch.randint(3, 96, (3,), generator=g).tolist()

    def run(speculative_first: bool):
        states = allocate_layer_states(t.config, 2, 5)
        book = SlotBook(2)
        with torch.no_grad():
            t(torch.tensor(prompt0 + prompt),
              build_step_plan([5, 7], [0, 1], [True, True], [False, False], speculative=True, book=book), states)
            logits = []
            if speculative_first:  # verify the window, accept `accepted` tokens, defer the commit
                t(torch.tensor(window), build_step_plan([4], [1], [False], [True], speculative=True, book=book),
                  states)
                book.set_pending(torch.tensor([1]), torch.tensor([accepted]))
                bank = int(book.bank_sel[1])
            else:  # the accepted prefix as AR steps
                for tok in window[:accepted]:
                    t(torch.tensor([tok]), build_step_plan([1], [1], [False], [True], speculative=False, book=book),
                      states)
                bank = None
            for i, (tok0, tok) in enumerate(zip(tail0, tail)):
                plan = build_step_plan([1, 1], [0, 1], [False, False], [True, True], speculative=False, book=book)
                if speculative_first and i == 0:
                    assert plan.verify.pending_len.tolist() == [0, accepted]
                h = t(torch.tensor([tok0, tok]), plan, states)
                logits.append(t.compute_logits(h))
                assert book.pending_len.tolist() == [0, 0]
            if bank is not None:
                assert int(book.bank_sel[1]) == bank
            nxt = build_step_plan([2, 2], [0, 1], [False, False], [True, True], speculative=True, book=book)
            assert nxt.verify.pending_len.tolist() == [0, 0]
        return torch.stack(logits)  # [steps, 2 slots, V]

    got, want = run(True), run(False)
    assert float((got - want).norm() / want.norm()) < 1e-5
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("prompts_,max_tokens,match", [
    ([[5, 6], [], [7]], 4, r"prompts\[1\]: empty prompt"),  # used to read another row's logits
    ([[5, 6], [7]], [4], r"max_tokens: 1 values for 2 prompts"),  # used to drop the second prompt
    ([[5, "V"]], 4, r"prompts\[0\]: token id V is not an int in \[0, V\)"),
    ([[-1]], 4, r"token id -1 is not an int in \[0, V\)"),
    ([[1.5, 2]], 4, r"token id 1.5 is not an int"),
    (["hello"], 4, r"prompts\[0\]: must be a list of token ids, got str"),
    ([5, 6, 7], 4, r"prompts\[0\]: must be a list of token ids, got int \(prompts is a list of prompts"),  # one prompt
    ([[5]], -3, r"max_tokens\[0\]=-3: must be an int >= 0"),
    ([[5]], 1.5, r"max_tokens\[0\]=1.5: must be an int >= 0"),
])
def test_generate_refuses_bad_inputs_naming_the_field(models, prompts_, max_tokens, match):
    """``V`` stands for the target's vocabulary size."""
    V = models["target"].config.vocab_size
    prompts_ = [[V if t == "V" else t for t in p] if isinstance(p, list) else p for p in prompts_]
    eng = SpecLAEngine(models["target"], _drafter(models, "perturbed", 4), num_speculative_tokens=2, max_batch=4)
    with pytest.raises(ValueError, match=match.replace("V", str(V))):
        eng.generate(prompts_, max_tokens)


def test_generate_takes_tensor_prompts_and_numpy_ints(models, prompts, ar_out):
    """Tensors, numpy arrays, tuples and generators of token ids; numpy ints and arrays as max_tokens;
    numpy scalars as engine arguments and TreeSpec fields (the argument checks take them)."""
    import numpy as np

    from vllm_specla.core.drafting import TreeSpec

    eng = SpecLAEngine(models["target"], max_batch=4, temperature=np.float32(0.0), top_p=np.float64(1.0))
    assert eng.generate([torch.tensor(prompts[0])], [np.int64(MAX_TOKENS[0])]) == ar_out[:1]
    got = eng.generate([np.array(prompts[0]), tuple(prompts[1]), (t for t in prompts[2])], np.array(MAX_TOKENS[:3]))
    assert got == ar_out[:3]
    assert TreeSpec(top_k=np.int64(2), max_depth=np.int32(3), node_budget=np.int64(6), tau=np.float32(1.0)).top_k == 2
    # a numpy int K (numpy scalars have a ``choose`` method: not a draft-length policy)
    spec = SpecLAEngine(models["target"], _drafter(models, "perturbed", 4), num_speculative_tokens=np.int64(3),
                        max_batch=4)
    assert spec.K == 3 and spec.policy is None
    assert spec.generate(prompts[:3], MAX_TOKENS[:3]) == ar_out[:3]
    # a numpy int seed (passed the argument check, then failed in torch.Generator.manual_seed)
    sampled = [SpecLAEngine(models["target"], max_batch=4, temperature=1.0, seed=sd).generate(prompts[:2], 6)
               for sd in (np.int64(3), 3)]
    assert sampled[0] == sampled[1]
    # prompts as a generator / map (read once: it used to give [] with one int max_tokens)
    assert spec.generate((p for p in prompts[:3]), MAX_TOKENS[:3]) == ar_out[:3]
    assert spec.generate(map(tuple, prompts[:2]), 4) == [o[:4] for o in ar_out[:2]]


@pytest.mark.parametrize("kw,match", [
    ({"num_speculative_tokens": True}, r"num_speculative_tokens=True: must be an int in 0\.\.64"),
    ({"num_speculative_tokens": 2.5}, r"num_speculative_tokens=2.5: must be an int in 0\.\.64"),
    ({"num_speculative_tokens": None}, r"num_speculative_tokens=None"),
    ({"num_speculative_tokens": 65}, r"num_speculative_tokens=65: must be an int in 0\.\.64"),  # (was an allocation)
    ({"num_speculative_tokens": "auto", "max_num_speculative_tokens": 0}, r"max_num_speculative_tokens=0"),
    ({"num_speculative_tokens": "auto", "max_num_speculative_tokens": 65},  # (was DraftLengthPolicy's k_max error)
     r"max_num_speculative_tokens=65: must be an int in 1\.\.64"),
    ({"max_batch": 0}, r"max_batch=0: must be an int >= 1"),
    ({"eos_token_id": "V+5"}, r"eos_token_id=V\+5: must be None or an int in \[0, V\)"),
    ({"temperature": -1.0}, r"temperature=-1.0: must be a finite number >= 0"),
    ({"temperature": float("nan")}, r"temperature=nan"),
    ({"top_k": -5}, r"top_k=-5: must be an int >= 0"),
    ({"top_p": 2.0}, r"top_p=2.0: must be a number in \(0, 1\]"),
    ({"top_p": 0.0}, r"top_p=0.0"),
    ({"tree": "tree"}, r"tree='tree': must be None \(chains\) or a TreeSpec"),
    ({"seed": "a"}, r"seed='a': must be an int in \[0, 2\*\*64\)"),  # used to be torch's error, not naming seed
    ({"seed": 2**70}, r"seed=1180591620717411303424: must be an int"),
    ({"deferred_commit": "no"}, r"deferred_commit='no': must be True .* or False"),  # ("no" was truthy: fused)
    ({"deferred_commit": 0}, r"deferred_commit=0: must be True .* or False"),
    ({"draft_budget": 3}, r"draft_budget=3: must be None or a callable"),  # (used to fail at generate)
])
def test_engine_refuses_bad_arguments_naming_them(models, kw, match):
    """``V`` stands for the target's vocabulary size."""
    V = models["target"].config.vocab_size
    if kw.get("eos_token_id") == "V+5":
        kw, match = {"eos_token_id": V + 5}, match.replace("V\\+5", str(V + 5))
    match = match.replace("V", str(V))
    with pytest.raises(ValueError, match=match):
        SpecLAEngine(models["target"], _drafter(models, "perturbed", 4), max_batch=kw.pop("max_batch", 4), **kw)


def test_generate_refuses_unordered_prompts(models):
    """A dict of prompts (its keys were taken as prompts) and a set as a prompt (taken in its iteration order)."""
    eng = SpecLAEngine(models["target"], max_batch=4)
    with pytest.raises(ValueError, match=r"prompts: must be a list of prompts \(lists of token ids\), got dict"):
        eng.generate({"a": [5]}, 3)
    with pytest.raises(ValueError, match=r"prompts\[1\]: must be a list of token ids \(in order\), got set"):
        eng.generate([[5, 6], {5, 6}], 3)
    assert eng.generate([(5, 6)], 3) == eng.generate([[5, 6]], 3)  # (a tuple is ordered: taken)


def test_engine_refuses_a_bad_draft_budget_value(models):
    """A ``draft_budget`` returning no int (a float, None) is named at the step (a float was a TypeError in the
    drafter, None one in ``min``); a negative int drafts nothing, as 0 (as before)."""
    for bad in (2.5, None):
        eng = SpecLAEngine(models["target"], _drafter(models, "perturbed", 4), num_speculative_tokens=3, max_batch=4,
                           draft_budget=lambda step, i, bad=bad: bad)
        with pytest.raises(ValueError, match=rf"draft_budget\(0, 0\) returned {bad}: must be an int \(<= 0: no "):
            eng.generate([[1, 2, 3]], 5)
    # the engine is usable after the error, and an int budget is honoured (0 or less: AR steps only)
    ar = SpecLAEngine(models["target"], max_batch=4).generate([[1, 2, 3]], 5)
    for none in (0, -1, np.int64(-3)):
        eng.draft_budget = lambda step, i, none=none: none
        n0 = sum(eng.stats.num_drafts)
        assert eng.generate([[1, 2, 3]], 5) == ar and sum(eng.stats.num_drafts) == n0
    assert SpecLAEngine(models["target"], max_batch=4, deferred_commit=np.False_).deferred is False  # (numpy bools)


@pytest.mark.parametrize("kw,match", [({"top_k": 0}, r"TreeSpec.top_k=0: must be an int >= 1"),
                                      ({"top_k": -1}, r"TreeSpec.top_k=-1"),
                                      ({"max_depth": 0}, r"TreeSpec.max_depth=0"),
                                      ({"node_budget": 0}, r"TreeSpec.node_budget=0: must be an int >= 1 or None"),
                                      ({"tau": -1.0}, r"TreeSpec.tau=-1.0: must be None \(no pruning\) or a number >= 0")])
def test_tree_spec_refuses_bad_fields(kw, match):
    from vllm_specla.core.drafting import TreeSpec

    with pytest.raises(ValueError, match=match):
        TreeSpec(**kw)


def test_engine_refuses_mismatched_drafters(models):
    """A drafter with fewer slots than ``max_batch`` (used to fail on an index mid-run), an EAGLE drafter in
    another dtype than the target (used to fail on a matmul dtype), and a non-drafter object."""
    with pytest.raises(ValueError, match=r"drafter: built for 2 slots \(max_requests\), fewer than max_batch=4"):
        SpecLAEngine(models["target"], _drafter(models, "perturbed", 2), num_speculative_tokens=2, max_batch=4)
    import copy

    half = copy.deepcopy(models["random"]).to(torch.bfloat16)
    runner = EagleDrafterRunner.for_target(half, models["target"], 4)
    with pytest.raises(ValueError, match=r"drafter: an EAGLE drafter .* \(torch.float32, cpu\), got \(torch.bfloat16"):
        SpecLAEngine(models["target"], runner, num_speculative_tokens=2, max_batch=4)
    with pytest.raises(ValueError, match=r"drafter: must be a SlotDrafter .* got str"):
        SpecLAEngine(models["target"], "eagle", num_speculative_tokens=2, max_batch=4)
    # a draft model with another vocabulary, an EAGLE drafter with another hidden size (used to fail mid-generate
    # on an embedding index / a matmul shape)
    from vllm_specla.models.drafter import EagleDrafter
    from vllm_specla.models.gdn import GatedDeltaNetForCausalLM

    cfg = copy.deepcopy(models["perturbed"].config)
    cfg.vocab_size += 8
    V = models["target"].config.vocab_size
    with pytest.raises(ValueError, match=rf"drafter: a draft model must share the target's vocabulary \(vocab_size "
                                         rf"{V}\), got vocab_size {V + 8}"):
        SpecLAEngine(models["target"], DraftModelDrafter(GatedDeltaNetForCausalLM(cfg), 4), num_speculative_tokens=2,
                     max_batch=4)
    ecfg = copy.deepcopy(models["random"].config)
    ecfg.hidden_size *= 2
    D = models["target"].config.hidden_size
    with pytest.raises(ValueError, match=rf"drafter: an EAGLE drafter .* target's hidden_size \({D}\), got {2 * D}"):
        SpecLAEngine(models["target"], EagleDrafterRunner.for_target(EagleDrafter(ecfg), models["target"], 4),
                     num_speculative_tokens=2, max_batch=4)
    # a draft *model* may use its own dtype: it reads tokens only
    dm = DraftModelDrafter(copy.deepcopy(models["perturbed"]).to(torch.bfloat16), 4)
    assert SpecLAEngine(models["target"], dm, num_speculative_tokens=2, max_batch=4).generate([[5, 6, 7]], 6)


@pytest.mark.parametrize("name,want", [("bf16", torch.bfloat16), ("BFloat16", torch.bfloat16),
                                       ("torch.float32", torch.float32), ("fp16", torch.float16),
                                       (torch.bfloat16, torch.bfloat16)])
def test_dtype_names_accepted(tiny_dir, name, want):
    from vllm_specla.runtime.fused_model import FusedTarget

    m = load_fla_checkpoint(tiny_dir["target"], dtype=name)
    assert next(m.parameters()).dtype == want
    assert FusedTarget(load_fla_checkpoint(tiny_dir["target"]), name, "cpu").dtype == want


@pytest.mark.parametrize("bad", ["bf8", "int8", torch.int8, torch.float8_e4m3fn, 16])
def test_bad_dtype_names_the_field_and_choices(tiny_dir, bad):
    from vllm_specla.runtime.fused_model import FusedTarget

    with pytest.raises(ValueError, match=r"dtype=.*: must be torch.float32 / torch.bfloat16 / torch.float16 or one of"):
        load_fla_checkpoint(tiny_dir["target"], dtype=bad)
    with pytest.raises(ValueError, match=r"dtype=.*: must be torch.float32"):
        FusedTarget(load_fla_checkpoint(tiny_dir["target"]), bad, "cpu")


def test_load_eagle_drafter_takes_dtype_names():
    """``load_eagle_drafter(path, dtype="bf16")`` resolves the name as ``load_fla_checkpoint`` does (it used to end in
    torch's ``to()`` TypeError); an unknown name is a ValueError naming ``dtype``."""
    path = os.path.join(os.path.dirname(__file__), "..", "models", "specla-gdn-tiny", "drafter")
    if not os.path.isdir(path):
        pytest.skip("default model not present")
    d = load_eagle_drafter(path, dtype="bf16")
    assert {p.dtype for p in d.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="dtype"):
        load_eagle_drafter(path, dtype="int8")


def test_load_fla_checkpoint_refuses_other_model_types(tiny_dir, tmp_path):
    """A checkpoint whose ``config.json`` names another ``model_type`` is refused by name (a ``mamba2`` config loaded
    silently into a GDN model; a llama one ended in ``KeyError: unexpected parameter``)."""
    import json
    import shutil

    from vllm_specla.models.config import UnsupportedConfigError

    d = tmp_path / "other"
    shutil.copytree(tiny_dir["target"], d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, model_type="mamba2")))
    with pytest.raises(UnsupportedConfigError, match=r"model_type='mamba2': vllm_specla loads 'gated_deltanet' "
                                                     r"checkpoints only"):
        load_fla_checkpoint(str(d))
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_fla_checkpoint(str(d)).config.vocab_size == cfg["vocab_size"]


def test_load_fla_checkpoint_names_the_drafter_loader():
    """The EAGLE drafter's folder given to ``load_fla_checkpoint`` (the target loader) is a ValueError pointing at
    ``load_eagle_drafter`` (it was ``KeyError: unexpected parameter 'fc.weight'``; a new user's review, session 52);
    the reverse was already one clear error."""
    root = os.path.join(os.path.dirname(__file__), "..", "models", "specla-gdn-tiny")
    if not os.path.isdir(root):
        pytest.skip("default model not present")
    with pytest.raises(ValueError, match=r"is an EAGLE drafter checkpoint .*load_eagle_drafter"):
        load_fla_checkpoint(os.path.join(root, "drafter"))
    with pytest.raises(ValueError, match="not an EAGLE drafter"):
        load_eagle_drafter(os.path.join(root, "target"))
    assert load_fla_checkpoint(os.path.join(root, "target")).config.hidden_size > 0
