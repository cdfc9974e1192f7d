"""One capacity step against a target: send its load, watch it, judge each tier's SLO on its window.

- One driver (``drivers.base.Driver``), one scraper and one clock (``t0``) for the whole run:
  ``requests.jsonl`` holds every step's records with ``stage`` = the step index, ``metrics.jsonl`` the
  scrape, both on the run's time axis, so a report can always be rebuilt from the folder alone.
- A step sends its load for ``step_duration_s``; requests scheduled in its first ``warmup_s`` are
  discarded, the rest (the *window*) are judged. After the last send it waits up to ``drain_s`` for
  answers; a request still waiting then is cancelled and counts with the time it had waited (a lower
  bound). Before each step the target is left to go idle (its running + waiting gauges at 0).
- While it runs, ``capacity.early_stop`` may end it (a certain or clear breach; a clear pass on a ramp
  step) when the driver can show its requests in flight; ``capacity.step_stats`` computes its figures.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from loadgen.capacity.early_stop import breach_reason, clear_pass_reason, min_window_s
from loadgen.capacity.plan import CapacityPlan
from loadgen.capacity.search import StepResult
from loadgen.capacity.step_stats import StepWindow, step_detail
from loadgen.drivers.base import Driver, connections_needed
from loadgen.drivers.event_loop import now
from loadgen.drivers.factory import make_driver
from loadgen.drivers.http_request import ClientConfig
from loadgen.results import latency
from loadgen.results.records import RecordWriter, RequestRecord
from loadgen.results.rundir import read_metrics
from loadgen.results.scraped import family
from loadgen.results.server_metrics import SERVERS, detect
from loadgen.scenario.steps import step_specs
from loadgen.target.prepare import PreparedTarget
from loadgen.target.scrape import Scraper, find_metrics_page, scrape_once
from loadgen.workload.sharing import PrefixShare


class StepRecordWriter(RecordWriter):
    """Appends records to requests.jsonl and keeps the current step's in memory."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.step_records: list[RequestRecord] = []

    def write(self, rec: RequestRecord) -> None:
        super().write(rec)
        self.step_records.append(rec)


