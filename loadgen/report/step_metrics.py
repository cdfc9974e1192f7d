"""A capacity run's figures per load step, for the report: each step's judged window of records
(``capacity.step_stats.window_records``), its offered load, throughput and every latency's p50 / p99 per
tier, and which steps the rating rests on (the rated load's and the first failing load's).

The offered load of a step is what its window offered the target (``data.offered_load``: the rate
``rated_capacity.rate_rps`` pools). The requested load (what the search asked for) is kept beside it: in a
queueing target the two differ by the draw's luck, and the rating is of the offered one. On the
concurrency axis a step's load is its users, offered as asked. Every latency comes from ``results.latency``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from loadgen.capacity.run import offered_rate
from loadgen.capacity.step_stats import window_records
from loadgen.report import data as d
from loadgen.results import latency

# (key, label): the latencies drawn against load, per tier, successful requests only
METRICS: tuple[tuple[str, str], ...] = (("ttft", "TTFT"), ("ttfot", "TTFOT"), ("tpot", "TPOT"), ("itl", "ITL"),
                                        ("e2el", "E2E latency"))
PER_REQUEST = {"ttft": latency.ttft_ms, "ttfot": latency.ttfot_ms, "tpot": latency.tpot_ms,
               "e2el": latency.e2el_ms}


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def step_windows(run: d.RunData, steps: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Each step's judged records: its stage's records scheduled in its window (``window_s``); a step of an
    older summary without a window gets every record of its stage."""
    if run.requests.empty:
        return {int(s["index"]): [] for s in steps if isinstance(s.get("index"), int)}
    records = [r for r in d.records_of(run.requests) if isinstance(r.get("scheduled_s"), (int, float))]
    out = window_records(steps, records)
    for s in steps:
        i = s.get("index")
        if isinstance(i, int) and i not in out:
            out[i] = [r for r in records if r.get("stage") == i]
    return out


def metric_values(records: list[dict[str, Any]], key: str) -> list[float]:
    """One latency (``METRICS``' key) of the successful requests, in ms: one value per request (ITL: every
    per-token gap, pooled)."""
    ok = [r for r in records if latency.succeeded(r)]
    vals = latency.pooled_itl_ms(ok).tolist() if key == "itl" else [PER_REQUEST[key](r) for r in ok]
    return [float(v) for v in vals if v is not None and math.isfinite(v)]


def latency_quantiles(records: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """{metric: {p50, p99, n}} of the successful requests (ITL: every per-token gap, pooled)."""
    out: dict[str, dict[str, float | None]] = {}
    for key, _ in METRICS:
        vals = metric_values(records, key)
        out[key] = {"p50": latency.percentile(vals, 50), "p99": latency.percentile(vals, 99), "n": len(vals)}
    return out


def has_ttfot(records: list[dict[str, Any]]) -> bool:
    """Whether any answer's first output token came after its first token (a reasoning model): only then
    is TTFOT a figure of its own."""
    for r in records:
        a, b = latency.ttft_ms(r), latency.ttfot_ms(r)
        if a is not None and b is not None and b - a > 1e-6:
            return True
    return False


@dataclass
class StepFigures:
    """One step's figures against load."""

    index: int
    phase: str
    requested: float | None
    offered: float | None
    passed: bool | None
    counted: bool
    stopped_early: bool
    requests: int
    window_s: float | None
    throughput_rps: float | None
    output_tok_s: float | None
    goodput_rps: float | None
    tiers: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)  # tier -> metric -> p50/p99


def step_figures(run: d.RunData, steps: list[dict[str, Any]],
                 windows: dict[int, list[dict[str, Any]]]) -> list[StepFigures]:
    """Every step with an offered load, sorted by it: throughput (the summary's, else from the window) and
    the latency quantiles per tier."""
    axis, _ = d.load_axis(run)
    out = []
    for s in steps:
        x = d.offered_load(s, axis)
        i = s.get("index")
        if x is None or not isinstance(i, int):
            continue
        recs = windows.get(i, [])
        w = s.get("window_s")
        span = float(w[1] - w[0]) if isinstance(w, (list, tuple)) and len(w) == 2 and w[1] > w[0] else None
        ok = [r for r in recs if latency.succeeded(r)]
        thr = _num(s.get("throughput_rps"))
        tok = _num(s.get("output_tok_s"))
        if thr is None and span:
            thr = len(ok) / span
        if tok is None and span:
            tok = sum(latency.output_tokens(r) for r in ok) / span
        tiers = {}
        for tier in sorted({str(r.get("tier") or "none") for r in recs}):
            tiers[tier] = latency_quantiles([r for r in recs if str(r.get("tier") or "none") == tier])
        out.append(StepFigures(i, str(s.get("phase") or ""), _num(s.get("load")), x, s.get("passed"),
                               s.get("counted") is not False, bool(s.get("stopped_early")), len(recs), span, thr, tok,
                               _num(s.get("goodput_rps")), tiers))
    out.sort(key=lambda f: (f.offered, f.index))
    return out


@dataclass
class ReferenceSteps:
    """The steps a distribution is drawn at: the rated load's and the first failing load's."""

    label: str  # "rated" | "first failing"
    steps: list[int]
    requested: float | None
    offered: float | None  # the steps' offered rates pooled over their windows (as rate_rps is)
    records: list[dict[str, Any]]


def reference_steps(run: d.RunData, steps: list[dict[str, Any]],
                    windows: dict[int, list[dict[str, Any]]]) -> list[ReferenceSteps]:
    """The rated load's passing steps (``rated_capacity.steps``) and the first failing load's failing
    steps (``first_fail_load``; the ones the verdict rests on where the summary names them): the windows the
    verdict rests on, either side of the capacity. Without a rating, the lowest failing load's."""
    s = run.summary
    axis, _ = d.load_axis(run)
    by_index = {st["index"]: st for st in steps if isinstance(st.get("index"), int)}
    counted = [st for st in by_index.values() if st.get("counted") is not False]
    rc = s.get("rated_capacity") if isinstance(s.get("rated_capacity"), dict) else {}
    rated_ix = [i for i in (rc.get("steps") or ([rc["step"]] if isinstance(rc.get("step"), int) else []))
                if i in by_index]
    if not rated_ix and _num(rc.get("load")) is not None:
        rated_ix = [st["index"] for st in counted if st.get("passed") is True and st.get("load") == rc["load"]]
    failing = [st for st in counted if st.get("passed") is False and _num(st.get("load")) is not None]
    fail_load = _num(s.get("first_fail_load"))
    if fail_load is None and failing:
        above = [st["load"] for st in failing if _num(rc.get("load")) is None or st["load"] > rc["load"]]
        fail_load = min(above) if above else None
    fail_ix = [st["index"] for st in failing if fail_load is not None and math.isclose(st["load"], fail_load)]
    deciding = (s.get("lateness") or {}).get("deciding_steps") if isinstance(s.get("lateness"), dict) else None
    if isinstance(deciding, list) and set(fail_ix) & set(deciding):
        fail_ix = [i for i in fail_ix if i in deciding]
    out = []
    for label, ix in (("rated", rated_ix), ("first failing", fail_ix)):
        if not ix:
            continue
        details = [by_index[i] for i in ix]
        offered = (offered_rate(details) if axis != "concurrency" else None) or None
        if offered is None:
            xs = [x for st in details if (x := d.offered_load(st, axis)) is not None]
            offered = sum(xs) / len(xs) if xs else None
        out.append(ReferenceSteps(label, sorted(ix), _num(details[0].get("load")), offered,
                                  [r for i in sorted(ix) for r in windows.get(i, [])]))
    return out
