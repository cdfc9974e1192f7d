"""The figures of one measured capacity step: each tier's SLO judgement on the step's window, the
breakdown, concurrency (Little's law and measured), goodput, and what the target's ``/metrics`` said
over the step. Every latency comes from ``results.latency``; every judgement from ``results.slo``."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadgen.capacity.settings import CapacitySettings
from loadgen.results import latency
from loadgen.results.outcomes import outcome_counts, within_shed_budget
from loadgen.results.records import RequestRecord
from loadgen.results.scraped import breakdown_histogram_means, family
from loadgen.results.sequential import clusters
from loadgen.results.server_metrics import VLLM, ServerMetrics, detect
from loadgen.results.slo import SLO, judge
from loadgen.results.summary import summarize

AGREE_REL = 0.10  # Little's law vs measured in-flight: relative agreement ...
AGREE_ABS = 0.25  # ... or this many requests apart (tiny concurrencies)


@dataclass
class StepWindow:
    """What happened in one step, on the run's clock (the inputs of ``step_detail``)."""

    index: int
    load: float
    phase: str
    start_s: float
    w0: float  # the judged window: requests scheduled in [w0, w1)
    w1: float
    inflight: list[int] = field(default_factory=list)  # measured in-flight counts over the window
    early: str | None = None  # "breach" | "pass" | None: the step stopped before its cap
    stop_reason: str | None = None
    stopped_at: float | None = None  # an early stop ends the window here
    cut: bool = False  # requests still in flight at the end of the drain were cancelled
    steady: bool | None = None  # the in-flight count settled before the window (False: still rising at the cap; None:
    #                             not measured, the warm-up floor)
    decision: str | None = None  # "breach" | "pass": what decided the step (None: the cap, point estimate)
    decided_by: str = "cap"  # "certain" | "confidence" | "clear_pass" | "cap"
    samples: dict[str, dict[str, int]] = field(default_factory=dict)  # tier -> SLO metric -> requests deciding
    looks: int = 0  # the sequential test's looks
    loop_lag_ms: list[float] = field(default_factory=list)  # how late the monitor's 0.1 s sleeps woke
    arrivals: list[float] = field(default_factory=list)  # open loop: every request's scheduled time, sent or not

    def planned_rps(self) -> float | None:
        """The rate the step's arrivals offer over its whole planned window, [w0, w1), however early it
        stopped. A step stopped at a breach stops *because* a burst filled its window's first seconds, so
        the rate of what it sent until then overstates its load; this is the load its draw was going to put
        on the target, decided before the step started. None without a schedule (closed loop, conversations)."""
        if not self.arrivals or self.w1 <= self.w0:
            return None
        return sum(1 for a in self.arrivals if self.w0 <= a < self.w1) / (self.w1 - self.w0)

    @property
    def window_end(self) -> float:
        return min(self.w1, self.stopped_at) if self.stopped_at is not None else self.w1


