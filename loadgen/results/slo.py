"""SLO judgement for one load step: a latency quantile (or mean), its bootstrap confidence interval, a verdict.

Values are per-request SLO values in ms, as ``latency.slo_value`` defines them (``inf`` for a failed
request, the time waited so far for one cut off: a lower bound), and the quantile is
``latency.quantile``, the one the summary's ``p99_ttft_ms`` uses. The quantile computed with lower
bounds is itself a lower bound of the true one, so a breach found with them is a real breach.

An SLO is on a quantile (``statistic="quantile"``, ``p99 TTFT <= 500 ms``) or on the mean
(``statistic="mean"``, ``mean TPOT <= 50 ms``, as AIPerf and vLLM users state TPOT promises). A mean SLO
judges the mean of the window's values, and a failed request is ``inf`` there as everywhere in slobench:
one failure breaks a mean SLO (a mean that let failures drop out would improve as the target fails).
A mean is a property of the whole window, not of one request: goodput and per-request attainment leave
mean SLOs out. A scenario's ``tier_slos`` mapping (metric -> threshold, carried through run, replay and
the Locust workers unchanged) names a mean SLO by the key ``<metric>@mean`` (``slo_key``): every reader
that counts requests against thresholds takes ``per_request_slos`` of it, the summary's verdict
``mean_slos``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from loadgen.results.latency import SLO_METRICS, quantile, quantile_of_sorted

METRICS = SLO_METRICS
STATISTICS = ("quantile", "mean")
MEAN_SUFFIX = "@mean"  # a mean SLO's key in a tier_slos mapping: tpot_ms@mean


@dataclass(frozen=True, slots=True)
class SLO:
    metric: str  # ttft_ms | tpot_ms | e2el_ms
    threshold_ms: float
    quantile: float = 0.99  # unused by a mean SLO
    statistic: str = "quantile"  # quantile | mean
    max_shed: float = 0.0  # the tier's shed budget: this share of its requests may be shed without being judged

    @property
    def is_mean(self) -> bool:
        return self.statistic == "mean"

    @property
    def label(self) -> str:
        """``p99`` / ``p99.9`` / ``mean``: how displays name what is judged."""
        return "mean" if self.is_mean else f"p{100 * self.quantile:g}"

    def as_dict(self) -> dict:
        budget = {"max_shed": self.max_shed} if self.max_shed else {}
        if self.is_mean:
            return {"metric": self.metric, "statistic": "mean", "quantile": None, "threshold_ms": self.threshold_ms,
                    **budget}
        return {"metric": self.metric, "quantile": self.quantile, "threshold_ms": self.threshold_ms, **budget}


def slo_label(slo: Mapping) -> str:
    """``SLO.label`` of an SLO's ``as_dict`` (a summary's ``slos``): ``mean``, or ``p99`` where the quantile is
    missing."""
    if slo.get("statistic") == "mean":
        return "mean"
    return f"p{100 * float(slo.get('quantile') or 0.99):g}"


def slo_key(metric: str, statistic: str = "quantile") -> str:
    """The key of an SLO in a ``tier_slos`` mapping: the metric, ``<metric>@mean`` for a mean SLO."""
    return metric + MEAN_SUFFIX if statistic == "mean" else metric


def split_slo_key(key: str) -> tuple[str, str]:
    """(metric, statistic) of a ``tier_slos`` key."""
    return (key[:-len(MEAN_SUFFIX)], "mean") if key.endswith(MEAN_SUFFIX) else (key, "quantile")


def per_request_slos(slos: Mapping[str, float]) -> dict[str, float]:
    """The thresholds a single request can meet or miss (goodput, attainment): the mean SLOs left out."""
    return {k: v for k, v in slos.items() if not k.endswith(MEAN_SUFFIX)}


def mean_slos(slos: Mapping[str, float]) -> dict[str, float]:
    """metric -> threshold of the mean SLOs of a ``tier_slos`` mapping."""
    return {split_slo_key(k)[0]: v for k, v in slos.items() if k.endswith(MEAN_SUFFIX)}


def mean_of(values: Sequence[float] | np.ndarray) -> float:
    """The mean of SLO values: ``inf`` when one is (a failed request), NaN without values."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan
    return math.inf if not np.isfinite(v).all() else float(v.mean())


@dataclass(slots=True)
class Judgement:
    n: int  # requests judged
    value_ms: float | None  # the quantile or mean (None: no request, or it is inf: a failed request)
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


def bootstrap_mean_ci(values: Sequence[float] | np.ndarray, confidence: float = 0.95, n_boot: int = 2000,
                      seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean (seeded), as ``bootstrap_ci`` does for a quantile: a
    resample that draws a failed request (inf) has an inf mean."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    if v.size == 1:
        return float(v[0]), float(v[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(n_boot, v.size))
    finite = np.isfinite(v)
    est = np.where(finite[idx].all(axis=1), np.where(finite, v, 0.0)[idx].mean(axis=1), math.inf)
    a = (1.0 - confidence) / 2.0
    return float(quantile(est, a)), float(quantile(est, 1.0 - a))


def judge(values: Sequence[float] | np.ndarray, slo: SLO, confidence: float = 0.95, n_boot: int = 2000,
          seed: int = 0) -> Judgement:
    """Pass when the quantile's (or the mean's) point estimate is within the threshold; the interval says
    how sure. A mean over a failed request is inf: it fails."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return Judgement(0, None, None, None, None, False, 0, 0)
    if slo.is_mean:
        est = mean_of(v)
        low, high = bootstrap_mean_ci(v, confidence, n_boot, seed)
    else:
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
    over the threshold. For a mean SLO: the sum of the lower bounds over the planned count (values are
    at least 0 ms, so those to come can only add to the sum) is over it; a failed request (inf) makes it so."""
    v = np.asarray(lower_bounds, dtype=float)
    if v.size == 0:
        return False
    if slo.is_mean:
        return bool(v.sum() / max(n_planned, v.size) > slo.threshold_ms)
    rest = max(0, n_planned - v.size)
    if (v > slo.threshold_ms).sum() == 0:
        return False
    return quantile(np.concatenate([v, np.zeros(rest)]), slo.quantile) > slo.threshold_ms
