"""The rated capacity as an estimate with a confidence interval, from every step of a capacity search.

The search brackets the capacity between a passing and a failing load; this module asks where, between
and around them, the SLO actually breaks, and how sure the steps are of it:

- **Margin against load.** For each judged SLO (tier, metric), each counted step gives a *margin*: its
  judged quantile / the threshold (> 1 breaks; a quantile on a failed request is capped at
  ``MARGIN_CAP``). The load is the rate the step's arrivals offer over its planned window (rate axis:
  ``planned_rps``, else ``offered_rps``, else its window's requests / window length) or its users
  (concurrency axis).
- **Isotonic fit.** log(margin) is fitted against load with a non-decreasing step function
  (pool-adjacent-violators, weighted by each step's judged requests): more load never helps, and noise
  that says otherwise is pooled away. Steps at the same load are pooled first.
- **Crossing.** The capacity for one SLO is where the fit crosses margin 1, interpolated in log(load) /
  log(margin) between the last fitted point at or under 1 and the first over it. The rated estimate is
  the lowest crossing over every SLO; ``binding`` names the SLO it belongs to. When every step passes
  (or fails) the crossing lies outside the loads tried: the estimate is the highest (lowest) load tried,
  and ``open`` says ``"above"`` (``"below"``).
- **Bootstrap.** Each replicate first resamples, among the steps that asked for the same load (a
  bracket end and its confirmations, each a window of its own arrival draw), which of them were measured:
  where failures come in bursts (admission refusing a run of requests) whether a window met one is most
  of the uncertainty, and resampling its requests alone cannot show it. Then, for every chosen step and
  SLO, it resamples the step's own requests' SLO values
  (``latency.slo_values`` of its window's records in ``requests.jsonl``, by ``stage``) with replacement,
  takes the quantile again, refits and takes the lowest crossing; ``ci_low`` / ``ci_high`` are the
  replicates' percentiles at the confidence level (0.95: 2.5 % and 97.5 %), widened to the estimate in
  the rare case the percentiles leave it out. At a cliff the interpolation between the last passing and
  the first failing load is not evidence of where in that gap the SLO breaks (a margin of 0.6 next to one of
  10 fits any crossing between them), so the interval is widened to span the gap (``cliff_gap``).
  Seeded: the same run gives the same interval. A step without its records
  (a summary read alone) varies instead as a log-normal around its quantile whose width is its own
  bootstrap interval (``ci_low_ms`` / ``ci_high_ms``); ``method`` says which were used. A step stopped
  at its breach has only a lower-bound margin (its requests still in flight count with the time they had
  waited): the fit is then too low at that load and the crossing, with its interval, leans high;
  ``breach_lower_bounds`` counts such steps among the binding SLO's points. The rating itself stays the
  search's pass end (``rate_rps``); the estimate and interval say how sharply the steps place it.
- **Boundary.** ``margin_load_ratio`` = load at margin 1.2 / load at margin 0.8 on the binding SLO's fit
  (log-log interpolation; where the fit does not reach one of them, the slope of the segment that
  crosses 1 extends it). ``boundary`` is ``"cliff"`` when that ratio is at most ``CLIFF_RATIO`` (1.10:
  the SLO goes from 20 % spare to 20 % over within 10 % more load), ``"gradual"`` otherwise. Lower-bound
  margins make a boundary look gentler, never sharper.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from loadgen.results import latency

MARGIN_CAP = 10.0  # a margin above this (a quantile on a failed request: inf) counts as this
CLIFF_RATIO = 1.10  # load(margin 1.2) / load(margin 0.8) at most this: a cliff
N_BOOT = 1000
_CHUNK = 200  # replicates resampled at once (memory: chunk x requests of a step)


def isotonic(y: Sequence[float], w: Sequence[float] | None = None) -> np.ndarray:
    """The non-decreasing sequence closest to ``y`` in weighted least squares (pool adjacent violators)."""
    y = np.asarray(y, dtype=float)
    w = np.ones_like(y) if w is None else np.asarray(w, dtype=float)
    vals: list[float] = []
    wts: list[float] = []
    sizes: list[int] = []
    for yi, wi in zip(y, w, strict=True):
        vals.append(float(yi))
        wts.append(float(wi))
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            wsum = wts[-2] + wts[-1]
            v = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / wsum if wsum > 0 else (vals[-2] + vals[-1]) / 2
            n = sizes[-2] + sizes[-1]
            del vals[-1], wts[-1], sizes[-1]
            vals[-1], wts[-1], sizes[-1] = v, wsum, n
    return np.repeat(vals, sizes)


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


def crossing(x: Sequence[float], logm: Sequence[float], w: Sequence[float]) -> tuple[float, str | None]:
    """(load where the isotonic fit of log margin crosses 0, None | "above" | "below" when it does not
    cross within the loads: the highest / lowest load tried)."""
    g = isotonic(logm, w)
    c = level_crossing(x, g)
    if c is not None:
        return c, None
    return (float(x[-1]), "above") if g[-1] <= 0 else (float(x[0]), "below")


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


def _boot_margins(values: np.ndarray | None, judged: Mapping[str, Any], q: float, n_boot: int,
                  rng: np.random.Generator, z: float) -> tuple[np.ndarray, str]:
    """n_boot log margins of one step and SLO: its requests resampled, or its interval as a log-normal."""
    thr = float(judged["threshold_ms"])
    if values is not None and values.size:
        big = np.finfo(float).max / 4
        v = np.where(np.isfinite(values), values, big)
        out = np.empty(n_boot)
        for a in range(0, n_boot, _CHUNK):
            b = min(n_boot, a + _CHUNK)
            rows = np.sort(v[rng.integers(0, v.size, size=(b - a, v.size))], axis=1)
            est = latency.quantile_of_sorted(rows, q)
            out[a:b] = np.where(est < big / 2, est / thr, MARGIN_CAP)
        return np.log(np.clip(out, 1e-6, MARGIN_CAP)), "requests"
    m = _margin(judged.get("value_ms_q"), thr)
    lo, hi = _num(judged.get("ci_low_ms")), _num(judged.get("ci_high_ms"))
    sigma = (math.log(hi) - math.log(lo)) / (2 * z) if lo and hi and hi > lo > 0 else 0.0
    return np.clip(math.log(m) + sigma * rng.standard_normal(n_boot), math.log(1e-6), math.log(MARGIN_CAP)), "interval"


def rate(steps: Iterable[Mapping[str, Any]], axis: str = "rate",
         records: Mapping[int, Sequence[Mapping[str, Any]]] | None = None, *, confidence: float = 0.95,
         n_boot: int = N_BOOT, seed: int = 0) -> dict[str, Any] | None:
    """The rated capacity's estimate, interval, boundary and binding SLO from a capacity summary's
    ``steps`` (counted ones: a step re-measured because it was disturbed is left out) and, when given,
    the run's records by stage. None when no step judged an SLO."""
    pts: dict[tuple[str, str], list[tuple[float, float, float, dict, float, int, int]]] = {}
    breach: dict[tuple[str, str], set] = {}
    asked: dict[int, float | None] = {}  # step ordinal -> the load it asked for (its stratum in the bootstrap)
    for ordinal, st in enumerate(steps):
        if st.get("counted") is False:
            continue
        asked[ordinal] = _num(st.get("load"))
        x = step_load(st, axis)
        if x is None or x <= 0:
            continue
        for tier, e in (st.get("tiers") or {}).items():
            for metric, j in (e.get("judged") or {}).items():
                if not j.get("n") or not _num(j.get("threshold_ms")):
                    continue
                m = _margin(j.get("value_ms_q"), float(j["threshold_ms"]))
                q = float(e.get("quantile") or 0.99)
                pts.setdefault((tier, metric), []).append((x, math.log(m), float(j["n"]), j, q, st.get("index"),
                                                           ordinal))
                if st.get("early") == "breach":
                    breach.setdefault((tier, metric), set()).add(st.get("index"))
    if not pts:
        return None
    z = _z(confidence)
    rng = np.random.default_rng(seed)
    methods = set()
    est: dict[tuple[str, str], tuple[float, str | None]] = {}
    boot = np.full(n_boot, math.inf)
    loads_all: list[float] = []
    picks, column = _resample_windows(asked, n_boot, rng)
    for key, rows in sorted(pts.items()):
        rows.sort(key=lambda r: r[0])
        x = np.asarray([r[0] for r in rows])
        lm = np.asarray([r[1] for r in rows])
        w = np.asarray([r[2] for r in rows])
        loads_all += list(x)
        ux, inv = np.unique(x, return_inverse=True)
        est[key] = crossing(ux, _pool(lm, w, inv, len(ux)), np.bincount(inv, w))
        sims = np.empty((n_boot, len(rows)))
        for k, (_x, _lm, _w, j, q, idx, _o) in enumerate(rows):
            vals = _values(records, idx, key, j) if records is not None else None
            sims[:, k], how = _boot_margins(vals, j, q, n_boot, rng, z)
            methods.add(how)
        cols = np.asarray([column[r[6]] for r in rows])
        for b in range(n_boot):
            wb = w * picks[b, cols]
            keep = wb > 0
            if not keep.any():  # none of this SLO's steps drawn: its steps as measured
                keep, wb = np.ones(len(rows), dtype=bool), w
            ub, ib = np.unique(x[keep], return_inverse=True)
            fit = _pool(sims[b][keep], wb[keep], ib, len(ub))
            boot[b] = min(boot[b], crossing(ub, fit, np.bincount(ib, wb[keep]))[0])
    binding = min(est, key=lambda k: est[k][0])
    value, open_end = est[binding]
    a = (1.0 - confidence) / 2.0
    lo, hi = latency.quantile(boot, a), latency.quantile(boot, 1.0 - a)  # the one quantile rule
    rows = sorted(pts[binding], key=lambda r: r[0])
    ux, inv = np.unique([r[0] for r in rows], return_inverse=True)
    w = np.asarray([r[2] for r in rows])
    pooled = _pool(np.asarray([r[1] for r in rows]), w, inv, len(ux))
    ratio = margin_load_ratio(ux, pooled, np.bincount(inv, w))
    cliff = ratio is not None and ratio <= CLIFF_RATIO
    gap = cliff_gap(ux, pooled, np.bincount(inv, w)) if cliff and open_end is None else None
    if gap is not None:  # the steps cannot place a cliff inside the gap between them: the interval spans it
        lo, hi = min(lo, gap[0]), max(hi, gap[1])
    return {
        "estimate": value, "ci_low": min(lo, value), "ci_high": max(hi, value), "confidence": confidence,
        "cliff_gap": gap,
        "of": "concurrency" if axis == "concurrency" else "rate_rps",
        "open": open_end,
        "binding": {"tier": binding[0], "metric": binding[1]},
        "crossings": [{"tier": t, "metric": m, "load": v, "open": o} for (t, m), (v, o) in sorted(est.items())],
        "boundary": None if ratio is None else ("cliff" if cliff else "gradual"),
        "margin_load_ratio": ratio, "breach_lower_bounds": len(breach.get(binding, ())),
        "method": "isotonic fit of log(margin) on " + ("users" if axis == "concurrency" else "offered rate")
                  + f"; bootstrap ({n_boot}) of " + " and ".join(
                      {"requests": "each step's requests", "interval": "each step's quantile interval"}[m]
                      for m in sorted(methods, reverse=True)),
        "n_boot": n_boot, "seed": seed,
    }


