"""The load steps of a capacity search, as plain data, and the rule that turns them into a verdict per load.

A *load step* is one window of requests at one load (``capacity.step`` measures it; an engine step is
something else). The search proposes a load step (``Proposal``), the caller measures it (``StepResult``), and
the search records it (``Step``). Every load's verdict is the majority of its counted measurements
(``majority``); the bracket, the confirmations and the outcome all read the steps through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERDICTS = ("rated", "never_met", "never_broke", "invalid")


@dataclass(slots=True)
class StepResult:
    """What measuring one load step found."""

    passed: bool | None  # None (nothing could be judged) counts as a failure
    stopped_early: bool = False
    detail: dict[str, Any] = field(default_factory=dict)
    margin: float | None = None  # worst judged quantile / threshold (a lower bound when stopped early)
    disturbed: str | None = None  # why this measurement cannot be trusted (the load generator fell behind)


@dataclass(slots=True)
class Step:
    """One measured load step, as the search recorded it."""

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
class Proposal:
    """The load step the search asks for next."""

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


@dataclass(slots=True)
class ArrivalDraws:
    """The arrival patterns handed out: 0 is the common one, and each fresh one is the next number."""

    handed_out: int = 0

    def fresh(self) -> int:
        self.handed_out += 1
        return self.handed_out


def judging(steps: list[Step]) -> list[Step]:
    """The counted steps the bracket and verdict rest on (refine windows only feed the rating)."""
    return [s for s in steps if s.counted and s.phase != "refine"]


def measured_at(steps: list[Step], load: float) -> list[Step]:
    """The judging steps measured at ``load``."""
    return [s for s in judging(steps) if s.load == load]


def latest_at(steps: list[Step], load: float) -> Step | None:
    """The last judging step measured at ``load``."""
    return next((s for s in reversed(judging(steps)) if s.load == load), None)


def majority(steps: list[Step], load: float) -> bool | None:
    """The majority of the load's counted measurements; None for a tie."""
    at = measured_at(steps, load)
    ok = sum(s.passed for s in at)
    if 2 * ok == len(at):
        return None
    return 2 * ok > len(at)


def on_axis(load: float, integer: bool) -> float:
    """A load as the search's axis takes it: a whole number of users on ``concurrency``."""
    return float(round(load)) if integer else load
