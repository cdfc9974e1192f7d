"""The true capacity of the mock's queueing mode, by exact simulation: what ``slobench calibrate`` holds the
capacity search against.

The mock with ``--slots C`` (``target.mock.slots``) is a FIFO C-server queue with known service times: a
request waits for a slot in arrival order, its first token comes ``ttft_ms + prefill_ms_per_token x prompt
tokens`` after it has one, its tokens ``itl_ms`` apart, and it holds the slot until its last token. Given
the arrival times, the waits follow exactly (the Kiefer-Wolfowitz recursion: each arrival takes the slot
that frees first), so the SLO quantiles are computed, not estimated from a run:

- **the workload** is the scenario's own: its arrival process (Poisson, gamma, constant) and its length
  and tier distributions (``SyntheticWorkload.generate``), drawn once per seed at rate 1 and scaled to each
  rate (common random numbers: every rate sees the same pattern, so the simulated curve is monotone);
- **steady state**: ``requests`` per seed over ``seeds`` seeds, the first ``discard`` share of each
  dropped (the queue starts empty), the rest pooled per tier; tiers have no priority in the mock (FIFO);
- **the true capacity** is the highest rate at which every tier's SLO quantiles (``Scenario.slos()``:
  TTFT, TTFOT = TTFT here, E2EL, TPOT = ITL) are within their thresholds, by bisection on the rate.

``SimulatedSteps`` gives the capacity search steps computed from the queue instead of measured (a step's
window from its own arrival draw, in a summary step's form), so the search and its rating can be run on
the calibration queue by the hundred, free of machine noise (``bench/rating_simulation.py``, the tests).

``ideal_step_ratings`` adds what a *perfect* search would rate with the scenario's step protocol (each
step from an empty queue, ``step_duration_s`` long, its first ``warmup_s`` discarded, one arrival draw
per seed): the noise and bias no search over such steps can avoid, to read a calibration error against.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass

import numpy as np

from loadgen.capacity import rating
from loadgen.capacity.search import CapacitySearch
from loadgen.capacity.search_steps import StepResult
from loadgen.capacity.settings import CapacitySettings
from loadgen.results.latency import quantile
from loadgen.results.sequential import clusters
from loadgen.scenario.model import Scenario
from loadgen.scenario.options import SearchConfig
from loadgen.workload.arrivals import Arrivals

METRICS = ("ttft_ms", "ttfot_ms", "e2el_ms", "tpot_ms")  # what the simulation knows for every request


class TruthError(ValueError):
    """A scenario the simulation cannot stand for (a trace, conversations, closed loop ...)."""


@dataclass(frozen=True)
class QueueParams:
    """The mock's queueing mode: ``mock-server --slots --ttft-ms --prefill-ms-per-token --itl-ms --tokens``."""

    slots: int = 16
    ttft_ms: float = 20.0  # the fixed part of the prefill
    prefill_ms_per_token: float = 0.1
    itl_ms: float = 20.0
    tokens: int | None = None  # every answer's length; None: the request's max_tokens

    def __post_init__(self) -> None:
        if self.slots < 1 or self.ttft_ms < 0 or self.prefill_ms_per_token < 0 or self.itl_ms < 0:
            raise ValueError("need slots >= 1 and ttft_ms, prefill_ms_per_token, itl_ms >= 0")
        if self.tokens is not None and self.tokens < 1:
            raise ValueError("tokens must be >= 1")

    def prefill_s(self, n_in: np.ndarray) -> np.ndarray:
        return (self.ttft_ms + self.prefill_ms_per_token * np.asarray(n_in, dtype=float)) / 1000.0

    def service_s(self, n_in: np.ndarray, n_out: np.ndarray) -> np.ndarray:
        """How long each request holds its slot: prefill, then its other tokens ``itl_ms`` apart."""
        return self.prefill_s(n_in) + (np.asarray(n_out, dtype=float) - 1.0) * self.itl_ms / 1000.0

    def as_dict(self) -> dict:
        return asdict(self)


