"""When a capacity step is decided, and why (the policy, apart from the running).

Every ``look_interval_s`` of the window (and once more after the drain, on the whole window) ``StepLooks``
looks at the step's records so far: finished ones and those in flight (``latency.slo_value`` gives a
request still waiting the time it has waited, a lower bound). A step is decided by

- **certain breach** (open loop only, where the window's requests are known in advance): a tier's SLO
  quantile over what is known, every request still to come at 0 ms, is already over its threshold (a mean
  SLO: the sum of what is known over the planned count: values are at least 0 ms, so those to come can only
  add to it; one failed request, inf, is a certain breach). No error: the whole window could not pass. A
  queue that keeps growing trips it within a second or two.
- **confidence**: the sequential test of ``results.sequential`` on each tier's SLO, over the *settled*
  requests (scheduled at least a threshold ago, so their outcome against it is known): a breach when the
  count over the threshold crosses the upper boundary (one SLO is enough: the step fails), a pass when
  every SLO's count has crossed its lower one. Alpha spending over the step's looks bounds the false
  breach (and false pass) rate at ``alpha`` per SLO for independent requests, however often it looks
  (``bench/early_stop_bench.py`` measures it). A queue delays requests in runs, and counted one by one
  they look far less likely than they are (an M/M/1 queue at its p99: ~17 % false breaches), so the
  breach side counts a run of exceedances (at most ``decluster_run`` requests apart) as one event (~2 %).
  The pass side counts every exceedance against the *effective* sample size (``effective_n``: the
  settled requests discounted by their lag-1 autocorrelation, for the same reason: a window can miss a
  queue's slow stretches); a p99 needs some 300 independent settled requests before it can pass so.
  A mean SLO has no sequential test (the test is of a quantile's share of requests over the threshold, a
  binomial count; a mean has no such count), so a step judged on a mean SLO never passes by
  confidence: it passes clearly, or at its cap; it breaks by a certain breach or at its cap (or by a
  quantile SLO's test).
- **clear pass** (ramp steps only, ``early_pass``, after ``min_window_s`` of the window): every SLO's
  quantile (a mean SLO: its mean), over at least ``CLEAR_PASS_MIN`` settled requests of all tiers pooled
  (and as many effective ones, ``effective_n``), is under ``pass_margin`` x its threshold. A heuristic,
  *not* error-bounded (far below the knee there is nothing more to learn; the bench gives its false-pass
  rate at the threshold); bisection steps, near the knee, never use it.
- **cap**: none of these by the step's length: the point estimate on the whole window judges, and the
  step says it was undecided. The length is ``step_duration_s``, or for a bisection or confirming step
  longer (``step_length_s``, up to
  ``max_step_duration_s``) until the window holds ``min_samples`` planned requests of every judged tier
  (default 1 / (1 - quantile): 100 for a p99; ``MEAN_MIN_SAMPLES``, 30, for a tier whose SLOs are all
  means: enough for the mean of a window's values to settle near its expectation). Fewer would make the
  judged "p99" a lower quantile (of 40 requests, their maximum: some p97.5) and rate a load too high; the
  runs it decides are the slow ones.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from loadgen.capacity.settings import CapacitySettings
from loadgen.results import latency
from loadgen.results.outcomes import within_shed_budget
from loadgen.results.records import RequestRecord
from loadgen.results.sequential import SequentialTest, clusters, effective_n
from loadgen.results.slo import breach_certain, mean_of

CLEAR_PASS_MIN = 30  # settled requests before a step may pass early
MEAN_MIN_SAMPLES = 30  # a window's requests for a tier whose SLOs are all means


def min_samples(settings: CapacitySettings, tier: str) -> int:
    """The planned requests of ``tier`` a step's window should hold (0: no rule)."""
    if settings.step.min_samples is not None:
        return settings.step.min_samples
    slos = settings.slos.get(tier, [])
    if slos and all(s.is_mean for s in slos):
        return MEAN_MIN_SAMPLES
    return math.ceil(1.0 / (1.0 - settings.quantile(tier)) - 1e-9)


