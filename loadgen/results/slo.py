"""SLO judgement for one load step: a latency quantile, its bootstrap confidence interval, a verdict.

Values are per-request SLO values in ms, as ``latency.slo_value`` defines them (``inf`` for a failed
request, the time waited so far for one cut off: a lower bound), and the quantile is
``latency.quantile``, the one the summary's ``p99_ttft_ms`` uses. The quantile computed with lower
bounds is itself a lower bound of the true one, so a breach found with them is a real breach.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadgen.results.latency import SLO_METRICS, quantile, quantile_of_sorted

METRICS = SLO_METRICS


@dataclass(frozen=True, slots=True)
class SLO:
    metric: str  # ttft_ms | tpot_ms | e2el_ms
    threshold_ms: float
    quantile: float = 0.99

    def as_dict(self) -> dict:
        return {"metric": self.metric, "quantile": self.quantile, "threshold_ms": self.threshold_ms}


@dataclass(slots=True)
class Judgement:
    n: int  # requests judged
    value_ms: float | None  # the quantile (None: no request, or it falls on a failed request: inf)
    ci_low_ms: float | None
    ci_high_ms: float | None
    passed: bool | None  # None: nothing to judge
    confident: bool  # the confidence interval lies entirely on one side of the threshold
    over: int  # requests over the threshold (failed ones included)
    failed: int  # requests that never produced the event (inf)


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def bootstrap_ci(values: Sequence[float] | np.ndarray, q: float, confidence: float = 0.95, n_boot: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the q-quantile (seeded: the same data give the same interval)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    if v.size == 1:
        return float(v[0]), float(v[0])
    # inf sorts last; a large finite stand-in keeps the interpolation arithmetic defined
    big = np.finfo(float).max / 4
    w = np.where(np.isfinite(v), v, big)
    rng = np.random.default_rng(seed)
    samples = np.sort(w[rng.integers(0, w.size, size=(n_boot, w.size))], axis=1)
    est = quantile_of_sorted(samples, q)
    a = (1.0 - confidence) / 2.0
    low, high = quantile(est, a), quantile(est, 1.0 - a)
    return (float(low) if low < big / 2 else math.inf), (float(high) if high < big / 2 else math.inf)


def judge(values: Sequence[float] | np.ndarray, slo: SLO, confidence: float = 0.95, n_boot: int = 2000,
          seed: int = 0) -> Judgement:
    """Pass when the quantile's point estimate is within the threshold; the interval says how sure."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return Judgement(0, None, None, None, None, False, 0, 0)
    est = quantile(v, slo.quantile)
    low, high = bootstrap_ci(v, slo.quantile, confidence, n_boot, seed)
    thr = slo.threshold_ms
    return Judgement(
        n=int(v.size), value_ms=_finite(est), ci_low_ms=_finite(low), ci_high_ms=_finite(high),
        passed=bool(est <= thr), confident=bool(high <= thr or low > thr),
        over=int((v > thr).sum()), failed=int((~np.isfinite(v)).sum()),
    )


def breach_certain(lower_bounds: Sequence[float] | np.ndarray, n_planned: int, slo: SLO) -> bool:
    """True when the step must fail whatever the requests not yet measured do: the quantile over the
    lower bounds known so far, with every request still to come at 0 ms (the best case), is already
    over the threshold."""
    v = np.asarray(lower_bounds, dtype=float)
    if v.size == 0:
        return False
    rest = max(0, n_planned - v.size)
    if (v > slo.threshold_ms).sum() == 0:
        return False
    return quantile(np.concatenate([v, np.zeros(rest)]), slo.quantile) > slo.threshold_ms


def breach_likely(settled: Sequence[float] | np.ndarray, slo: SLO, confidence: float = 0.95,
                  min_requests: int = 20, n_boot: int = 400) -> bool:
    """True when the lower end of the confidence interval of the quantile over ``settled`` requests (an
    unbiased sample of the step so far: every request old enough that its outcome against the
    threshold is known) is over the threshold.

    The old early-stop rule: re-tested at every look with no correction for the looks, so its false-breach
    rate is not bounded. Capacity steps decide with ``results.sequential``; this stays for
    ``bench/early_stop_bench.py``'s comparison."""
    v = np.asarray(settled, dtype=float)
    if v.size < min_requests or quantile(v, slo.quantile) <= slo.threshold_ms:
        return False
    low, _ = bootstrap_ci(v, slo.quantile, confidence, n_boot, seed=1)
    return low > slo.threshold_ms
