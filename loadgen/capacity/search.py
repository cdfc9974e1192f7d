"""The capacity search, as pure logic: a geometric ramp until the SLO breaks, then bisection.

``CapacitySearch`` knows nothing about HTTP or time. It proposes load steps (``next_step()``, with the
arrival pattern to use in ``next_draw``) and learns whether each passed (``record()``);
``run(measure)`` drives it with a ``measure(load, phase) -> StepResult`` callback (``draws=True``:
``measure(load, phase, draw)``), which is how the tests check it against synthetic latency models and
how ``loadgen.capacity.run`` drives it against a real target. Its plain data (``StepResult``, ``Step``,
``SearchOutcome``) and each load's majority verdict are in ``capacity.search_steps``.

- **ramp**: start at ``start`` and multiply by ``growth`` while steps pass. If the very first step fails,
  divide by ``growth`` instead until one passes (or ``min_load`` fails too: *never met*).
- **bisect**: between the highest passing load and the lowest failing one until ``(fail - pass) / pass
  <= tolerance`` (concurrency: integers, until they are adjacent). When the steps report their SLO
  *margin* (judged quantile / threshold: <= 1 passes) the next load is where log(margin) crosses 0 on
  the line through the bracket's ends (false position in log-log), kept inside the bracket's middle
  80%, and a plain bisection (geometric mean) follows any interpolated step that failed to halve the
  bracket, so it never converges slower than bisection by more than one step in two. A failing end
  that was stopped early has only a lower-bound margin: that bracket is bisected.
- **confirm** (``capacity.confirm``): once the bracket has converged (or the step budget is spent), its
  ends are measured again on fresh arrival draws. When the majority of an end's measurements turns against
  its verdict the bracket reopens and the search bisects on from there, at most ``max_reopens`` times.
- **refine** (``capacity.refine``, ``refine_steps``, default 0): after the confirmed bracket, windows on
  fresh draws at the rating's estimate (``refine_centre``), for the rating's fit alone: they move neither
  the bracket nor the verdict.
- **arrival draws** (``SearchConfig.arrivals``): ``fresh`` (the default) gives every step its own draw
  (``draw`` 0, 1, 2, ...), so the steps are independent windows and ``capacity.rating`` can pool them.
  With one draw scaled to every step (``common``), every bisection step repeats that draw's luck (one
  that is sparse near the knee rated the calibration queue 21 % high on seed 0), and pooling them
  averages nothing. ``common`` keeps draw 0 for the ramp and bisection (steps differ by load alone, the
  verdicts are monotone in load on a deterministic target) until a confirmation reopens the bracket.
- **disturbed steps**: a step whose result says ``disturbed`` (the load generator fell behind its
  schedule) decides nothing: the same load, phase and draw is measured again, at most ``retries`` times
  (``remeasured_of`` links each attempt to the one before). When the retries run out the last attempt
  counts as measured; if the verdict rests on it (a *deciding* step: a measurement that agrees with the
  pass or fail end's verdict, every step of never_met) the verdict is ``invalid``.
- Verdicts: ``rated`` (a pass and a fail bracket the capacity), ``never_met`` (even ``min_load``
  fails), ``never_broke`` (``max_load`` still passes; the rating is a lower bound), ``invalid`` (one of
  those, ``search_verdict``, resting on a disturbed step).
- The step budget (``max_steps``: ramp and bisection steps; confirmations and re-measures come on top,
  bounded by ``max_reopens`` and ``retries``) ends the search early with the best bracket so far, and
  says so. A reopening raises the budget to what has been spent plus the plain bisections the reopened
  bracket needs to reach the tolerance again: a ramp that spent the budget must not leave a reopened
  bracket wide (a run rated 53.8 req/s with the next failure at 64, 19 % above, for want of it).
- ``end(reason)`` ends the search at once (``capacity.run``: the time budget, ``max_duration_s``), and
  the outcome says why (``ended_by``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from loadgen.capacity.confirm import MAX_REOPENS, confirmation, confirmed, tie_break
from loadgen.capacity.refine import RefineCentre, refinement
from loadgen.capacity.search_steps import (
    ArrivalDraws,
    Proposal,
    SearchOutcome,
    Step,
    StepResult,
    judging,
    latest_at,
    majority,
    measured_at,
    on_axis,
)
from loadgen.scenario.options import SearchConfig

RETRIES = 2  # re-measures of a disturbed step


class CapacitySearch:
    """Proposes load steps and learns from their results until it has a verdict (the module's docstring)."""

    def __init__(self, cfg: SearchConfig, *, confirm: bool = True, retries: int = RETRIES,
                 max_reopens: int = MAX_REOPENS, refine_centre: RefineCentre | None = None):
        self.cfg = cfg
        self.refine_centre = refine_centre
        self.confirm = confirm
        self.retries = retries
        self.max_reopens = max_reopens
        self.steps: list[Step] = []
        self.best_pass: float | None = None  # highest passing load
        self.first_fail: float | None = None  # lowest failing load above best_pass (or anywhere without one)
        self.reopens = 0
        self.ended_by: str | None = None
        self._draws = ArrivalDraws()  # fresh arrival patterns handed out
        self._budget = cfg.max_steps  # ramp and bisection steps allowed (a reopening may raise it)
        self._pending: Proposal | None = Proposal(cfg.start, "ramp")
        self._brackets: list[float] = []  # log width of the bracket after each bisection-phase step
        self._interp_last = False
        self.unit = "users" if cfg.integer else "req/s"

    # ------------------------------------------------------------ driving

    def next_step(self) -> tuple[float, str] | None:
        """The next (load, phase) to measure, or None when the search is over."""
        if self._pending is None:
            return None
        return self._pending.load, self._pending.phase

    @property
    def next_draw(self) -> int:
        """The arrival pattern of the next step (a fresh one each, or 0: the common one)."""
        return self._pending.draw if self._pending else 0

    def record(self, load: float, result: StepResult) -> Step:
        p = self._pending if self._pending is not None and self._pending.load == load else Proposal(load, "ramp")
        step = Step(len(self.steps), load, p.phase, result, p.draw, p.attempt, p.remeasured_of)
        prev = latest_at(self.steps, load)
        self.steps.append(step)
        if result.disturbed and p.attempt <= self.retries:
            step.counted = False  # measure it again: same load, phase and pattern
            self._pending = Proposal(load, p.phase, p.draw, p.attempt + 1, step.index, p.want)
            return step
        reopened = False
        if p.phase == "confirm" and prev is not None:
            step.confirms = prev.index
            verdict = majority(self.steps, load)
            if verdict is None:  # a tie: one more fresh pattern breaks it
                self._pending = tie_break(load, p.want, self._draws)
                return step
            if p.want is not None and verdict != p.want:
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
        self._pending = None
        self.ended_by = reason

    def run(self, measure: Callable[..., StepResult], draws: bool = False) -> SearchOutcome:
        while (nxt := self.next_step()) is not None:
            load, phase = nxt
            res = measure(load, phase, self.next_draw) if draws else measure(load, phase)
            self.record(load, res)
        return self.outcome()

    # ------------------------------------------------------------ the bracket

    def _update_bracket(self) -> None:
        """Each load's verdict is its measurements' majority (a tie fails); fails below the highest pass
        are noise."""
        loads = {s.load for s in judging(self.steps)}
        verdict = {x: bool(majority(self.steps, x)) for x in loads}
        passes = [x for x, v in verdict.items() if v]
        self.best_pass = max(passes) if passes else None
        fails = [x for x, v in verdict.items() if not v and (self.best_pass is None or x > self.best_pass)]
        self.first_fail = min(fails) if fails else None

    def _search_steps(self) -> int:
        """Steps counted against ``max_steps``: first attempts of ramp and bisection steps."""
        return sum(1 for s in self.steps if s.phase in ("ramp", "bisect") and s.attempt == 1)

    def _round(self, x: float) -> float:
        return on_axis(x, self.cfg.integer)

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

    # ------------------------------------------------------------ proposals: ramp and bisection

    def _propose(self) -> Proposal | None:
        c = self.cfg
        lo, hi = self.best_pass, self.first_fail
        spent = self._search_steps() >= self._budget
        if lo is not None and hi is not None:
            conv = self._converged(lo, hi)
            if conv or spent:
                return self._confirmation(lo, hi) or refinement(c, self.steps, lo, hi, self.refine_centre,
                                                                self._draws)
            mid = self._round(self._interpolated(lo, hi) or math.sqrt(lo * hi))
            if c.integer and not lo < mid < hi:
                mid = lo + 1
            return Proposal(mid, "bisect", self._fresh()) if lo < mid < hi else None
        if spent:
            return None
        if hi is None and lo is not None:  # everything so far passed: ramp up
            if lo >= c.max_load:
                return None
            nxt = self._round(lo * c.growth)
            if c.integer and nxt <= lo:
                nxt = lo + 1
            return Proposal(min(nxt, c.max_load), "ramp", self._fresh())
        # everything so far failed: ramp down
        low = min((s.load for s in self.steps if s.counted), default=c.start)
        if low <= c.min_load:
            return None
        nxt = self._round(low / c.growth)
        if c.integer and nxt >= low:
            nxt = low - 1
        return Proposal(max(nxt, c.min_load), "ramp", self._fresh())

    def _confirmation(self, lo: float, hi: float) -> Proposal | None:
        """The next confirmation (``capacity.confirm``), while confirming is on and reopenings are left."""
        if not self.confirm or self.reopens >= self.max_reopens + 1:
            return None
        return confirmation(self.steps, lo, hi, self._draws)

    def _fresh(self) -> int:
        """A fresh draw; with ``arrivals: common``, draw 0 until a confirmation reopened the bracket."""
        if self.cfg.arrivals == "common" and not self.reopens:
            return 0
        return self._draws.fresh()

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
        st = latest_at(self.steps, load)
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
                v = bool(majority(self.steps, load))
                keep += [s.index for s in measured_at(self.steps, load) if s.passed == v]
        return sorted(keep)

    def outcome(self) -> SearchOutcome:
        c = self.cfg
        lo, hi, u = self.best_pass, self.first_fail, self.unit
        n = len(self.steps)
        ends_confirmed = None
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
                ends_confirmed = confirmed(self.steps, lo) and confirmed(self.steps, hi)
                if not ends_confirmed:
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
        out = SearchOutcome(verdict, rated, fail, conv, list(self.steps), text, search_verdict=verdict,
                            confirmed=ends_confirmed, reopens=self.reopens, deciding=deciding, ended_by=self.ended_by)
        if bad:
            out.verdict = "invalid"
            out.invalid_reason = (f"the verdict rests on step(s) {', '.join(str(s.index) for s in bad)}, still "
                                  f"disturbed after {self.retries} re-measure(s): {bad[0].disturbed}")
            out.text = f"INVALID ({out.invalid_reason}); the steps say: {text}"
        return out


def fmt_load(x: float | None) -> str:
    """A load in three significant digits, whole numbers from 100 up; "-" for none."""
    if x is None:
        return "-"
    if x < 100:
        return f"{x:.3g}"
    return f"{x:.0f}"