def step_length_s(settings: CapacitySettings, arrivals: Sequence[tuple[float, str]]) -> float:
    """How long a step sends, its arrivals ``(time from the step's start, tier)`` planned up to
    ``max_step_duration_s``: ``step_duration_s``, or past the arrival that gives every judged tier
    ``min_samples`` requests after the longest warm-up (halfway to the next), at most ``max_step_duration_s``."""
    opts = settings.step
    length = opts.step_duration_s
    for tier, slos in settings.slos.items():
        need = min_samples(settings, tier) if slos else 0
        if need <= 0:
            continue
        times = sorted(a for a, t in arrivals if t == tier and a >= opts.max_warmup_s)
        if len(times) < need:
            length = opts.max_step_duration_s
        else:  # halfway to the next arrival: the last one needed is still sent inside the window if it is late
            length = max(length, (times[need - 1] + times[need]) / 2 if len(times) > need else times[need - 1] + 1e-3)
    return min(length, opts.max_step_duration_s)


def min_window_s(settings: CapacitySettings) -> float:
    """Steady state after the warm-up before a clear pass may be declared."""
    return min(2.0, settings.step.window_s)


@dataclass
class Decision:
    kind: str  # "breach" | "pass"
    by: str  # "certain" | "confidence" | "clear_pass"
    reason: str
    samples: dict[str, dict[str, int]] = field(default_factory=dict)  # tier -> SLO metric -> requests


