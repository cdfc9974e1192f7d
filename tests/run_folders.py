"""Builders of recorded run folders (records + metrics + summary), for the tests of what reads them: the
report, the gate, the outputs, the planner's prediction.

``make_capacity_run`` writes a capacity search (ramp then bisect) with two tiers whose TTFT grows with
load; ``make_fixed_run`` a single-level ``slobench run``. Both use the record and summary contracts of
docs/ARCHITECTURE.md, so the report code is tested against what the measuring code writes.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from loadgen.capacity import rating
from loadgen.results import latency
from loadgen.results.summary import summarize

XSS = '</script><img src=x onerror="alert(1)"><script>alert(2)</script> & \u2028'


def _record(i: int, stage: int, tier: str, t: float, ttft_ms: float, *, status: str = "ok", tokens: int = 8,
            itl_ms: float = 20.0, error: str | None = None, timing: bool = True) -> dict[str, Any]:
    if status != "ok":
        return {"id": f"r{i}", "stage": stage, "tier": tier, "scheduled_s": round(t, 6), "sent_s": round(t + 0.0005, 6),
                "first_token_s": None, "token_s": [], "done_s": round(t + 0.01, 6), "prompt_tokens": 32,
                "output_tokens": None, "status": status, "http_status": 429 if status == "rejected" else
                (500 if status == "http_error" else None), "error": error, "server": None}
    first = t + ttft_ms / 1000.0
    ts = [round(first + k * itl_ms / 1000.0, 6) for k in range(tokens)]
    q = ttft_ms * 0.4
    server = {"queue_ms": round(q, 3), "prefill_ms": round(ttft_ms * 0.5, 3),
              "decode_ms": round((tokens - 1) * itl_ms, 3)} if timing else None
    return {"id": f"r{i}", "stage": stage, "tier": tier, "scheduled_s": round(t, 6), "sent_s": round(t + 0.0004, 6),
            "first_token_s": ts[0], "token_s": ts, "done_s": ts[-1], "prompt_tokens": 32, "output_tokens": tokens,
            "status": "ok", "http_status": 200, "error": None, "server": server}


def _metric_lines(duration: float, tiers: list[str], load_at) -> list[dict[str, Any]]:
    out, gen, rej = [], 0.0, {t: 0.0 for t in tiers}
    for k in range(int(duration) + 2):
        t = float(k)
        load = load_at(t)
        gen += 40.0 * load
        m: dict[str, float] = {
            'vllm:num_requests_running{model_name="tiny"}': min(8.0, load),
            'vllm:kv_cache_usage_perc{model_name="tiny"}': min(1.0, 0.05 * load),
            'vllm:generation_tokens_total{model_name="tiny"}': gen,
        }
        for tier in tiers:
            lab = f'model_name="tiny",tier="{tier}"'
            rej[tier] += max(0.0, load - 6.0)
            m[f"slobench:batch_fill_ratio{{{lab}}}"] = min(1.0, load / 16.0)
            m[f"slobench:kv_cache_usage_perc{{{lab}}}"] = min(0.5, 0.025 * load)
            m[f"slobench:output_tokens_per_second{{{lab}}}"] = 20.0 * load
            m[f"slobench:admission_rejections_total{{{lab}}}"] = rej[tier]
        out.append({"t": t, "metrics": m})
    out.insert(2, {"t": 1.5, "error": "URLError: refused"})
    return out


def write_run(path: Path, records: list[dict], summary: dict | None, metrics: list[dict] | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "requests.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    if metrics is not None:
        with open(path / "metrics.jsonl", "w") as f:
            for m in metrics:
                f.write(json.dumps(m) + "\n")
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary, indent=2))
    return path


META = {"driver": "aiohttp", "target": "http://127.0.0.1:9/<b>target</b>", "started_at": "2025-01-01T00:00:00+00:00",
        "versions": {"slobench": "0.1.0", "python": "3.11"}, "git_commit": "0123456789abcdef",
        "machine": {"cpus": 2, "host": "ci"}}


def _judged(recs: list[dict], thr: float, q: float) -> dict[str, Any]:
    """A step's judgement of one TTFT SLO, as ``capacity.step_stats.tier_entry`` writes it (its counts)."""
    vals = latency.slo_values(recs, "ttft_ms")
    value = latency.quantile(vals, q) if vals.size else None
    value = None if value is None or math.isinf(value) else value
    return {"value_ms_q": value, "threshold_ms": thr, "quantile": q, "passed": value is not None and value <= thr,
            "over": int((vals > thr).sum()), "n": int(vals.size), "runs": int((vals > thr).sum() > 0)}