def step_detail(settings: CapacitySettings, st: StepWindow, records: Sequence[RequestRecord], metrics: list[dict],
                clock_s: float, wall_s: float) -> dict[str, Any]:
    """The step's entry in ``summary.json["steps"]`` (``metrics``: the run's scrape so far)."""
    w1 = st.window_end
    window = [r for r in records if st.w0 <= r.scheduled_s < w1]
    win_s = w1 - st.w0
    names = list(settings.slos) + sorted({r.tier or "none" for r in window} - set(settings.slos))
    tiers = {tier: tier_entry([r for r in window if (r.tier or "none") == tier], settings.slos.get(tier, []),
                              settings.quantile(tier), settings.step.confidence, seed=st.index,
                              decluster_run=settings.step.decluster_run) for tier in names}
    judged = [e["passed"] for e in tiers.values() if e["passed"] is not None]
    margins = [math.inf if j["value_ms_q"] is None else j["value_ms_q"] / j["threshold_ms"]
               for e in tiers.values() for j in e["judged"].values() if j["n"]]
    passed = bool(judged) and all(judged) and st.early != "breach"
    scraped = scraped_step_metrics(metrics, st.start_s, st.w0, w1, clock_s,
                                   max_num_seqs=settings.scenario.engine.get("max_num_seqs"))
    hist = scraped.pop("breakdown_histograms")
    step_metrics = [m for m in metrics if st.start_s - 1.0 <= m["t"] <= clock_s]
    summ = summarize([json.loads(r.to_json()) for r in window], goodput=settings.scenario.goodput or None,
                     tier_slos=settings.scenario.tier_slos, lateness_bound_ms=settings.lateness_bound_ms,
                     metrics=step_metrics)
    ok = [r for r in window if latency.succeeded(r)]
    arrivals = len(window) / win_s if win_s > 0 else None
    sent = sum(1 for r in window if r.sent_s is not None and st.w0 <= r.sent_s < w1)
    disturbed, disturbance, lag = disturbance_of(summ, st.loop_lag_ms, settings.lateness_bound_ms)
    sojourn = [s for r in window if (s := latency.sojourn_s(r)) is not None]
    little = arrivals * float(np.mean(sojourn)) if sojourn and arrivals is not None else None
    measured = float(np.mean(st.inflight)) if st.inflight else None
    return {
        "index": st.index, "load": st.load, "phase": st.phase, "passed": passed,
        "stopped_early": st.early is not None, "early": st.early, "stop_reason": st.stop_reason,
        # worst judged quantile (or mean) / threshold (> 1: broken; a lower bound when stopped early); null: inf
        "margin": (max(margins) if math.isfinite(max(margins)) else None) if margins else None,
        "duration_s": round(wall_s, 3), "requests": len(window),
        "window_s": [round(st.w0, 3), round(w1, 3)], "start_s": round(st.start_s, 3),
        "decided_by": st.decided_by, "decision": st.decision, "looks": st.looks,
        "samples": st.samples or {t: {m: j["n"] for m, j in e["judged"].items()} for t, e in tiers.items()
                                  if e["judged"]},
        "warmup_s": round(st.w0 - st.start_s, 3), "steady": st.steady,
        "disturbed": disturbed, "disturbance": disturbance, "loop_lag_ms": lag,
        "offered_rps": sent / win_s if win_s > 0 else None, "scheduled_rps": arrivals,
        "planned_rps": st.planned_rps(),
        "throughput_rps": len(ok) / win_s if win_s > 0 else None,
        "output_tok_s": sum(r.output_tokens or 0 for r in ok) / win_s if win_s > 0 else None,
        "goodput_rps": goodput_rps(window, settings.slos, win_s),
        "concurrency_littles_law": little, "concurrency_measured": measured,
        "concurrency_agree": None if st.early == "breach" else agree(little, measured),  # not steady
        "tiers": tiers,
        "breakdown": latency.breakdown(window, hist),
        **scraped,
        "admission_rejections_client": sum(1 for r in window if r.status == "rejected"),
        "cut_at_drain": st.cut and st.early != "breach",
        "valid": bool(summ.get("valid")),
        "load_avg_1m": load_avg(),  # a busy shared machine slows the target: context for outliers
        "summary": summ,
    }


def disturbance_of(summ: dict, lag_ms: Sequence[float], bound_ms: float) -> tuple[bool, str | None, dict]:
    """(disturbed, why, loop lag figures): the load generator fell behind in the step, its client p99
    lateness or the event loop's p99 lag (how late a 0.1 s sleep woke) over ``bound_ms``."""
    lag = {"p50": latency.percentile(lag_ms, 50), "p99": latency.percentile(lag_ms, 99),
           "max": max(lag_ms) if lag_ms else None}
    why = []
    late = (summ.get("client_lateness") or {}).get("p99_ms")
    if late is not None and late > bound_ms:
        why.append(f"client p99 lateness {late:.1f} ms over the {bound_ms:g} ms bound")
    if lag["p99"] is not None and lag["p99"] > bound_ms:
        why.append(f"event-loop p99 lag {lag['p99']:.1f} ms over the {bound_ms:g} ms bound")
    return bool(why), "; ".join(why) or None, lag


