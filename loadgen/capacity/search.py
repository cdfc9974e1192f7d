"""The capacity search, as pure logic: a geometric ramp until the SLO breaks, then bisection.

``CapacitySearch`` knows nothing about HTTP or time. It proposes loads (``next_step()``) and learns
whether each passed (``record()``); ``run(measure)`` drives it with a ``measure(load, phase) ->
StepResult`` callback, which is how the tests check it against synthetic latency models and how
``loadgen.capacity`` drives it against a real target.

- **ramp**: start at ``start`` and multiply by ``growth`` while steps pass. If the very first step fails,
  divide by ``growth`` instead until one passes (or ``min_load`` fails too: *never met*).
- **bisect**: between the highest passing load and the lowest failing one until ``(fail - pass) / pass
  <= tolerance`` (concurrency: integers, until they are adjacent). When the steps report their SLO
  *margin* (judged quantile / threshold: <= 1 passes) the next load is where log(margin) crosses 0 on
  the line through the bracket's ends (false position in log-log), kept inside the bracket's middle
  80%, and a plain bisection (geometric mean) follows any interpolated step that failed to halve the
  bracket, so it never converges slower than bisection by more than one step in two. A failing end
  that was stopped early has only a lower-bound margin: that bracket is bisected.
- Verdicts: ``rated`` (a pass and a fail bracket the capacity), ``never_met`` (even ``min_load``
  fails), ``never_broke`` (``max_load`` still passes; the rating is a lower bound). The step budget
  (``max_steps``) ends the search early with the best bracket so far, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadgen.scenario.options import SearchConfig

VERDICTS = ("rated", "never_met", "never_broke")


@dataclass(slots=True)
class StepResult:
    passed: bool | None  # None (nothing could be judged) counts as a failure
    stopped_early: bool = False
    detail: dict[str, Any] = field(default_factory=dict)
    margin: float | None = None  # worst judged quantile / threshold (a lower bound when stopped early)


@dataclass(slots=True)
class Step:
    index: int
    load: float
    phase: str  # ramp | bisect
    result: StepResult

    @property
    def passed(self) -> bool:
        return bool(self.result.passed)


@dataclass(slots=True)
class SearchOutcome:
    verdict: str  # rated | never_met | never_broke
    rated_load: float | None  # the highest load that met every SLO
    first_fail_load: float | None  # the lowest load that broke one
    converged: bool  # the bracket is within tolerance (or, for never_*, the limit was reached)
    steps: list[Step]
    text: str


class CapacitySearch:
    def __init__(self, cfg: SearchConfig):
        self.cfg = cfg
        self.steps: list[Step] = []
        self.best_pass: float | None = None  # highest passing load
        self.first_fail: float | None = None  # lowest failing load above best_pass (or anywhere without one)
        self._phase = "ramp"
        self._next: float | None = cfg.start
        self._brackets: list[float] = []  # log width of the bracket after each bisection-phase step
        self._interp_last = False
        self.unit = "users" if cfg.integer else "req/s"

    # ------------------------------------------------------------ driving

    def next_step(self) -> tuple[float, str] | None:
        """The next (load, phase) to measure, or None when the search is over."""
        if self._next is None or len(self.steps) >= self.cfg.max_steps:
            return None
        return self._next, self._phase

    def record(self, load: float, result: StepResult) -> Step:
        step = Step(len(self.steps), load, self._phase, result)
        self.steps.append(step)
        if step.passed:
            if self.best_pass is None or load > self.best_pass:
                self.best_pass = load
        elif self.first_fail is None or load < self.first_fail:
            self.first_fail = load
        if self.best_pass is not None and self.first_fail is not None and self.first_fail > self.best_pass:
            self._brackets.append(math.log(self.first_fail / self.best_pass))
        self._next = self._propose()
        return step

    def run(self, measure: Callable[[float, str], StepResult]) -> SearchOutcome:
        while (nxt := self.next_step()) is not None:
            load, phase = nxt
            self.record(load, measure(load, phase))
        return self.outcome()

    # ------------------------------------------------------------ logic

    def _round(self, x: float) -> float:
        return float(round(x)) if self.cfg.integer else x

    def _propose(self) -> float | None:
        c = self.cfg
        lo, hi = self.best_pass, self.first_fail
        if lo is not None and hi is not None and hi > lo:
            self._phase = "bisect"
            if self._converged(lo, hi):
                return None
            mid = self._round(self._interpolated(lo, hi) or math.sqrt(lo * hi))
            if c.integer and not lo < mid < hi:
                mid = lo + 1
            return mid if lo < mid < hi else None
        if hi is not None and lo is not None:  # noise: a pass above a fail; search above the highest pass
            self.first_fail = None
            hi = None
        if hi is None:  # everything so far passed: ramp up
            last = max(s.load for s in self.steps)
            if last >= c.max_load:
                return None
            nxt = self._round(last * c.growth)
            if c.integer and nxt <= last:
                nxt = last + 1
            return min(nxt, c.max_load)
        # everything so far failed: ramp down
        low = min(s.load for s in self.steps)
        if low <= c.min_load:
            return None
        nxt = self._round(low / c.growth)
        if c.integer and nxt >= low:
            nxt = low - 1
        return max(nxt, c.min_load)

    def _interpolated(self, lo: float, hi: float) -> float | None:
        """False position in log(load), log(margin) between the bracket's ends, or None for a bisection."""
        if not self.cfg.interpolate:
            return None
        width = math.log(hi / lo)
        prev = self._brackets[-2] if len(self._brackets) >= 2 else None
        if prev is not None and self._interp_last and width > 0.5 * prev:
            self._interp_last = False  # the last guess did not halve the bracket: bisect once
            return None
        m_lo = self._margin(lo, True)
        m_hi = self._margin(hi, False)
        if m_lo is None or m_hi is None or not 0 < m_lo <= 1 < m_hi:
            self._interp_last = False
            return None
        m_hi = min(m_hi, 100.0)
        f = -math.log(m_lo) / (math.log(m_hi) - math.log(m_lo))
        f = min(max(f, 0.1), 0.9)
        self._interp_last = True
        return lo * math.exp(f * width)

    def _margin(self, load: float, passed: bool) -> float | None:
        for st in reversed(self.steps):
            if st.load == load and st.passed == passed:
                if not passed and st.result.stopped_early:
                    # a step stopped at its breach reports a margin just over 1 by construction (a lower
                    # bound taken the moment it crossed), which would drag every guess onto the fail end
                    return None
                m = st.result.margin
                if m is None:
                    return None
                if not math.isfinite(m):
                    return None if passed else 100.0
                return m
        return None

    def _converged(self, lo: float, hi: float) -> bool:
        if self.cfg.integer and hi - lo <= 1:
            return True
        return (hi - lo) / lo <= self.cfg.tolerance

    def outcome(self) -> SearchOutcome:
        c = self.cfg
        lo, hi, u = self.best_pass, self.first_fail, self.unit
        n = len(self.steps)
        if lo is None:
            low = min((s.load for s in self.steps), default=None)
            reached = low is not None and low <= c.min_load
            text = (f"never met: the SLO broke at every load tried, down to {_fmt(low)} {u}"
                    if low is not None else "never met: no step was measured")
            if not reached and low is not None:
                text += f" (the search stopped after {n} steps, before min_load {_fmt(c.min_load)} {u})"
            return SearchOutcome("never_met", None, low, reached, list(self.steps), text)
        if hi is None:
            reached = lo >= c.max_load
            text = f"never broke: every SLO held up to {_fmt(lo)} {u}"
            text += (" (max_load); the capacity is at least that" if reached else
                     f" (the search stopped after {n} steps, before max_load {_fmt(c.max_load)} {u}); "
                     "the capacity is at least that")
            return SearchOutcome("never_broke", lo, None, reached, list(self.steps), text)
        conv = self._converged(lo, hi)
        width = (hi - lo) / lo
        text = (f"rated capacity {_fmt(lo)} {u}: every SLO held there and broke at {_fmt(hi)} {u} "
                f"({100 * width:.1f}% above)")
        if not conv:
            text += f"; the step budget ended the bisection before the {100 * c.tolerance:g}% tolerance"
        return SearchOutcome("rated", lo, hi, conv, list(self.steps), text)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"