def _resample_windows(asked: Mapping[int, float | None], n_boot: int, rng: np.random.Generator
                      ) -> tuple[np.ndarray, dict[int, int]]:
    """How often each step is drawn in each replicate ([n_boot, steps]) and each step's column: the steps
    that asked for one load (a bracket end and its confirmations, each on its own arrival draw) are
    resampled among themselves; a load measured once (or a step that names no load) keeps its one step.
    The loads are the search's design, not a sample, so they are not resampled: a replicate that lost the
    one step near the knee would fit across the ramp's whole gap."""
    order = sorted(asked)
    column = {ordinal: c for c, ordinal in enumerate(order)}
    picks = np.ones((n_boot, len(order)), dtype=np.int64)
    by_load: dict[float, list[int]] = {}
    for ordinal in order:
        if asked[ordinal] is not None:
            by_load.setdefault(asked[ordinal], []).append(column[ordinal])
    for cols in by_load.values():
        if len(cols) > 1:
            picks[:, cols] = rng.multinomial(len(cols), np.full(len(cols), 1.0 / len(cols)), size=n_boot)
    return picks, column


def _pool(lm: np.ndarray, w: np.ndarray, inv: np.ndarray, n: int) -> np.ndarray:
    """Weighted means of the points at each distinct load."""
    wsum = np.bincount(inv, w, minlength=n)
    s = np.bincount(inv, lm * w, minlength=n)
    plain = np.bincount(inv, lm, minlength=n) / np.bincount(inv, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(wsum > 0, s / wsum, plain)


def _values(records: Mapping[int, Sequence[Mapping[str, Any]]], index: Any, key: tuple[str, str],
            judged: Mapping[str, Any]) -> np.ndarray | None:
    """The SLO values of one step's window for one tier and metric, or None when the records do not match
    the step's judgement (more than 1 % or 2 requests apart, say a window edge rounded in the summary:
    then its interval is used instead)."""
    window = records.get(index)
    if not window:
        return None
    tier, metric = key
    v = latency.slo_values([r for r in window if (r.get("tier") or "none") == tier], metric)
    n = judged.get("n") or 0
    return v if v.size and abs(v.size - n) <= max(2, 0.01 * n) else None


def window_records(steps: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> dict[int, list]:
    """Each step's judged records: its stage's records scheduled inside its window."""
    win = {}
    for st in steps:
        w = st.get("window_s")
        if isinstance(st.get("index"), int) and isinstance(w, Sequence) and len(w) == 2:
            win[st["index"]] = (float(w[0]), float(w[1]))
    out: dict[int, list] = {i: [] for i in win}
    for r in records:
        i = r.get("stage")
        if i in win and win[i][0] <= r.get("scheduled_s", -math.inf) < win[i][1]:
            out[i].append(r)
    return out


def _z(confidence: float) -> float:
    """The standard normal quantile of (1 + confidence) / 2 (no scipy: bisection on erf)."""
    target = (1.0 + confidence) / 2.0
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < target else (lo, mid)
    return (lo + hi) / 2
