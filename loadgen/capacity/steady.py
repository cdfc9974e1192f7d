"""When a step's queue has settled at its load, so that its measurement window may start.

A step starts from an idle target: its first seconds see a short queue, a p99 from them understates the
steady state. The warm-up lasts at least ``warmup_s`` and goes on while the in-flight count still rises:
at each check (every ``interval_s`` past the floor) the mean in-flight count over the last interval is
compared with the one before; it is *trending* when it grew by more than ``tolerance`` of it plus one
request (the slack keeps a count of a few requests from looking like a trend). The first check that
finds no trend ends the warm-up; at ``max_warmup_s`` it ends anyway and the step says it never settled
(a queue that grows without end: an overloaded step, which its window then shows). Pure: the monitor of
``capacity.step`` feeds it samples.
"""

from __future__ import annotations

from collections.abc import Sequence

SLACK = 1.0  # requests: a growth this small is never a trend


def trending(prev: Sequence[float], last: Sequence[float], tolerance: float) -> bool:
    """Whether the mean of ``last`` rose above the mean of ``prev`` by more than tolerance x it + SLACK."""
    if not prev or not last:
        return True
    m1, m2 = sum(prev) / len(prev), sum(last) / len(last)
    return m2 - m1 > tolerance * m1 + SLACK


class SteadyState:
    """Feeds on (t, in-flight) samples from a step's start (``t`` relative to it); ``check(t)`` says
    whether the warm-up is over at ``t``. ``settled`` then says whether the queue settled (False: the cap)."""

    def __init__(self, floor_s: float, cap_s: float, interval_s: float = 1.0, tolerance: float = 0.1):
        self.floor_s, self.cap_s = floor_s, max(cap_s, floor_s)
        self.interval_s, self.tolerance = interval_s, tolerance
        self.samples: list[tuple[float, float]] = []
        self.next_check = floor_s
        self.done_at: float | None = None
        self.settled: bool | None = None  # None: not decided yet (or no samples: the floor only)

    def add(self, t: float, in_flight: float) -> None:
        self.samples.append((t, in_flight))

    def check(self, t: float) -> bool:
        if self.done_at is not None:
            return True
        if t >= self.cap_s:
            return self._done(self.cap_s, None if not self.samples else not self._trend(t))
        if t < self.next_check:
            return False
        self.next_check = t + self.interval_s
        if not self.samples:  # the driver does not measure in-flight requests: the floor is the warm-up
            return self._done(t, None)
        if self._trend(t):
            return False
        return self._done(t, True)

    def _trend(self, t: float) -> bool:
        a, b = t - 2 * self.interval_s, t - self.interval_s
        prev = [v for s, v in self.samples if a <= s < b]
        last = [v for s, v in self.samples if b <= s <= t]
        return trending(prev, last, self.tolerance)

    def _done(self, t: float, settled: bool | None) -> bool:
        self.done_at, self.settled = t, settled
        return True


def steady_time(series: Sequence[float], dt: float, floor_s: float, cap_s: float, interval_s: float = 1.0,
                tolerance: float = 0.1) -> tuple[float, bool | None]:
    """(warm-up end, settled) for an in-flight ``series`` sampled every ``dt`` s from the step's start."""
    ss = SteadyState(floor_s, cap_s, interval_s, tolerance)
    for i, v in enumerate(series):
        t = (i + 1) * dt
        ss.add(t, v)
        if ss.check(t):
            break
    else:
        ss.check(max(cap_s, len(series) * dt))
    return ss.done_at if ss.done_at is not None else cap_s, ss.settled
