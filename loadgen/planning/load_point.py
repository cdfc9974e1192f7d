"""The calibration's load points: the scenario's own requests sent open loop at a rate, then simulated on
the same arrivals, and the probe's step-time model scaled until the two agree.

Why: the probe's points are clean steps (a fixed batch decoding, one prompt prefilling alone). A served
engine under the scenario's load runs mixed steps (prefill chunks of every length beside the decodes,
arrivals, admission, a front end on the same machine), and each of those can cost more than the clean
steps say (on the reference engine the factors that fit were 1.1-1.26, ``bench/results/plan.json``), which
near the knee becomes a larger error in the rated capacity (longer steps, a bigger batch, longer steps
again).

The points, one after the other: each at its ``fracs`` share of the rated capacity that the model as the
point before left it predicts (a quick simulation; the first: the probe's fit), for ``duration_s``, with the
scenario's arrival process, lengths, tiers and shared prefixes. Two by default: the first at 0.6, below
the knee unless the probe's fit overestimates the capacity by more than 1 / 0.6; the second at 0.85 of the
corrected prediction, near the knee, where the capacity is decided. The last point's factor is the
calibration's. Compared: each answered request's service time (first scheduled to last token: the
server's own prefill + decode timing where the records carry it, else the client's end-to-end latency,
and the simulation's matching figure), mean over the requests both answered. The simulation is run on
exactly the requests sent (their arrival times, prompt and answer lengths, prefixes), from an idle engine
as the target started, so the two see the same transient. The factor that equates the means (bisection:
the simulated mean rises with it) multiplies every coefficient of the model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from loadgen.drivers.event_loop import run_sync
from loadgen.drivers.factory import make_driver
from loadgen.drivers.http_request import ClientConfig
from loadgen.planning.predict import Predictor
from loadgen.planning.requests import Requests, draw, requests_of
from loadgen.planning.simulate import EngineShape, simulate
from loadgen.planning.step_model import LinearStep
from loadgen.results import latency
from loadgen.results.records import RecordWriter, read_records
from loadgen.results.slo import SLO
from loadgen.scenario.model import Scenario
from loadgen.scenario.steps import step_specs
from loadgen.target.prepare import TargetOptions, prepare_target
from loadgen.workload.specs import RequestSpec

FACTOR_BOUNDS = (0.25, 4.0)
QUICK_REQUESTS = 3000  # the rate-finding simulation's: a guide, not the prediction


@dataclass(frozen=True)
class LoadPointPlan:
    fracs: tuple[float, ...] = (0.6, 0.85)  # each of the rated capacity the model so far predicts
    duration_s: float = 20.0

    def __post_init__(self) -> None:
        if not self.fracs or not all(0 < f <= 1.5 for f in self.fracs) or self.duration_s < 2:
            raise ValueError("load points need shares in (0, 1.5] and a duration of at least 2 s")


@dataclass
class LoadPoint:
    frac: float
    rate: float  # req/s sent (requested)
    duration_s: float
    sent: int
    compared: int  # answered by both the target and the simulation
    guide_rps: float  # the quick prediction the rate was set from (the model as the point before left it)
    measured_ms: float  # mean service time of the ``compared`` requests
    simulated_probe_ms: float  # the simulation's, with the probe's fit (the same requests at factor 1)
    factor: float  # of the probe's fit
    simulated_ms: float  # the simulation's, with the fit scaled by ``factor``
    source: str  # "server timing" | "client timing"
    wall_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def scaled(model: LinearStep, factor: float) -> LinearStep:
    return replace(model, const_s=model.const_s * factor, per_seq_s=model.per_seq_s * factor,
                   per_token_s=model.per_token_s * factor, per_pair_s=model.per_pair_s * factor)


def quick_rated(scn: Scenario, eng: EngineShape, model: LinearStep, slos: dict[str, list[SLO]]) -> float | None:
    """The rated capacity ``model`` predicts on one small draw (where to put the load point)."""
    pred = Predictor([draw(scn, scn.seed * 7919 + 1, QUICK_REQUESTS)], eng, model, slos)
    one = float(model.step_s(1, 1, 1, 1))
    return pred.rated_capacity(max(0.05 / max(one, 1e-6), 0.1), rel_tol=0.03)


async def send_open_loop(cfg: ClientConfig, specs: list[RequestSpec], path: Path) -> None:
    """Send ``specs`` open loop (one aiohttp driver, warmed up), their records to ``path``."""
    with RecordWriter(path) as writer:
        driver = make_driver("aiohttp", cfg, writer)
        try:
            await driver.open()
            await driver.warm_up(min(64, max(1, len(specs) // 10)))
            await driver.run(specs, stage=0)
        finally:
            await driver.close()


def service_s(records: list[dict], ids: list[str]) -> tuple[np.ndarray, str]:
    """Each spec's measured service time (nan: not answered), and where it came from."""
    by_id = {r["id"]: r for r in records if r.get("status") == "ok"}
    server = bool(by_id) and all((by_id[i].get("server") or {}).get("decode_ms") is not None
                                 for i in ids if i in by_id)
    out = np.full(len(ids), np.nan)
    for k, i in enumerate(ids):
        r = by_id.get(i)
        if r is None:
            continue
        if server:
            out[k] = (r["server"]["prefill_ms"] + r["server"]["decode_ms"]) / 1e3
        elif (e2e := latency.e2el_ms(r)) is not None:
            out[k] = e2e / 1e3
    return out, "server timing" if server else "client timing"