def fifo_waits(arrive: np.ndarray, service: np.ndarray, slots: int) -> np.ndarray:
    """Each request's wait for a slot in a FIFO ``slots``-server queue that starts empty (arrivals sorted):
    request i takes the slot that frees first, at ``max(arrival, that time)``."""
    free = [-math.inf] * slots  # a heap of the times each slot frees
    out = np.empty(len(arrive))
    for i, (a, s) in enumerate(zip(np.asarray(arrive, dtype=float).tolist(),
                                   np.asarray(service, dtype=float).tolist(), strict=True)):
        start = max(a, free[0])
        heapq.heapreplace(free, start + s)
        out[i] = start - a
    return out


def latencies(arrive: np.ndarray, n_in: np.ndarray, n_out: np.ndarray, q: QueueParams) -> dict[str, np.ndarray]:
    """Every request's wait and SLO values (ms) in the mock, from its arrival time and lengths."""
    n_out = np.full(len(n_in), q.tokens) if q.tokens is not None else np.asarray(n_out)
    wait = fifo_waits(arrive, q.service_s(n_in, n_out), q.slots)
    first = (wait + q.prefill_s(n_in)) * 1000.0
    decode = (n_out - 1.0) * q.itl_ms
    return {"wait_ms": wait * 1000.0, "ttft_ms": first, "ttfot_ms": first, "e2el_ms": first + decode,
            "tpot_ms": np.where(n_out > 1, q.itl_ms, np.nan)}


@dataclass
class Draw:
    """One seed's requests at rate 1: arrival times, prompt and answer lengths, tiers."""

    arrive: np.ndarray
    n_in: np.ndarray
    n_out: np.ndarray
    tier: np.ndarray


def check_scenario(scn: Scenario) -> None:
    """A TruthError unless the scenario is what the simulation stands for: synthetic, single-turn, open loop."""
    if scn.workload_type != "synthetic" or scn.synthetic is None:
        raise TruthError("calibration needs a synthetic workload (workload.type: synthetic), not a trace")
    if scn.synthetic.conversations:
        raise TruthError("calibration needs single-turn requests: workload.conversations depend on the replies")
    if scn.cancel is not None:
        raise TruthError("calibration needs requests that run to the end: remove workload.cancel")
    if (scn.search and scn.search.axis != "rate") or (scn.arrivals is not None and scn.arrivals.closed):
        raise TruthError("calibration needs open-loop arrivals (search.axis: rate, load.arrival: poisson | gamma "
                         "| constant)")
    if scn.endpoint not in (None, "completions"):
        raise TruthError(f"calibration sends token-id prompts to /v1/completions, whose tokens the mock counts "
                         f"exactly; remove client.endpoint: {scn.endpoint}")
    if not any(scn.slos().values()):
        raise TruthError("calibration needs an SLO on at least one tier")
    for ss in scn.slos().values():
        for s in ss:
            if s.metric not in METRICS:
                raise TruthError(f"calibration knows {', '.join(METRICS)}; not the SLO metric {s.metric}")


def _arrivals(scn: Scenario, rate: float = 1.0) -> Arrivals:
    a = scn.arrivals
    return Arrivals(a.kind if a else "poisson", rate=rate, burstiness=a.burstiness if a else 1.0)


def draw(scn: Scenario, seed: int, n: int | None = None, duration_s: float | None = None, chunk: int = 4096,
         rate: float = 1.0, exact_at: tuple[float, ...] = ()) -> Draw:
    """``n`` requests (or those within ``duration_s``) of the scenario's workload at ``rate`` (1: a pattern
    to scale), for one seed, counted exactly at ``exact_at`` (``Arrivals.times``). The prompts are drawn
    ``chunk`` requests at a time and only their lengths kept."""
    times = _arrivals(scn, rate).times(n=n, duration_s=duration_s, seed=seed, exact_at=exact_at)
    n_in, n_out, tiers = [], [], []
    for k, i in enumerate(range(0, len(times), chunk)):
        for sp in scn.synthetic.generate(times[i:i + chunk], seed=seed * 7919 + k + 1):
            n_in.append(len(sp.prompt))
            n_out.append(sp.max_tokens)
            tiers.append(sp.tier or "none")
    return Draw(times, np.asarray(n_in, dtype=float), np.asarray(n_out, dtype=float), np.asarray(tiers))