def make_capacity_run(path: Path, *, knee: float = 8.0, scale: float = 1.0, error_text: str = XSS,
                      metrics: bool = True, seed: int = 0, axis: str = "rate") -> Path:
    """A capacity search whose premium p99 TTFT crosses 300 ms at about ``knee`` req/s (x ``scale``): with the
    defaults rated at 10 req/s (steps 5), first failing at 12 (step 4), the rating's interval from
    ``capacity.rating.rate`` over the steps' counts. Each step's window is its whole stage."""
    rng = random.Random(seed)
    loads = [2.0, 4.0, 8.0, 16.0, 12.0, 10.0, 9.0]
    phases = ["ramp"] * 4 + ["bisect"] * 3
    slo = {"premium": {"metric": "ttft_ms", "quantile": 0.99, "threshold_ms": 300.0},
           "standard": {"metric": "ttft_ms", "quantile": 0.99, "threshold_ms": 800.0}, "basic": None}
    tier_slos = {t: {"ttft_ms": v["threshold_ms"]} for t, v in slo.items() if v}
    records, steps, t0, i = [], [], 0.0, 0
    step_dur = 3.0
    for idx, (load, phase) in enumerate(zip(loads, phases, strict=True)):
        n = int(load * step_dur)
        recs = []
        for k in range(n):
            tier = ("premium", "standard", "basic")[k % 3]
            base = 50.0 * (1.0 + (load / (knee * scale)) ** 4) * (1.0 if tier == "premium" else 1.3)
            ttft = base * rng.uniform(0.7, 1.3)
            t = t0 + k / load
            if load >= 16 and k % 7 == 0:
                recs.append(_record(i, idx, tier, t, 0, status="rejected", error=error_text))
            elif load >= 16 and k % 11 == 0:
                recs.append(_record(i, idx, tier, t, 0, status="http_error", error="upstream <b>500</b>"))
            else:
                recs.append(_record(i, idx, tier, t, ttft))
            i += 1
        records += recs
        s = summarize(recs, tier_slos=tier_slos)
        tiers = {}
        for tier in ("premium", "standard", "basic"):
            e = (s.get("tiers") or {}).get(tier, {})
            p99 = e.get("p99_ttft_ms")
            thr = (slo[tier] or {}).get("threshold_ms")
            mine = [r for r in recs if r["tier"] == tier]
            tiers[tier] = {"requests": e.get("requests", 0), "quantile": 0.99, "ttft_ms_q": p99,
                           "ci_low_ms": p99 * 0.9 if p99 else None, "ci_high_ms": p99 * 1.1 if p99 else None,
                           "passed": None if thr is None else (p99 is not None and p99 <= thr),
                           "p50_ttft_ms": e.get("median_ttft_ms"), "p99_ttft_ms": p99,
                           "judged": {"ttft_ms": _judged(mine, thr, 0.99)} if thr else {}}
        ok = [r for r in recs if r["status"] == "ok"]
        passed = all(v["passed"] is not False for v in tiers.values())
        steps.append({"index": idx, "load": load, "phase": phase, "passed": passed, "stopped_early": load >= 16,
                      "duration_s": step_dur, "requests": n, "tiers": tiers, "counted": True,
                      "window_s": [round(t0, 3), round(t0 + step_dur, 3)], "offered_rps": n / step_dur,
                      "planned_rps": n / step_dur, "throughput_rps": len(ok) / step_dur,
                      "output_tok_s": 8 * len(ok) / step_dur, "goodput_rps": len(ok) / step_dur,
                      "breakdown": {"mean_queue_ms": 20.0 * load, "mean_prefill_ms": 30.0, "mean_network_ms": 2.0,
                                    "mean_decode_ms": 140.0, "source": "server timing"},
                      "kv_usage": 0.05 * load, "batch_fill_ratio": min(1.0, load / 16), "admission_rejections":
                      0 if load < 16 else 5, "summary": s})
        t0 += step_dur + 0.5
    passing = [s["load"] for s in steps if s["passed"]]
    rated = max(passing) if passing else None
    failing = [s["load"] for s in steps if not s["passed"] and (rated is None or s["load"] > rated)]
    first_fail = min(failing) if failing else None
    rated_steps = [s["index"] for s in steps if s["load"] == rated]
    interval = rating.rate(steps, axis) if rated else None
    rc = None
    if rated:
        rc = {"rate_rps": rated, "requested_rps": rated, "concurrency": rated * 0.2,
              "concurrency_littles_law": rated * 0.2, "concurrency_measured": rated * 0.21, "concurrency_agree": True,
              "output_tok_s": rated * 8, "spec_rate_rps": rated * 0.8, "load": rated, "window_s": 2.5, "axis": axis,
              "step": rated_steps[-1], "steps": rated_steps, "lower_bound": False}
        if interval:
            rc.update(estimate=interval["estimate"], ci_low=interval["ci_low"], ci_high=interval["ci_high"],
                      ci_of=interval["of"], confidence=interval["confidence"], boundary=interval["boundary"],
                      binding=interval["binding"], interval=interval)
    deciding = [s["index"] for s in steps if s["load"] in (rated, first_fail)]
    summary = {
        "kind": "capacity", "run_id": path.name, "scenario": {"name": "chat<script>", "path": "scenarios/chat.yaml"},
        **META, "duration_s": t0, "verdict": "rated" if rated else "never_met",
        "verdict_text": f"rated capacity {rated} req/s (the search's words)" if rated else "the SLO was never met",
        "axis": axis, "slo": slo, "slos": {t: [v] for t, v in slo.items() if v}, "headroom": 0.2,
        "rated_capacity": rc, "first_fail_load": first_fail,
        "steps": steps, "valid": True,
        "lateness": {"p50_ms": 0.3, "p99_ms": 1.2, "bound_ms": 10.0, "deciding_steps": deciding},
    }
    return write_run(path, records, summary,
                     _metric_lines(t0, ["premium", "standard", "basic"],
                                   lambda t: loads[min(len(loads) - 1, int(t // (step_dur + 0.5)))])
                     if metrics else None)


def make_fixed_run(path: Path, *, n: int = 200, ttft_ms: float = 80.0, fail_all: bool = False,
                   error_text: str = XSS, metrics: bool = True, summary: bool = True, seed: int = 0,
                   timing: bool = True, kind: str = "run") -> Path:
    rng = random.Random(seed)
    recs = []
    for k in range(n):
        tier = ("premium", "standard")[k % 2]
        if fail_all:
            recs.append(_record(k, 0, tier, k * 0.05, 0, status="conn_error" if k % 2 else "rejected",
                                error=error_text))
        else:
            recs.append(_record(k, 0, tier, k * 0.05, ttft_ms * rng.uniform(0.8, 1.2), timing=timing))
    s = summarize(recs, tier_slos={"premium": {"ttft_ms": 300.0}})
    s.update(kind=kind, run_id=path.name, scenario="loadgen/scenarios/chat.yaml", **META)
    return write_run(path, recs, s if summary else None,
                     _metric_lines(n * 0.05, ["premium", "standard"], lambda t: 4.0) if metrics else None)


def make_empty_run(path: Path) -> Path:
    s = summarize([])
    s.update(kind="run", run_id=path.name)
    return write_run(path, [], s, [])
