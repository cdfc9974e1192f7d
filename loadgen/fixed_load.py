"""One fixed-load run (``slobench run`` / ``replay``): records, scrape, live progress, Ctrl-C, summary,
in one run folder.

Any driver (``drivers.factory``) sends the schedule; its records go to ``requests.jsonl`` as each
request ends. Ctrl-C, a target that stops accepting connections, or a watched engine process that dies
all end the run the same way: nothing more is sent, requests in flight are recorded as ``cancelled``,
and the summary is written from whatever was measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from loadgen.drivers.base import Driver, Progress, connections_needed
from loadgen.drivers.event_loop import add_stop_handlers, now, remove_stop_handlers, run_sync
from loadgen.drivers.factory import make_driver
from loadgen.drivers.http_request import ClientConfig
from loadgen.results import latency
from loadgen.results.conversation_stats import planned_of
from loadgen.results.prefix_cache import prefix_cache_check
from loadgen.results.records import RecordWriter, read_records
from loadgen.results.rundir import SCHEMA_VERSION, read_metrics, write_json, write_summary
from loadgen.results.runmeta import now_iso, run_metadata
from loadgen.results.summary import summarize
from loadgen.target.prepare import TargetOptions, prepare_target
from loadgen.target.scrape import Scraper
from loadgen.workload.sharing import PrefixShare
from loadgen.workload.specs import RequestSpec


@dataclass
class RunOptions:
    run_dir: Path
    client: ClientConfig
    workers: int = 1
    driver: str = "aiohttp"  # or "locust" (loadgen/drivers/locust: the same records through a Locust process)
    concurrency: int = 0  # > 0: closed loop with this many users
    scrape: bool = True
    progress: bool = True
    goodput: dict[str, float] = field(default_factory=dict)
    tier_slos: dict[str, dict[str, float]] = field(default_factory=dict)
    lateness_bound_ms: float = latency.LATENESS_BOUND_MS
    watch: Callable[[], str | None] | None = None  # returns a reason to stop (e.g. the engine died)
    meta: dict[str, Any] = field(default_factory=dict)
    target_options: TargetOptions = field(default_factory=TargetOptions)  # probe, tokenizer, explicit fields


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    stopped: str | None  # why the run ended early, None when it ran to the end


def execute(specs: Sequence[RequestSpec], opts: RunOptions) -> RunResult:
    """Probe the target and fit the requests to it, run, summarise. Raises what ``prepare_target`` raises
    (before anything is sent or written)."""
    specs = list(specs)
    prepared = prepare_target(opts.client.target, opts.client.model, specs, opts.target_options)
    prepared.adapt(specs)
    opts = replace(opts, client=replace(opts.client, model=prepared.model, shape=prepared.shape,
                                        headers=prepared.headers, extra_body=prepared.extra_body))
    run_dir = Path(opts.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started_at = now_iso()
    req_path, met_path = run_dir / "requests.jsonl", run_dir / "metrics.jsonl"
    for p in (req_path, met_path):
        p.unlink(missing_ok=True)
    client = asdict(opts.client) | {"headers": sorted(opts.client.headers)}  # names only: a header may be a secret
    config = {"target": opts.client.target, "client": client, "workers": opts.workers,
              "concurrency": opts.concurrency, "requests_planned": len(specs), **opts.meta,
              **prepared.as_summary()}
    if opts.driver == "locust":
        config["driver"] = "locust"
    stopped, model = run_sync(lambda: _drive(specs, opts, req_path, met_path))
    config["model"] = model
    write_json(run_dir / "config.json", {"schema_version": SCHEMA_VERSION, **config})
    records, samples = read_records(req_path), read_metrics(met_path)
    summary = summarize(records, goodput=opts.goodput or None, tier_slos=opts.tier_slos,
                        lateness_bound_ms=opts.lateness_bound_ms, metrics=samples, planned=planned_of(specs))
    sharing = PrefixShare()
    sharing.add(specs)
    summary["prefix_cache"] = prefix_cache_check(records, samples, sharing.share)
    summary["run_id"] = run_dir.name
    summary["model"] = model
    summary["requests_planned"] = len(specs)
    summary["stopped_early"] = stopped
    summary.update(prepared.as_summary())
    summary = {**_metadata(opts, run_dir, config.get("driver", "aiohttp"), started_at), **summary}
    write_summary(run_dir, summary)
    return RunResult(run_dir, summary, stopped)


def _metadata(opts: RunOptions, run_dir: Path, driver: str, started_at: str) -> dict[str, Any]:
    """The metadata keys every summary.json carries (kind run | replay, scenario, target, versions ...)."""
    meta = opts.meta
    if isinstance(meta.get("scenario"), str):
        scenario = {"name": meta.get("scenario_name") or Path(meta["scenario"]).stem, "path": meta["scenario"]}
        kind = "run"
    elif isinstance(meta.get("trace"), dict):
        path = meta["trace"].get("path")
        scenario = {"name": Path(path).stem.split(".")[0] if path else None, "path": path}
        kind = "replay"
    else:
        scenario, kind = None, meta.get("kind", "run")
    return run_metadata(kind, run_dir.name, scenario=scenario, target=opts.client.target, started_at=started_at,
                        driver=driver)


async def _drive(specs: Sequence[RequestSpec], opts: RunOptions, req_path: Path,
                 met_path: Path) -> tuple[str | None, str | None]:
    """The run itself: open the driver, start the scraper on the same t0, send, watch, close."""
    loop = asyncio.get_running_loop()
    with RecordWriter(req_path) as writer:
        driver = make_driver(opts.driver, opts.client, writer, workers=opts.workers, work_dir=req_path.parent,
                             tier_slos=opts.tier_slos)
        try:
            await driver.open()
        except BaseException:
            await driver.close()
            raise
        scraper = None
        if opts.scrape:
            scraper = Scraper(opts.client.target, met_path)
            await loop.run_in_executor(None, scraper.start)
        stop_handlers = add_stop_handlers(loop, driver.stop)
        display = RunDisplay(len(specs)) if opts.progress else None
        watcher = asyncio.ensure_future(_watch(driver, opts.watch, display))
        try:
            await driver.warm_up(connections_needed(specs, opts.concurrency, opts.client.max_connections))
            t0 = now() + driver.start_lead_s
            if scraper:
                scraper.go(t0)
            await driver.run(specs, t0=t0, stage=0, concurrency=opts.concurrency)
        finally:
            watcher.cancel()
            remove_stop_handlers(loop, stop_handlers)
            await driver.close()
            if display:
                display.update(driver.progress)
                display.close()
            if scraper:
                await loop.run_in_executor(None, scraper.stop)
    if driver.abort_reason is None and opts.watch:
        driver.abort_reason = opts.watch()
    return driver.abort_reason, driver.model


async def _watch(driver: Driver, watch: Callable[[], str | None] | None, display: RunDisplay | None) -> None:
    while True:
        await asyncio.sleep(0.5)
        if watch:
            reason = watch()
            if reason:
                driver.stop(reason)
        if display:
            display.update(driver.progress)


class RunDisplay:
    """rich live line: sent / in flight / done / errors, TTFT p50 / p99 of recent requests."""

    def __init__(self, planned: int):
        from rich.console import Console
        from rich.live import Live

        self.planned = planned
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.live.start()

    def update(self, prog: Progress) -> None:
        from rich.text import Text

        recent = list(prog.ttft_ms)
        p = (f"TTFT p50 {latency.percentile(recent, 50):.0f} ms  p99 {latency.percentile(recent, 99):.0f} ms"
             if recent else "TTFT -")
        self.live.update(Text(f"sent {prog.sent}/{self.planned}  in flight {prog.in_flight}  done {prog.done}  "
                              f"errors {prog.errors}  {p}"), refresh=True)

    def close(self) -> None:
        self.live.stop()

