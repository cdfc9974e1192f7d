"""``slobench run`` and ``slobench replay``: build the workload (a scenario file, a trace), then one
fixed-load run against the target (the embedded reference engine when there is none), its summary
table and report."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from loadgen.commands.common import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    goodput_slos,
    pick,
    run_dir_from,
    target_options,
)
from loadgen.commands.flags import check_driver_support, scenario_from_args, slo_flags, target_url
from loadgen.commands.summary_table import print_summary
from loadgen.results.latency import LATENESS_BOUND_MS


@dataclass
class LoadRun:
    """A workload and its settings, resolved from the scenario or trace and the command line."""

    specs: list
    name: str
    target: str | None
    model: str | None
    engine_opts: dict[str, Any]
    goodput: dict[str, float]
    tier_slos: dict[str, Any]
    workers: int
    max_connections: int
    lateness_bound_ms: float
    concurrency: int
    read_timeout_s: float
    meta: dict[str, Any]
    scenario: Any = None  # the Scenario of `run` (its explicit request fields); None for `replay`


def cmd_run(args: argparse.Namespace) -> int:
    from loadgen.scenario.model import ScenarioError

    goodput_slos(args.goodput)  # bad SLOs fail before anything is loaded
    scn, path = scenario_from_args(args)
    try:
        specs, info = scn.build()
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    # --slo without --goodput: goodput counts the requests that met it (vLLM's --goodput)
    goodput = scn.goodput or ({k: v for t in scn.tier_slos.values() for k, v in t.items()} if args.slo else {})
    return execute_load_run(args, LoadRun(
        specs, name=scn.name, target=args.target or scn.target, model=args.model or scn.model,
        engine_opts=scn.engine_options(args.engine_opt), goodput=goodput, tier_slos=scn.tier_slos,
        workers=args.workers or scn.workers, max_connections=pick(args.max_connections, scn.max_connections),
        lateness_bound_ms=pick(args.lateness_bound_ms, scn.lateness_bound_ms),
        concurrency=scn.arrivals.concurrency if scn.arrivals and scn.arrivals.closed else 0,
        read_timeout_s=scn.read_timeout_s,
        meta={"scenario": str(path), "scenario_name": scn.name, "workload": info}, scenario=scn))


def cmd_replay(args: argparse.Namespace) -> int:
    from loadgen.workload.arrivals import Arrivals
    from loadgen.workload.traces import TraceError, TraceOptions, load_trace

    goodput = goodput_slos(args.goodput)
    slos = slo_flags(args)
    if slos and not goodput:  # --slo: the summary's goodput counts the requests that met it
        goodput = {s.metric: s.threshold_ms for s in slos}
    for name in ("time_scale", "rate", "max_duration"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {v}")
    if args.max_requests is not None and args.max_requests < 1:
        raise UsageError("--max-requests must be >= 1")
    try:
        arrivals = Arrivals(args.arrival, rate=args.rate or 1.0, burstiness=args.burstiness)
        opts = TraceOptions(
            time_scale=args.time_scale, rate=args.rate, start_offset_s=args.start_offset,
            max_requests=args.max_requests, max_duration_s=args.max_duration, block_size=args.block_size,
            seed=args.seed, skip_failed=not args.include_failed, token_range=tuple(args.token_range),
            output_len=args.output_len, max_output_len=args.max_output_len, arrivals=arrivals,
            tiers=args.tier_mix or {},
        )
        specs, info = load_trace(args.trace, args.format, opts)
    except (TraceError, ValueError) as e:
        raise UsageError(str(e)) from None
    if info.skipped_failed:
        print(f"skipped {info.skipped_failed} failed rows (0 response tokens); --include-failed keeps them",
              file=sys.stderr)
    return execute_load_run(args, LoadRun(
        specs, name=args.trace.stem.split(".")[0], target=args.target, model=args.model,
        engine_opts=dict(args.engine_opt), goodput=goodput, tier_slos={}, workers=args.workers or 1,
        max_connections=args.max_connections or 0, lateness_bound_ms=pick(args.lateness_bound_ms, LATENESS_BOUND_MS),
        concurrency=args.concurrency, read_timeout_s=300.0, meta={"trace": info.as_dict()}))


def execute_load_run(args: argparse.Namespace, run: LoadRun) -> int:
    """Exit 0, or 1 when the target failed or no request succeeded, 130 on Ctrl-C or SIGTERM; whatever was
    measured is saved and summarised in every case."""
    from loadgen.drivers.http_request import ClientConfig
    from loadgen.fixed_load import RunOptions, execute
    from loadgen.target.access import AccessError
    from loadgen.target.capabilities import ProbeError
    from loadgen.target.discovery import TargetError
    from loadgen.target.embedded import EmbeddedEngine, EngineStartError, require_engine
    from loadgen.target.request_shape import TargetFitError
    from loadgen.workload.exact_text import ExactLengthError
    from loadgen.workload.tokenizer import TokenizerError

    if not run.specs:
        raise UsageError("the workload has no requests")
    check_driver_support(run.scenario, args.driver)
    if run.workers < 1 or run.max_connections < 0 or run.concurrency < 0:
        raise UsageError("--workers must be >= 1, --max-connections and --concurrency >= 0")
    target = target_url(run.target)
    goodput = {**run.goodput, **goodput_slos(args.goodput)}
    if not target:
        require_engine()  # before the run folder exists: nothing is left behind
    run_dir = run_dir_from(args, run.name)
    engine = None
    try:
        if not target:
            engine = EmbeddedEngine(run.engine_opts, log_path=run_dir / "engine.log")
            print(f"starting the reference engine on {engine.url} ...", file=sys.stderr)
            target = engine.start()
        opts = RunOptions(
            run_dir=run_dir,
            client=ClientConfig(target.rstrip("/"), model=run.model, max_connections=run.max_connections,
                                read_timeout_s=run.read_timeout_s, retries=getattr(run.scenario, "retries", 0),
                                retry_max_wait_s=getattr(run.scenario, "retry_max_wait_s", 30.0)),
            workers=run.workers, driver=args.driver, concurrency=run.concurrency, scrape=not args.no_scrape,
            progress=not args.no_progress and sys.stderr.isatty(), goodput=goodput, tier_slos=run.tier_slos,
            lateness_bound_ms=run.lateness_bound_ms, watch=engine.died if engine else None,
            meta={**run.meta, "engine": run.engine_opts if engine else None},
            target_options=target_options(args, run.scenario),
        )
        result = execute(run.specs, opts)
    except EngineStartError as e:
        print(f"error: could not start the reference engine: {e}", file=sys.stderr)
        return EXIT_FAIL
    except (TargetError, ProbeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, AccessError) else EXIT_FAIL
    except (TargetFitError, TokenizerError, ExactLengthError) as e:
        raise UsageError(str(e)) from None
    finally:
        if engine:
            engine.stop()
    print_summary(result.summary, result.run_dir, args.json)
    if not args.no_report:
        from loadgen.report import auto_report

        auto_report(result.run_dir)
    if not result.stopped and result.summary.get("requests") and not result.summary.get("completed"):
        examples = "; ".join(result.summary.get("error_examples") or [])
        print(f"error: no request succeeded ({examples})", file=sys.stderr)
        return EXIT_FAIL
    if result.stopped:
        saved = result.summary.get("requests", 0)
        print(f"run ended early: {result.stopped}\n{saved} request records saved in {result.run_dir}",
              file=sys.stderr)
        return EXIT_INTERRUPTED if result.stopped.startswith("interrupted") else EXIT_FAIL
    return EXIT_OK