class QueueTruth:
    """The scenario's SLO quantiles in the mock's queue at any rate, and the rate where they break."""

    def __init__(self, scn: Scenario, q: QueueParams, *, requests: int = 20000, seeds: int = 4,
                 discard: float = 0.1, seed0: int = 1000):
        check_scenario(scn)
        self.scn, self.q = scn, q
        self.slos = {t: ss for t, ss in scn.slos().items() if ss}
        self.draws = [draw(scn, seed0 + k, n=requests) for k in range(seeds)]
        self.skip = int(requests * discard)
        self.requests, self.seeds, self.discard = requests, seeds, discard
        mean_service = float(np.mean(np.concatenate(
            [q.service_s(d.n_in, np.full(len(d.n_in), q.tokens) if q.tokens else d.n_out) for d in self.draws])))
        self.saturation_rps = q.slots / mean_service  # the queue grows without bound above it

    def quantiles(self, rate: float) -> dict[str, dict[str, float]]:
        """Each judged tier's SLO quantiles (ms) at ``rate`` req/s, steady state, pooled over the seeds."""
        pooled: dict[str, dict[str, list[np.ndarray]]] = {t: {} for t in self.slos}
        for d in self.draws:
            lat = latencies(d.arrive / rate, d.n_in, d.n_out, self.q)
            keep = slice(self.skip, None)
            for tier, ss in self.slos.items():
                mask = d.tier[keep] == tier
                for s in ss:
                    pooled[tier].setdefault(s.metric, []).append(lat[s.metric][keep][mask])
        out: dict[str, dict[str, float]] = {}
        for tier, ss in self.slos.items():
            out[tier] = {}
            for s in ss:
                v = np.concatenate(pooled[tier][s.metric])
                out[tier][s.metric] = quantile(v[~np.isnan(v)], s.quantile)
        return out

    def margin(self, rate: float) -> float:
        """The largest quantile / threshold over every judged SLO at ``rate``: <= 1 means all are met."""
        qs = self.quantiles(rate)
        return max(qs[t][s.metric] / s.threshold_ms for t, ss in self.slos.items() for s in ss)

    def capacity(self, rel_tol: float = 1e-4) -> float | None:
        """The true capacity (req/s): the highest rate whose SLO quantiles all hold. 0.0 when they fail
        even with no queue; None when they still hold at twice the saturation rate."""
        lo, hi = self.saturation_rps * 1e-3, self.saturation_rps
        if self.margin(lo) > 1.0:
            return 0.0
        while self.margin(hi) <= 1.0:
            if hi > 2 * self.saturation_rps:
                return None
            lo, hi = hi, hi * 1.25
        while (hi - lo) > rel_tol * lo:
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self.margin(mid) <= 1.0 else (lo, mid)
        return lo

    def describe(self, capacity: float | None) -> dict:
        """The truth's figures for a summary: the capacity, where the queue saturates, how it was found."""
        return {"true_capacity_rps": capacity, "saturation_rps": self.saturation_rps,
                "utilisation_at_capacity": capacity / self.saturation_rps if capacity else None,
                "quantiles_at_capacity_ms": self.quantiles(capacity) if capacity else None,
                "simulation": {"requests_per_seed": self.requests, "seeds": self.seeds, "discarded": self.discard}}


def ideal_step_ratings(scn: Scenario, q: QueueParams, truth_rps: float, duration_s: float, warmup_s: float,
                       seeds: int = 20, seed0: int = 0, rel_tol: float = 1e-3) -> np.ndarray:
    """What a perfect search over the scenario's steps would rate for each of ``seeds`` seeds: the rate
    where one step's window quantiles cross their thresholds (each step starts empty, sends for
    ``duration_s``, is judged on the requests scheduled after ``warmup_s``), by bisection on the rate."""
    check_scenario(scn)
    slos = {t: ss for t, ss in scn.slos().items() if ss}
    top = 4.0 * truth_rps
    out = []
    for seed in range(seed0, seed0 + seeds):
        d = draw(scn, seed, duration_s=duration_s * top)

        def holds(rate: float, d: Draw = d) -> bool:
            arrive = d.arrive / rate
            n = int(np.searchsorted(arrive, duration_s))
            lat = latencies(arrive[:n], d.n_in[:n], d.n_out[:n], q)
            win = arrive[:n] >= warmup_s
            for tier, ss in slos.items():
                mask = win & (d.tier[:n] == tier)
                for s in ss:
                    v = lat[s.metric][mask]
                    v = v[~np.isnan(v)]
                    if v.size and quantile(v, s.quantile) > s.threshold_ms:
                        return False
            return True

        lo, hi = truth_rps / 8.0, top
        if not holds(lo):
            out.append(0.0)
            continue
        if holds(hi):
            out.append(hi)
            continue
        while hi - lo > rel_tol * lo:
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if holds(mid) else (lo, mid)
        out.append(lo)
    return np.asarray(out)


