"""Where the share of requests over an SLO's threshold crosses its level, against load, and how sure the
windows are of it: the fits and the interval behind ``capacity.rating``.

- **The fit.** First a monotone one: the shares pooled per load, fitted non-decreasing (isotonic,
  pool-adjacent-violators, weighted by ``n``), crossing 1 - q interpolated linearly in the share and in
  log(load); it says whether the steps cross at all (``open``). Then a dose-response fit: a logistic
  regression of each request's exceedance on log(load), first over every window, then over the steps
  within ``NEIGHBOURHOOD`` (x / 1.25) of its crossing, refitted around its own crossing (three times); the
  estimate is where it is 1 - q. It uses the slope of every window near the knee, not only the two either
  side of the crossing, and it is not fooled by a gap: between a ramp window with no exceedance far below
  and the first window just over 1 - q the isotonic crossing interpolates linearly, far too low, where the
  share rises steeply. A fit stands when it rests on at least two loads, some requests over and some
  within, rises with load, and crosses within 5 % of the loads it was fitted on; the local one is preferred,
  then the one over every window, then the isotonic crossing (``fit``: ``logistic`` or ``isotonic``;
  ``fit_windows``). When every step passes (or fails) the crossing lies outside the loads tried: the estimate is
  the highest (lowest) load tried, and ``open`` says ``"above"`` (``"below"``).
- **A mean SLO** (``margin_crossing``) has no share over a threshold: its crossing is where the isotonic
  fit of each window's log(mean / threshold) against load crosses 0, interpolated between the neighbouring
  loads; no logistic fit, no profile interval.
- **The interval: profile quasi-likelihood.** The local logistic fit, written with the crossing c as its
  parameter (logit P(over) = logit(1 - q) + b (log load - log c)), gives a deviance for every c (the slope
  refitted); c is inside the interval while the deviance's rise over its minimum, divided by the windows'
  dispersion phi, stays within F(1, k - 2) at the confidence level, for the k windows of the fit.
  phi is Pearson's chi-square over k - 2, at least 1 and at least the windows' mean run of exceedances
  (``mean_run``): the requests of one window are correlated (one busy period, one burst of refusals,
  makes many exceedances at once), so a window's count varies several times as much as a binomial's, and
  phi says how much; the runs say it where Pearson's statistic cannot (few windows, a knee so sharp that
  the fit nearly separates them). A likelihood does not care how the search chose
  its loads from the verdicts before them; a bootstrap that resamples windows at fixed loads does, and it
  understated the spread on the exactly simulated calibration queue. Its coverage on the calibration
  targets is in ``bench/results/calibration.json`` (the ``simulated-*`` parts). Each end is widened
  by ``PROFILE_STEP`` at a time until the deviance bounds it. Where the windows near the knee cannot (the
  rise stays within the critical value out to ``MAX_REACH``), the nearest load whose share is significantly
  past the level bounds it (``significant_loads``: the share rises with load); an end neither bounds is
  reported as such (``unbounded``), never as a bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NEIGHBOURHOOD = 1.25  # the logistic fit uses the steps within this factor of the crossing
PROFILE_STEP = 1.25  # the profile interval widens by this factor at a time until the deviance bounds it
MAX_REACH = 4.0  # ... up to x / ÷ this of the estimate; an end not bounded there is marked unbounded


@dataclass(frozen=True)
class ProfileInterval:
    """One SLO's profile interval: its ends, the windows' dispersion, and which ends the windows could not
    bound within ``MAX_REACH`` of the estimate (there ``low`` / ``high`` is the reach, not a bound)."""
    low: float
    high: float
    dispersion: float
    unbounded: tuple[str, ...] = ()


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


def exceedance_crossing(x: np.ndarray, over: np.ndarray, n: np.ndarray, level: float) -> tuple[float, str | None]:
    """Where the isotonic fit of the share over the threshold (pooled per load, weighted by requests) first
    rises over ``level``: (load, None), or the highest / lowest load and ``"above"`` / ``"below"`` when it
    does not cross within the loads."""
    ux, inv = np.unique(x, return_inverse=True)
    o, m = np.bincount(inv, over, len(ux)), np.bincount(inv, n, len(ux))
    g = isotonic(o / np.maximum(m, 1e-12), m)
    if g[-1] <= level:
        return float(ux[-1]), "above"
    if g[0] > level:
        return float(ux[0]), "below"
    j = int(np.argmax(g > level))
    t = (level - g[j - 1]) / (g[j] - g[j - 1])
    return float(math.exp(math.log(ux[j - 1]) + t * (math.log(ux[j]) - math.log(ux[j - 1])))), None


def margin_crossing(x: np.ndarray, logm: np.ndarray, n: np.ndarray) -> tuple[float, str | None]:
    """A mean SLO's crossing: where the isotonic fit of log(mean / threshold) (pooled per load, weighted by
    requests) first rises over 0, interpolated linearly in log load between the last load at or under it
    and the first over it; the highest / lowest load and ``"above"`` / ``"below"`` when it does not cross
    within the loads. A mean has no share of requests over a threshold, so no logistic fit and no profile
    interval: its interval is the rating's bootstrap of the windows."""
    ux, inv = np.unique(x, return_inverse=True)
    w = np.bincount(inv, n, len(ux))
    g = isotonic(np.bincount(inv, logm * n, len(ux)) / np.maximum(w, 1e-12), w)
    if g[-1] <= 0.0:
        return float(ux[-1]), "above"
    if g[0] > 0.0:
        return float(ux[0]), "below"
    j = int(np.argmax(g > 0.0))
    t = -g[j - 1] / (g[j] - g[j - 1])
    return float(math.exp(math.log(ux[j - 1]) + t * (math.log(ux[j]) - math.log(ux[j - 1])))), None


