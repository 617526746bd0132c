"""Automatic draft length: pick K per step so that SpecLA is never slower than AR (vLLM-free).

``num_speculative_tokens: "auto"`` replaces the fixed K by :class:`DraftLengthPolicy`. Before
each step it picks one K for the whole batch (``0 <= K <= k_max``) that maximises the expected
output tokens per second::

    rate(B, K) = tau(K) / (step_cost(B, 1 + K) + draft_cost(B, K))       [tokens / second]
    rate(B, 0) = 1 / step_cost(B, 1)                                      (AR)

and returns 0 (no speculation) unless the best K beats AR by ``margin`` (2 %). Three parts:

* :class:`StepCostModel` — seconds per target step, by batch size ``B`` (requests in the step)
  and window ``T = 1 + K`` (tokens verified per request), from observed step times (median of
  the last observations per cell) and/or a seed table ``{"B": {"T": seconds}}`` (dict or JSON
  file); plus the drafter's seconds per step for ``K`` drafts.
* :class:`AcceptanceEstimator` — per-position conditional acceptance ``alpha_i`` (ALGORITHMS.md
  §9b: P(draft i accepted | drafts 1..i-1 accepted)), an EMA over verify steps of
  ``(num_drafts, num_accepted)`` outcomes, weighted by the step's trials (so batch-1 steps of
  one outcome each do not swing it), with a prior and a floor. The expected tokens per
  verify step (mean acceptance length, bonus token included) is
  ``tau(K) = 1 + sum_{k=1..K} prod_{i=1..k} alpha_i``, which for i.i.d. ``alpha`` is the
  closed form ``(1 - alpha^(K+1)) / (1 - alpha)`` of §9b (:func:`chain_tau`).
* :class:`DraftLengthPolicy` — the argmax above, with a deterministic exploration schedule (steps
  2, 4, 8, ... while warming up, then every ``explore_every``-th step, or further apart the
  slower the model expects the candidate to be, tries a neighbouring K or AR) so that costs of
  windows other than the chosen one, AR's included, get measured.

Units: seconds for costs, tokens for ``tau``, tokens per second for rates. Nothing here imports
torch or vLLM; the runtime engine and the vLLM proposer time their own steps and feed the policy.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from typing import Callable, Iterable, Mapping

from vllm_specla.core import is_int

__all__ = ["AcceptanceEstimator", "DraftLengthPolicy", "StepCostModel", "chain_tau", "load_cost_table"]


def chain_tau(alpha: float, k: int) -> float:
    """Expected tokens per verify step of a K-draft chain with i.i.d. acceptance ``alpha``.

    ``tau = (1 - alpha^(K+1)) / (1 - alpha)`` (ALGORITHMS.md §9b; includes the bonus token);
    ``K + 1`` at ``alpha = 1``; ``1`` at ``K = 0``.
    """
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


# ------------------------------------------------------------------------------------------------
# step costs
def load_cost_table(table: str | os.PathLike | Mapping) -> dict[int, dict[int, float]]:
    """Parse a cost table ``{"B": {"T": seconds}}`` (dict, or a path to a JSON file holding one).

    Keys are batch sizes and windows (ints >= 1, JSON strings allowed), values seconds (> 0).

    Raises:
        ValueError: missing file, a directory, invalid JSON, or a key / value that is not as above (the
        message names the offending entry).
    """
    if isinstance(table, (str, os.PathLike)):
        path = os.fspath(table)
        if os.path.isdir(path):
            raise ValueError(f"cost table {path!r} is a directory, not a JSON file")
        if not os.path.isfile(path):
            raise ValueError(f"cost table file {path!r} does not exist")
        try:
            with open(path) as f:
                table = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"cost table {path!r} is not valid JSON: {e}") from None
    if not isinstance(table, Mapping):
        raise ValueError(f'cost table must be an object {{"B": {{"T": seconds}}}}, got {type(table).__name__}')
    out: dict[int, dict[int, float]] = {}
    for b, row in table.items():
        bi = _pos_int(b, "batch size")
        if not isinstance(row, Mapping):
            raise ValueError(f'cost table[{b!r}] must be an object {{"T": seconds}}, got {row!r}')
        for t, s in row.items():
            ti = _pos_int(t, f"window in cost table[{b!r}]")
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
                raise ValueError(f"cost table[{b!r}][{t!r}] must be seconds > 0, got {s!r}")
            out.setdefault(bi, {})[ti] = float(s)
    return out


def _pos_int(x, what: str) -> int:
    try:
        v = int(x)
    except (TypeError, ValueError):
        v = 0
    if isinstance(x, bool) or v < 1 or str(v) != str(x).strip():
        raise ValueError(f"{what} must be an integer >= 1, got {x!r}")
    return v


def _bucket(b: int) -> int:
    """Batch-size bucket: exact up to 8, then a quarter-octave grid (≈ 19 % apart)."""
    if b <= 8:
        return b
    return int(round(2 ** (round(4 * math.log2(b)) / 4)))


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear ``y(x)`` through ``points`` (sorted by x, distinct x). Outside their range:
    the line through the two nearest points with a slope >= 0, floored at a tenth of the nearest
    point's value; a single point is a constant."""
    if len(points) == 1:
        return points[0][1]
    if x <= points[0][0]:
        (x0, y0), (x1, y1) = points[0], points[1]
        slope = max(0.0, (y1 - y0) / (x1 - x0))
        return max(0.1 * y0, y0 - slope * (x0 - x))
    if x >= points[-1][0]:
        (x0, y0), (x1, y1) = points[-2], points[-1]
        slope = max(0.0, (y1 - y0) / (x1 - x0))
        return y1 + slope * (x - x1)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise AssertionError("unreachable")


