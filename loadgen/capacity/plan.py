"""What a capacity run measures: the scenario's search and step options, and each step's requests."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from loadgen.results.slo import SLO
from loadgen.scenario.model import Scenario, ScenarioError
from loadgen.scenario.options import SearchConfig, StepOptions
from loadgen.workload.arrivals import Arrivals
from loadgen.workload.specs import RequestSpec

TRACE_MIN_ROWS = 50  # trace rows a rate step draws on at least (a short slice of a bursty trace degenerates)


@dataclass
class CapacityPlan:
    scenario: Scenario
    search: SearchConfig
    step: StepOptions
    slos: dict[str, list[SLO]]  # tier -> judged SLOs ([] for a tier with no promise)
    headroom: float
    lateness_bound_ms: float

    @classmethod
    def from_scenario(cls, scn: Scenario) -> CapacityPlan:
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
    def closed(self) -> bool:
        return self.search.axis == "concurrency"

    def quantile(self, tier: str) -> float:
        return self.scenario.tier_quantiles.get(tier, self.step.quantile)


# ------------------------------------------------------------------ per-step workload


def step_specs(scn: Scenario, axis: str, load: float, index: int, start_s: float,
               duration_s: float) -> list[RequestSpec]:
    """The requests of one step, arrival times offset to ``start_s`` on the run's clock. Closed loop
    (``axis == 'concurrency'``): enough requests for ``load`` users for the whole step, in order."""
    seed = scn.seed * 1000 + index + 1  # fresh prompts per step; arrivals use scn.seed (common numbers)
    if scn.workload_type == "synthetic":
        if axis == "rate":
            a = scn.arrivals if scn.arrivals and not scn.arrivals.closed else None
            arr = Arrivals(a.kind if a else "poisson", rate=load, burstiness=a.burstiness if a else 1.0)
            times = arr.times(duration_s=duration_s, seed=scn.seed)
        else:
            times = np.zeros(int(load * duration_s * 25) + 50)
        specs = scn.synthetic.generate(times, seed=seed)
        if axis == "rate":
            specs = [s for s in specs if s.arrival_s < duration_s]
    else:
        opts = dataclasses.replace(scn.trace_options, seed=seed)
        if axis == "rate":  # the trace's first load x duration rows (at least 50), at mean rate `load`
            opts.rate = load
            opts.max_requests = max(TRACE_MIN_ROWS, math.ceil(load * duration_s))
            opts.max_duration_s = None  # cut after the ties are spread
            if opts.arrivals is not None:
                opts.arrivals = dataclasses.replace(opts.arrivals, rate=load)
        else:
            opts.rate = None
            opts.max_duration_s = None
        specs, _ = scn.trace_specs(opts)
        if axis == "rate":
            specs = [s for s in specs if s.arrival_s < duration_s]
    for s in specs:
        s.id = f"s{index}-{s.id}"
        s.arrival_s = start_s + (s.arrival_s if axis == "rate" else 0.0)
    return specs
