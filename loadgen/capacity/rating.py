"""The rated capacity as an estimate with a confidence interval, from every step of a capacity search.

The search brackets the capacity between a passing and a failing load; this module asks where, between
and around them, the SLO actually breaks, and how sure the steps are of it. A step is one window of its
own arrival draw (``search.arrivals: fresh``); the steps together say more than any one of them.

- **Exceedances against load.** For each judged SLO (tier, metric) of quantile q, each counted step gives
  how many of its window's requests were over the threshold (``over``: failed ones included) of how many
  it judged (``n``). The load is the rate the step's arrivals offer over its planned window (rate axis:
  ``planned_rps``, else ``offered_rps``, else its window's requests / window length) or its users
  (concurrency axis). The SLO holds where the share over the threshold is at most 1 - q.
  *Why shares, not each window's quantile:* a window's share is an unbiased estimate of the share in
  steady state at its load, and the shares of several windows pool. A window's p99 is not: requests queue
  in runs, so most short windows miss the rare long busy period and a few catch it, and the typical window
  passes above the true capacity (the calibration queue: a 15 s window passes 20 % of the time 16 % above
  it). A step stopped at its breach is counted up to its stop,
  which is still biased: it stops as soon as its exceedances are enough, in the middle of the run of
  them, so its count leaves out the rest of that run (were requests independent, the pooled share would
  be unbiased however steps stop; they are not).
- **The fit and the interval** (``capacity.crossing``): where each SLO's share crosses 1 - q, by
  isotonic then logistic fits, and its profile quasi-likelihood interval. The rated estimate is the lowest
  crossing over every SLO; ``binding`` names the SLO it belongs to. The interval of the rating is that of
  the lowest crossing: each end is the lowest over the SLOs (an SLO without a profile, its crossing above
  every profiled SLO's interval, cannot be the lowest). An end the windows cannot bound within
  ``crossing.MAX_REACH`` of the estimate is named in ``ci_unbounded`` (its ``ci_low`` / ``ci_high`` is
  then the reach): the summary, the console and the report say "unbounded" there, never a bound.
  Where no profile stands (no logistic fit, or an SLO without one near the lowest crossing), a
  **bootstrap of the windows** stands in: each
  replicate resamples the counted steps with replacement, those within ``NEIGHBOURHOOD`` of the estimate
  among themselves and the others among themselves (how many windows the search put near the knee is its
  design, not chance), refits and takes the lowest crossing; its percentiles at the confidence level,
  each side's distance from the estimate scaled by t(k - 2) / z (at most ``MAX_T_SCALE``). Seeded: the
  same run gives the same interval. ``interval_method`` says which stood.
  At a cliff the steps are no evidence of where in the gap between the last passing and the first failing
  load the SLO breaks, so the interval is widened to span the gap (``cliff_gap``).
- **Boundary.** From each step's margin (judged quantile / threshold; > 1 breaks; a quantile on a failed
  request counts as ``MARGIN_CAP``): ``margin_load_ratio`` = load at margin 1.2 / load at margin 0.8 on the
  binding SLO's isotonic fit of log(margin) against log(load) (where it does not reach one of them, the
  slope of the segment that crosses 1 extends it). ``boundary`` is ``"cliff"`` when that ratio is at most
  ``CLIFF_RATIO`` (1.10: the SLO goes from 20 % spare to 20 % over within 10 % more load), ``"gradual"``
  otherwise.

- **Mean SLOs** (``statistic: mean``) have no share of requests over a threshold: each counted window
  gives its margin, mean / threshold, and the SLO's crossing is where the isotonic fit of log margin
  against load crosses 0 (margin 1), interpolated linearly in log load between the neighbouring loads
  (``crossing.margin_crossing``). It joins the lowest crossing like any other SLO (``binding`` may name
  it; its ``crossings`` entry says ``statistic: mean``). It has no profile interval, so where it is the
  lowest crossing, or crosses below every profiled SLO's upper end, the bootstrap of the windows stands
  (each replicate refits its margins too).

The rating itself stays the search's pass end (``rate_rps`` in ``capacity.run``); the estimate and its
interval are what the gate compares (``gate.rules`` ``within_intervals``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from loadgen.capacity.crossing import (
    NEIGHBOURHOOD,
    isotonic,
    margin_crossing,
    profile_interval,
    slo_crossing,
    t_quantile,
)
from loadgen.results import latency

MARGIN_CAP = 10.0  # a margin above this (a quantile on a failed request: inf) counts as this
CLIFF_RATIO = 1.10  # load(margin 1.2) / load(margin 0.8) at most this: a cliff
MAX_T_SCALE = 3.0  # the small-sample widening t(k - 2) / z at most this
N_BOOT = 1000


def level_crossing(x: Sequence[float], g: Sequence[float], level: float = 0.0) -> float | None:
    """Where the non-decreasing fit ``g`` (of log margin, at sorted loads ``x``) first rises over
    ``level``: interpolated in log(load) between the last point at or under it and the first over it;
    None when it is over it already at the first point or never gets over it."""
    if len(x) == 0 or g[0] > level or g[-1] <= level:
        return None
    j = next(i for i, v in enumerate(g) if v > level)
    gi, gj = g[j - 1], g[j]
    t = (level - gi) / (gj - gi)
    return float(math.exp(math.log(x[j - 1]) + t * (math.log(x[j]) - math.log(x[j - 1]))))


def margin_load_ratio(x: Sequence[float], logm: Sequence[float], w: Sequence[float]) -> float | None:
    """Load at margin 1.2 / load at margin 0.8 on the fit (see the module's docstring)."""
    g = isotonic(logm, w)
    c = level_crossing(x, g)
    if c is None:
        return None
    j = next(i for i, v in enumerate(g) if v > 0)
    lx = math.log(x[j]) - math.log(x[j - 1])
    slope = (g[j] - g[j - 1]) / lx if lx > 0 else math.inf  # d log margin / d log load across 1
    out = []
    for level in (math.log(0.8), math.log(1.2)):
        at = level_crossing(x, g, level)
        if at is None:
            at = c * math.exp((level / slope) if slope > 0 else 0.0)
        out.append(at)
    return out[1] / out[0] if out[0] > 0 else None


def cliff_gap(x: Sequence[float], logm: Sequence[float], w: Sequence[float]) -> list[float] | None:
    """[the last load the fit passes, the first it fails]: the loads either side of its crossing."""
    g = isotonic(logm, w)
    j = next((i for i, v in enumerate(g) if v > 0), None)
    return [float(x[j - 1]), float(x[j])] if j else None


def step_load(step: Mapping[str, Any], axis: str) -> float | None:
    """The load a step is placed at: the rate its arrivals offer over its whole planned window
    (``planned_rps``; else its offered rate) on the rate axis, its users on the concurrency axis. Not the
    rate of what it sent before an early stop: a step stopped at a breach stopped because a burst filled
    its first seconds (at 64 req/s asked, a step stopped 5 s in had sent at 84 req/s), which placed every
    early breach above its load and the crossing too high."""
    if axis == "concurrency":
        return _num(step.get("load"))
    planned = _num(step.get("planned_rps"))
    if planned is not None and planned > 0:
        return planned
    offered = _num(step.get("offered_rps"))
    if offered is not None and offered > 0:
        return offered
    w = step.get("window_s")
    n = _num(step.get("requests"))
    if isinstance(w, Sequence) and len(w) == 2 and n and w[1] > w[0]:
        return n / (w[1] - w[0])
    return _num(step.get("load"))


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _margin(q_ms: float | None, threshold: float) -> float:
    m = math.inf if q_ms is None else q_ms / threshold
    return float(min(max(m, 1e-6), MARGIN_CAP))


def estimate(steps: Iterable[Mapping[str, Any]], axis: str = "rate") -> float | None:
    """The estimate alone (no interval): where the search's refine windows go next. None when no step
    judged an SLO or the steps do not cross it (an open end)."""
    arrays, level, means = _series(steps, axis)
    if not arrays and not means:
        return None
    value, open_end, _k = min(_crossings(arrays, level, means).values(), key=lambda e: e[0])
    return None if open_end else value


Series = dict[tuple[str, str], np.ndarray]


def _crossings(arrays: Series, level: Mapping[tuple[str, str], float], means: Series
               ) -> dict[tuple[str, str], tuple[float, str | None, int]]:
    """Each SLO's (crossing, open end, logistic fit's windows): the quantile SLOs' first, then the means'."""
    est = {k: slo_crossing(a[:, 1], a[:, 2], a[:, 3], level[k]) for k, a in arrays.items()}
    for k, a in means.items():
        c, open_end = margin_crossing(a[:, 1], a[:, 4], a[:, 3])
        est[k] = (c, open_end, 0)
    return est


def _series(steps: Iterable[Mapping[str, Any]], axis: str) -> tuple[Series, dict[tuple[str, str], float], Series]:
    """Per judged quantile SLO (tier, metric), the counted steps' rows (column, load, over, n, log margin,
    runs of exceedances: NaN where the summary does not count them) sorted by load, and the SLO's level
    (1 - quantile); per mean SLO, its rows in the same columns (over and runs NaN)."""
    pts: dict[tuple[str, str], list[tuple[int, float, float, float, float, float]]] = {}
    mean_pts: dict[tuple[str, str], list[tuple[int, float, float, float, float, float]]] = {}
    level: dict[tuple[str, str], float] = {}
    cols = 0
    for st in steps:
        if st.get("counted") is False:
            continue
        x = step_load(st, axis)
        if x is None or x <= 0:
            continue
        used = False
        for tier, e in (st.get("tiers") or {}).items():
            for metric, j in (e.get("judged") or {}).items():
                n, thr = _num(j.get("n")), _num(j.get("threshold_ms"))
                if not n or not thr:
                    continue
                if j.get("statistic") == "mean":
                    m = _margin(j.get("value_ms_q"), thr)
                    mean_pts.setdefault((tier, metric), []).append((cols, x, math.nan, n, math.log(m), math.nan))
                    used = True
                    continue
                over = _num(j.get("over"))
                if over is None:  # a summary from before steps counted their exceedances
                    continue
                m = _margin(j.get("value_ms_q"), thr)
                level[(tier, metric)] = 1.0 - float(j.get("quantile") or e.get("quantile") or 0.99)
                runs = _num(j.get("runs"))
                pts.setdefault((tier, metric), []).append((cols, x, over, n, math.log(m),
                                                           math.nan if runs is None else runs))
                used = True
        cols += used
    def rows(p: dict) -> Series:
        return {k: np.asarray(sorted(v, key=lambda r: r[1]), dtype=float) for k, v in p.items()}

    return rows(pts), level, rows(mean_pts)


def rate(steps: Iterable[Mapping[str, Any]], axis: str = "rate", *, confidence: float = 0.95,
         n_boot: int = N_BOOT, seed: int = 0, interval: str = "profile") -> dict[str, Any] | None:
    """The rated capacity's estimate, interval, boundary and binding SLO from a capacity summary's
    ``steps`` (counted ones: a step re-measured because it was disturbed is left out). None when no step
    judged an SLO. ``interval="bootstrap"`` skips the profile interval (to compare the two on one run)."""
    if interval not in ("profile", "bootstrap"):
        raise ValueError(f"interval must be 'profile' or 'bootstrap', got {interval!r}")
    arrays, level, means = _series(steps, axis)
    if not arrays and not means:
        return None
    cols = len(_window_loads({**arrays, **means}))
    est = _crossings(arrays, level, means)
    binding = min(est, key=lambda k: est[k][0])
    value, open_end, k_fit = est[binding]
    profiles = {k: profile_interval(a[:, 1], a[:, 2], a[:, 3], level[k], est[k][0], confidence, runs=a[:, 5])
                for k, a in arrays.items() if interval == "profile" and est[k][2] and est[k][1] is None}
    stood = {k: p for k, p in profiles.items() if p is not None}
    top = min((p.high for p in stood.values()), default=None)
    unbounded: list[str] = []
    # the interval of the lowest crossing: each end's lowest over the SLOs with a profile; an SLO without
    # one (no logistic fit, or open above) may be left out only where it crosses above all their ends
    if top is not None and all(est[k][0] > top for k in est if k not in stood):
        lowest = min(stood.values(), key=lambda p: p.low)
        highest = min(stood.values(), key=lambda p: p.high)
        lo, hi = lowest.low, highest.high
        unbounded = [e for e, p in (("low", lowest), ("high", highest)) if e in p.unbounded]
        dispersion, method, scale = stood[binding].dispersion, "profile", None
    else:
        lo, hi, scale = _bootstrap_interval(arrays, level, value, k_fit, confidence, n_boot, seed, means)
        method, dispersion = "bootstrap", None
    a = arrays[binding] if binding in arrays else means[binding]
    ux, inv = np.unique(a[:, 1], return_inverse=True)
    wsum = np.bincount(inv, a[:, 3])
    pooled = np.bincount(inv, a[:, 4] * a[:, 3]) / wsum
    ratio = margin_load_ratio(ux, pooled, wsum)
    cliff = ratio is not None and ratio <= CLIFF_RATIO
    gap = cliff_gap(ux, pooled, wsum) if cliff and open_end is None else None
    if gap is not None:  # the steps cannot place a cliff inside the gap between them: the interval spans it
        lo, hi = min(lo, gap[0]), max(hi, gap[1])
    return {
        "estimate": value, "ci_low": min(lo, value), "ci_high": max(hi, value), "confidence": confidence,
        # an end the windows could not bound: ci_low / ci_high there is the search's reach, not a bound
        "ci_unbounded": unbounded,
        "cliff_gap": gap,
        "of": "concurrency" if axis == "concurrency" else "rate_rps",
        "open": open_end,
        "binding": {"tier": binding[0], "metric": binding[1]},
        "crossings": [{"tier": t, "metric": m, "load": v, "open": o, "fit": "logistic" if k else "isotonic",
                       **({"statistic": "mean"} if (t, m) in means else {})}
                      for (t, m), (v, o, k) in sorted(est.items())],
        "fit": "logistic" if k_fit else "isotonic", "fit_windows": k_fit, "t_scale": scale,
        "interval_method": method, "dispersion": dispersion,
        "boundary": None if ratio is None else ("cliff" if cliff else "gradual"),
        "margin_load_ratio": ratio, "windows": cols,
        "method": "share of requests over the threshold against " + ("users" if axis == "concurrency" else
                  "offered rate") + " (isotonic, then logistic fits); " + (
                      "profile quasi-likelihood interval (dispersion from the windows)" if method == "profile"
                      else f"bootstrap ({n_boot}) of the windows") + (
                      "; mean SLOs: isotonic fit of log(mean / threshold) against load, crossing 0" if means else ""),
        "n_boot": n_boot, "seed": seed,
    }


def _bootstrap_interval(arrays: Mapping[tuple[str, str], np.ndarray], level: Mapping[tuple[str, str], float],
                        value: float, k_fit: int, confidence: float, n_boot: int, seed: int,
                        means: Series | None = None) -> tuple[float, float, float]:
    """(low, high, t scale) of the lowest crossing by a bootstrap of the windows (stratified near the
    estimate, widened by t(k - 2) / z): where no logistic fit stands for the profile interval, or a mean
    SLO (``means``) may be the lowest."""
    means = means or {}
    picks = _resample_windows(_window_loads({**arrays, **means}), value, n_boot, np.random.default_rng(seed))
    boot = np.full(n_boot, math.inf)
    for key, a in arrays.items():
        col = a[:, 0].astype(int)
        for b in range(n_boot):
            w = picks[b, col]
            keep = w > 0
            if not keep.any():
                continue
            c, _o, _k = slo_crossing(a[keep, 1], a[keep, 2] * w[keep], a[keep, 3] * w[keep], level[key])
            boot[b] = min(boot[b], c)
    for a in means.values():
        col = a[:, 0].astype(int)
        for b in range(n_boot):
            w = picks[b, col]
            keep = w > 0
            if keep.any():
                boot[b] = min(boot[b], margin_crossing(a[keep, 1], a[keep, 4], a[keep, 3] * w[keep])[0])
    boot = boot[np.isfinite(boot)]
    lo = hi = value
    if boot.size:
        a_ = (1.0 - confidence) / 2.0
        lo, hi = min(latency.quantile(boot, a_), value), max(latency.quantile(boot, 1.0 - a_), value)
    scale = t_scale(k_fit - 2, confidence) if k_fit else 1.0
    return value - scale * (value - lo), value + scale * (hi - value), scale


def _window_loads(arrays: Mapping[tuple[str, str], np.ndarray]) -> np.ndarray:
    """Each window's load, by its column."""
    loads: dict[int, float] = {}
    for a in arrays.values():
        loads.update(zip(a[:, 0].astype(int).tolist(), a[:, 1].tolist(), strict=True))
    return np.asarray([loads[c] for c in range(len(loads))])


def _resample_windows(loads: np.ndarray, estimate: float, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """How often each window is drawn in each replicate ([n_boot, windows]): the windows near the
    estimate (within ``NEIGHBOURHOOD``) among themselves, the others among themselves. Where the search
    put its windows is its design, not luck: a replicate that lost every window near the knee would fit
    across the ramp's whole gap, an interval no run of the same design could give."""
    near = (loads >= estimate / NEIGHBOURHOOD) & (loads <= estimate * NEIGHBOURHOOD)
    picks = np.zeros((n_boot, len(loads)), dtype=np.int64)
    for group in (np.flatnonzero(near), np.flatnonzero(~near)):
        if group.size:
            picks[:, group] = rng.multinomial(group.size, np.full(group.size, 1.0 / group.size), size=n_boot)
    return picks


def t_scale(df: int, confidence: float) -> float:
    """t(df) / z at (1 + confidence) / 2, at most ``MAX_T_SCALE`` (df < 1: ``MAX_T_SCALE``)."""
    if df < 1:
        return MAX_T_SCALE
    return min(MAX_T_SCALE, t_quantile(df, (1.0 + confidence) / 2.0) / _z(confidence))


def _z(confidence: float) -> float:
    """The standard normal quantile of (1 + confidence) / 2 (no scipy: bisection on erf)."""
    target = (1.0 + confidence) / 2.0
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < target else (lo, mid)
    return (lo + hi) / 2