def load_avg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def tier_entry(rs: list[RequestRecord], slos: list[SLO], q: float, confidence: float, seed: int,
               decluster_run: int = 0) -> dict:
    """One tier's window: the TTFT quantile the search looks at (failed requests at ``inf``), each judged
    SLO with its confidence interval (a mean SLO: ``value_ms_q`` is the mean, ``statistic: mean``), its
    requests over the threshold (``over``) and the runs they come in (``runs``: exceedances at most
    ``decluster_run`` requests apart in scheduled order are one run; the rating's interval reads the
    windows' mean run as a floor on their dispersion), and the successful requests' p50 / p99 TTFT."""
    j = judge(latency.slo_values(rs, "ttft_ms"), SLO("ttft_ms", math.inf, q), confidence, seed=seed)
    ok_ttft = [latency.ttft_ms(r) for r in rs if latency.succeeded(r)]
    entry: dict[str, Any] = {
        "requests": len(rs), "completed": sum(1 for r in rs if latency.succeeded(r)),
        "quantile": q, "ttft_ms_q": j.value_ms, "ci_low_ms": j.ci_low_ms, "ci_high_ms": j.ci_high_ms,
        "passed": None, "confident": None,
        "p50_ttft_ms": latency.percentile(ok_ttft, 50), "p99_ttft_ms": latency.percentile(ok_ttft, 99),
        "failed": j.failed, "censored": sum(1 for r in rs if r.status == "cancelled" and r.first_token_s is None),
        "slo": [s.as_dict() for s in slos] or None, "judged": {},
        "outcomes": outcome_counts(rs, {s.metric: s.threshold_ms for s in slos if not s.is_mean}),
    }
    if not slos or not rs:
        return entry
    verdicts = []
    # the shed budget: the refusals it allows are reported (outcomes) but not judged
    in_order = within_shed_budget(sorted(rs, key=lambda r: r.scheduled_s), max(s.max_shed for s in slos))
    entry["shed_unjudged"] = len(rs) - len(in_order)
    for slo in slos:
        values = latency.slo_values(in_order, slo.metric)
        jj = judge(values, slo, confidence, seed=seed)
        entry["judged"][slo.metric] = {"value_ms_q": jj.value_ms, "ci_low_ms": jj.ci_low_ms,
                                       "ci_high_ms": jj.ci_high_ms, "threshold_ms": slo.threshold_ms,
                                       "quantile": None if slo.is_mean else slo.quantile, "passed": jj.passed,
                                       "confident": jj.confident, "over": jj.over, "n": jj.n,
                                       "runs": clusters(values > slo.threshold_ms, decluster_run)}
        if slo.is_mean:  # value_ms_q (and its interval) is the window's mean; a failed request makes it inf
            entry["judged"][slo.metric]["statistic"] = "mean"
        verdicts.append(jj)
    entry["passed"] = all(v.passed for v in verdicts if v.passed is not None)
    entry["confident"] = all(v.confident for v in verdicts)
    return entry


def goodput_rps(window: Sequence[RequestRecord], slos: dict[str, list[SLO]], win_s: float) -> float | None:
    """Requests per second of the window that met every SLO of their tier (tiers without one: succeeded).
    A mean SLO is no request's to meet: it is left out."""
    if win_s <= 0:
        return None
    good = sum(1 for r in window
               if latency.meets(r, {s.metric: s.threshold_ms for s in slos.get(r.tier or "none", []) if not s.is_mean}))
    return good / win_s


def agree(a: float | None, b: float | None) -> bool | None:
    if a is None or b is None:
        return None
    return abs(a - b) <= max(AGREE_REL * max(a, b), AGREE_ABS)


