"""``slobench capacity``: ramp the load until an SLO breaks, bisect, report the rated capacity.

The search itself is pure (``capacity.search``); ``capacity.step.CapacityRunner`` measures one load step
against a target; this module runs the whole search and writes the run folder.

- Each step's arrival pattern is the draw the search asks for (``CapacitySearch.next_draw``: a fresh one
  per step by default, ``search.arrivals: common`` for one draw scaled to every step); prompts differ
  (fresh seed per step), so one step's prefix cache never serves the next (``scenario.steps.step_specs``).
- A step whose load generator fell behind (its detail's ``disturbed``, or client p99 lateness over the
  bound) is handed to the search as disturbed: it is measured again instead of deciding.
- The rated capacity is the *offered* rate of the deciding passing steps (``rate_rps``; the load asked
  for is ``requested_rps``), with the estimate, interval, boundary and binding SLO of ``capacity.rating``
  over every counted step (computed once, at the end). ``headline`` and ``verdict_text`` say that offered
  rate (``capacity.headline``); ``search_text`` is the search's account in its requested loads.
- The run's time budget (``search.max_duration_s``, off by default): no step starts that would end past it
  (``over_budget``); the search ends with what it measured, ``summary.json["ended_by"]`` says why.
- ``summary.json`` and ``steps.csv`` (``capacity.steps_csv``) are rewritten after every step, each
  atomically: Ctrl-C or a dying target leaves everything measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.capacity import rating
from loadgen.capacity.cause import break_cause
from loadgen.capacity.headline import headline, interval_span, verdict_text
from loadgen.capacity.search import CapacitySearch
from loadgen.capacity.search_steps import SearchOutcome, Step, StepResult
from loadgen.capacity.settings import CapacitySettings
from loadgen.capacity.step import CapacityRunner
from loadgen.capacity.steps_csv import write_steps_csv
from loadgen.drivers.event_loop import add_stop_handlers, remove_stop_handlers, run_sync
from loadgen.results.latency import percentile
from loadgen.results.prefix_cache import prefix_cache_check
from loadgen.results.rundir import (
    CONFIG,
    METRICS,
    SCHEMA_VERSION,
    read_metrics,
    read_run_records,
    write_json,
    write_summary,
)
from loadgen.results.runmeta import now_iso, run_metadata
from loadgen.results.summary import prompt_length_of
from loadgen.scenario.model import Scenario
from loadgen.scenario.steps import step_specs
from loadgen.target.prepare import TargetOptions, prepare_target

# ------------------------------------------------------------------ the run


@dataclass
class CapacityResult:
    run_dir: Path
    summary: dict[str, Any]
    stopped: str | None


def offered_rate(details: list[dict[str, Any]]) -> float | None:
    """The rate the steps actually offered: their offered rates pooled over their windows' lengths (the
    window's requests / its length where a step has no ``offered_rps``)."""
    num = den = 0.0
    for d in details:
        w = d.get("window_s")
        span = (w[1] - w[0]) if isinstance(w, (list, tuple)) and len(w) == 2 else None
        rate = d.get("offered_rps")
        if rate is None and span and d.get("requests") is not None:
            rate = d["requests"] / span
        if rate is None:
            continue
        weight = span if span and span > 0 else 1.0
        num += rate * weight
        den += weight
    return num / den if den > 0 else None


