"""What an experiment hands back: its parameters, one finding per design claim (its wording and figure, the
measured figure, whether it holds here and, where not, by how much and why), its raw figures and a plot."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Finding:
    claim: str  # the design claim's wording
    seed_figure: str  # the claimed number, as the claim states it
    setting: str  # what was compared, in a few words
    measured: str  # the measured figure, as text
    value: float | None  # the headline number behind `measured`
    holds: bool
    rule: str  # how `holds` was decided
    note: str = ""  # by how much it misses and the likely reason, from the measurement; "" when it holds


@dataclass
class Plot:
    """One plotly figure: named series of x and y (bars when `kind` is "bar")."""

    title: str
    x_title: str
    y_title: str
    kind: str = "bar"  # "bar" | "line"
    series: dict[str, dict[str, list]] = field(default_factory=dict)

    def add(self, name: str, x: list, y: list) -> None:
        self.series[name] = {"x": list(x), "y": [None if v is None else float(v) for v in y]}


@dataclass
class ExperimentResult:
    name: str
    title: str
    params: dict[str, Any]
    findings: list[Finding]
    data: dict[str, Any]  # every measured figure, by variant
    plot: Plot
    wall_s: float = 0.0

    @property
    def holds(self) -> bool:
        return all(f.holds for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "holds": self.holds}


def pct(x: float) -> str:
    return f"{x:.1%}"


def times(x: float) -> str:
    return f"{x:.2f}x"
