"""The capacity search's and its steps' options, as a scenario's ``search`` section gives them.

They live here, below ``loadgen.capacity``, because the scenario parser builds them and scenario may not
import capacity; ``loadgen.capacity.search`` runs on a :class:`SearchConfig` and the capacity plan
carries both.
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("rate", "concurrency")


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

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise ValueError(f"axis must be one of {', '.join(AXES)}, got {self.axis!r}")
        if not self.start > 0 or not self.growth > 1 or not self.tolerance > 0 or self.max_steps < 1:
            raise ValueError("need start > 0, growth > 1, tolerance > 0 and max_steps >= 1")
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
    """How ``slobench capacity`` measures one load step."""

    step_duration_s: float = 15.0  # sending time of a step, warm-up included
    warmup_s: float = 3.0  # discarded start of each step
    quantile: float = 0.99
    confidence: float = 0.95
    drain_s: float | None = None  # None: 2x the largest SLO threshold, at least 2 s
    early_stop: bool = True  # end a step once its breach is certain
    early_pass: bool = True  # ramp steps: ... or once every SLO is clearly met (quantile < pass_margin x threshold)
    pass_margin: float = 0.5
    settle_timeout_s: float = 30.0  # wait for the target to go idle between steps

    @property
    def window_s(self) -> float:
        return self.step_duration_s - self.warmup_s