def rated_capacity(outcome: SearchOutcome, settings: CapacitySettings,
                   interval: dict[str, Any] | None = None) -> dict[str, Any] | None:
    if outcome.rated_load is None:
        return None
    deciding = set(outcome.deciding)
    steps = [s for s in outcome.steps if s.passed and s.load == outcome.rated_load and s.counted
             and s.phase != "refine"]  # refine windows feed the interval only
    steps = [s for s in steps if s.index in deciding] or steps
    if not steps:
        return None
    details = [s.result.detail for s in steps]
    d = details[-1]
    if settings.closed:
        tps = [x["throughput_rps"] for x in details if x.get("throughput_rps") is not None]
        rate = sum(tps) / len(tps) if tps else None
        requested = None
        conc = float(outcome.rated_load)
    else:
        requested = float(outcome.rated_load)
        rate = offered_rate(details)
        if rate is None:
            rate = requested
        conc = d.get("concurrency_measured")
    spec = rate * (1.0 - settings.headroom) if rate is not None else None
    # how long the deciding windows were: near a wide knee a longer window fails at a lower load, so a
    # rating holds for windows of this length (docs/validation.md, "Capacity search: the embedded engine")
    spans = [w[1] - w[0] for x in details if isinstance(w := x.get("window_s"), (list, tuple)) and len(w) == 2]
    out = {
        "rate_rps": rate, "requested_rps": requested, "window_s": percentile(spans, 50),
        "concurrency": conc,
        "concurrency_littles_law": d.get("concurrency_littles_law"),
        "concurrency_measured": d.get("concurrency_measured"),
        "concurrency_agree": d.get("concurrency_agree"),
        "output_tok_s": d.get("output_tok_s"), "spec_rate_rps": spec,
        "spec_concurrency": conc * (1.0 - settings.headroom) if conc is not None else None,
        "goodput_rps": d.get("goodput_rps"), "step": d.get("index"), "steps": [s.index for s in steps],
        "load": outcome.rated_load, "axis": settings.search.axis,
        "lower_bound": outcome.search_verdict == "never_broke",
        "confirmed": outcome.confirmed,
        "estimate": None, "ci_low": None, "ci_high": None, "ci_unbounded": [], "ci_of": None, "confidence": None,
        "boundary": None, "binding": None, "tier_capacity": {},
        "cause": break_cause(d, first_failure(outcome), None, settings.lateness_bound_ms),
    }
    if interval is not None:
        out.update(estimate=interval["estimate"], ci_low=interval["ci_low"], ci_high=interval["ci_high"],
                   ci_unbounded=interval.get("ci_unbounded", []),
                   ci_of=interval["of"], confidence=interval["confidence"], boundary=interval["boundary"],
                   binding=interval["binding"], interval=interval, tier_capacity=tier_capacity(interval))
        out["cause"] = break_cause(d, first_failure(outcome), (interval.get("binding") or {}).get("metric"),
                                   settings.lateness_bound_ms)
        if interval.get("open"):  # no crossing inside the loads tried: no interval to gate on
            out.update(ci_low=None, ci_high=None, ci_unbounded=[])
    return out


def first_failure(outcome: SearchOutcome) -> dict[str, Any] | None:
    """The detail of the lowest counted step above the rated load that failed: where the SLO broke."""
    above = [s for s in outcome.steps if s.counted and not s.passed and s.load > outcome.rated_load
             and s.phase != "refine"]
    return min(above, key=lambda s: (s.load, s.index)).result.detail if above else None


