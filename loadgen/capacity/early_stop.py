"""When a capacity step may stop before its window ends, and why (the policy, apart from the running).

- **Breach** (any step): a tier's SLO quantile is over its threshold *for certain* (the quantile over
  what is known, every request still to come at 0 ms, is already over: open loop only, where the
  window's requests are known in advance), or *statistically clearly* (the confidence interval's lower
  end is over, on the requests old enough that their outcome against the threshold is settled). A
  queue that keeps growing trips both within seconds.
- **Clear pass** (ramp steps only, after ``min_window_s`` of the window): every SLO's quantile, over at
  least ``CLEAR_PASS_MIN`` settled requests of all tiers pooled, is under ``pass_margin`` x its
  threshold: far below the knee there is nothing more to learn. Bisection steps, near the knee by
  construction, always run their whole window unless they break.

Both look at the step's records so far: finished ones and those in flight (``latency.slo_value`` gives
a request still waiting the time it has waited, a lower bound).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from loadgen.capacity.plan import CapacityPlan
from loadgen.results import latency
from loadgen.results.records import RequestRecord
from loadgen.results.slo import breach_certain, breach_likely

CLEAR_PASS_MIN = 30  # settled requests before a step may pass early


def min_window_s(plan: CapacityPlan) -> float:
    """Steady state after the warm-up before a clear pass may be declared."""
    return min(2.0, plan.step.window_s)


def breach_reason(plan: CapacityPlan, records: Sequence[RequestRecord], w0: float, w1: float, planned: Counter,
                  t: float) -> str | None:
    """Why the step has already failed (its window is [w0, w1), ``planned`` its requests per tier), or None."""
    by_tier: dict[str, list[RequestRecord]] = {}
    for r in records:
        if w0 <= r.scheduled_s < w1:
            by_tier.setdefault(r.tier or "none", []).append(r)
    for tier, slos in plan.slos.items():
        rs = by_tier.get(tier)
        if not rs:
            continue
        sched = np.asarray([r.scheduled_s for r in rs])
        for slo in slos:
            vals = np.asarray([latency.slo_value(r, slo.metric, t) for r in rs], dtype=float)
            known = ~np.isnan(vals)
            what = f"{tier} p{100 * slo.quantile:g} {slo.metric[:-3].upper()} over {slo.threshold_ms:g} ms"
            if not plan.closed and breach_certain(vals[known], planned.get(tier, 0), slo):
                n_over = int((vals[known] > slo.threshold_ms).sum())
                return (f"{what} whatever follows: {n_over} of {planned.get(tier, 0)} planned window "
                        "requests already over")
            settled = known & (sched <= t - slo.threshold_ms / 1000.0)
            if breach_likely(vals[settled], slo, plan.step.confidence):
                return (f"{what} ({100 * plan.step.confidence:g}% confidence interval above it, "
                        f"{int(settled.sum())} settled requests)")
    return None


def clear_pass_reason(plan: CapacityPlan, records: Sequence[RequestRecord], w0: float, t: float) -> str | None:
    """Why the step has clearly passed, or None. Pooling the tiers lets a light load decide early; it is
    conservative for a prioritised tier (premium is served first, so its latencies sit below the pool's)."""
    horizon = max(s.threshold_ms for ss in plan.slos.values() for s in ss) / 1000.0
    settled = [r for r in records if w0 <= r.scheduled_s <= t - horizon]
    if len(settled) < CLEAR_PASS_MIN:
        return None
    margin = plan.step.pass_margin
    worst = 0.0
    for slos in plan.slos.values():
        for slo in slos:
            v = latency.slo_values(settled, slo.metric, t)
            if v.size < CLEAR_PASS_MIN:
                return None
            ratio = latency.quantile(v, slo.quantile) / slo.threshold_ms
            if not ratio <= margin:
                return None
            worst = max(worst, ratio)
    return (f"clear pass: every SLO quantile at most {100 * worst:.0f}% of its threshold over "
            f"{len(settled)} settled requests (all tiers pooled)")
