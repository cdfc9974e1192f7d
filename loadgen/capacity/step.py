"""One capacity step against a target: send its load, watch it, judge each tier's SLO on its window.

- One replayer session, one scraper and one clock (``t0``) for the whole run: ``requests.jsonl`` holds
  every step's records with ``stage`` = the step index, ``metrics.jsonl`` the scrape, both on the run's
  time axis, so a report can always be rebuilt from the folder alone.
- A step sends its load for ``step_duration_s``; requests scheduled in its first ``warmup_s`` are
  discarded, the rest (the *window*) are judged. After the last send it waits up to ``drain_s`` for
  answers; a request still waiting then is cancelled and counts with the time it had waited (a lower
  bound). Before each step the target is left to go idle (its running + waiting gauges at 0).
- Each tier's SLO is judged on its window: the quantile, with a bootstrap confidence interval. A step
  stops early when its breach is certain (the quantile over what is known, with everything still to
  come at 0 ms, is already over) or statistically clear (the interval's lower end is over, on the
  requests old enough to be settled): a queue that keeps growing trips both within seconds. A *ramp*
  step also stops sending once every SLO is clearly met (each quantile under ``pass_margin`` x its
  threshold over at least 30 settled requests): far below the knee there is nothing more to learn.
  Bisection steps, near the knee by construction, always run their whole window unless they break.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.capacity.plan import CapacityPlan, step_specs
from loadgen.capacity.search import StepResult
from loadgen.drivers.replayer import ClientConfig, Progress, Replayer, now
from loadgen.results.records import RecordWriter, RequestRecord
from loadgen.results.rundir import read_metrics
from loadgen.results.slo import SLO, breach_certain, breach_likely, judge, quantile
from loadgen.results.summary import BREAKDOWN_HISTOGRAMS, summarize
from loadgen.target.scrape import Scraper, scrape_once
from loadgen.workload.specs import RequestSpec

AGREE_REL = 0.10  # Little's law vs measured in-flight: relative agreement ...
AGREE_ABS = 0.25  # ... or this many requests apart (tiny concurrencies)
CLEAR_PASS_MIN = 30  # settled requests before a step may pass early


def _feed(specs: list[RequestSpec], stop: Callable[[], bool]) -> Iterator[RequestSpec]:
    """Open-loop feed: the specs in order until ``stop()`` (checked as each one is due to be sent)."""
    for s in specs:
        if stop():
            return
        yield s


def _cycle_until(specs: list[RequestSpec], stop: Callable[[], bool]) -> Iterator[RequestSpec]:
    """Closed-loop feed: the specs in order (then again, with new ids) until ``stop()``."""
    k = 0
    while specs:
        for s in specs:
            if stop():
                return
            yield s if k == 0 else dataclasses.replace(s, id=f"{s.id}-{k}")
        k += 1


# ------------------------------------------------------------------ per-request values


def metric_value(r: RequestRecord, metric: str, now_s: float | None = None) -> float:
    """A request's latency in ms for one SLO metric: exact when known, ``inf`` for a failed request
    (error, 429, read timeout), the time waited so far (a lower bound) for one still in flight or cut
    off at the end of a step, NaN when it says nothing (TPOT of an unfinished request)."""
    sched = r.scheduled_s
    pending = r.done_s is None
    end = now_s if pending else r.done_s
    cut = pending or r.status == "cancelled"
    if metric == "ttft_ms":
        if r.first_token_s is not None:
            return (r.first_token_s - sched) * 1000.0
        return (end - sched) * 1000.0 if cut and end is not None else math.inf
    if metric == "e2el_ms":
        if not cut and r.status == "ok" and r.token_s:
            return (r.token_s[-1] - sched) * 1000.0
        return (end - sched) * 1000.0 if cut and end is not None else math.inf
    if metric == "tpot_ms":
        if cut:
            return math.nan
        if r.status != "ok":
            return math.inf
        n = r.output_tokens or len(r.token_s)
        if n > 1 and r.first_token_s is not None and r.token_s:
            return (r.token_s[-1] - r.first_token_s) * 1000.0 / (n - 1)
        return 0.0
    raise ValueError(f"unknown SLO metric {metric!r}")


def _values(rs: list[RequestRecord], metric: str, now_s: float | None = None) -> np.ndarray:
    v = np.asarray([metric_value(r, metric, now_s) for r in rs], dtype=float)
    return v[~np.isnan(v)]


# ------------------------------------------------------------------ one step against a target


class _StepWriter(RecordWriter):
    """Appends records to requests.jsonl and keeps the current step's in memory."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.step_records: list[RequestRecord] = []

    def write(self, rec: RequestRecord) -> None:
        super().write(rec)
        self.step_records.append(rec)