def tier_capacity(interval: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each tier's own rated load at the scenario's mix: the lowest crossing over its SLOs (on the rating's
    axis), with ``open`` ``above`` where its SLOs held at every load tried (its capacity is at least that)."""
    out: dict[str, dict[str, Any]] = {}
    for c in interval.get("crossings") or []:
        best = out.get(c["tier"])
        if best is None or c["load"] < best["load"]:
            out[c["tier"]] = {"load": c["load"], "open": c.get("open"), "metric": c["metric"]}
    return out


def step_entry(s: Step) -> dict[str, Any]:
    """A step's entry in ``summary.json["steps"]``: its detail and what the search made of it."""
    return s.result.detail | {"phase": s.phase, "index": s.index, "load": s.load, "draw": s.draw,
                              "attempt": s.attempt, "remeasured_of": s.remeasured_of, "counted": s.counted,
                              "confirms": s.confirms, "disturbance": s.disturbed}


def build_summary(settings: CapacitySettings, outcome: SearchOutcome, *, meta: dict[str, Any], duration_s: float,
                  complete: bool, stopped: str | None, interval: dict[str, Any] | None = None) -> dict[str, Any]:
    steps = [step_entry(s) for s in outcome.steps]
    rated = rated_capacity(outcome, settings, interval)
    # the headline (the offered rate) first, then the search's account in its requested loads
    text, search_text = verdict_text(outcome.text, rated, outcome.search_verdict, settings.search.axis)
    if rated is not None:
        if rated["ci_low"] is not None:
            of = "users" if rated["ci_of"] == "concurrency" else "req/s"
            text += (f". {100 * rated['confidence']:g}% interval of the capacity: {interval_span(rated)} "
                     f"{of} (estimate {rated['estimate']:.3g}; {rated['boundary'] or '-'} "
                     f"boundary; binding: {rated['binding']['tier']} {rated['binding']['metric']})")
        text += (f". Spec capacity with {100 * settings.headroom:g}% headroom: {rated['spec_rate_rps']:.3g} req/s"
                 if rated["spec_rate_rps"] is not None else "")
        if rated.get("concurrency_agree") is not None:
            text += (f". Concurrency there: {_f(rated['concurrency_measured'])} measured in flight, "
                     f"{_f(rated['concurrency_littles_law'])} by Little's law ("
                     + ("they agree" if rated["concurrency_agree"] else "they DISAGREE: check the client") + ")")
    if not complete:
        text = f"INCOMPLETE ({stopped}): " + text
        search_text = f"INCOMPLETE ({stopped}): " + search_text
    late = [(st.get("summary") or {}).get("client_lateness") or {} for st in steps]
    p99s = [x.get("p99_ms") for x in late if x.get("p99_ms") is not None]
    invalid = [st["index"] for st in steps if not st.get("valid", True)]
    disturbed = [st["index"] for st in steps if st.get("disturbance")]
    s: dict[str, Any] = {
        **meta,
        "duration_s": round(duration_s, 3),
        "verdict": outcome.verdict, "search_verdict": outcome.search_verdict,
        "headline": headline(rated, outcome.search_verdict, settings.search.axis), "verdict_text": text,
        "search_text": search_text,
        "converged": outcome.converged, "confirmed": outcome.confirmed, "reopens": outcome.reopens,
        "ended_by": outcome.ended_by,
        "complete": complete, "interrupted": bool(stopped and stopped.startswith("interrupted")),
        "stopped_early": stopped,
        "axis": settings.search.axis,
        "slo": {t: (ss[0].as_dict() if ss else None) for t, ss in settings.slos.items()},
        "slos": {t: [x.as_dict() for x in ss] for t, ss in settings.slos.items()},
        "headroom": settings.headroom,
        "rated_capacity": rated,
        "first_fail_load": outcome.first_fail_load,
        "search": (dataclasses.asdict(settings.search) | dataclasses.asdict(settings.step)
                   | {"drain_s": settings.drain_s}),
        "steps": steps,
        "valid": bool(steps) and outcome.invalid_reason is None,
        "lateness": {"p99_ms_max": max(p99s) if p99s else None, "bound_ms": settings.lateness_bound_ms,
                     "invalid_steps": invalid, "disturbed_steps": disturbed, "deciding_steps": outcome.deciding},
    }
    if outcome.invalid_reason:
        s["invalid_reason"] = outcome.invalid_reason + ": the load generator could not keep the schedule"
    elif not steps:
        s["invalid_reason"] = "no step was measured"
    return s


def write_outputs(run_dir: Path, summary: dict[str, Any]) -> None:
    """``summary.json`` and ``steps.csv`` beside it, each written atomically."""
    write_summary(run_dir, summary)
    write_steps_csv(run_dir, summary)


def deciding_steps(outcome: SearchOutcome) -> list[int]:
    """The steps the verdict rests on (``SearchOutcome.deciding``): the measurements that agree with the
    pass and the fail end (rated), the highest pass (never_broke), every counted step (never_met). A
    late client elsewhere does not change it."""
    return list(outcome.deciding)


def disturbance(detail: dict[str, Any], bound_ms: float) -> str | None:
    """Why a step's measurement cannot be trusted: its detail's ``disturbance`` (the load generator fell
    behind), else a client p99 lateness over the bound (the step's summary is not ``valid``)."""
    if detail.get("disturbed"):
        return str(detail.get("disturbance") or "the load generator fell behind")
    if detail.get("valid") is False:
        p99 = ((detail.get("summary") or {}).get("client_lateness") or {}).get("p99_ms")
        return (f"client p99 lateness {p99:.1f} ms over the {bound_ms:g} ms bound" if p99 is not None
                else "the step's summary is not valid (client lateness)")
    return None


async def measure_step(runner: CapacityRunner, load: float, phase: str, index: int, draw: int) -> StepResult:
    """One step through the runner, on arrival draw ``draw``, its disturbance filled in."""
    res = await runner.measure(load, phase, index, draw=draw)
    if not res.disturbed:
        res.disturbed = disturbance(res.detail, runner.settings.lateness_bound_ms)
    return res


def over_budget(settings: CapacitySettings, elapsed_s: float, full_step_walls: list[float]) -> str | None:
    """Why the next step must not start (None: it may): it would end past the run's time budget,
    ``search.max_duration_s``, counted from the run's start (the engine's start-up included). The next step
    is taken to last as long as the longest step so far that ran to its cap (its settle, warm-up, window and
    drain: ``full_step_walls``), at least ``step_duration_s``; steps stopped early are not a guide."""
    budget = settings.search.max_duration_s
    if budget is None:
        return None
    need = max([settings.step.step_duration_s, *full_step_walls])
    if elapsed_s + need <= budget:
        return None
    return (f"the time budget ended the search (search.max_duration_s {budget:g} s: {elapsed_s:.0f} s in, "
            f"the next step would take about {need:.0f} s)")


def rate_interval(settings: CapacitySettings, summary: dict[str, Any]) -> dict[str, Any] | None:
    """``capacity.rating`` over the summary's counted steps; None without a verdict to put an interval on
    (never_met, or nothing judged)."""
    if summary.get("search_verdict") not in ("rated", "never_broke"):
        return None
    steps = summary["steps"]
    return rating.rate(steps, settings.search.axis, confidence=settings.step.confidence, seed=settings.scenario.seed)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def run_capacity(scn: Scenario, run_dir: str | Path, *, target: str | None = None,
                 engine_opts: dict[str, Any] | None = None, model: str | None = None, progress: bool = True,
                 scenario_path: str | None = None, log: Callable[[str], None] | None = None,
                 driver: str = "aiohttp", workers: int = 1,
                 target_options: TargetOptions | None = None) -> CapacityResult:
    """The whole capacity run: start the embedded engine when there is no target, probe it and fit the
    requests to it, search, write the run folder. Raises EngineStartError / TargetError / ProbeError for
    a target that cannot be used at all, TargetFitError / TokenizerError for what it cannot be asked."""
    from loadgen.capacity.display import CapacityDisplay
    from loadgen.target.embedded import EmbeddedEngine

    settings = CapacitySettings.from_scenario(scn)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started_at = now_iso()
    wall0 = time.monotonic()
    engine = None
    log = log or (lambda _m: None)
    engine_opts = engine_opts if engine_opts is not None else scn.engine_options()
    try:
        if not target:
            engine = EmbeddedEngine(engine_opts, log_path=run_dir / "engine.log")
            log(f"starting the reference engine on {engine.url} ...")
            t_eng = time.monotonic()
            target = engine.start()
            engine_start_s = time.monotonic() - t_eng
        else:
            engine_start_s = None
        meta = run_metadata("capacity", run_dir.name, scenario={"name": scn.name, "path": scenario_path or scn.source},
                            target=None if engine else target, started_at=started_at)
        meta["target"] = target if not engine else f"embedded reference engine ({target})"
        meta["engine"] = engine_opts if engine else None
        meta["engine_start_s"] = engine_start_s
        meta["driver"] = driver
        meta["workers"] = workers
        sample = step_specs(scn, settings.search.axis, settings.search.start, 0, 0.0, settings.step.step_duration_s)
        prepared = prepare_target(target, model, sample, target_options or TargetOptions())
        meta.update(prepared.as_summary())
        unit = "users" if settings.closed else "req/s"
        display = CapacityDisplay(f"slobench capacity: {scn.name}", unit, list(settings.slos), enabled=progress)
        try:
            result = run_sync(lambda: _search_main(settings, run_dir, target, prepared, engine, display, meta, wall0,
                                                   driver, workers))
        finally:
            display.close()
    finally:
        if engine:
            engine.stop()
    return result


async def _search_main(settings, run_dir, target, prepared, engine, display, meta, wall0, driver="aiohttp",
                       workers=1) -> CapacityResult:
    runner = CapacityRunner(settings, run_dir, target, prepared=prepared, watch=engine.died if engine else None,
                            display=display, driver=driver, workers=workers)
    loop = asyncio.get_running_loop()
    await runner.open()
    meta["model"] = runner.model
    write_json(run_dir / CONFIG,
               {"schema_version": SCHEMA_VERSION, "kind": "capacity", "scenario": meta.get("scenario"),
                "target": target, "model": runner.model, "engine": meta.get("engine"),
                "search": dataclasses.asdict(settings.search), "step": dataclasses.asdict(settings.step),
                "request_fit": meta.get("request_fit")})
    stop_handlers = add_stop_handlers(loop, runner.stop)
    search = CapacitySearch(settings.search, refine_centre=lambda steps: rating.estimate(
        [step_entry(s) for s in steps], settings.search.axis))  # refine windows go to the estimate so far
    full_walls: list[float] = []  # steps that ran to their cap: what the next one may take (the time budget)
    try:
        while runner.stopped is None and (nxt := search.next_step()) is not None:
            if why := over_budget(settings, time.monotonic() - wall0, full_walls):
                search.end(why)
                break
            load, phase = nxt
            t_step = time.monotonic()
            res = await measure_step(runner, load, phase, len(search.steps), search.next_draw)
            if not res.stopped_early:
                full_walls.append(time.monotonic() - t_step)
            if runner.stopped:  # a step cut by Ctrl-C or a dead target says nothing about the load
                display.status(f"step {len(search.steps)} cut short: {runner.stopped}")
                break
            step: Step = search.record(load, res)
            display.end_step(step_entry(step))
            write_outputs(run_dir, build_summary(settings, search.outcome(), meta=meta,
                                                 duration_s=time.monotonic() - wall0, complete=False,
                                                 stopped="in progress"))
    finally:
        remove_stop_handlers(loop, stop_handlers)
        await runner.close()
    outcome = search.outcome()
    summary = build_summary(settings, outcome, meta=meta, duration_s=time.monotonic() - wall0,
                            complete=runner.stopped is None, stopped=runner.stopped)
    records = read_run_records(run_dir)
    interval = rate_interval(settings, summary)
    if interval is not None:
        summary = build_summary(settings, outcome, meta=meta, duration_s=time.monotonic() - wall0,
                                complete=runner.stopped is None, stopped=runner.stopped, interval=interval)
    summary["prompt_length"] = prompt_length_of(records)  # over every step's requests
    summary["prefix_cache"] = prefix_cache_check(records, read_metrics(Path(run_dir) / METRICS), runner.sharing.share)
    write_outputs(run_dir, summary)
    return CapacityResult(run_dir, summary, runner.stopped)