class StepLooks:
    """The looks of one step's window [w0, w1) (``planned``: its requests per tier, open loop)."""

    def __init__(self, settings: CapacitySettings, w0: float, w1: float, planned: Counter, phase: str):
        self.settings, self.w0, self.w1, self.planned, self.phase = settings, w0, w1, planned, phase
        self.horizon = max(s.threshold_ms for ss in settings.slos.values() for s in ss) / 1000.0
        opts = settings.step
        keys = [(tier, slo) for tier, slos in settings.slos.items() for slo in slos if not slo.is_mean]
        self.has_mean = any(slo.is_mean for slos in settings.slos.values() for slo in slos)  # no confidence pass
        self.tests = {(tier, slo.metric): SequentialTest(slo.quantile, opts.alpha, opts.alpha_spending)
                      for tier, slo in keys}  # the breach side
        self.pass_tests = {(tier, slo.metric): SequentialTest(slo.quantile, opts.alpha, opts.alpha_spending)
                           for tier, slo in keys}  # the pass side, on the effective sample size
        self.samples: dict[str, dict[str, int]] = {}
        self.looks = 0

    def fraction(self, t: float) -> float:
        """The information fraction at ``t``: the share of the longest window (and its settling) elapsed."""
        span = self.w1 + self.horizon - self.w0
        return 1.0 if span <= 0 else min(1.0, max(0.0, (t - self.w0) / span))

    def look(self, records: Sequence[RequestRecord], t: float, final: bool = False) -> Decision | None:
        """One look at time ``t``; ``final``: the window is over and every record is finished."""
        self.looks += 1
        settings = self.settings
        by_tier: dict[str, list[RequestRecord]] = {}
        for r in records:
            if self.w0 <= r.scheduled_s < self.w1:
                by_tier.setdefault(r.tier or "none", []).append(r)
        frac = 1.0 if final else self.fraction(t)
        breach: Decision | None = None
        for tier, slos in settings.slos.items():
            rs = by_tier.get(tier, [])
            if slos:  # the refusals within the tier's shed budget are not judged (results.outcomes)
                rs = within_shed_budget(sorted(rs, key=lambda r: r.scheduled_s), max(s.max_shed for s in slos),
                                        of=max(len(rs), self.planned.get(tier, 0)))
            sched = np.asarray([r.scheduled_s for r in rs], dtype=float)
            for slo in slos:
                vals = np.asarray([latency.slo_value(r, slo.metric, t) for r in rs], dtype=float)
                known = ~np.isnan(vals)
                what = f"{tier} {slo.label} {slo.metric[:-3].upper()} over {slo.threshold_ms:g} ms"
                if breach is None and not settings.closed and not final and rs and breach_certain(
                        vals[known], self.planned.get(tier, 0), slo):
                    n_over = int((vals[known] > slo.threshold_ms).sum())
                    breach = Decision("breach", "certain", f"{what} whatever follows: {n_over} of "
                                      f"{self.planned.get(tier, 0)} planned window requests already over")
                settled = known if final else known & (sched <= t - slo.threshold_ms / 1000.0)
                ordered = vals[settled][np.argsort(sched[settled], kind="stable")]
                flags = ordered > slo.threshold_ms
                n, over = int(settled.sum()), int(flags.sum())
                events = clusters(flags, settings.step.decluster_run)
                self.samples.setdefault(tier, {})[slo.metric] = n
                if slo.is_mean:  # no sequential test of a mean (see the module's docstring)
                    continue
                test, ptest = self.tests[(tier, slo.metric)], self.pass_tests[(tier, slo.metric)]
                if ptest.decision is None:
                    ptest.look(frac, effective_n(np.minimum(ordered, 1e300)), over, breach_side=False)
                if test.look(frac, n, over, pass_side=False, events=events) == "breach" and breach is None:
                    breach = Decision("breach", "confidence",
                                      f"{what}: {over} of {n} settled requests over it ({events} runs), past the "
                                      f"sequential boundary (alpha {settings.step.alpha:g}, look {test.looks})")
        if breach is not None:
            breach.samples = self.copy_samples()
            return breach
        if self.pass_tests and not self.has_mean and all(ts.decision == "pass" for ts in self.pass_tests.values()):
            return Decision("pass", "confidence", "every SLO within its threshold past the sequential boundary "
                            f"(alpha {settings.step.alpha:g})", self.copy_samples())
        if final or not (settings.step.early_pass and self.phase == "ramp" and t >= self.w0 + min_window_s(settings)):
            return None
        reason = clear_pass_reason(settings, records, self.w0, t)
        return Decision("pass", "clear_pass", reason, self.copy_samples()) if reason else None

    def copy_samples(self) -> dict[str, dict[str, int]]:
        return {tier: dict(m) for tier, m in self.samples.items()}


def clear_pass_reason(settings: CapacitySettings, records: Sequence[RequestRecord], w0: float, t: float) -> str | None:
    """Why the step has clearly passed, or None. Pooling the tiers lets a light load decide early; it is
    conservative for a prioritised tier (premium is served first, so its latencies sit below the pool's)."""
    horizon = max(s.threshold_ms for ss in settings.slos.values() for s in ss) / 1000.0
    settled = sorted((r for r in records if w0 <= r.scheduled_s <= t - horizon), key=lambda r: r.scheduled_s)
    if len(settled) < CLEAR_PASS_MIN:
        return None
    margin = settings.step.pass_margin
    worst = 0.0
    for slos in settings.slos.values():
        for slo in slos:
            v = latency.slo_values(settled, slo.metric, t)
            if v.size < CLEAR_PASS_MIN or effective_n(v) < CLEAR_PASS_MIN:  # a queue's latencies move together
                return None
            ratio = (mean_of(v) if slo.is_mean else latency.quantile(v, slo.quantile)) / slo.threshold_ms
            if not ratio <= margin:
                return None
            worst = max(worst, ratio)
    judged = "quantile" if not any(s.is_mean for ss in settings.slos.values() for s in ss) else "quantile or mean"
    return (f"clear pass: every SLO {judged} at most {100 * worst:.0f}% of its threshold over "
            f"{len(settled)} settled requests (all tiers pooled)")