def simulated_s(reqs: Requests, eng: EngineShape, model: LinearStep, server: bool) -> np.ndarray:
    res = simulate(reqs, 1.0, eng, model)
    begin = res.start_s if server else res.arrive
    return np.where(res.rejected, np.nan, res.done_s - begin)


def fit_factor(reqs: Requests, measured: np.ndarray, eng: EngineShape, model: LinearStep,
               server: bool) -> tuple[float, float, float, float, int]:
    """(factor, simulated mean at factor 1, simulated mean at the factor, measured mean, requests compared),
    the means over the requests both answered. The factor is clamped to ``FACTOR_BOUNDS``."""
    def means_at(f: float) -> tuple[float, float, int]:
        """(simulated, measured) means over the requests both answered, and how many."""
        sim = simulated_s(reqs, eng, scaled(model, f), server)
        both = ~np.isnan(sim) & ~np.isnan(measured)
        if not both.any():
            return math.nan, math.nan, 0
        return float(np.mean(sim[both])), float(np.mean(measured[both])), int(both.sum())

    def short(f: float) -> bool:  # the simulation is faster than the target at factor f
        sim, meas, _ = means_at(f)
        return sim < meas

    at_one = means_at(1.0)[0]
    lo, hi = FACTOR_BOUNDS
    if not short(lo):
        f = lo
    elif short(hi):
        f = hi
    else:
        while hi / lo > 1.005:
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if short(mid) else (lo, mid)
        f = math.sqrt(lo * hi)
    sim, meas, n = means_at(f)
    return f, at_one, sim, meas, n


def run_load_points(target: str, scn: Scenario, eng: EngineShape, model: LinearStep,
                    slos: dict[str, list[SLO]], plan: LoadPointPlan, work_dir: Path,
                    model_name: str | None = None,
                    on_start: Callable[[int, float, int], None] | None = None) -> list[LoadPoint]:
    """Each of the plan's points in turn; every factor is of ``model`` (the probe's fit). ``on_start(index,
    rate, requests)`` is called as each point starts sending (progress)."""
    points: list[LoadPoint] = []
    for k, frac in enumerate(plan.fracs):
        factor = points[-1].factor if points else 1.0
        points.append(run_load_point(target, scn, eng, model, factor, slos, frac, plan, k, work_dir, model_name,
                                     on_start))
    return points


def run_load_point(target: str, scn: Scenario, eng: EngineShape, model: LinearStep, factor: float,
                   slos: dict[str, list[SLO]], frac: float, plan: LoadPointPlan, index: int, work_dir: Path,
                   model_name: str | None = None,
                   on_start: Callable[[int, float, int], None] | None = None) -> LoadPoint:
    t0 = time.monotonic()
    guide = quick_rated(scn, eng, scaled(model, factor), slos)
    if not guide:
        raise ValueError("the step model predicts no load that keeps the SLOs: no load point to measure")
    rate = frac * guide
    # the scenario's requests as a capacity step builds them, on a fresh arrival draw per point
    specs = step_specs(scn, "rate", rate, index, 0.0, plan.duration_s, draw=index + 1)
    if len(specs) < 20:
        raise ValueError(f"the load point at {rate:.3g} req/s for {plan.duration_s:g} s has {len(specs)} requests: "
                         f"too few (lengthen it)")
    reqs = requests_of(specs)
    prepared = prepare_target(target, model_name, specs, TargetOptions())
    prepared.adapt(specs)
    cfg = ClientConfig(target, model=prepared.model, shape=prepared.shape)
    path = Path(work_dir) / f"load-point-{index}-requests.jsonl"
    path.unlink(missing_ok=True)
    if on_start is not None:
        on_start(index, rate, len(specs))
    run_sync(lambda: send_open_loop(cfg, specs, path))
    measured, source = service_s(list(read_records(path)), [s.id for s in specs])
    if np.count_nonzero(~np.isnan(measured)) < 10:
        raise ValueError(f"the load point at {rate:.3g} req/s got fewer than 10 answers")
    fitted, at_one, at_f, meas, n = fit_factor(reqs, measured, eng, model, source == "server timing")
    return LoadPoint(frac=frac, rate=rate, duration_s=plan.duration_s, sent=len(specs), compared=n, guide_rps=guide,
                     measured_ms=meas * 1e3, simulated_probe_ms=at_one * 1e3, factor=fitted,
                     simulated_ms=at_f * 1e3, source=source, wall_s=time.monotonic() - t0)
