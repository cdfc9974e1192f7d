"""One load run: records, scrape, live progress, Ctrl-C, summary, in ``reports/<run-id>/``.

``execute()`` runs the replayer in this process, or shards the schedule round-robin over ``workers``
processes that share one start time (``time.monotonic`` is system-wide) and append to the same
``requests.jsonl``. Ctrl-C, a target that stops accepting connections, or a watched engine process
that dies all end the run the same way: nothing more is sent, requests in flight are recorded as
``cancelled``, and the summary is written from whatever was measured.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.drivers.replayer import ClientConfig, Progress, Replayer, TargetError, run_sync
from loadgen.results.records import RecordWriter, read_records
from loadgen.results.rundir import read_metrics
from loadgen.results.runmeta import now_iso
from loadgen.results.summary import summarize
from loadgen.target.scrape import Scraper
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
    lateness_bound_ms: float = 10.0
    watch: Callable[[], str | None] | None = None  # returns a reason to stop (e.g. the engine died)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    stopped: str | None  # why the run ended early, None when it ran to the end



def execute(specs: Sequence[RequestSpec], opts: RunOptions) -> RunResult:
    run_dir = Path(opts.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started_at = now_iso()
    req_path, met_path = run_dir / "requests.jsonl", run_dir / "metrics.jsonl"
    for p in (req_path, met_path):
        p.unlink(missing_ok=True)
    config = {"target": opts.client.target, "client": asdict(opts.client), "workers": opts.workers,
              "concurrency": opts.concurrency, "requests_planned": len(specs), **opts.meta}
    if opts.driver == "locust":
        from loadgen.drivers.locust.driver import run_locust

        config["driver"] = "locust"
        stopped, model = run_locust(specs, opts, req_path, met_path)
    elif opts.workers > 1:
        stopped, model = _sharded(specs, opts, req_path, met_path)
    else:
        stopped, model = run_sync(lambda: _single(specs, opts, req_path, met_path))
    config["model"] = model
    (run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    summary = summarize(read_records(req_path), goodput=opts.goodput or None, tier_slos=opts.tier_slos,
                        lateness_bound_ms=opts.lateness_bound_ms, metrics=read_metrics(met_path))
    summary["run_id"] = run_dir.name
    summary["model"] = model
    summary["requests_planned"] = len(specs)
    summary["stopped_early"] = stopped
    summary = {**_metadata(opts, run_dir, config.get("driver", "aiohttp"), started_at), **summary}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    return RunResult(run_dir, summary, stopped)


def _metadata(opts: RunOptions, run_dir: Path, driver: str, started_at: str) -> dict[str, Any]:
    """The metadata keys every summary.json carries (kind run | replay, scenario, target, versions ...)."""
    from loadgen.results.runmeta import run_metadata

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


# ------------------------------------------------------------------ one process


async def _single(specs, opts: RunOptions, req_path: Path, met_path: Path) -> tuple[str | None, str | None]:
    loop = asyncio.get_running_loop()
    with RecordWriter(req_path) as writer:
        prog = Progress()
        rep = Replayer(opts.client, writer, prog)
        try:
            await rep.open()
        except BaseException:
            await rep.close()
            raise
        scraper = Scraper(opts.client.target, met_path).start() if opts.scrape else None
        loop.add_signal_handler(signal.SIGINT, rep.stop, "interrupted (Ctrl-C)")
        display = _Display(len(specs)) if opts.progress else None
        watcher = asyncio.ensure_future(_watch(rep, prog, opts.watch, display))
        try:
            await rep.run(specs, concurrency=opts.concurrency, on_start=scraper.go if scraper else None)
        finally:
            watcher.cancel()
            loop.remove_signal_handler(signal.SIGINT)
            await rep.close()
            if display:
                display.update(prog.sent, prog.in_flight, prog.done, prog.errors, list(prog.ttft_ms))
                display.close()
            if scraper:
                scraper.stop()
    if rep.abort_reason is None and opts.watch:
        rep.abort_reason = opts.watch()
    return rep.abort_reason, rep.model


async def _watch(rep: Replayer, prog: Progress, watch, display) -> None:
    while True:
        await asyncio.sleep(0.5)
        if watch:
            reason = watch()
            if reason:
                rep.stop(reason)
        if display:
            display.update(prog.sent, prog.in_flight, prog.done, prog.errors, list(prog.ttft_ms))


class _Display:
    """rich live line: sent / in flight / done / errors, TTFT p50 / p99 of recent requests."""

    def __init__(self, planned: int):
        from rich.console import Console
        from rich.live import Live

        self.planned = planned
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.live.start()

    def update(self, sent: int, in_flight: int, done: int, errors: int, ttft_ms: list[float]) -> None:
        from rich.text import Text

        p = f"TTFT p50 {np.percentile(ttft_ms, 50):.0f} ms  p99 {np.percentile(ttft_ms, 99):.0f} ms" \
            if ttft_ms else "TTFT -"
        self.live.update(Text(f"sent {sent}/{self.planned}  in flight {in_flight}  done {done}  "
                              f"errors {errors}  {p}"), refresh=True)

    def close(self) -> None:
        self.live.stop()


# ------------------------------------------------------------------ N processes


def _worker(idx, specs, cfg: ClientConfig, req_path, concurrency, ready, go, t0v, counters, stop_ev, results):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and tells us through stop_ev

    async def main():
        with RecordWriter(req_path) as writer:
            prog = Progress()
            rep = Replayer(cfg, writer, prog)
            await rep.open()
            await asyncio.get_running_loop().run_in_executor(None, ready.wait)
            await asyncio.get_running_loop().run_in_executor(None, go.wait)

            async def sync():
                while True:
                    counters[idx * 4: idx * 4 + 4] = [prog.sent, prog.in_flight, prog.done, prog.errors]
                    if stop_ev.is_set():
                        rep.stop("stopped")
                    await asyncio.sleep(0.2)

            s = asyncio.ensure_future(sync())
            try:
                await rep.run(specs, t0=t0v.value, concurrency=concurrency)
            finally:
                s.cancel()
                counters[idx * 4: idx * 4 + 4] = [prog.sent, prog.in_flight, prog.done, prog.errors]
                await rep.close()
            return rep.abort_reason

    try:
        reason = run_sync(main)
        results.put((idx, reason, None))
    except Exception as e:  # noqa: BLE001 (reported to the parent)
        results.put((idx, None, f"{type(e).__name__}: {e}"))


def _sharded(specs, opts: RunOptions, req_path: Path, met_path: Path) -> tuple[str | None, str | None]:
    from loadgen.drivers.replayer import discover_model

    cfg = opts.client
    if cfg.model is None:
        async def find():
            import aiohttp
            async with aiohttp.ClientSession() as s:
                return await discover_model(s, cfg.target)
        cfg = ClientConfig(**{**asdict(cfg), "model": run_sync(find)})
    n = opts.workers
    ctx = mp.get_context("spawn")
    ready, go = ctx.Barrier(n + 1), ctx.Event()
    t0v = ctx.Value("d", 0.0)
    counters = ctx.Array("q", 4 * n, lock=False)
    stop_ev = ctx.Event()
    results = ctx.Queue()
    conc = -(-opts.concurrency // n) if opts.concurrency else 0
    procs = [ctx.Process(target=_worker, args=(i, list(specs[i::n]), cfg, str(req_path), conc, ready, go, t0v,
                                               counters, stop_ev, results), daemon=True) for i in range(n)]
    for p in procs:
        p.start()
    stopped: str | None = None
    old = signal.getsignal(signal.SIGINT)

    def on_sigint(*_):
        nonlocal stopped
        stopped = stopped or "interrupted (Ctrl-C)"
        stop_ev.set()

    signal.signal(signal.SIGINT, on_sigint)
    display = None
    scraper = None
    try:
        try:
            ready.wait(timeout=120)
        except Exception:  # noqa: BLE001
            stop_ev.set()
            raise TargetError("worker processes did not start (see their errors above)") from None
        scraper = Scraper(cfg.target, met_path).start() if opts.scrape else None
        t0v.value = time.monotonic() + 0.2
        go.set()
        if scraper:
            scraper.go(t0v.value)
        display = _Display(len(specs)) if opts.progress else None
        errors: list[str] = []
        done_workers = 0
        while done_workers < n:
            try:
                _idx, reason, err = results.get(timeout=0.5)
                done_workers += 1
                if err:
                    errors.append(err)
                if reason and reason != "stopped":
                    stopped = stopped or reason
                    stop_ev.set()
            except Exception:  # noqa: BLE001 (queue.Empty)
                pass
            if opts.watch and not stopped:
                r = opts.watch()
                if r:
                    stopped = r
                    stop_ev.set()
            if display:
                c = list(counters)
                sums = [sum(c[i::4]) for i in range(4)]
                display.update(*sums, _recent_ttfts(req_path))
        if errors and not stopped:
            stopped = "worker failed: " + errors[0]
    finally:
        signal.signal(signal.SIGINT, old)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
        if display:
            display.close()
        if scraper:
            scraper.stop()
    return stopped, cfg.model


def _recent_ttfts(req_path: Path, tail_bytes: int = 1 << 18) -> list[float]:
    try:
        with open(req_path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    out = []
    for line in lines[-2000:]:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("status") == "ok" and r.get("first_token_s") is not None:
            out.append((r["first_token_s"] - r["scheduled_s"]) * 1000.0)
    return out