class _Surface:
    """``seconds(B, x)`` over batch size ``B`` and a window-like ``x`` (T for the target, K for the
    drafter), from observations (median of the last ``window`` per (bucket, x) cell, at the cell's
    mean B) and seed points (a table entry is used until its cell has observations).

    ``estimate(B, x)``: the values known at ``B`` for each ``x'`` (from points no further than a
    factor 2 away: interpolated over B between them; beyond them, the value at the nearest one
    times the change of the best-covered ``x'`` curve among those known at ``B``, i.e. the ratio
    to that curve held constant, so that every ``x'`` moves alike outside its data: extrapolated
    each on its own line, a vLLM-CPU run with data up to 16 requests put a T = 9 verify step at
    32 requests at the cost of its T = 3 step and rated K = 8 at 1.48x AR where 16 requests gave
    0.70x), then piecewise-linear in ``x`` over those; with a single known ``x0``, ``value(x0) * shape(B, x) / shape(B, x0)``; with nothing known at ``B``, the
    curve of the nearest batch size that has data. None when there is no data at all.
    ``split``: windows ``x >= split`` are estimated from the known ``x' >= split`` only (and
    ``x < split`` from ``x' < split``) where at least two are known there, and never below the
    largest known ``x' < split``. For the target, split = 2: a T = 1 step is a plain AR step (no
    verify, no drafter), so the line from T = 1 to T = 3 underestimates a T = 2 step (H200, trained
    pair at batch 1: 0.205 ms interpolated against 0.231 measured, and ``auto`` picked K = 1 at
    0.91x AR; RESULTS.md session 13). With one verify window known, the line through T = 1 stays (a
    prior's shape scaled to that window alone could put a verify step below the AR step).
    """

    def __init__(self, shape: Callable[[int, int], float], window: int = 16, split: int | None = None):
        self.shape = shape
        self.split = split
        self.window = window
        self.cells: dict[tuple[int, int], deque] = {}
        self.cell_value: dict[tuple[int, int], tuple[float, float]] = {}  # (mean B, median seconds)
        self.seeds: dict[tuple[int, int], tuple[float, float]] = {}
        self._pts: dict[int, list[tuple[float, float]]] | None = None  # caches, dropped on change
        self._known: dict[float, dict[int, float]] = {}

    def _changed(self) -> None:
        self._pts = None
        self._known = {}

    def seed(self, table: Mapping[int, Mapping[int, float]]) -> None:
        """Seed points ``table[B][x]`` = seconds at batch ``B`` and window-like ``x`` (e.g. a
        ``step_cost_table``); a cell's observations replace its seed."""
        for b, row in table.items():
            for x, s in row.items():
                self.seeds[(_bucket(int(b)), int(x))] = (float(b), float(s))
        self._changed()

    def observe(self, b: int, x: int, seconds: float) -> None:
        """One measurement: ``seconds`` at batch ``b`` and window-like ``x``. The cell (batch-size
        bucket, ``x``) keeps its last ``window`` observations; its value is their median."""
        key = (_bucket(b), x)
        cell = self.cells.setdefault(key, deque(maxlen=self.window))
        cell.append((float(b), float(seconds)))
        ss = sorted(s for _, s in cell)
        n = len(ss)
        med = ss[n // 2] if n % 2 else 0.5 * (ss[n // 2 - 1] + ss[n // 2])
        self.cell_value[key] = (sum(bb for bb, _ in cell) / n, med)
        self._changed()

    def points(self) -> dict[int, list[tuple[float, float]]]:
        """``{x: [(B, seconds), ...]}`` sorted by B, one point per (bucket, x)."""
        if self._pts is None:
            pts = {**self.seeds, **self.cell_value}
            by_x: dict[int, dict[float, float]] = {}
            for (_, x), (b, s) in pts.items():
                by_x.setdefault(x, {})[b] = s
            self._pts = {x: sorted(d.items()) for x, d in by_x.items()}
        return self._pts

    def _known_at(self, pts: dict, b: float) -> dict[int, float]:
        known = self._known.get(b)
        if known is None:
            near = {x: p for x, p in pts.items() if p[0][0] / 2 <= b <= 2 * p[-1][0]}
            # the best-covered curve among those known at b (more points, then the smaller x)
            ref = near[max(near, key=lambda x: (len(near[x]), -x))] if near else None
            known = {}
            for x, p in near.items():
                if p is ref or p[0][0] <= b <= p[-1][0]:
                    known[x] = _interp(p, b)
                else:  # outside x's own batch sizes: its ratio to the reference curve held constant
                    bn = p[0][0] if b < p[0][0] else p[-1][0]
                    known[x] = _interp(p, bn) * _interp(ref, b) / _interp(ref, bn)
            self._known[b] = known
        return known

    def estimate(self, b: int, x: int) -> float | None:
        """Seconds at batch ``b`` and window-like ``x`` as the class docstring describes; None
        before anything was seeded or observed."""
        pts = self.points()
        if not pts:
            return None
        known = self._known_at(pts, b)
        if not known:  # nothing near this batch size: borrow the nearest batch size's curve
            near = min((p for ps in pts.values() for p, _ in ps), key=lambda p: abs(math.log(p / max(b, 1e-9))))
            b = near
            known = self._known_at(pts, b)
        if x in known:
            return known[x]
        floor = 0.0
        if self.split is not None:
            side = {x2: v for x2, v in known.items() if (x2 >= self.split) == (x >= self.split)}
            if x >= self.split:  # a verify window costs at least the AR step
                floor = max((v for x2, v in known.items() if x2 < self.split), default=0.0)
            if len(side) >= 2:
                known = side
        if len(known) >= 2:
            return max(floor, _interp(sorted(known.items()), x))
        (x0, v0), = known.items()
        return max(floor, v0 * self.shape(int(round(b)), x) / self.shape(int(round(b)), x0))


class StepCostModel:
    """Seconds per target step (``cost``) and per drafting pass (``draft_cost``).

    Args:
        table: seed step costs ``{B: {T: seconds}}`` (dict or JSON file path, see
            :func:`load_cost_table`), e.g. measured offline on the serving machine.
        draft_table: seed drafting costs ``{B: {K: seconds}}`` (seconds for the drafter to
            absorb the committed tokens and propose K drafts for a batch of B requests).
        draft_seconds_per_token: fixed drafting cost ``K * draft_seconds_per_token`` per step
            (seconds per draft position for the whole batch); overrides learning it.
        prior: ``prior(B, T) -> relative cost`` used for windows not observed at a batch size
            (scaled to a known window there); default ``1 + prior_slope * (T - 1)``.
        prior_slope: relative extra cost per extra window token in the default prior.
        draft_prior_ratio: drafting cost per draft position, as a fraction of an AR step, while no
            drafting time has been seen.
        window: observations kept per (batch bucket, window) cell; the cell's value is their median
            (robust to a stray slow step).
        learn: False freezes the model at its seed (observations are ignored).

    Windows not observed at a batch size are interpolated/extrapolated linearly in T from the
    windows known there (slope >= 0), verify windows (T >= 2) from the known verify windows only
    when there are two or more, never below the AR step (T = 1); with one known window the prior's
    shape is used.
    Batch sizes are interpolated linearly between observed ones (bucketed: exact up to 8, then a
    quarter-octave grid); beyond a window's own batch sizes (up to 2x) its ratio to the
    best-covered window's curve is held (:class:`_Surface`). The switch cost (:meth:`switch_cost`)
    is learnt per request.
    """

    def __init__(self, table=None, *, draft_table=None, draft_seconds_per_token: float | None = None,
                 prior: Callable[[int, int], float] | None = None, prior_slope: float = 0.25,
                 draft_prior_ratio: float = 0.1, window: int = 16, learn: bool = True):
        self.prior = prior if prior is not None else (lambda b, t: 1.0 + prior_slope * (t - 1))
        self.step = _Surface(self.prior, window, split=2)  # T = 1 (AR) apart from the verify windows
        self.draft = _Surface(lambda b, k: float(k), window)
        self.switch = _Surface(lambda b, x: 1.0, window)  # x = 1 only: seconds per switch, by B
        if table is not None:
            self.step.seed(load_cost_table(table))
        if draft_table is not None:
            self.draft.seed(load_cost_table(draft_table))
        self.draft_seconds_per_token = draft_seconds_per_token
        self.draft_prior_ratio = draft_prior_ratio
        self.learn = learn

    def observe(self, batch_size: int, window: int, seconds: float) -> None:
        """Record one target step: ``batch_size`` requests, ``window`` = 1 + drafts tokens each."""
        if self.learn and batch_size > 0 and window > 0 and seconds > 0:
            self.step.observe(batch_size, window, seconds)

    def observe_draft(self, batch_size: int, num_drafts: int, seconds: float) -> None:
        """Record one drafting pass proposing ``num_drafts`` drafts for ``batch_size`` requests."""
        if self.learn and batch_size > 0 and num_drafts > 0 and seconds > 0:
            self.draft.observe(batch_size, num_drafts, seconds)

    def observe_switch(self, batch_size: int, seconds: float) -> None:
        """Record the extra ``seconds`` (>= 0) a drafting pass took to absorb what a run of K = 0
        steps held back, beyond a steady drafting pass of ``batch_size`` requests. Kept per
        request (each request's backlog is absorbed alike), so other batch sizes scale it."""
        if self.learn and batch_size > 0 and seconds >= 0:
            self.switch.observe(batch_size, 1, max(seconds / batch_size, 1e-12))

    def switch_cost(self, batch_size: int) -> float:
        """Extra seconds of the first drafting pass after a run of K = 0 steps for ``batch_size``
        requests: the learnt seconds per request (interpolated over batch size, the nearest batch
        size's beyond the data) times ``batch_size``; 0 before any was seen."""
        v = self.switch.estimate(batch_size, 1)
        return v * batch_size if v is not None else 0.0

    def cost(self, batch_size: int, window: int) -> float:
        """Seconds for a target step of ``batch_size`` requests verifying ``window`` tokens each."""
        v = self.step.estimate(batch_size, window)
        return v if v is not None else self.prior(batch_size, window)

    def draft_cost(self, batch_size: int, num_drafts: int) -> float:
        """Seconds for the drafter to propose ``num_drafts`` per request (0 for ``num_drafts = 0``)."""
        if num_drafts <= 0:
            return 0.0
        if self.draft_seconds_per_token is not None:
            return num_drafts * self.draft_seconds_per_token
        v = self.draft.estimate(batch_size, num_drafts)
        if v is not None:
            return v
        return self.draft_prior_ratio * num_drafts * self.cost(batch_size, 1)

    def to_table(self) -> dict[str, dict[str, float]]:
        """The current step-cost points as ``{"B": {"T": seconds}}`` (JSON-ready; B = a bucket's
        mean batch size, rounded): save it to seed a later run."""
        out: dict[str, dict[str, float]] = {}
        for t, pts in self.step.points().items():
            for b, s in pts:
                out.setdefault(str(int(round(b))), {})[str(t)] = s
        return out


# ------------------------------------------------------------------------------------------------
# acceptance
class AcceptanceEstimator:
    """Per-position conditional acceptance ``alpha_i`` (ALGORITHMS.md §9b), EMA over verify steps.

    Args:
        k_max: positions tracked.
        prior: alpha before any outcome (and for positions not yet observed ``min_steps`` times,
            the pooled estimate over all positions is used instead).
        floor: lower bound on every alpha used for decisions (so one bad streak cannot pin K at
            0 for good; exploration re-measures it).
        ema: the largest weight one step's acceptance ratio gets in the moving average.
        ema_per_trial: the weight per trial below that cap: a step with ``n`` trials at a position
            gets ``min(ema, 1 - (1 - ema_per_trial)^n)``. At batch 1 a step is one Bernoulli
            outcome per position, so a fixed per-step weight of 0.1 averaged over ~10 outcomes
            only: on the trained pair (H200, RESULTS.md session 13) that noise made ``auto`` pick
            K = 4 at 0.92x AR. With 0.01 per trial the memory is ~100 outcomes at batch 1 and
            the per-step ``ema`` from ~11 rows up (as before); the price is a slower reaction at
            batch 1 (10 steps of all drafts rejected move alpha_1 from 0.7 to ~0.63, where the
            per-step EMA went to ~0.24; exploration and the margin bound the loss meanwhile).
            ``ema_per_trial = 1`` gives the per-step EMA at every batch size.
        min_steps: steps with outcomes at a position before its own estimate is used (and its
            data must weigh at least half of it against the prior; until then the pooled
            estimate, which gets every position's trials, is used).
    Raises:
        ValueError: ``prior``, ``floor``, ``ema`` or ``ema_per_trial`` outside the ranges above.
    """

    def __init__(self, k_max: int, prior: float = 0.7, floor: float = 0.05, ema: float = 0.1,
                 min_steps: int = 4, ema_per_trial: float = 0.01):
        if (not 0.0 < prior <= 1.0 or not 0.0 <= floor <= prior or not 0.0 < ema <= 1.0
                or not 0.0 < ema_per_trial <= 1.0):
            raise ValueError(f"AcceptanceEstimator: need 0 < prior <= 1, 0 <= floor <= prior, 0 < ema <= 1, "
                             f"0 < ema_per_trial <= 1 (got prior={prior}, floor={floor}, ema={ema}, "
                             f"ema_per_trial={ema_per_trial})")
        self.k_max, self.floor, self.ema, self.min_steps = k_max, floor, ema, min_steps
        self.ema_per_trial = ema_per_trial
        self.pooled = prior
        self.per_pos = [prior] * k_max
        self.steps_at = [0] * k_max
        self.mass = [0.0] * k_max  # weight of the data (not the prior) in per_pos[i]

    def update(self, num_drafts: Iterable[int], num_accepted: Iterable[int]) -> None:
        """Fold one verify step's outcomes in: per row, drafts proposed and drafts accepted
        (``0 <= accepted <= drafts``; bonus token not counted). Rows without drafts are ignored.

        Position ``i`` (1-based) of a row is a trial when drafts 1..i-1 were accepted
        (``i <= accepted + 1`` and ``i <= drafts``), a success when ``i <= accepted``.
        """
        trials = [0] * self.k_max
        succ = [0] * self.k_max
        for d, a in zip(num_drafts, num_accepted):
            d = min(int(d), self.k_max)
            a = max(0, min(int(a), d))
            for i in range(min(a + 1, d)):
                trials[i] += 1
                succ[i] += i < a
        tot_t, tot_s = sum(trials), sum(succ)
        if tot_t == 0:
            return
        self.pooled += self._weight(tot_t) * (tot_s / tot_t - self.pooled)
        for i in range(self.k_max):
            if trials[i]:
                w = self._weight(trials[i])
                self.per_pos[i] += w * (succ[i] / trials[i] - self.per_pos[i])
                self.mass[i] = 1.0 - (1.0 - self.mass[i]) * (1.0 - w)
                self.steps_at[i] += 1

    def _weight(self, trials: int) -> float:
        """A step's weight in the moving average for ``trials`` outcomes (see ``ema_per_trial``)."""
        return min(self.ema, 1.0 - (1.0 - self.ema_per_trial) ** trials)

    def alpha(self, position: int) -> float:
        """Conditional acceptance used for draft ``position`` (1-based), floored."""
        i = position - 1
        own = i < self.k_max and self.steps_at[i] >= self.min_steps and self.mass[i] >= 0.5
        a = self.per_pos[i] if own else self.pooled
        return max(self.floor, min(1.0, a))

    def tau(self, k: int) -> float:
        """Expected tokens per verify step with K drafts: ``1 + sum_k prod_{i<=k} alpha_i``
        (= :func:`chain_tau` when every alpha_i is equal)."""
        total, p = 1.0, 1.0
        for i in range(1, k + 1):
            p *= self.alpha(i)
            total += p
        return total


# ------------------------------------------------------------------------------------------------
# policy
class DraftLengthPolicy:
    """Chooses K per step (one value for the whole batch) to maximise expected tokens per second.

    Args:
        k_max: largest K (the factor banks hold ``1 + k_max`` window positions).
        costs: a :class:`StepCostModel` (default: learn from observations, default prior).
        acceptance: an :class:`AcceptanceEstimator` (default: prior 0.7, floor 0.05).
        margin: speculate only when the best K's rate exceeds AR's by this fraction (0.02 = 2 %).
        explore_every: every n-th :meth:`choose` call, and calls 2, 4, 8, ... below n (warm-up:
            the first measurements come early), return a neighbour of the best K instead: the
            candidates are ``best - 1``, ``best + 1`` and ``0`` (AR), those in 0..k_max and
            different from the best, sorted, taken in turn (exploration i takes candidate
            ``i mod count``, so AR is measured first whenever the best K is > 1); 0 = never.
            Deterministic (step counters), so runs and tests are reproducible.
        explore_regret: after the warm-up, each candidate has its own gap, which grows with how
            much slower the model expects it to be: candidate ``c`` is due once at least
            ``explore_every * (1 + regret_c / explore_regret)`` steps (at most
            ``16 * explore_every``) passed since it was last tried, ``regret_c = max(0, 1 -
            rate(c) / rate(best))`` at the step's batch size. A step explores when some candidate
            is due and ``explore_every`` steps passed since the last exploration (so at most one
            in ``explore_every`` steps, as before); it takes the due candidate tried longest ago.
            Each exploration is expected to cost ``regret_c`` of a step, so each candidate costs
            under ``explore_regret / explore_every`` of the steps (0.6 % by default) unless the
            16x cap binds (``regret_c > 15 * explore_regret``: then ``1 / (16 * explore_every)``),
            while a candidate within a few per cent of the best is still tried about every
            ``explore_every`` steps (every ``2 * explore_every`` when two are that close). Why:
            with K = 0 best at large batch (vLLM-CPU, 16 requests), every fixed 16th step drafted
            for the whole batch, absorbing what each request held back. None: every
            ``explore_every``-th step, candidates in turn (:meth:`is_exploration_step`). While the
            best K is 0, a candidate K > 0 also pays the switch: the measured extra seconds of
            the drafting pass that absorbs what the K = 0 steps held back, over the AR step, is
            added to its regret (vLLM-CPU, 16 requests: 0.13 s, 2.7-2.8 AR steps; with the drafting
            cost learnt from steady passes only and no switch cost, the policy explored K = 1
            every ~25 steps, each exploration paying that absorb, and ``auto`` ran 0.93x AR where
            K pinned at 0 ran 0.99x; with it, 0.97-0.98x, within 1.6 % of K pinned at 0 in two runs;
            RESULTS.md session 41).
        switch_backlog: the mean held inputs per request from which a drafting pass counts as a
            switch out of a run of K = 0 steps (:meth:`observe_draft`).

    Per step the caller does: ``k = policy.choose(B)``; proposes up to k drafts per request;
    after the verify, ``policy.observe_step(B, 1 + drafts, seconds)``,
    ``policy.observe_acceptance(drafts_per_row, accepted_per_row)`` and, when it timed the
    drafter, ``policy.observe_draft(B, k, seconds, backlog)``.
    """

    def __init__(self, k_max: int = 8, costs: StepCostModel | None = None,
                 acceptance: AcceptanceEstimator | None = None, *, margin: float = 0.02,
                 explore_every: int = 16, explore_regret: float | None = 0.1, switch_backlog: float = 8.0):
        if not is_int(k_max) or not 1 <= k_max <= 64:
            raise ValueError(f"DraftLengthPolicy: k_max={k_max!r} must be an int in 1..64")
        if not (is_int(explore_every) and explore_every >= 0 and margin >= 0):  # (NaN too)
            raise ValueError(f"DraftLengthPolicy: explore_every={explore_every!r} must be an int >= 0 and "
                             f"margin={margin!r} a number >= 0")
        if explore_regret is not None and not explore_regret > 0:
            raise ValueError(f"DraftLengthPolicy: explore_regret={explore_regret} must be > 0 or None")
        if not switch_backlog > 0:
            raise ValueError(f"DraftLengthPolicy: switch_backlog={switch_backlog} must be > 0")
        self.k_max = k_max
        self.costs = costs if costs is not None else StepCostModel()
        self.acceptance = acceptance if acceptance is not None else AcceptanceEstimator(k_max)
        if self.acceptance.k_max < k_max:
            raise ValueError(f"DraftLengthPolicy: acceptance tracks {self.acceptance.k_max} positions < k_max={k_max}")
        self.margin = margin
        self.explore_every = explore_every
        self.explore_regret = explore_regret
        self.switch_backlog = switch_backlog
        self.last_explored = 0  # step of the last exploration after the warm-up
        self.last_tried: dict[int, int] = {}  # candidate K -> step it was last explored (explore_regret)
        self.steps = 0
        self.explored = 0
        self.chosen: dict[int, int] = {}  # K -> steps it was chosen (exploration included)
        self.chosen_by_batch: dict[int, dict[int, int]] = {}  # batch bucket -> {K: steps}

    # ---- model ---------------------------------------------------------------------------------
    def expected_rate(self, batch_size: int, k: int) -> float:
        """Expected tokens per second per request: ``tau(K) / (cost(B, 1+K) + draft_cost(B, K))``
        (multiply by B for the batch)."""
        b = max(1, batch_size)
        return self.acceptance.tau(k) / (self.costs.cost(b, 1 + k) + self.costs.draft_cost(b, k))

    def best(self, batch_size: int) -> int:
        """The rate-maximising K (0 unless some K >= 1 beats AR by ``margin``). No side effects."""
        ar = self.expected_rate(batch_size, 0)
        rates = [self.expected_rate(batch_size, k) for k in range(1, self.k_max + 1)]
        k = max(range(len(rates)), key=lambda i: rates[i]) + 1
        return k if rates[k - 1] > (1.0 + self.margin) * ar else 0

    def choose(self, batch_size: int) -> int:
        """K for the next step of ``batch_size`` requests (0 = a plain AR step). Counts a step."""
        if batch_size <= 0:
            return 0
        self.steps += 1
        k = self.best(batch_size)
        cands = [c for c in sorted({k - 1, k + 1, 0} - {k}) if 0 <= c <= self.k_max]
        c = self._exploration(batch_size, k, cands) if cands else None
        if c is not None:
            k = c
            self.explored += 1
        self.chosen[k] = self.chosen.get(k, 0) + 1
        row = self.chosen_by_batch.setdefault(_bucket(batch_size), {})
        row[k] = row.get(k, 0) + 1
        return k

    def _exploration(self, batch_size: int, best: int, cands: list[int]) -> int | None:
        """The candidate this step (``self.steps``) explores instead of ``best``, or None (class
        doc: ``explore_every``, ``explore_regret``)."""
        n, s = self.explore_every, self.steps
        if not n:
            return None
        if s < n or self.explore_regret is None:  # warm-up, or the fixed schedule: candidates in turn
            return cands[self.explored % len(cands)] if self.is_exploration_step(s) else None
        if s - self.last_explored < n:
            return None
        r_best = self.expected_rate(batch_size, best)
        # leaving a run of K = 0 steps costs the backlog's absorb on top of the step (in AR steps)
        switch = self.costs.switch_cost(batch_size) / self.costs.cost(batch_size, 1) if best == 0 else 0.0
        due = []
        for c in cands:
            regret = max(0.0, 1.0 - self.expected_rate(batch_size, c) / r_best) + (switch if c > 0 else 0.0)
            waited = s - self.last_tried.get(c, 0)
            if waited >= min(16 * n, n * (1.0 + regret / self.explore_regret)):
                due.append((-waited, c))
        if not due:
            return None
        c = min(due)[1]  # tried longest ago (then the smaller K)
        self.last_explored = self.last_tried[c] = s
        return c

    def is_exploration_step(self, step: int) -> bool:
        """The fixed schedule (``explore_regret=None``): step ``step`` (1-based count of
        :meth:`choose` calls) explores when it is a multiple of ``explore_every``, or a power of
        two >= 2 below it (the warm-up, which ``explore_regret`` leaves as is)."""
        n = self.explore_every
        if not n:
            return False
        return step % n == 0 or (1 < step < n and step & (step - 1) == 0)

    # ---- feedback ------------------------------------------------------------------------------
    def observe_step(self, batch_size: int, window: int, seconds: float) -> None:
        """A target step took ``seconds`` for ``batch_size`` requests of ``window`` tokens each."""
        self.costs.observe(batch_size, window, seconds)

    def observe_draft(self, batch_size: int, num_drafts: int, seconds: float, backlog: float = 0.0) -> None:
        """The drafter took ``seconds`` to propose ``num_drafts`` drafts for ``batch_size`` requests,
        absorbing ``backlog`` inputs per request (mean) that K = 0 steps had held back.

        A pass without backlog is a steady drafting step (``costs.observe_draft``). A pass with a
        backlog of at least ``switch_backlog`` ends a run of K = 0 steps: the seconds beyond the
        steady drafting cost are the switch cost (``costs.observe_switch``), which prices
        explorations out of a run of K = 0 steps. A smaller backlog (one AR exploration among
        drafting steps) is neither, and ignored.
        """
        if backlog <= 0:
            self.costs.observe_draft(batch_size, num_drafts, seconds)
        elif backlog >= self.switch_backlog:
            self.costs.observe_switch(batch_size, max(0.0, seconds - self.costs.draft_cost(batch_size, num_drafts)))

    def observe_acceptance(self, num_drafts: Iterable[int], num_accepted: Iterable[int]) -> None:
        """One verify step's outcomes: drafts proposed and accepted per row."""
        self.acceptance.update(num_drafts, num_accepted)

    def summary(self) -> dict:
        """Counters for tests and logs: steps, explored steps, K histogram (overall and per
        batch-size bucket: exact up to 8, then a quarter-octave grid), pooled alpha."""
        return {"steps": self.steps, "explored": self.explored, "chosen": dict(sorted(self.chosen.items())),
                "chosen_by_batch": {b: dict(sorted(r.items())) for b, r in sorted(self.chosen_by_batch.items())},
                "alpha": round(self.acceptance.pooled, 4)}

    def describe(self, batch_sizes: Iterable[int] = (1, 2, 4, 8, 16, 32, 64)) -> dict:
        """The model as it stands, for logs and diagnosis (JSON-ready): per batch size, the
        expected rate of each K relative to AR's (``rate(B, K) / rate(B, 0)``; > 1 + margin
        means K beats AR) and the K :meth:`best` picks; the step and drafting cost points
        (``{"B": {"T" or "K": seconds}}``), the switch costs (``{"B": seconds}``); the alpha used
        per draft position."""
        rel = {}
        for b in batch_sizes:
            ar = self.expected_rate(b, 0)
            rel[str(b)] = {"best": self.best(b),
                           "rate_vs_ar": {str(k): round(self.expected_rate(b, k) / ar, 4) for k in range(1, self.k_max + 1)}}
        drafts: dict[str, dict[str, float]] = {}
        for k, pts in self.costs.draft.points().items():
            for b, s in pts:
                drafts.setdefault(str(int(round(b))), {})[str(k)] = s
        switch = {str(int(round(b))): v * b for b, v in self.costs.switch.points().get(1, [])}
        return {"by_batch": rel, "step_costs": self.costs.to_table(), "draft_costs": drafts, "switch_costs": switch,
                "alpha": [round(self.acceptance.alpha(i), 4) for i in range(1, self.k_max + 1)]}
