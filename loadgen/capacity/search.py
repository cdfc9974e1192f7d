"""The capacity search, as pure logic: a geometric ramp until the SLO breaks, bisection, confirmation.

``CapacitySearch`` knows nothing about HTTP or time. It proposes loads (``next_step()``, with the
arrival pattern to use in ``next_draw``) and learns whether each passed (``record()``);
``run(measure)`` drives it with a ``measure(load, phase[, draw]) -> StepResult`` callback: the tests
check it against synthetic latency models so, and ``loadgen.capacity.run`` drives it against a target.

- **ramp**: start at ``start`` and multiply by ``growth`` while steps pass. If the very first step fails,
  divide by ``growth`` instead until one passes (or ``min_load`` fails too: *never met*).
- **bisect**: between the highest passing load and the lowest failing one until ``(fail - pass) / pass
  <= tolerance`` (concurrency: integers, until they are adjacent). When the steps report their SLO
  *margin* (judged quantile / threshold: <= 1 passes) the next load is where log(margin) crosses 0 on
  the line through the bracket's ends (false position in log-log), kept inside the bracket's middle
  80%, and a plain bisection (geometric mean) follows any interpolated step that failed to halve the
  bracket, so it never converges slower than bisection by more than one step in two. A failing end
  that was stopped early has only a lower-bound margin: that bracket is bisected.
- **confirm**: once the bracket has converged (or the step budget is spent), its pass end and then its
  fail end are measured again, each with a fresh arrival pattern. A load's verdict is the majority of its
  counted measurements (a tie counts as a failure: a rating must hold on most patterns). A confirmation
  that disagrees makes a tie, which one more fresh draw breaks; when the majority turns against the end,
  the bracket reopens (a pass end that now fails, a fail end that now passes) and the search bisects on
  from there. An end is *confirmed* when two of its measurements, with different draws, agree with its
  verdict. After ``max_reopens`` reopenings no more are asked: the bracket is said to be unconfirmed.
- **refine** (``refine_steps``, default 0): after the confirmed bracket, that many more windows on fresh
  draws at ``refine_centre(steps)`` (``capacity.run``: the rating's estimate so far; within ``REFINE_REACH``
  of the bracket; its centre without one), for the rating's fit alone: they move neither the bracket nor
  the verdict. Precision bought with time (``bench/results/calibration.json``, ``simulated-gradual``).
- **arrival draws** (``SearchConfig.arrivals``): ``fresh`` (the default) gives every step its own draw,
  independent windows ``capacity.rating`` can pool; ``common`` scales draw 0 to every ramp and bisection
  step until a confirmation reopens the bracket, so every step repeats that draw's luck (a sparse one
  rated the calibration queue 21 % high on seed 0) and pooling them averages nothing.
- **disturbed steps**: a step whose result says ``disturbed`` (the load generator fell behind its
  schedule) decides nothing: the same load, phase and draw is measured again, at most ``retries`` times
  (``remeasured_of`` links each attempt to the one before). When the retries run out the last attempt
  counts as measured; if the verdict rests on it (a *deciding* step: a measurement that agrees with the
  pass or fail end's verdict, every step of never_met) the verdict is ``invalid``.
- Verdicts: ``rated`` (a pass and a fail bracket the capacity), ``never_met`` (even ``min_load``
  fails), ``never_broke`` (``max_load`` still passes; the rating is a lower bound), ``invalid`` (one of
  those, ``search_verdict``, resting on a disturbed step). The step budget (``max_steps`` ramp and
  bisection steps; confirmations and re-measures come on top) ends the search early with the best
  bracket so far, and says so; a reopening raises it by the bisections the reopened bracket needs (a ramp
  that spent it left one wide: rated 53.8 req/s, the next failure at 64). ``end(reason)`` ends the search
  at once (``capacity.run``: the time budget, ``max_duration_s``), and the outcome says why (``ended_by``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadgen.scenario.options import SearchConfig

VERDICTS = ("rated", "never_met", "never_broke", "invalid")
RETRIES = 2  # re-measures of a disturbed step
MAX_REOPENS = 2  # confirmations that may disagree before the search stops confirming
REFINE_REACH = 1.25  # a refine window's load (the estimate) is kept within the bracket's ends / and x this


@dataclass(slots=True)
class StepResult:
    passed: bool | None  # None (nothing could be judged) counts as a failure
    stopped_early: bool = False
    detail: dict[str, Any] = field(default_factory=dict)
    margin: float | None = None  # worst judged quantile / threshold (a lower bound when stopped early)
    disturbed: str | None = None  # why this measurement cannot be trusted (the load generator fell behind)


@dataclass(slots=True)
class Step:
    index: int
    load: float
    phase: str  # ramp | bisect | confirm | refine
    result: StepResult
    draw: int = 0  # the arrival pattern (0: the common one)
    attempt: int = 1  # 2, 3: re-measures of a disturbed step
    remeasured_of: int | None = None  # the disturbed step this one measures again
    counted: bool = True  # False: disturbed and measured again; the search ignores it
    confirms: int | None = None  # confirm phase: the step whose verdict this one checks

    @property
    def passed(self) -> bool:
        return bool(self.result.passed)

    @property
    def disturbed(self) -> str | None:
        return self.result.disturbed


@dataclass(slots=True)
class _Proposal:
    load: float
    phase: str
    draw: int = 0
    attempt: int = 1
    remeasured_of: int | None = None
    want: bool | None = None  # confirm phase: the verdict the end had


@dataclass(slots=True)
class SearchOutcome:
    verdict: str  # rated | never_met | never_broke | invalid
    rated_load: float | None  # the highest load that met every SLO
    first_fail_load: float | None  # the lowest load that broke one
    converged: bool  # the bracket is within tolerance (or, for never_*, the limit was reached)
    steps: list[Step]
    text: str
    search_verdict: str = ""  # the steps' verdict (``verdict`` is ``invalid`` when it rests on a disturbed step)
    confirmed: bool | None = None  # rated: both ends measured twice, with different draws, alike
    reopens: int = 0  # confirmations that disagreed
    deciding: list[int] = field(default_factory=list)  # the steps the verdict rests on
    invalid_reason: str | None = None
    ended_by: str | None = None  # why the search was ended before it was done (``CapacitySearch.end``)


class CapacitySearch:
    def __init__(self, cfg: SearchConfig, *, confirm: bool = True, retries: int = RETRIES,
                 max_reopens: int = MAX_REOPENS, refine_centre: Callable[[list[Step]], float | None] | None = None):
        self.cfg = cfg
        self.refine_centre = refine_centre
        self.confirm, self.retries, self.max_reopens = confirm, retries, max_reopens
        self.steps: list[Step] = []
        self.best_pass: float | None = None  # highest passing load
        self.first_fail: float | None = None  # lowest failing load above best_pass (or anywhere without one)
        self.reopens = 0
        self.ended_by: str | None = None
        self._draws = 0  # fresh arrival patterns handed out
        self._budget = cfg.max_steps  # ramp and bisection steps allowed (a reopening may raise it)
        self._pending: _Proposal | None = _Proposal(cfg.start, "ramp")
        self._brackets: list[float] = []  # log width of the bracket after each bisection-phase step
        self._interp_last = False
        self.unit = "users" if cfg.integer else "req/s"

    # ------------------------------------------------------------ driving

    def next_step(self) -> tuple[float, str] | None:
        """The next (load, phase) to measure, or None when the search is over."""
        return None if self._pending is None else (self._pending.load, self._pending.phase)

    @property
    def next_draw(self) -> int:
        """The arrival pattern of the next step (a fresh one each, or 0: the common one)."""
        return self._pending.draw if self._pending else 0

    def record(self, load: float, result: StepResult) -> Step:
        p = self._pending if self._pending is not None and self._pending.load == load else _Proposal(load, "ramp")
        step = Step(len(self.steps), load, p.phase, result, p.draw, p.attempt, p.remeasured_of)
        prev = self._latest(load)
        self.steps.append(step)
        if result.disturbed and p.attempt <= self.retries:
            step.counted = False  # measure it again: same load, phase and pattern
            self._pending = _Proposal(load, p.phase, p.draw, p.attempt + 1, step.index, p.want)
            return step
        reopened = False
        if p.phase == "confirm" and prev is not None:
            step.confirms = prev.index
            v = self._verdict(load)
            if v is None:  # a tie: one more fresh pattern breaks it
                self._draws += 1
                self._pending = _Proposal(load, "confirm", self._draws, want=p.want)
                return step
            if p.want is not None and v != p.want:
                self.reopens += 1  # the majority turned against the end: the bracket moves
                reopened = True
        self._update_bracket()
        if reopened:  # the reopened bracket gets the bisections it needs, whatever the ramp spent
            self._budget = max(self._budget, self._search_steps() + self._bisections_needed())
        if self.best_pass is not None and self.first_fail is not None:
            self._brackets.append(math.log(self.first_fail / self.best_pass))
        self._pending = self._propose()
        return step

    def end(self, reason: str) -> None:
        """End the search now: no more steps; the outcome rests on what was measured and says why."""
        self._pending, self.ended_by = None, reason

    def run(self, measure: Callable[..., StepResult], draws: bool = False) -> SearchOutcome:
        while (nxt := self.next_step()) is not None:
            load, phase = nxt
            res = measure(load, phase, self.next_draw) if draws else measure(load, phase)
            self.record(load, res)
        return self.outcome()

    # ------------------------------------------------------------ logic

    def _latest(self, load: float) -> Step | None:
        return next((s for s in reversed(self._judging()) if s.load == load), None)

    def _judging(self) -> list[Step]:
        """The counted steps the bracket and verdict rest on (refine windows only feed the rating)."""
        return [s for s in self.steps if s.counted and s.phase != "refine"]

    def _at(self, load: float) -> list[Step]:
        return [s for s in self._judging() if s.load == load]

    def _verdict(self, load: float) -> bool | None:
        """The majority of the load's counted measurements; None for a tie."""
        at = self._at(load)
        ok = sum(s.passed for s in at)
        return None if 2 * ok == len(at) else 2 * ok > len(at)

    def _update_bracket(self) -> None:
        """Each load's verdict is its measurements' majority (a tie fails); fails below the highest pass
        are noise."""
        loads = {s.load for s in self._judging()}
        verdict = {x: bool(self._verdict(x)) for x in loads}
        passes = [x for x, v in verdict.items() if v]
        self.best_pass = max(passes) if passes else None
        fails = [x for x, v in verdict.items() if not v and (self.best_pass is None or x > self.best_pass)]
        self.first_fail = min(fails) if fails else None

    def _search_steps(self) -> int:
        """Steps counted against ``max_steps``: first attempts of ramp and bisection steps."""
        return sum(1 for s in self.steps if s.phase in ("ramp", "bisect") and s.attempt == 1)

    def _round(self, x: float) -> float:
        return float(round(x)) if self.cfg.integer else x

    def _confirmed(self, load: float) -> bool:
        """At least two of the load's measurements, with different draws, agree with its verdict."""
        v = self._verdict(load)
        agree = {s.draw for s in self._at(load) if s.passed == v}
        return v is not None and len(agree) >= 2

    def _confirmation(self, lo: float, hi: float) -> _Proposal | None:
        if not self.confirm or self.reopens >= self.max_reopens + 1:
            return None
        for end, want in ((lo, True), (hi, False)):
            if not self._confirmed(end):
                self._draws += 1
                return _Proposal(end, "confirm", self._draws, want=want)
        return None

    def _refinement(self, lo: float, hi: float) -> _Proposal | None:
        done = sum(1 for s in self.steps if s.phase == "refine" and s.counted)
        if done >= self.cfg.refine_steps:
            return None
        centre = self.refine_centre(self.steps) if self.refine_centre else None
        centre = centre if centre is not None and math.isfinite(centre) else math.sqrt(lo * hi)
        self._draws += 1
        return _Proposal(self._round(min(max(centre, lo / REFINE_REACH), hi * REFINE_REACH)), "refine", self._draws)

    def _propose(self) -> _Proposal | None:
        c = self.cfg
        lo, hi = self.best_pass, self.first_fail
        spent = self._search_steps() >= self._budget
        if lo is not None and hi is not None:
            conv = self._converged(lo, hi)
            if conv or spent:
                return self._confirmation(lo, hi) or self._refinement(lo, hi)
            mid = self._round(self._interpolated(lo, hi) or math.sqrt(lo * hi))
            if c.integer and not lo < mid < hi:
                mid = lo + 1
            return _Proposal(mid, "bisect", self._fresh()) if lo < mid < hi else None
        if spent:
            return None
        if hi is None and lo is not None:  # everything so far passed: ramp up
            if lo >= c.max_load:
                return None
            nxt = self._round(lo * c.growth)
            if c.integer and nxt <= lo:
                nxt = lo + 1
            return _Proposal(min(nxt, c.max_load), "ramp", self._fresh())
        # everything so far failed: ramp down
        low = min((s.load for s in self.steps if s.counted), default=c.start)
        if low <= c.min_load:
            return None
        nxt = self._round(low / c.growth)
        if c.integer and nxt >= low:
            nxt = low - 1
        return _Proposal(max(nxt, c.min_load), "ramp", self._fresh())

    def _fresh(self) -> int:
        """A fresh draw; with ``arrivals: common``, draw 0 until a confirmation reopened the bracket."""
        if self.cfg.arrivals == "common" and not self.reopens:
            return 0
        self._draws += 1
        return self._draws

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
        st = self._latest(load)
        if st is None or st.passed != passed:
            return None
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

    def _bisections_needed(self) -> int:
        """Plain bisections that take the current bracket within the tolerance (0 without a bracket)."""
        lo, hi = self.best_pass, self.first_fail
        if lo is None or hi is None or self._converged(lo, hi):
            return 0
        if self.cfg.integer:
            return math.ceil(math.log2(hi - lo))
        return math.ceil(math.log2(math.log(hi / lo) / math.log1p(self.cfg.tolerance)))

    def _converged(self, lo: float, hi: float) -> bool:
        if self.cfg.integer and hi - lo <= 1:
            return True
        return (hi - lo) / lo <= self.cfg.tolerance

    # ------------------------------------------------------------ the verdict

    def _deciding(self, verdict: str) -> list[int]:
        """The rated step and the first failure above it (rated), the highest pass (never_broke), with the
        measurement each confirmed when they agree; every counted step (never_met)."""
        counted = [s for s in self.steps if s.counted]
        if verdict == "never_met":
            return [s.index for s in counted]
        keep: list[int] = []
        for load in (self.best_pass, self.first_fail):
            if load is not None:
                v = bool(self._verdict(load))
                keep += [s.index for s in self._at(load) if s.passed == v]
        return sorted(keep)

    def outcome(self) -> SearchOutcome:
        c = self.cfg
        lo, hi, u = self.best_pass, self.first_fail, self.unit
        n = len(self.steps)
        confirmed = None
        if lo is None:
            low = min((s.load for s in self.steps if s.counted), default=None)
            reached = low is not None and low <= c.min_load
            text = (f"never met: the SLO broke at every load tried, down to {fmt_load(low)} {u}"
                    if low is not None else "never met: no step was measured")
            if not reached and low is not None:
                text += f" (the search stopped after {n} steps, before min_load {fmt_load(c.min_load)} {u})"
            verdict, rated, fail, conv = "never_met", None, low, reached
        elif hi is None:
            conv = lo >= c.max_load
            text = f"never broke: every SLO held up to {fmt_load(lo)} {u}"
            text += (" (max_load); the capacity is at least that" if conv else
                     f" (the search stopped after {n} steps, before max_load {fmt_load(c.max_load)} {u}); "
                     "the capacity is at least that")
            verdict, rated, fail = "never_broke", lo, None
        else:
            conv = self._converged(lo, hi)
            width = (hi - lo) / lo
            text = (f"rated capacity {fmt_load(lo)} {u}: every SLO held there and broke at {fmt_load(hi)} {u} "
                    f"({100 * width:.1f}% above)")
            if not conv:
                by = "search was ended" if self.ended_by else "step budget ended the bisection"
                text += f"; the {by} before the {100 * c.tolerance:g}% tolerance"
            if self.confirm:
                confirmed = self._confirmed(lo) and self._confirmed(hi)
                if not confirmed:
                    text += "; the bracket is unconfirmed" + (
                        "" if self.ended_by else f" ({self.reopens} reopening(s), the most allowed)")
                elif self.reopens:
                    text += f"; confirmed with fresh arrivals after {self.reopens} reopening(s)"
                else:
                    text += "; both ends confirmed with fresh arrivals"
            verdict, rated, fail = "rated", lo, hi
        if self.ended_by:
            text += f"; {self.ended_by}"
        deciding = self._deciding(verdict)
        bad = [self.steps[i] for i in deciding if self.steps[i].disturbed]
        out = SearchOutcome(verdict, rated, fail, conv, list(self.steps), text, verdict, confirmed, self.reopens,
                            deciding, ended_by=self.ended_by)
        if bad:
            out.verdict = "invalid"
            out.invalid_reason = (f"the verdict rests on step(s) {', '.join(str(s.index) for s in bad)}, still "
                                  f"disturbed after {self.retries} re-measure(s): {bad[0].disturbed}")
            out.text = f"INVALID ({out.invalid_reason}); the steps say: {text}"
        return out


def fmt_load(x: float | None) -> str:
    """A load in three significant digits, whole numbers from 100 up; "-" for none."""
    return "-" if x is None else f"{x:.3g}" if x < 100 else f"{x:.0f}"
