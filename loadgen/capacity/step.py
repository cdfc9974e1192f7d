"""One capacity step against a target: send its load, watch it, judge each tier's SLO on its window.

- One driver (``drivers.base.Driver``), one scraper and one clock (``t0``) for the whole run:
  ``requests.jsonl`` holds every step's records with ``stage`` = the step index, ``metrics.jsonl`` the
  scrape, both on the run's time axis, so a report can always be rebuilt from the folder alone.
- A step's requests are built for its cap, ``step_duration_s``; a bisection or confirming step's (open
  loop) is lengthened until its window holds enough requests of each judged tier for its quantile
  (``early_stop.step_length_s``; ramp steps far below the knee need no p99 that exact, and the bracket's
  pass end is confirmed with one). Its warm-up
  lasts at least ``warmup_s`` and goes on while the in-flight count still rises (``capacity.steady``), at
  most ``max_warmup_s``;
  requests scheduled before the window starts are never judged. Then ``capacity.early_stop`` looks at
  the window every ``look_interval_s`` until the step is decided (a certain breach, the sequential test's
  breach or pass, a ramp step's clear pass: it stops sending) or the cap ends it undecided (judged on
  the point estimate). After the last send it waits up to ``drain_s`` for answers; a request still
  waiting then is cancelled and counts with the time it had waited (a lower bound); a last look on the
  whole window says whether the cap's verdict is also a confident one. Before each step the target is
  left to go idle (its running + waiting gauges at 0).
- The monitor also measures its own event loop's lag (how late a 0.1 s sleep wakes): with the client's
  lateness it says whether the load generator fell behind (``disturbed``); ``capacity.step_stats``
  computes the step's figures.
- A test hook stalls the load generator on purpose: ``SLOBENCH_INJECT_STALL=INDEX:AT_S:FOR_S`` blocks this
  process's event loop for FOR_S seconds, AT_S seconds into step INDEX (its first measurement only: the
  re-measure runs undisturbed), as a machine's hiccup would; ``tests/loadgen/capacity/test_calibration.py`` uses it to
  check that such a step is measured again instead of deciding the search.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from loadgen.capacity.early_stop import Decision, StepLooks, step_length_s
from loadgen.capacity.search_steps import StepResult
from loadgen.capacity.settings import CapacitySettings
from loadgen.capacity.steady import SteadyState
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

STALL_ENV = "SLOBENCH_INJECT_STALL"


def injected_stall(index: int) -> tuple[float, float] | None:
    """(at_s, for_s) when ``SLOBENCH_INJECT_STALL`` asks to stall step ``index`` (the test hook above)."""
    spec = os.environ.get(STALL_ENV, "")
    try:
        step, at_s, for_s = spec.split(":")
        if int(step) == index:
            return float(at_s), float(for_s)
    except ValueError:
        if spec:
            raise ValueError(f"{STALL_ENV}={spec!r}: expected INDEX:AT_S:FOR_S, e.g. 1:4:0.5") from None
    return None


def record_decision(st: StepWindow, d: Decision | None, looks: StepLooks, final: bool = False) -> None:
    """What one look of ``looks`` (its decision ``d``, None: undecided) tells the step. Only the last look
    (``final``) of a step that ran to its cap makes it undecided; a look before a decision leaves the reason
    open."""
    st.looks = looks.looks
    st.samples = looks.copy_samples()
    if d is not None:
        st.decision, st.decided_by, st.samples = d.kind, d.by, d.samples
        st.stop_reason = d.reason
    elif final:
        st.stop_reason = "undecided at the cap (the step's length): judged on the point estimate"


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

    def __init__(self, settings: CapacitySettings, run_dir: Path, target: str, *,
                 prepared: PreparedTarget | None = None, watch: Callable[[], str | None] | None = None,
                 display=None, scrape: bool = True, driver: str = "aiohttp", workers: int = 1):
        self.settings = settings
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
        s = self.settings.scenario
        self.writer = StepRecordWriter(req)
        cfg = ClientConfig(self.target, model=self.model, max_connections=s.max_connections,
                           read_timeout_s=s.read_timeout_s, retries=s.retries, retry_max_wait_s=s.retry_max_wait_s)
        if self.prepared is not None:
            cfg.shape = self.prepared.shape
            cfg.headers, cfg.extra_body = self.prepared.headers, self.prepared.extra_body
        self.driver = make_driver(self.driver_kind, cfg, self.writer, workers=self.workers, work_dir=self.run_dir,
                                  drain_s=self.settings.drain_s, tier_slos=s.tier_slos)
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

    async def measure(self, load: float, phase: str, index: int, early_stop: bool | None = None,
                      draw: int = 0) -> StepResult:
        """One step at ``load``; ``draw``: its arrival pattern (``scenario.steps``; 0: the common one)."""
        settings, driver = self.settings, self.driver
        await self._settle()
        dur = settings.step.step_duration_s  # the cap: a step decided sooner stops sending then
        if not settings.closed and phase != "ramp" and settings.step.max_step_duration_s > dur:  # enough per tier?
            longest = step_specs(settings.scenario, settings.search.axis, load, index, 0.0,
                                 settings.step.max_step_duration_s, draw=draw, exact_at=settings.count_marks)
            dur = step_length_s(settings, [(s.arrival_s, s.tier or "none") for s in longest])
        specs = step_specs(settings.scenario, settings.search.axis, load, index, 0.0, dur, draw=draw,
                           exact_at=settings.count_marks)  # before the clock
        if self.prepared is not None:
            self.prepared.adapt(specs)  # text prompts for a target that takes only text
        self.sharing.add(specs)
        concurrency = int(load) if settings.closed else 0
        await driver.warm_up(connections_needed(specs, concurrency, settings.scenario.max_connections))
        start = self.clock() + driver.start_lead_s
        for sp in specs:
            sp.arrival_s += start
        st = StepWindow(index, load, phase, start, start + settings.step.warmup_s, start + dur)
        arrivals = [(s.arrival_s, s.tier or "none") for s in specs]  # open loop: known in advance
        if not settings.closed and not any(s.follow_up for s in specs):  # a later turn's time waits on an answer
            st.arrivals = [a for a, _ in arrivals]
        self.writer.step_records = []
        prog = driver.progress
        base = (prog.sent, prog.done, prog.errors)
        if self.display:
            self.display.start_step(index, load, phase, dur + settings.drain_s)
        es = settings.step.early_stop if early_stop is None else early_stop
        if phase == "refine":  # a window for the rating's fit alone: whole, its runs of exceedances uncut
            es = False
        es = es and driver.in_flight() is not None  # deciding early needs the requests in flight too
        looks: list[StepLooks] = []  # the window's looks, once the warm-up is over
        mon = asyncio.ensure_future(self._monitor(st, arrivals, es, base, looks))
        stall = injected_stall(index)
        if stall is not None:
            asyncio.get_running_loop().call_later(max(0.0, start + stall[0] - self.clock()), time.sleep, stall[1])
        wall0 = time.monotonic()
        try:
            await driver.run(specs, t0=self.t0, stage=index, concurrency=concurrency,
                             until_s=st.w1 if settings.closed else None)
        finally:
            mon.cancel()
            await asyncio.gather(mon, return_exceptions=True)
        if driver.abort_reason and not self.stopped:
            self.stopped = driver.abort_reason
        records = list(self.writer.step_records)
        if not looks:  # the step ended within its warm-up (Ctrl-C, a dead target)
            looks.append(self._looks(st, arrivals))
        if st.decision is None:  # the last look, on the whole window: was the cap's verdict a confident one?
            record_decision(st, looks[0].look(records, self.clock(), final=True), looks[0], final=True)
        detail = step_detail(settings, st, records, read_metrics(self.run_dir / "metrics.jsonl"),
                             self.clock(), time.monotonic() - wall0)
        margin = detail["margin"] if detail["margin"] is not None else (None if detail["passed"] else math.inf)
        return StepResult(detail["passed"], detail["stopped_early"], detail, margin=margin,
                          disturbed=detail["disturbance"])

    def _looks(self, st: StepWindow, arrivals: list[tuple[float, str]]) -> StepLooks:
        planned = Counter(tier for a, tier in arrivals if st.w0 <= a < st.w1)
        return StepLooks(self.settings, st.w0, st.w1, planned, st.phase)

    async def _settle(self) -> None:
        """Wait until the target has nothing running or waiting (two scrapes in a row, in its own gauges'
        names: ``results.server_metrics``), at most settle_timeout_s; targets without them get half a second."""
        deadline = time.monotonic() + self.settings.step.settle_timeout_s
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

    async def _monitor(self, st: StepWindow, arrivals: list[tuple[float, str]], early_stop: bool,
                       base: tuple[int, int, int], looks: list[StepLooks]) -> None:
        settings, driver = self.settings, self.driver
        opts, prog = settings.step, driver.progress
        steady = SteadyState(opts.warmup_s, opts.max_warmup_s, opts.steady_interval_s, opts.steady_tolerance)
        tick, next_look = 0, math.inf
        while True:
            before = now()
            await asyncio.sleep(0.1)
            lag_ms = max(0.0, (now() - before - 0.1) * 1000.0)
            tick += 1
            t = self.clock()
            if st.start_s <= t < st.window_end:
                st.loop_lag_ms.append(lag_ms)
            if not looks and t >= st.start_s:  # the warm-up: until the in-flight count stops rising
                if driver.measures_in_flight:
                    steady.add(t - st.start_s, prog.in_flight)
                if steady.check(t - st.start_s):
                    st.w0, st.steady = st.start_s + steady.done_at, steady.settled
                    looks.append(self._looks(st, arrivals))
                    next_look = st.w0 + opts.look_interval_s
            elif looks and driver.measures_in_flight and st.w0 <= t < st.window_end:
                st.inflight.append(prog.in_flight)
            if early_stop and st.early is None and t >= next_look:
                next_look += opts.look_interval_s
                d = looks[0].look(self.writer.step_records + (driver.in_flight() or []), t)
                record_decision(st, d, looks[0])
                if d is not None:
                    st.early, st.stopped_at = d.kind, t
                    if d.kind == "breach":
                        driver.stop()
                    else:  # stop sending; what is in flight finishes (the drain below still applies)
                        driver.stop_sending()
            send_end = st.stopped_at if st.early == "pass" else st.w1
            if t >= send_end + settings.drain_s and not st.cut:
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