def logistic_fit(x: np.ndarray, over: np.ndarray, n: np.ndarray) -> tuple[float, float] | None:
    """(a, b) of P(over) = 1 / (1 + exp(-(a + b log x))) by maximum likelihood (Newton's method on the
    binomial counts); None when it does not converge."""
    lx = np.log(x)
    a, b = math.log(max(over.sum(), 0.5) / max(n.sum() - over.sum(), 0.5)), 0.0
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(a + b * lx, -30.0, 30.0)))
        w = n * p * (1.0 - p) + 1e-12
        r = over - n * p
        h00, h01, h11 = w.sum(), (w * lx).sum(), (w * lx * lx).sum()
        det = h00 * h11 - h01 * h01
        if not det > 0:
            return None
        g0, g1 = r.sum(), (r * lx).sum()
        da, db = (h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det
        a, b = a + da, b + db
        if abs(da) < 1e-9 and abs(db) < 1e-9:
            return a, b
    return None


def logistic_crossing(x: np.ndarray, over: np.ndarray, n: np.ndarray, level: float,
                      start: float) -> tuple[float, int] | None:
    """(load where the local logistic fit is ``level``, the windows it rests on), refitted around its own
    crossing; None where it cannot stand (see the module's docstring)."""
    c, k = start, 0
    for _ in range(3):
        near = (x >= c / NEIGHBOURHOOD) & (x <= c * NEIGHBOURHOOD)
        at = _logistic_level(x[near], over[near], n[near], level)
        if at is None:
            return None
        c, k = at, int(near.sum())
    return c, k


def slo_crossing(x: np.ndarray, over: np.ndarray, n: np.ndarray, level: float) -> tuple[float, str | None, int]:
    """(crossing, open end, windows of the logistic fit: 0 when the isotonic crossing stands). The local fit
    starts from a logistic fit over every window (a start the isotonic crossing can miss by far: it
    interpolates linearly between a window with no exceedance far below and the first one over the level)."""
    c, open_end = exceedance_crossing(x, over, n, level)
    if open_end is not None:
        return c, open_end, 0
    whole = _logistic_level(x, over, n, level)
    fit = logistic_crossing(x, over, n, level, whole if whole is not None else c)
    if fit is not None:
        return fit[0], None, fit[1]
    if whole is not None:
        return whole, None, len(x)
    return c, None, 0


def _logistic_level(x: np.ndarray, over: np.ndarray, n: np.ndarray, level: float) -> float | None:
    """Where a logistic fit over every window is ``level``; None where it cannot stand."""
    if len(np.unique(x)) < 2 or over.sum() == 0 or (n - over).sum() == 0:
        return None
    ab = logistic_fit(x, over, n)
    if ab is None or not ab[1] > 0:
        return None
    z = (math.log(level / (1.0 - level)) - ab[0]) / ab[1]
    lx = np.log(x)
    return math.exp(z) if lx.min() - 0.05 <= z <= lx.max() + 0.05 else None


def profile_interval(x: np.ndarray, over: np.ndarray, n: np.ndarray, level: float, estimate: float,
                     confidence: float, runs: np.ndarray | None = None) -> ProfileInterval | None:
    """One SLO's crossing's interval by profile quasi-likelihood, over the windows within
    ``NEIGHBOURHOOD`` of its estimate (the local logistic fit's); None with fewer than 3 of them at two
    loads, or no exceedance among them.

    The model is the local fit's, written with the crossing as a parameter: logit P(over) = logit(level)
    + b (log load - log c). For each c the slope b is fitted; the deviance rises as c leaves the estimate,
    and c is inside while that rise, over the windows' dispersion phi (Pearson's chi-square at the
    estimate over k - 2, at least 1: runs of exceedances make a window's count vary 3-4 times a
    binomial's), stays within F(1, k - 2) at ``confidence``. ``runs`` (each window's runs of exceedances,
    NaN where not counted) puts a floor under phi: the windows' mean run, their exceedances over their
    runs. Exceedances that come in runs of mean size S make a count vary at least S times a binomial's,
    and Pearson's statistic cannot see it where the windows are few or the knee so sharp that the fit
    nearly separates them (on the paced calibration queue, ``loadgen/scenarios/calibrate-steady.yaml``, the
    floor is what lifts the interval's coverage to its level). Why not only a bootstrap of the windows: the
    search places each window from the verdicts before it, and a bootstrap that keeps the loads fixed
    understates the spread; a likelihood does not depend on how the loads were chosen. Each end widens by
    ``PROFILE_STEP`` until the rise bounds it, up to ``MAX_REACH``; beyond that the nearest load whose share is
    significantly past the level bounds it (``significant_loads``); an end neither bounds is named in
    ``unbounded``."""
    near = (x >= estimate / NEIGHBOURHOOD) & (x <= estimate * NEIGHBOURHOOD)
    lx, o, m = np.log(x[near]), over[near], n[near]
    k = int(near.sum())
    if k < 3 or len(np.unique(lx)) < 2 or o.sum() == 0:
        return None
    lv, c0 = math.log(level / (1.0 - level)), math.log(estimate)

    def deviance(c: float, b: float) -> float:
        p = np.clip(1.0 / (1.0 + np.exp(-np.clip(lv + b * (lx - c), -30.0, 30.0))), 1e-12, 1.0 - 1e-12)
        return float(-2.0 * np.sum(o * np.log(p) + (m - o) * np.log1p(-p)))

    def profile(c: float) -> tuple[float, float]:
        """The deviance at crossing c, minimised over the slope (golden section on log b)."""
        g = (math.sqrt(5.0) - 1.0) / 2.0
        a, z = math.log(0.1), math.log(1000.0)
        for _ in range(50):
            u, v = z - g * (z - a), a + g * (z - a)
            a, z = (a, v) if deviance(c, math.exp(u)) < deviance(c, math.exp(v)) else (u, z)
        b = math.exp((a + z) / 2.0)
        return deviance(c, b), b

    d0, b0 = profile(c0)
    p0 = 1.0 / (1.0 + np.exp(-(lv + b0 * (lx - c0))))
    phi = max(1.0, float(np.sum((o - m * p0) ** 2 / (m * p0 * (1.0 - p0) + 1e-12))) / max(k - 2, 1),
              mean_run(o, runs[near] if runs is not None else None))
    crit = t_quantile(max(k - 2, 1), (1.0 + confidence) / 2.0) ** 2  # F(1, k - 2) = t(k - 2) squared

    def end(side: float) -> tuple[float, bool]:
        """This side's end, and whether it is unbounded: widen until the rise passes the critical value
        (then bisect between the last point inside and the first outside), or stop at the reach."""
        inside, limit = c0, c0 + side * math.log(MAX_REACH)
        while True:
            out = inside + side * math.log(PROFILE_STEP)
            out = min(out, limit) if side > 0 else max(out, limit)
            if (profile(out)[0] - d0) / phi > crit:
                break
            if out == limit:
                return math.exp(limit), True
            inside = out
        for _ in range(30):
            mid = (inside + out) / 2.0
            inside, out = (mid, out) if (profile(mid)[0] - d0) / phi <= crit else (inside, mid)
        return math.exp(inside), False

    (low, low_open), (high, high_open) = end(-1.0), end(1.0)
    # where the windows near the knee cannot bound an end, a load the share is significantly past its
    # level at does: the share rises with load, so the crossing lies below any such failing load (above
    # any such passing one)
    passing, failing = significant_loads(x, over, n, level, phi, confidence)
    if low_open and (below := [v for v in passing if v < estimate]):
        low, low_open = max(max(below), low), False
    if high_open and (above := [v for v in failing if v > estimate]):
        high, high_open = min(min(above), high), False
    unbounded = tuple(name for name, is_open in (("low", low_open), ("high", high_open)) if is_open)
    return ProfileInterval(min(low, estimate), max(high, estimate), phi, unbounded)


def significant_loads(x: np.ndarray, over: np.ndarray, n: np.ndarray, level: float, phi: float,
                      confidence: float) -> tuple[list[float], list[float]]:
    """(loads whose pooled share is significantly below ``level``, loads where it is significantly above):
    one-sided at (1 + confidence) / 2, the binomial variance times the windows' dispersion ``phi``."""
    z = t_quantile(10_000, (1.0 + confidence) / 2.0)
    passing, failing = [], []
    for load in np.unique(x):
        at = x == load
        m = float(n[at].sum())
        if m <= 0:
            continue
        score = (float(over[at].sum()) / m - level) / math.sqrt(phi * level * (1.0 - level) / m)
        if score < -z:
            passing.append(float(load))
        elif score > z:
            failing.append(float(load))
    return passing, failing


def mean_run(over: np.ndarray, runs: np.ndarray | None) -> float:
    """The mean size of the windows' runs of exceedances (their exceedances over their runs, over the
    windows whose runs are counted); 1 where none are."""
    if runs is None:
        return 1.0
    known = ~np.isnan(runs)
    total = float(runs[known].sum())
    return float(over[known].sum()) / total if total > 0 else 1.0


def t_quantile(df: int, p: float) -> float:
    """Student's t quantile (no scipy): bisection on its distribution function, the density integrated by
    Simpson's rule."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float, steps: int = 400) -> float:
        xs = np.linspace(0.0, t, steps + 1)
        f = c * (1.0 + xs * xs / df) ** (-(df + 1) / 2)
        return 0.5 + (t / steps / 3.0) * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    lo, hi = 0.0, 1000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2
