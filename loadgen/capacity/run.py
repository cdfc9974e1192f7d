"""``slobench capacity``: ramp the load until an SLO breaks, bisect, report the rated capacity.

The search itself is pure (``loadgen.search``); ``capacity_step.CapacityRunner`` measures one load step
against a target; this module runs the whole search and writes the run folder.

- Steps use common random numbers: the arrival pattern of every step is the same seeded draw scaled to
  its rate, so steps differ by load, not by luck; prompts differ (fresh seed per step), so one step's
  prefix cache never serves the next (``capacity_plan.step_specs``).
- ``summary.json`` is rewritten after every step: Ctrl-C or a dying target leaves everything measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.capacity.plan import CapacityPlan
from loadgen.capacity.search import CapacitySearch, SearchOutcome, Step
from loadgen.capacity.step import CapacityRunner
from loadgen.drivers.event_loop import run_sync
from loadgen.results.prefix_cache import prefix_cache_check
from loadgen.results.rundir import METRICS, read_metrics, read_run_records, write_summary
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


def rated_capacity(outcome: SearchOutcome, plan: CapacityPlan) -> dict[str, Any] | None:
    if outcome.rated_load is None:
        return None
    steps = [s for s in outcome.steps if s.passed and s.load == outcome.rated_load]
    if not steps:
        return None
    d = steps[-1].result.detail
    if plan.closed:
        rate = d.get("throughput_rps")
        conc = float(outcome.rated_load)
    else:
        rate = float(outcome.rated_load)
        conc = d.get("concurrency_measured")
    spec = rate * (1.0 - plan.headroom) if rate is not None else None
    return {
        "rate_rps": rate, "concurrency": conc,
        "concurrency_littles_law": d.get("concurrency_littles_law"),
        "concurrency_measured": d.get("concurrency_measured"),
        "concurrency_agree": d.get("concurrency_agree"),
        "output_tok_s": d.get("output_tok_s"), "spec_rate_rps": spec,
        "spec_concurrency": conc * (1.0 - plan.headroom) if conc is not None else None,
        "goodput_rps": d.get("goodput_rps"), "step": d.get("index"), "load": outcome.rated_load,
        "axis": plan.search.axis, "lower_bound": outcome.verdict == "never_broke",
    }


def build_summary(plan: CapacityPlan, outcome: SearchOutcome, *, meta: dict[str, Any], duration_s: float,
                  complete: bool, stopped: str | None) -> dict[str, Any]:
    steps = [s.result.detail | {"phase": s.phase, "index": s.index, "load": s.load} for s in outcome.steps]
    rated = rated_capacity(outcome, plan)
    text = outcome.text
    if rated is not None:
        text += (f". Spec capacity with {100 * plan.headroom:g}% headroom: {rated['spec_rate_rps']:.3g} req/s"
                 if rated["spec_rate_rps"] is not None else "")
        if rated.get("concurrency_agree") is not None:
            text += (f". Concurrency there: {_f(rated['concurrency_measured'])} measured in flight, "
                     f"{_f(rated['concurrency_littles_law'])} by Little's law ("
                     + ("they agree" if rated["concurrency_agree"] else "they DISAGREE: check the client") + ")")
    if not complete:
        text = f"INCOMPLETE ({stopped}): " + text
    late = [st["summary"].get("client_lateness", {}) for st in steps]
    p99s = [x.get("p99_ms") for x in late if x.get("p99_ms") is not None]
    invalid = [st["index"] for st in steps if not st.get("valid")]
    deciding = deciding_steps(outcome)
    bad = [i for i in invalid if i in deciding]
    s: dict[str, Any] = {
        **meta,
        "duration_s": round(duration_s, 3),
        "verdict": outcome.verdict, "verdict_text": text, "converged": outcome.converged,
        "complete": complete, "interrupted": bool(stopped and stopped.startswith("interrupted")),
        "stopped_early": stopped,
        "axis": plan.search.axis,
        "slo": {t: (ss[0].as_dict() if ss else None) for t, ss in plan.slos.items()},
        "slos": {t: [x.as_dict() for x in ss] for t, ss in plan.slos.items()},
        "headroom": plan.headroom,
        "rated_capacity": rated,
        "first_fail_load": outcome.first_fail_load,
        "search": dataclasses.asdict(plan.search) | dataclasses.asdict(plan.step) | {"drain_s": plan.drain_s},
        "steps": steps,
        "valid": bool(steps) and not bad,
        "lateness": {"p99_ms_max": max(p99s) if p99s else None, "bound_ms": plan.lateness_bound_ms,
                     "invalid_steps": invalid, "deciding_steps": deciding},
    }
    if bad:
        s["invalid_reason"] = (f"client p99 lateness over {plan.lateness_bound_ms:g} ms in step(s) "
                               f"{', '.join(map(str, bad))}, which decide the verdict: the load generator could not "
                               "keep the schedule")
    elif not steps:
        s["invalid_reason"] = "no step was measured"
    return s


def deciding_steps(outcome: SearchOutcome) -> list[int]:
    """The steps the verdict rests on: the rated step and the first failure above it (rated), the
    highest pass (never_broke), every step (never_met). A late client elsewhere does not change it."""
    if outcome.verdict == "never_met":
        return [s.index for s in outcome.steps]
    keep = []
    for load, want in ((outcome.rated_load, True), (outcome.first_fail_load, False)):
        hits = [s.index for s in outcome.steps if s.load == load and s.passed == want]
        keep += hits[-1:]
    return keep


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

    plan = CapacityPlan.from_scenario(scn)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started_at = now_iso()
    wall0 = time.monotonic()
    engine = None
    log = log or (lambda _m: None)
    try:
        if not target:
            engine = EmbeddedEngine(engine_opts if engine_opts is not None else scn.engine,
                                    log_path=run_dir / "engine.log")
            log(f"starting the reference engine on {engine.url} ...")
            t_eng = time.monotonic()
            target = engine.start()
            engine_start_s = time.monotonic() - t_eng
        else:
            engine_start_s = None
        meta = run_metadata("capacity", run_dir.name, scenario={"name": scn.name, "path": scenario_path or scn.source},
                            target=None if engine else target, started_at=started_at)
        meta["target"] = target if not engine else f"embedded reference engine ({target})"
        meta["engine"] = (engine_opts if engine_opts is not None else scn.engine) if engine else None
        meta["engine_start_s"] = engine_start_s
        meta["driver"] = driver
        meta["workers"] = workers
        sample = step_specs(scn, plan.search.axis, plan.search.start, 0, 0.0, plan.step.step_duration_s)
        prepared = prepare_target(target, model, sample, target_options or TargetOptions())
        meta.update(prepared.as_summary())
        unit = "users" if plan.closed else "req/s"
        display = CapacityDisplay(f"slobench capacity: {scn.name}", unit, list(plan.slos), enabled=progress)
        try:
            result = run_sync(lambda: _search_main(plan, run_dir, target, prepared, engine, display, meta, wall0,
                                                   driver, workers))
        finally:
            display.close()
    finally:
        if engine:
            engine.stop()
    return result


async def _search_main(plan, run_dir, target, prepared, engine, display, meta, wall0, driver="aiohttp",
                       workers=1) -> CapacityResult:
    runner = CapacityRunner(plan, run_dir, target, prepared=prepared, watch=engine.died if engine else None,
                            display=display, driver=driver, workers=workers)
    loop = asyncio.get_running_loop()
    await runner.open()
    meta["model"] = runner.model
    (run_dir / "config.json").write_text(json.dumps(
        {"scenario": meta.get("scenario"), "target": target, "model": runner.model, "engine": meta.get("engine"),
         "search": dataclasses.asdict(plan.search), "step": dataclasses.asdict(plan.step),
         "request_fit": meta.get("request_fit")}, indent=2,
        default=str) + "\n")
    loop.add_signal_handler(signal.SIGINT, runner.stop, "interrupted (Ctrl-C)")
    search = CapacitySearch(plan.search)
    try:
        while runner.stopped is None and (nxt := search.next_step()) is not None:
            load, phase = nxt
            res = await runner.measure(load, phase, len(search.steps))
            if runner.stopped:  # a step cut by Ctrl-C or a dead target says nothing about the load
                display.status(f"step {len(search.steps)} cut short: {runner.stopped}")
                break
            step: Step = search.record(load, res)
            display.end_step(res.detail | {"phase": step.phase})
            write_summary(run_dir, build_summary(plan, search.outcome(), meta=meta, duration_s=time.monotonic() - wall0,
                                          complete=False, stopped="in progress"))
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await runner.close()
    outcome = search.outcome()
    summary = build_summary(plan, outcome, meta=meta, duration_s=time.monotonic() - wall0,
                            complete=runner.stopped is None, stopped=runner.stopped)
    records = read_run_records(run_dir)
    summary["prompt_length"] = prompt_length_of(records)  # over every step's requests
    summary["prefix_cache"] = prefix_cache_check(records, read_metrics(Path(run_dir) / METRICS), runner.sharing.share)
    write_summary(run_dir, summary)
    return CapacityResult(run_dir, summary, runner.stopped)


def measure_fixed(scn: Scenario, loads: Iterable[float], run_dir: str | Path, *, target: str,
                  early_stop: bool = False, display=None) -> list[dict[str, Any]]:
    """Measure each load once with the capacity step machinery (a dense sweep, for comparison with the
    search); returns the step details. ``requests.jsonl`` stages are the loads' positions."""
    plan = CapacityPlan.from_scenario(scn)

    async def main():
        runner = CapacityRunner(plan, Path(run_dir), target, display=display)
        await runner.open()
        out = []
        try:
            for i, load in enumerate(loads):
                res = await runner.measure(load, "sweep", i, early_stop=early_stop)
                out.append(res.detail)
                if display:
                    display.end_step(res.detail)
                if runner.stopped:
                    break
        finally:
            await runner.close()
        return out

    return run_sync(main)
