"""A capacity run's settings: the scenario's search and load-step options and its judged SLOs (each load
step's requests come from ``scenario.steps.step_specs``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from loadgen.results.slo import SLO
from loadgen.scenario.model import Scenario, ScenarioError
from loadgen.scenario.options import SearchConfig, StepOptions


@dataclass
class CapacitySettings:
    scenario: Scenario
    search: SearchConfig
    step: StepOptions
    slos: dict[str, list[SLO]]  # tier -> judged SLOs ([] for a tier with no promise)
    headroom: float
    lateness_bound_ms: float

    @classmethod
    def from_scenario(cls, scn: Scenario) -> CapacitySettings:
        search = dataclasses.replace(scn.search) if scn.search else SearchConfig()
        step = dataclasses.replace(scn.step) if scn.step else StepOptions()
        if scn.step is None:
            scn.step = step
        slos = scn.slos()
        if not any(slos.values()):
            raise ScenarioError("tiers: the capacity search needs at least one tier with an SLO, e.g. "
                                "tiers: {standard: {slo: {ttft_ms: 800}}}")
        return cls(scn, search, step, slos, scn.headroom, scn.lateness_bound_ms)

    @property
    def drain_s(self) -> float:
        if self.step.drain_s is not None:
            return self.step.drain_s
        worst = max(s.threshold_ms for ss in self.slos.values() for s in ss) / 1000.0
        return max(2.0, 2.0 * worst)

    @property
    def count_marks(self) -> tuple[float, ...]:
        """Where a rate step's arrival count is exact (``search.window_counts: exact``; ``Arrivals.times``):
        every time its warm-up may end (``capacity.steady`` checks at the floor and every interval after it, up
        to the cap) and its planned end, so that whichever window the warm-up leaves offers the step's load."""
        if self.closed or self.search.window_counts != "exact":
            return ()
        o = self.step
        marks = [o.warmup_s + k * o.steady_interval_s for k in range(int((o.max_warmup_s - o.warmup_s)
                                                                          / o.steady_interval_s) + 1)]
        return tuple(sorted({m for m in [*marks, o.max_warmup_s, o.step_duration_s] if m > 0}))

    @property
    def closed(self) -> bool:
        return self.search.axis == "concurrency"

    def quantile(self, tier: str) -> float:
        """The tier's highest judged quantile (its SLOs may each have their own), which decides how many
        requests a step's window needs; the tier's (or the search's) quantile for a tier with no quantile
        SLO (none, or only mean ones)."""
        qs = [s.quantile for s in self.slos.get(tier, []) if not s.is_mean]
        return max(qs) if qs else self.scenario.tier_quantiles.get(tier, self.step.quantile)