def scraped_step_metrics(metrics: list[dict], start: float, w0: float, w1: float, end: float,
                         max_num_seqs: int | None = None) -> dict[str, Any]:
    """KV usage, batch fill ratio, server-side in-flight (window means), admission rejections (delta
    over the whole step) and the breakdown histograms' means (``breakdown_histograms``, deltas over the
    whole step) from the scrape, in the names of the server the page is from (``results.server_metrics``).
    ``max_num_seqs``: the target's batch slots where its page does not say (vLLM, TGI), for the fill ratio."""
    win = [m["metrics"] for m in metrics if w0 <= m["t"] <= w1]
    before = [m["metrics"] for m in metrics if m["t"] <= start]
    during = [m["metrics"] for m in metrics if start < m["t"] <= end]
    first = before[-1] if before else (during[0] if during else None)
    last = during[-1] if during else None
    srv = next((s for s in (detect(x) for x in [*win[-1:], *during[-1:]]) if s), None) or VLLM

    def mean_of(names: tuple[str, ...], combine) -> float | None:
        vals = []
        for s in win:
            for n in names:
                f = family(s, n)
                if f:
                    vals.append(combine(f))
                    break
        return float(np.mean(vals)) if vals else None

    kv_names = srv.kv_usage
    kv = [max(next((f for n in kv_names if (f := family(s, n))), [math.nan])) for s in win]
    kv = [x for x in kv if not math.isnan(x)]
    fill, fill_source = batch_fill(win, srv, max_num_seqs)
    out: dict[str, Any] = {
        "kv_usage": mean_of(kv_names, lambda f: float(np.mean(f))) if kv_names else None,
        "kv_usage_max": max(kv) if kv else None,
        "batch_fill_ratio": fill,
        "batch_fill_source": fill_source,
        "server_running": mean_of((srv.running,), sum) if srv.running else None,
        "server_waiting": mean_of((srv.waiting,), sum) if srv.waiting else None,
        "admission_rejections": None,
        "preemptions": None,
        "breakdown_histograms": {},
    }
    if first is not None and last is not None:
        for name in srv.preemptions:  # the reference engine's is vLLM's, under the same name
            if family(last, name):
                out["preemptions"] = int(round(sum(family(last, name)) - sum(family(first, name))))
                break
        rejected = family(last, "slobench:admission_rejections_total")
        if rejected:
            out["admission_rejections"] = int(round(sum(rejected) - sum(family(first,
                                                                            "slobench:admission_rejections_total"))))
        out["breakdown_histograms"] = breakdown_histogram_means(first, last, srv)
    return out



def batch_fill(win: list[dict], srv: ServerMetrics, max_num_seqs: int | None) -> tuple[float | None, str | None]:
    """(mean batch fill ratio over the window samples, where it came from): the reference engine's
    ``slobench:batch_fill_ratio`` (tiers summed); else the server's running gauge over its batch capacity:
    a gauge of it on the page (SGLang's ``max_running_requests``, TRT-LLM's ``max_batch_size_runtime``),
    else ``max_num_seqs`` (the scenario's ``engine.max_num_seqs``: vLLM and TGI do not expose theirs)."""
    own = [sum(f) for s in win if (f := family(s, "slobench:batch_fill_ratio"))]
    if own:
        return float(np.mean(own)), "slobench:batch_fill_ratio"
    if not srv.running:
        return None, None
    vals, source = [], None
    for s in win:
        running = family(s, srv.running)
        if not running:
            continue
        cap_name = next((n for n in srv.max_running if family(s, n)), None)
        cap = sum(family(s, cap_name)) if cap_name else (max_num_seqs or 0)
        if cap > 0:
            vals.append(sum(running) / cap)
            source = f"{srv.running} / {cap_name}" if cap_name else f"{srv.running} / engine.max_num_seqs ({cap})"
    return (float(np.mean(vals)), source) if vals else (None, None)


def window_records(steps: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]]) -> dict[int, list]:
    """Each step's judged records, from a run's summary steps and ``requests.jsonl``: its stage's records
    scheduled inside its window."""
    win = {}
    for st in steps:
        w = st.get("window_s")
        if isinstance(st.get("index"), int) and isinstance(w, Sequence) and len(w) == 2:
            win[st["index"]] = (float(w[0]), float(w[1]))
    out: dict[int, list] = {i: [] for i in win}
    for r in records:
        i = r.get("stage")
        if i in win and win[i][0] <= r.get("scheduled_s", -math.inf) < win[i][1]:
            out[i].append(r)
    return out
