"""The scenario's requests as the planner sees them: arrival times at rate 1, prompt and answer lengths,
tiers and shared prefixes, drawn with the scenario's own arrival process and workload generator."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadgen.scenario.model import Scenario
from loadgen.workload.arrivals import Arrivals
from loadgen.workload.specs import RequestSpec


class PlanError(ValueError):
    """Input the planner cannot stand for: one line for the user."""


@dataclass
class Requests:
    arrive: np.ndarray  # seconds, at a mean rate of 1 request/s: divide by the rate
    n_in: np.ndarray  # prompt tokens (shared prefix included)
    n_out: np.ndarray  # answer tokens (max_tokens: the scenario's workloads ignore EOS)
    tier: np.ndarray  # tier names ("none" without tiers)
    prefix: np.ndarray  # which shared system prompt (-1: none)
    prefix_len: np.ndarray  # its tokens (0: none)

    def __len__(self) -> int:
        return len(self.arrive)


def check_scenario(scn: Scenario) -> None:
    """A PlanError unless the scenario is synthetic, single-turn and open loop (what the simulation draws)."""
    if scn.workload_type != "synthetic" or scn.synthetic is None:
        raise PlanError("plan needs a synthetic workload (workload.type: synthetic), not a trace")
    if scn.synthetic.conversations:
        raise PlanError("plan needs single-turn requests: workload.conversations depend on the replies")
    if (scn.search and scn.search.axis != "rate") or (scn.arrivals is not None and scn.arrivals.closed):
        raise PlanError("plan needs open-loop arrivals (search.axis: rate, load.arrival: poisson | gamma | constant)")
    if not any(scn.slos().values()):
        raise PlanError("plan needs an SLO on at least one tier")


def draw(scn: Scenario, seed: int, n: int) -> Requests:
    """``n`` requests of the scenario at rate 1 (its arrival process, lengths, tiers and prefixes)."""
    check_scenario(scn)
    a = scn.arrivals
    times = Arrivals(a.kind if a else "poisson", rate=1.0, burstiness=a.burstiness if a else 1.0).times(n=n, seed=seed)
    return requests_of(scn.synthetic.generate(times, seed=seed))


def requests_of(specs: list[RequestSpec]) -> Requests:
    """The planner's view of generated requests (their ``arrival_s`` as given)."""
    prefix = np.full(len(specs), -1, dtype=np.int64)
    prefix_len = np.zeros(len(specs), dtype=np.int64)
    for i, sp in enumerate(specs):
        first = sp.segments[0] if sp.segments else None
        if first is not None and first.key[0] == "prefix":  # workload.synthetic's shared system prompt
            prefix[i], prefix_len[i] = int(first.key[-1]), first.tokens
    return Requests(arrive=np.asarray([s.arrival_s for s in specs], dtype=float),
                    n_in=np.asarray([s.prompt_tokens or len(s.prompt) for s in specs], dtype=np.int64),
                    n_out=np.asarray([s.max_tokens for s in specs], dtype=np.int64),
                    tier=np.asarray([s.tier or "none" for s in specs]), prefix=prefix, prefix_len=prefix_len)