@dataclass
class _StepState:
    index: int
    load: float
    phase: str
    start_s: float
    w0: float
    w1: float
    drain_s: float
    planned: Counter  # open loop: window requests per tier, known in advance
    inflight: list[int] = dataclasses.field(default_factory=list)
    early: str | None = None  # "breach" (stopped, in-flight cancelled) | "pass" (sending stopped, drained)
    stop_reason: str | None = None
    stopped_at: float | None = None  # run clock when the early stop fired: the window ends there
    cut: bool = False


class CapacityRunner:
    """Measures load steps against one target, on one clock, into one run folder."""

    def __init__(self, plan: CapacityPlan, run_dir: Path, target: str, *, model: str | None = None,
                 watch: Callable[[], str | None] | None = None, display=None, scrape: bool = True,
                 driver: str = "aiohttp", workers: int = 1):
        self.plan = plan
        self.driver = driver  # "aiohttp" (this process's replayer) | "locust" (a Locust run per step)
        self.workers = workers  # Locust processes
        self.run_dir = Path(run_dir)
        self.target = target.rstrip("/")
        self.model = model
        self.watch = watch
        self.display = display
        self.scrape = scrape
        self.stopped: str | None = None  # why the run ends early (Ctrl-C, target died)
        self.t0 = 0.0
        self._rep: Replayer | None = None
        self._scraper: Scraper | None = None
        self._metrics_ok = True

    # -------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        req, met = self.run_dir / "requests.jsonl", self.run_dir / "metrics.jsonl"
        for p in (req, met):
            p.unlink(missing_ok=True)
        s = self.plan.scenario
        self.writer = _StepWriter(req)
        self.prog = Progress()
        cfg = ClientConfig(self.target, model=self.model, max_connections=s.max_connections,
                           read_timeout_s=s.read_timeout_s)
        self._rep = Replayer(cfg, self.writer, self.prog)
        await self._rep.open()
        self.model = self._rep.model
        if self.scrape:
            self._scraper = Scraper(self.target, met)
            await asyncio.get_running_loop().run_in_executor(None, self._scraper.start)
        self.t0 = now() + 0.3
        if self._scraper:
            self._scraper.go(self.t0)

    async def close(self) -> None:
        if self._rep is not None:
            await self._rep.close()
        if self._scraper is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._scraper.stop)
            self._scraper = None
        self.writer.close()

    def stop(self, reason: str) -> None:
        """End the run: the step under way is cut, no more steps start."""
        self.stopped = self.stopped or reason
        if self._rep is not None:
            self._rep.stop()

    def clock(self) -> float:
        return now() - self.t0

    # -------------------------------------------------------------- a step

    async def measure(self, load: float, phase: str, index: int, early_stop: bool | None = None) -> StepResult:
        plan = self.plan
        await self._settle()
        dur = plan.step.step_duration_s
        specs = step_specs(plan.scenario, plan.search.axis, load, index, 0.0, dur)  # built before the clock runs
        locust = self.driver == "locust"
        # Locust needs a couple of seconds to start its processes before the first send.
        start = self.clock() + ((3.0 if self.workers > 1 else 2.0) if locust else 0.05)
        for sp in specs:
            sp.arrival_s += start
        st = _StepState(index, load, phase, start, start + plan.step.warmup_s, start + dur, plan.drain_s,
                        Counter(s.tier or "none" for s in specs if start + plan.step.warmup_s <= s.arrival_s))
        rep = self._rep
        rep.cfg.stage = index
        self.writer.step_records = []
        base = (self.prog.sent, self.prog.done, self.prog.errors)
        if self.display:
            self.display.start_step(index, load, phase, dur + st.drain_s)
        es = plan.step.early_stop if early_stop is None else early_stop
        es = es and not locust  # Locust hands its records over only when the step ends
        mon = asyncio.ensure_future(self._monitor(st, es, base))
        wall0 = time.monotonic()
        try:
            if locust:
                await self._run_locust_step(specs, load, index, start, dur)
            elif plan.closed:
                feed = _cycle_until(specs, lambda: self.clock() >= st.w1 or st.early is not None)
                await rep.run(feed, t0=self.t0, concurrency=int(load))
            else:
                await rep.run(_feed(specs, lambda: st.early is not None), t0=self.t0)
        finally:
            mon.cancel()
            await asyncio.gather(mon, return_exceptions=True)
        if rep.abort_reason and not self.stopped:
            self.stopped = rep.abort_reason
        detail = self._detail(st, list(self.writer.step_records), time.monotonic() - wall0)
        margin = detail["margin"] if detail["margin"] is not None else (None if detail["passed"] else math.inf)
        return StepResult(detail["passed"], detail["stopped_early"], detail, margin=margin)

    async def _run_locust_step(self, specs: list[RequestSpec], load: float, index: int, start: float,
                               dur: float) -> None:
        """One step through Locust (its own processes); its records join this run's clock and file."""
        from loadgen.drivers.locust.driver import run_stage

        plan, s = self.plan, self.plan.scenario
        recs = await asyncio.get_running_loop().run_in_executor(None, lambda: run_stage(
            specs, self.target, self.run_dir / "locust" / f"step{index}", stage=index,
            concurrency=int(load) if plan.closed else 0, start_s=start, duration_s=dur if plan.closed else None,
            t0=self.t0, processes=self.workers, model=self.model, max_connections=s.max_connections,
            read_timeout_s=s.read_timeout_s, drain_s=plan.drain_s))
        for rec in recs:
            self.writer.write(rec)

    async def _settle(self) -> None:
        """Wait until the target has nothing running or waiting (two scrapes in a row), at most
        settle_timeout_s; targets without the gauges get half a second."""
        url = self.target + "/metrics"
        deadline = time.monotonic() + self.plan.step.settle_timeout_s
        loop = asyncio.get_running_loop()
        idle = 0
        while self._metrics_ok and time.monotonic() < deadline and not self.stopped:
            try:
                m = await loop.run_in_executor(None, scrape_once, url, ("vllm:num_requests",), 2.0)
            except Exception:  # noqa: BLE001 (no /metrics: fall back to a pause)
                self._metrics_ok = False
                break
            busy = [v for k, v in m.items() if k.startswith(("vllm:num_requests_running",
                                                              "vllm:num_requests_waiting"))]
            if not busy:
                self._metrics_ok = False
                break
            idle = idle + 1 if sum(busy) == 0 else 0
            if idle >= 2:
                return
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)

    async def _monitor(self, st: _StepState, early_stop: bool, base: tuple[int, int, int]) -> None:
        tick = 0
        while True:
            await asyncio.sleep(0.1)
            tick += 1
            t = self.clock()
            in_window = st.w0 <= t < (st.stopped_at if st.early else st.w1)  # it ends at an early stop
            if in_window and self.driver == "aiohttp":  # Locust's in-flight count is not visible from here
                st.inflight.append(self.prog.in_flight)
            if early_stop and st.early is None and t >= st.w0 and tick % 5 == 0:
                reason = self._breach(st, t)
                if reason:
                    st.early, st.stop_reason, st.stopped_at = "breach", reason, t
                    self._rep.stop()
                elif self.plan.step.early_pass and st.phase == "ramp" and t >= st.w0 + self._min_window():
                    reason = self._clear_pass(st, t)
                    if reason:  # stop sending; what is in flight finishes (the drain below still applies)
                        st.early, st.stop_reason, st.stopped_at = "pass", reason, t
            send_end = st.stopped_at if st.early == "pass" else st.w1
            if t >= send_end + st.drain_s and not st.cut:
                st.cut = True
                self._rep.stop()
            if self.watch and tick % 5 == 0:
                why = self.watch()
                if why:
                    self.stop(why)
            if self.display and tick % 2 == 0:
                sent, done, errs = (self.prog.sent - base[0], self.prog.done - base[1], self.prog.errors - base[2])
                recent = list(self.prog.ttft_ms)[-200:]
                p99 = f"  TTFT p99 {np.percentile(recent, 99):.0f} ms" if recent else ""
                self.display.update(t - st.start_s, f"sent {sent}  in flight {self.prog.in_flight}  done {done}  "
                                                     f"errors {errs}{p99}")

    def _min_window(self) -> float:
        return min(2.0, self.plan.step.window_s)  # of steady state after the warm-up, before a clear pass

    def _clear_pass(self, st: _StepState, t: float) -> str | None:
        """Every SLO far from breaking: over the window's settled requests of *all* tiers pooled (at
        least CLEAR_PASS_MIN of them), each SLO's quantile is under pass_margin x its threshold. Pooling
        lets a light load decide early; it is conservative for a prioritised tier (premium is served
        first, so its latencies sit below the pool's)."""
        horizon = max(s.threshold_ms for ss in self.plan.slos.values() for s in ss) / 1000.0
        recs = self.writer.step_records + self._rep.active_records()
        settled = [r for r in recs if st.w0 <= r.scheduled_s <= t - horizon]
        if len(settled) < CLEAR_PASS_MIN:
            return None
        margin = self.plan.step.pass_margin
        worst = 0.0
        for slos in self.plan.slos.values():
            for slo in slos:
                v = _values(settled, slo.metric, t)
                if v.size < CLEAR_PASS_MIN:
                    return None
                ratio = quantile(v, slo.quantile) / slo.threshold_ms
                if not ratio <= margin:
                    return None
                worst = max(worst, ratio)
        return (f"clear pass: every SLO quantile at most {100 * worst:.0f}% of its threshold over "
                f"{len(settled)} settled requests (all tiers pooled)")

    def _breach(self, st: _StepState, t: float) -> str | None:
        recs = self.writer.step_records + self._rep.active_records()
        by_tier: dict[str, list[RequestRecord]] = {}
        for r in recs:
            if st.w0 <= r.scheduled_s < st.w1:
                by_tier.setdefault(r.tier or "none", []).append(r)
        for tier, slos in self.plan.slos.items():
            rs = by_tier.get(tier)
            if not rs:
                continue
            sched = np.asarray([r.scheduled_s for r in rs])
            for slo in slos:
                vals = np.asarray([metric_value(r, slo.metric, t) for r in rs], dtype=float)
                known = ~np.isnan(vals)
                what = f"{tier} p{100 * slo.quantile:g} {slo.metric[:-3].upper()} over {slo.threshold_ms:g} ms"
                if not self.plan.closed and breach_certain(vals[known], st.planned.get(tier, 0), slo):
                    n_over = int((vals[known] > slo.threshold_ms).sum())
                    return (f"{what} whatever follows: {n_over} of {st.planned.get(tier, 0)} planned window "
                            "requests already over")
                settled = known & (sched <= t - slo.threshold_ms / 1000.0)
                if breach_likely(vals[settled], slo, self.plan.step.confidence):
                    return (f"{what} ({100 * self.plan.step.confidence:g}% confidence interval above it, "
                            f"{int(settled.sum())} settled requests)")
        return None

    # -------------------------------------------------------------- the step's figures

    def _detail(self, st: _StepState, records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
        plan = self.plan
        w1 = min(st.w1, st.stopped_at) if st.stopped_at is not None else st.w1  # an early stop ends the window
        window = [r for r in records if st.w0 <= r.scheduled_s < w1]
        win_s = w1 - st.w0
        tiers: dict[str, Any] = {}
        names = list(plan.slos) + sorted({r.tier or "none" for r in window} - set(plan.slos))
        for tier in names:
            rs = [r for r in window if (r.tier or "none") == tier]
            tiers[tier] = _tier_entry(rs, plan.slos.get(tier, []), plan.quantile(tier), plan.step.confidence,
                                      seed=st.index)
        judged = [e["passed"] for e in tiers.values() if e["passed"] is not None]
        margins = [math.inf if j["value_ms_q"] is None else j["value_ms_q"] / j["threshold_ms"]
                   for e in tiers.values() for j in e["judged"].values() if j["n"]]
        passed = bool(judged) and all(judged) and st.early != "breach"
        # metrics of this step: from its start to its end (drain included)
        metrics = [m for m in read_metrics(self.run_dir / "metrics.jsonl")]
        scraped = _scraped(metrics, st.start_s, st.w0, w1, self.clock())
        dicts = [json.loads(r.to_json()) for r in window]
        step_metrics = [m for m in metrics if st.start_s - 1.0 <= m["t"] <= self.clock()]
        summ = summarize(dicts, goodput=plan.scenario.goodput or None, tier_slos=plan.scenario.tier_slos,
                         lateness_bound_ms=plan.lateness_bound_ms, metrics=step_metrics)
        n_ok_tokens = sum(r.output_tokens or 0 for r in window if r.status == "ok")
        arrivals = len(window) / win_s if win_s > 0 else None
        sojourn = [r.done_s - r.scheduled_s for r in window if r.done_s is not None]
        little = arrivals * float(np.mean(sojourn)) if sojourn and arrivals is not None else None
        measured = float(np.mean(st.inflight)) if st.inflight else None
        completed = sum(1 for r in window if r.status == "ok")
        return {
            "index": st.index, "load": st.load, "phase": st.phase, "passed": passed,
            "stopped_early": st.early is not None, "early": st.early, "stop_reason": st.stop_reason,
            # worst judged quantile / threshold (> 1: broken; a lower bound when stopped early); null: inf
            "margin": (max(margins) if math.isfinite(max(margins)) else None) if margins else None,
            "duration_s": round(wall_s, 3), "requests": len(window),
            "window_s": [round(st.w0, 3), round(w1, 3)], "start_s": round(st.start_s, 3),
            "offered_rps": arrivals, "throughput_rps": completed / win_s if win_s > 0 else None,
            "output_tok_s": n_ok_tokens / win_s if win_s > 0 else None,
            "goodput_rps": _goodput(window, plan.slos, win_s),
            "concurrency_littles_law": little, "concurrency_measured": measured,
            "concurrency_agree": None if st.early == "breach" else _agree(little, measured),  # not steady
            "tiers": tiers,
            "breakdown": _breakdown(window, scraped.pop("_hist", None)),
            **scraped,
            "admission_rejections_client": sum(1 for r in window if r.status == "rejected"),
            "cut_at_drain": st.cut and st.early != "breach",
            "valid": bool(summ.get("valid")),
            "load_avg_1m": _loadavg(),  # a busy shared machine slows the target: context for outliers
            "summary": summ,
        }


def _loadavg() -> float | None:
    try:
        import os

        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _tier_entry(rs: list[RequestRecord], slos: list[SLO], q: float, confidence: float, seed: int) -> dict:
    ttft = _values(rs, "ttft_ms")
    j = judge(ttft, SLO("ttft_ms", math.inf, q), confidence, seed=seed)
    ok_ttft = np.asarray([(r.first_token_s - r.scheduled_s) * 1000.0 for r in rs if r.first_token_s is not None])
    entry: dict[str, Any] = {
        "requests": len(rs), "completed": sum(1 for r in rs if r.status == "ok"),
        "quantile": q, "ttft_ms_q": j.value_ms, "ci_low_ms": j.ci_low_ms, "ci_high_ms": j.ci_high_ms,
        "passed": None, "confident": None,
        "p50_ttft_ms": float(np.percentile(ok_ttft, 50)) if ok_ttft.size else None,
        "p99_ttft_ms": float(np.percentile(ok_ttft, 99)) if ok_ttft.size else None,
        "failed": j.failed, "censored": sum(1 for r in rs if r.status == "cancelled" and r.first_token_s is None),
        "slo": [s.as_dict() for s in slos] or None, "judged": {},
    }
    if not slos or not rs:
        return entry
    verdicts = []
    for slo in slos:
        jj = judge(_values(rs, slo.metric), slo, confidence, seed=seed)
        entry["judged"][slo.metric] = {"value_ms_q": jj.value_ms, "ci_low_ms": jj.ci_low_ms,
                                       "ci_high_ms": jj.ci_high_ms, "threshold_ms": slo.threshold_ms,
                                       "passed": jj.passed, "confident": jj.confident, "over": jj.over,
                                       "n": jj.n}
        verdicts.append(jj)
    entry["passed"] = all(v.passed for v in verdicts if v.passed is not None)
    entry["confident"] = all(v.confident for v in verdicts)
    return entry


def _goodput(window: list[RequestRecord], slos: dict[str, list[SLO]], win_s: float) -> float | None:
    """Requests per second of the window that met every SLO of their tier (tiers without one: succeeded)."""
    if win_s <= 0:
        return None
    good = 0
    for r in window:
        if r.status != "ok":
            continue
        if all(metric_value(r, s.metric) <= s.threshold_ms for s in slos.get(r.tier or "none", [])):
            good += 1
    return good / win_s


def _agree(a: float | None, b: float | None) -> bool | None:
    if a is None or b is None:
        return None
    return abs(a - b) <= max(AGREE_REL * max(a, b), AGREE_ABS)


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def _breakdown(window: list[RequestRecord], hist: dict[str, float | None] | None) -> dict[str, Any]:
    """TTFT = queue + prefill + the rest (network + frontend), and decode time, in ms (means over the
    window's successful requests). From per-request server timing when the target sends it, else from
    the scraped histograms' deltas over the step."""
    ok = [r for r in window if r.status == "ok" and r.first_token_s is not None]
    timed = [r for r in ok if r.server and "queue_ms" in r.server and "prefill_ms" in r.server]
    ttft = _mean([(r.first_token_s - r.scheduled_s) * 1000.0 for r in ok])
    if timed:
        q = _mean([r.server["queue_ms"] for r in timed])
        p = _mean([r.server["prefill_ms"] for r in timed])
        d = _mean([r.server["decode_ms"] for r in timed if "decode_ms" in r.server])
        net = _mean([(r.first_token_s - r.scheduled_s) * 1000.0 - r.server["queue_ms"] - r.server["prefill_ms"]
                     for r in timed])
        return {"queue_ms": q, "prefill_ms": p, "network_ms": net, "decode_ms": d, "ttft_ms": ttft,
                "source": "timing", "requests": len(timed)}
    if hist and hist.get("queue_ms") is not None and hist.get("prefill_ms") is not None:
        net = ttft - hist["queue_ms"] - hist["prefill_ms"] if ttft is not None else None
        return {"queue_ms": hist["queue_ms"], "prefill_ms": hist["prefill_ms"], "network_ms": net,
                "decode_ms": hist.get("decode_ms"), "ttft_ms": ttft, "source": "metrics",
                "requests": hist.get("requests")}
    return {"queue_ms": None, "prefill_ms": None, "network_ms": None, "decode_ms": None, "ttft_ms": ttft,
            "source": None}


def _family(sample: dict[str, float], name: str) -> list[float]:
    return [v for k, v in sample.items() if k == name or k.startswith(name + "{")]


def _scraped(metrics: list[dict], start: float, w0: float, w1: float, end: float) -> dict[str, Any]:
    """KV usage, batch fill ratio, server-side in-flight (window means) and admission rejections and
    breakdown histograms (deltas over the whole step) from the scrape."""
    win = [m["metrics"] for m in metrics if w0 <= m["t"] <= w1]
    before = [m["metrics"] for m in metrics if m["t"] <= start]
    during = [m["metrics"] for m in metrics if start < m["t"] <= end]
    first = before[-1] if before else (during[0] if during else None)
    last = during[-1] if during else None

    def mean_of(names: tuple[str, ...], combine) -> float | None:
        vals = []
        for s in win:
            for n in names:
                f = _family(s, n)
                if f:
                    vals.append(combine(f))
                    break
        return float(np.mean(vals)) if vals else None

    out: dict[str, Any] = {
        "kv_usage": mean_of(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), lambda f: float(np.mean(f))),
        "kv_usage_max": None,
        "batch_fill_ratio": mean_of(("slobench:batch_fill_ratio",), sum),
        "server_running": mean_of(("vllm:num_requests_running",), sum),
        "server_waiting": mean_of(("vllm:num_requests_waiting",), sum),
        "admission_rejections": None,
    }
    kv = [max(_family(s, "vllm:kv_cache_usage_perc") or _family(s, "vllm:gpu_cache_usage_perc") or [math.nan])
          for s in win]
    kv = [x for x in kv if not math.isnan(x)]
    out["kv_usage_max"] = max(kv) if kv else None
    hist: dict[str, float | None] = {}
    if first is not None and last is not None:
        rej_a, rej_b = _family(first, "slobench:admission_rejections_total"), _family(last,
                                                                                      "slobench:admission_rejections_total")
        if rej_b:
            out["admission_rejections"] = int(round(sum(rej_b) - sum(rej_a)))
        for k, h in BREAKDOWN_HISTOGRAMS.items():
            ds = sum(_family(last, h + "_sum")) - sum(_family(first, h + "_sum"))
            dc = sum(_family(last, h + "_count")) - sum(_family(first, h + "_count"))
            hist[k] = ds / dc * 1000.0 if dc > 0 else None
            if k == "queue_ms":
                hist["requests"] = int(dc)
    out["_hist"] = hist
    return out