class SimulatedSteps:
    """Capacity-search steps computed, not measured: the mock's queue fed one arrival draw from empty for
    the scenario's ``step_duration_s``, the requests scheduled in its first ``warmup_s`` not judged, judged
    on the scenario's first SLO, runs of exceedances counted as a step counts them (``decluster_run``).
    What it leaves out of a real step: early stopping, the adaptive warm-up, the client. Its arrivals are
    counted as a real step's are (``CapacitySettings.count_marks``: exact counts, ``search.window_counts``).
    ``prefix_s`` > 0
    feeds the queue that many seconds of the same load before the step (a window from the queue's steady
    state instead of an idle one: what an idle start costs the rating, ``bench/rating_simulation.py``)."""

    def __init__(self, scn: Scenario, q: QueueParams, prefix_s: float = 0.0):
        check_scenario(scn)
        settings = CapacitySettings.from_scenario(scn)
        step = settings.step
        self.scn, self.q, self.prefix_s = scn, q, prefix_s
        self.marks = tuple(prefix_s + m for m in settings.count_marks)  # the prefix's own count is exact too
        self.duration_s, self.warmup_s, self.decluster_run = step.step_duration_s, step.warmup_s, step.decluster_run
        slo = next(s for ss in scn.slos().values() for s in ss)
        self.threshold, self.quantile = slo.threshold_ms, slo.quantile
        self.tier = next(t for t, ss in scn.slos().items() if ss)

    def ttfts(self, seed: int, rate: float) -> tuple[np.ndarray, float]:
        """The judged requests' TTFTs (ms) of draw ``seed`` at ``rate``, and the rate they were planned at."""
        end = self.prefix_s + self.duration_s
        if self.marks:  # counts fixed at rate x mark: drawn at the rate itself (such a pattern does not scale)
            d = draw(self.scn, seed, duration_s=end, rate=rate, exact_at=self.marks)
            a = d.arrive
        else:
            d = draw(self.scn, seed, duration_s=end * rate + 50)
            a = d.arrive / rate
        n = int(np.searchsorted(a, end))
        v = latencies(a[:n], d.n_in[:n], d.n_out[:n], self.q)["ttft_ms"]
        judged = a[:n] >= self.prefix_s + self.warmup_s
        return v[judged], judged.sum() / (self.duration_s - self.warmup_s)

    def step(self, index: int, load: float, seed: int) -> tuple[dict, StepResult]:
        """A summary step's entry (what ``capacity.rating`` reads) and the search's result for it."""
        v, planned = self.ttfts(seed, load)
        q = quantile(v, self.quantile)
        judged = {"n": int(v.size), "over": int((v > self.threshold).sum()), "value_ms_q": q,
                  "threshold_ms": self.threshold, "runs": clusters(v > self.threshold, self.decluster_run)}
        entry = {"index": index, "load": load, "planned_rps": float(planned),
                 "tiers": {self.tier: {"quantile": self.quantile, "judged": {"ttft_ms": judged}}}}
        return entry, StepResult(passed=q <= self.threshold, margin=q / self.threshold)

    def search(self, seed: int, cfg: SearchConfig | None = None) -> tuple[list[dict], float | None]:
        """The real search (``CapacitySearch`` with ``cfg``, default the scenario's ``search``) on these
        steps, its refine windows aimed at the rating's estimate as ``capacity.run`` aims them: the steps in
        a summary's form and the rated rate (the deciding passing steps' planned rate, as ``rate_rps``; None
        when none passed). Step draw d of ``seed`` is 1,000,003 (seed + 1) + d."""
        steps: list[dict] = []

        def measure(load: float, phase: str, d: int) -> StepResult:
            entry, res = self.step(len(steps), load, 1_000_003 * (seed + 1) + d)
            steps.append(entry)
            return res

        out = CapacitySearch(cfg or self.scn.search, refine_centre=lambda _s: rating.estimate(steps)).run(
            measure, draws=True)
        passed = [s["planned_rps"] for s in steps if s["load"] == out.rated_load]
        return steps, float(np.mean(passed)) if passed else None
