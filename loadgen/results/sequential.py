"""A sequential test of a latency quantile against its SLO threshold, with bounded error over many looks.

For the p-quantile SLO with threshold T, let q0 = 1 - p. If the true quantile is at most T, a request
is over T with probability at most q0, so the count over T among n settled requests (requests old
enough that their outcome against T is known) is at most Binomial(n, q0) in distribution. A look
rejects "the quantile is within T" (a *breach*) when the count reaches the look's upper critical value,
and "the quantile is over T" (a *pass*) when it is at or below the lower one.

By look k, at information fraction t_k (here: the share of the step's longest possible window elapsed),
the test has spent at most A(t_k) of an alpha-spending function A (Lan-DeMets: Pocock- or
O'Brien-Fleming-type, or linear): the boundaries are chosen look by look so that the probability of
having crossed one wrongly so far, computed exactly from the counts' distribution given the settled
requests at each look, stays within A(t_k); A(1) = alpha bounds it per SLO and per side, however many
looks there are. The count is exact (no bootstrap), so is the bound, for independent requests; a
queue's correlated latencies widen the count's spread (documented, not corrected).
"""

from __future__ import annotations

import math

import numpy as np

SPENDING = ("pocock", "obrien_fleming", "linear")


def _norm_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def norm_ppf(p: float) -> float:
    """The standard normal quantile (bisection on erf: exact to ~1e-12, no scipy)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if _norm_cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def spent(kind: str, alpha: float, t: float) -> float:
    """A(t): the alpha spent by information fraction ``t`` (A(0) = 0, A(1) = alpha, non-decreasing)."""
    t = min(max(t, 0.0), 1.0)
    if t <= 0:
        return 0.0
    if kind == "pocock":
        return alpha * math.log(1.0 + (math.e - 1.0) * t)
    if kind == "obrien_fleming":
        return min(alpha, 2.0 * (1.0 - _norm_cdf(norm_ppf(1.0 - alpha / 2.0) / math.sqrt(t))))
    if kind == "linear":
        return alpha * t
    raise ValueError(f"alpha spending must be one of {', '.join(SPENDING)}, got {kind!r}")


def clusters(over: np.ndarray, run: int) -> int:
    """The exceedances (``over``: one flag per request, in scheduled order) counted as clusters: an
    exceedance at most ``run`` requests after the one before belongs to its cluster (runs declustering).
    A queue's requests are over the threshold in runs (one long queue delays all of them); counting a run
    as one event keeps the count near binomial, and never above the plain count, so the bound still holds
    for independent requests. ``run`` 0: the plain count."""
    idx = np.flatnonzero(over)
    if idx.size == 0 or run <= 0:
        return int(idx.size)
    return 1 + int((idx[1:] - idx[:-1] > run).sum())


def effective_n(values: np.ndarray) -> int:
    """How many independent requests ``values`` (latencies in scheduled order) are worth for the pass side:
    n (1 - r) / (1 + r), r the lag-1 autocorrelation of their logarithms (a failed request's ``inf`` at
    twice the largest finite value; r at least 0; an AR(1)'s effective sample size). A queue's latencies
    rise and fall together: a window can miss its slow stretches entirely, so their exceedance count is
    zero far more often than a binomial's."""
    n = int(values.size)
    if n < 3:
        return n
    v = np.asarray(values, dtype=float)
    finite = v[np.isfinite(v)]
    x = np.log1p(np.clip(np.where(np.isfinite(v), v, 2.0 * finite.max() if finite.size else 1.0), 0.0, None))
    a, b = x[:-1] - x[:-1].mean(), x[1:] - x[1:].mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    r = max(0.0, float((a * b).sum()) / den) if den > 0 else 0.0  # all equal: nothing to discount
    return int(n * (1.0 - r) / (1.0 + r))


def binom_pmf(m: int, q: float) -> np.ndarray:
    """P(Binomial(m, q) = k) for k = 0..m."""
    if m <= 0:
        return np.ones(1)
    if q <= 0:
        return np.r_[1.0, np.zeros(m)]
    lq, lp, lm = math.log(q), math.log1p(-q), math.lgamma(m + 1)
    return np.exp([lm - math.lgamma(k + 1) - math.lgamma(m - k + 1) + k * lq + (m - k) * lp
                   for k in range(m + 1)])


class SequentialTest:
    """The looks of one SLO over one step: feed ``look(t_frac, n, over)`` at each look (cumulative
    counts: the settled requests so far and how many of them are over the threshold); it says
    ``"breach"``, ``"pass"`` or None.

    The boundaries are exact for the counts actually seen: the chance, with every request over the
    threshold with probability exactly q0 = 1 - quantile (the worst case of "the quantile is within
    it"), that the count has ever reached the upper boundary by look k is kept at most A(t_k) (a
    recursion over the count's distribution on the paths not stopped yet, look by look); likewise for
    the lower boundary and a pass. So the false breach and false pass rates are at most ``alpha`` each,
    with no union bound to make them conservative, however many looks there are."""

    def __init__(self, quantile: float, alpha: float = 0.05, spending: str = "pocock"):
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        spent(spending, alpha, 1.0)  # check the kind
        self.q0 = 1.0 - quantile
        self.alpha, self.spending = alpha, spending
        self.t_last, self.looks, self.n, self.over, self.events = 0.0, 0, 0, 0, 0
        self.up = np.ones(1)  # P(count = c and never at the upper boundary), c = 0, 1, ...
        self.lo = np.ones(1)  # P(count = c and never at or under the lower boundary)
        self.spent_up = self.spent_lo = 0.0  # the probability of having crossed so far (<= A(t))
        self.bounds: list[tuple[int, int | None, int | None]] = []  # (n, lower, upper) of each look
        self.decision: str | None = None
        self.samples: int | None = None  # the settled requests at the deciding look

    def look(self, t_frac: float, n: int, over: int, pass_side: bool = True, events: int | None = None,
             breach_side: bool = True) -> str | None:
        """One look at information fraction ``t_frac`` (0..1, never less than the last look's). ``events``:
        the exceedances as clusters (``clusters``), which the breach side counts (default: ``over``)."""
        t = min(max(t_frac, self.t_last), 1.0)
        budget = spent(self.spending, self.alpha, t)
        self.t_last, self.looks = t, self.looks + 1
        n, over = max(n, self.n), max(over, self.over)
        events = over if events is None else min(over, max(events, self.events))
        if n > self.n:
            pmf = binom_pmf(n - self.n, self.q0)
            self.up, self.lo = np.convolve(self.up, pmf), _trim(np.convolve(self.lo, pmf))
        self.n, self.over, self.events = n, over, events
        hi = lo = None
        tail = np.cumsum(self.up[::-1])[::-1]  # tail[c] = P(count >= c, not stopped)
        fits = np.nonzero(self.spent_up + tail <= budget)[0]
        if fits.size:
            hi = int(fits[0])
            self.spent_up += float(tail[hi])
            self.up = self.up[:hi]
        head = np.cumsum(self.lo)  # head[c] = P(count <= c, not stopped)
        fits = np.nonzero(self.spent_lo + head <= budget)[0]
        if fits.size:
            lo = int(fits[-1])
            self.spent_lo += float(head[lo])
            self.lo[: lo + 1] = 0.0
        self.bounds.append((n, lo, hi))
        if breach_side and hi is not None and events >= hi:
            return self._decide("breach", n)
        if pass_side and lo is not None and over <= lo:
            return self._decide("pass", n)
        return None

    def _decide(self, what: str, n: int) -> str:
        self.decision, self.samples = what, n
        return what


def _trim(p: np.ndarray) -> np.ndarray:
    """Drop the top counts whose mass is below 1e-18 together (they can never reach a lower boundary)."""
    tail = np.cumsum(p[::-1])[::-1]
    keep = np.nonzero(tail >= 1e-18)[0]
    return p[: int(keep[-1]) + 1] if keep.size else p[:1]