class CapacityRunner:
    """Measures load steps against one target, on one clock, into one run folder."""

    def __init__(self, plan: CapacityPlan, run_dir: Path, target: str, *, prepared: PreparedTarget | None = None,
                 watch: Callable[[], str | None] | None = None, display=None, scrape: bool = True,
                 driver: str = "aiohttp", workers: int = 1):
        self.plan = plan
        self.driver_kind = driver  # "aiohttp" (this process, or sharded with workers > 1) | "locust"
        self.workers = workers
        self.run_dir = Path(run_dir)
        self.target = target.rstrip("/")
        self.prepared = prepared  # what the target accepts; None: send everything (a sweep against a known target)
        self.model = prepared.model if prepared else None
        self.watch = watch
        self.display = display
        self.scrape = scrape
        self.stopped: str | None = None  # why the run ends early (Ctrl-C, target died)
        self.t0 = 0.0
        self.driver: Driver | None = None
        self._scraper: Scraper | None = None
        self._metrics_ok = True
        self._metrics_url: str | None = None  # the target's Prometheus page, found at the first settle
        self.sharing = PrefixShare()  # what the steps' prompts share: the expected prefix-cache hit rate

    # -------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        req, met = self.run_dir / "requests.jsonl", self.run_dir / "metrics.jsonl"
        for p in (req, met):
            p.unlink(missing_ok=True)
        s = self.plan.scenario
        self.writer = StepRecordWriter(req)
        cfg = ClientConfig(self.target, model=self.model, max_connections=s.max_connections,
                           read_timeout_s=s.read_timeout_s)
        if self.prepared is not None:
            cfg.shape = self.prepared.shape
        self.driver = make_driver(self.driver_kind, cfg, self.writer, workers=self.workers, work_dir=self.run_dir,
                                  drain_s=self.plan.drain_s, tier_slos=s.tier_slos)
        await self.driver.open()
        self.model = self.driver.model
        if self.scrape:
            self._scraper = Scraper(self.target, met)
            await asyncio.get_running_loop().run_in_executor(None, self._scraper.start)
        self.t0 = now() + 0.3
        if self._scraper:
            self._scraper.go(self.t0)

    async def close(self) -> None:
        if self.driver is not None:
            await self.driver.close()
        if self._scraper is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._scraper.stop)
            self._scraper = None
        self.writer.close()

    def stop(self, reason: str) -> None:
        """End the run: the step under way is cut, no more steps start."""
        self.stopped = self.stopped or reason
        if self.driver is not None:
            self.driver.stop()

    def clock(self) -> float:
        return now() - self.t0

    # -------------------------------------------------------------- a step

    async def measure(self, load: float, phase: str, index: int, early_stop: bool | None = None) -> StepResult:
        plan, driver = self.plan, self.driver
        await self._settle()
        dur = plan.step.step_duration_s
        specs = step_specs(plan.scenario, plan.search.axis, load, index, 0.0, dur)  # built before the clock runs
        if self.prepared is not None:
            self.prepared.adapt(specs)  # text prompts for a target that takes only text
        self.sharing.add(specs)
        concurrency = int(load) if plan.closed else 0
        await driver.warm_up(connections_needed(specs, concurrency, plan.scenario.max_connections))
        start = self.clock() + driver.start_lead_s
        for sp in specs:
            sp.arrival_s += start
        w0 = start + plan.step.warmup_s
        st = StepWindow(index, load, phase, start, w0, start + dur)
        planned = Counter(s.tier or "none" for s in specs if w0 <= s.arrival_s)  # open loop: known in advance
        self.writer.step_records = []
        prog = driver.progress
        base = (prog.sent, prog.done, prog.errors)
        if self.display:
            self.display.start_step(index, load, phase, dur + plan.drain_s)
        es = plan.step.early_stop if early_stop is None else early_stop
        es = es and driver.in_flight() is not None  # deciding early needs the requests in flight too
        mon = asyncio.ensure_future(self._monitor(st, planned, es, base))
        wall0 = time.monotonic()
        try:
            await driver.run(specs, t0=self.t0, stage=index, concurrency=concurrency,
                             until_s=st.w1 if plan.closed else None)
        finally:
            mon.cancel()
            await asyncio.gather(mon, return_exceptions=True)
        if driver.abort_reason and not self.stopped:
            self.stopped = driver.abort_reason
        detail = step_detail(plan, st, list(self.writer.step_records), read_metrics(self.run_dir / "metrics.jsonl"),
                             self.clock(), time.monotonic() - wall0)
        margin = detail["margin"] if detail["margin"] is not None else (None if detail["passed"] else math.inf)
        return StepResult(detail["passed"], detail["stopped_early"], detail, margin=margin)

    async def _settle(self) -> None:
        """Wait until the target has nothing running or waiting (two scrapes in a row, in its own gauges'
        names: ``results.server_metrics``), at most settle_timeout_s; targets without them get half a second."""
        deadline = time.monotonic() + self.plan.step.settle_timeout_s
        loop = asyncio.get_running_loop()
        if self._metrics_url is None:
            self._metrics_url, _ = await loop.run_in_executor(None, find_metrics_page, self.target)
        idle = 0
        prefixes = tuple(s.prefix for s in SERVERS)
        while self._metrics_ok and time.monotonic() < deadline and not self.stopped:
            try:
                m = await loop.run_in_executor(None, scrape_once, self._metrics_url, prefixes, 2.0)
            except Exception:  # noqa: BLE001 (no /metrics: fall back to a pause)
                self._metrics_ok = False
                break
            names = detect(m)
            gauges = [g for g in (names.running, names.waiting) if g] if names else []
            busy = [v for g in gauges for v in family(m, g)]
            if not busy:
                self._metrics_ok = False
                break
            idle = idle + 1 if sum(busy) == 0 else 0
            if idle >= 2:
                return
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)

    async def _monitor(self, st: StepWindow, planned: Counter, early_stop: bool, base: tuple[int, int, int]) -> None:
        plan, driver = self.plan, self.driver
        prog = driver.progress
        tick = 0
        while True:
            await asyncio.sleep(0.1)
            tick += 1
            t = self.clock()
            if driver.measures_in_flight and st.w0 <= t < st.window_end:
                st.inflight.append(prog.in_flight)
            if early_stop and st.early is None and t >= st.w0 and tick % 5 == 0:
                records = self.writer.step_records + (driver.in_flight() or [])
                reason = breach_reason(plan, records, st.w0, st.w1, planned, t)
                if reason:
                    st.early, st.stop_reason, st.stopped_at = "breach", reason, t
                    driver.stop()
                elif plan.step.early_pass and st.phase == "ramp" and t >= st.w0 + min_window_s(plan):
                    reason = clear_pass_reason(plan, records, st.w0, t)
                    if reason:  # stop sending; what is in flight finishes (the drain below still applies)
                        st.early, st.stop_reason, st.stopped_at = "pass", reason, t
                        driver.stop_sending()
            send_end = st.stopped_at if st.early == "pass" else st.w1
            if t >= send_end + plan.drain_s and not st.cut:
                st.cut = True
                driver.stop()
            if self.watch and tick % 5 == 0:
                why = self.watch()
                if why:
                    self.stop(why)
            if self.display and tick % 2 == 0:
                sent, done, errs = (prog.sent - base[0], prog.done - base[1], prog.errors - base[2])
                recent = list(prog.ttft_ms)[-200:]
                p99 = f"  TTFT p99 {latency.percentile(recent, 99):.0f} ms" if recent else ""
                self.display.update(t - st.start_s, f"sent {sent}  in flight {prog.in_flight}  done {done}  "
                                                     f"errors {errs}{p99}")
