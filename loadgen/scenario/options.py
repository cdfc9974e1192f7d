"""The capacity search's and its steps' options, as a scenario's ``search`` section gives them.

They live here, below ``loadgen.capacity``, because the scenario parser builds them and scenario may not
import capacity; ``loadgen.capacity.search`` runs on a :class:`SearchConfig` and the capacity settings
(``loadgen.capacity.settings``) carry both.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.results.sequential import SPENDING

AXES = ("rate", "concurrency")
ARRIVAL_DESIGNS = ("fresh", "common")  # search.arrivals: each step's own draw, or one draw for every step
WINDOW_COUNTS = ("drawn", "exact")  # search.window_counts: a window offers its draw's count, or exactly its load


@dataclass(slots=True)
class SearchConfig:
    """How the capacity search ramps and bisects (``loadgen.capacity.search``)."""

    axis: str = "rate"  # rate (requests/s, open loop) | concurrency (users, closed loop)
    start: float = 1.0
    growth: float = 2.0  # ramp factor, > 1
    tolerance: float = 0.05  # relative width of the final bracket
    max_steps: int = 12
    min_load: float | None = None  # default: start / growth**2 (rate), 1 (concurrency)
    max_load: float | None = None  # default: start * growth**(max_steps - 1)
    interpolate: bool = True  # false position on the SLO margins; False: plain bisection
    arrivals: str = "fresh"  # fresh: every step its own arrival draw | common: one draw scaled to every step
    window_counts: str = "drawn"  # drawn: the arrival process's own count | exact: load x the window's length
    refine_steps: int = 0  # windows at the rating's estimate after the bracket, for its fit only (phase refine)
    max_duration_s: float | None = None  # the run's time budget: no step starts that would end past it (capacity.run)

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise ValueError(f"axis must be one of {', '.join(AXES)}, got {self.axis!r}")
        if self.arrivals not in ARRIVAL_DESIGNS:
            raise ValueError(f"arrivals must be one of {', '.join(ARRIVAL_DESIGNS)}, got {self.arrivals!r}")
        if self.window_counts not in WINDOW_COUNTS:
            raise ValueError(f"window_counts must be one of {', '.join(WINDOW_COUNTS)}, got {self.window_counts!r}")
        if not self.start > 0 or not self.growth > 1 or not self.tolerance > 0 or self.max_steps < 1:
            raise ValueError("need start > 0, growth > 1, tolerance > 0 and max_steps >= 1")
        if self.refine_steps < 0:
            raise ValueError("need refine_steps >= 0")
        if self.max_duration_s is not None and not self.max_duration_s > 0:
            raise ValueError("need max_duration_s > 0")
        if self.integer:
            self.start = max(1, round(self.start))
        if self.min_load is None:
            self.min_load = 1 if self.integer else self.start / self.growth**2
        if self.max_load is None:
            self.max_load = self.start * self.growth ** (self.max_steps - 1)
        if not 0 < self.min_load <= self.start <= self.max_load:
            raise ValueError(f"need 0 < min_load <= start <= max_load, got {self.min_load}, {self.start}, "
                             f"{self.max_load}")

    @property
    def integer(self) -> bool:
        return self.axis == "concurrency"


@dataclass
class StepOptions:
    """How ``slobench capacity`` measures one load step (``loadgen.capacity.step``)."""

    step_duration_s: float = 15.0  # the most a step sends, warm-up included (a step decided sooner stops then)
    warmup_s: float = 3.0  # the least warm-up: requests scheduled before the window are never judged
    quantile: float = 0.99
    confidence: float = 0.95  # the bootstrap interval reported with each quantile
    drain_s: float | None = None  # None: 2x the largest SLO threshold, at least 2 s
    early_stop: bool = True  # end a step once it is decided: a certain breach, or the sequential test's verdict
    early_pass: bool = True  # ramp steps: ... or once every SLO is clearly met (quantile < pass_margin x threshold)
    pass_margin: float = 0.5
    settle_timeout_s: float = 30.0  # wait for the target to go idle between steps
    max_warmup_s: float | None = None  # the warm-up goes on while in-flight rises, up to this (None: 2x warmup_s,
    #                                    at most half the step)
    steady_interval_s: float = 1.0  # in-flight means of successive intervals this long are compared
    steady_tolerance: float = 0.1  # ... a rise of more than this share (+ 1 request) is a trend
    alpha: float = 0.05  # the sequential test's error bound per SLO and side (false breach, false pass)
    alpha_spending: str = "pocock"  # pocock | obrien_fleming | linear (Bonferroni over equal looks)
    look_interval_s: float = 0.5  # the sequential test looks this often
    decluster_run: int = 2  # breach side: exceedances at most this many requests apart count as one (0: off)
    # A bisection or confirming step's window (after max_warmup_s) holds at least this many planned requests
    # of each judged tier (open loop): a p99 of 40 requests is their maximum, some p97.5, and rates a load
    # too high. None: 1 / (1 -
    # quantile), 100 for a p99; 0: off. The step is lengthened for it up to max_step_duration_s (None: 4 x
    # step_duration_s).
    min_samples: int | None = None
    max_step_duration_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_warmup_s is None:
            self.max_warmup_s = max(self.warmup_s, min(2.0 * self.warmup_s, self.step_duration_s / 2.0))
        if self.max_step_duration_s is None:
            self.max_step_duration_s = 4.0 * self.step_duration_s
        if self.alpha_spending not in SPENDING:
            raise ValueError(f"alpha_spending must be one of {', '.join(SPENDING)}, got {self.alpha_spending!r}")

    @property
    def window_s(self) -> float:
        """The longest window a step may get (its warm-up at the floor, undecided until the cap)."""
        return self.step_duration_s - self.warmup_s
