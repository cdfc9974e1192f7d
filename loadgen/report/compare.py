"""Side-by-side numbers for two runs (A = baseline, B = candidate), with deltas and their direction."""

from __future__ import annotations

from typing import Any

from loadgen.gate import MISSING, is_number, rated_step, resolve
from loadgen.report import data as d
from loadgen.report.capacity_page import rated_tier_table

# (metric as the gate names it, True when higher is better)
HEADLINE: tuple[tuple[str, bool | None], ...] = (
    ("verdict", None),
    ("rated_capacity.rate_rps", True),
    ("rated_capacity.spec_rate_rps", True),
    ("rated_capacity.concurrency", True),
    ("rated_capacity.output_tok_s", True),
    ("request_throughput", True),
    ("output_throughput", True),
    ("request_goodput", True),
    ("mean_ttft_ms", False),
    ("median_ttft_ms", False),
    ("p90_ttft_ms", False),
    ("p99_ttft_ms", False),
    ("median_tpot_ms", False),
    ("p99_tpot_ms", False),
    ("median_itl_ms", False),
    ("p99_itl_ms", False),
    ("median_e2el_ms", False),
    ("p99_e2el_ms", False),
    ("error_rate", False),
    ("lateness_p99_ms", False),
    ("valid", None),
)


def _delta(a: Any, b: Any, higher_better: bool | None) -> dict[str, Any]:
    if not (is_number(a) and is_number(b)):
        return {"delta": None, "pct": None, "cls": "" if a == b else ("worse" if higher_better is None and
                                                                     a is True and b is False else "")}
    delta = b - a
    pct = 100.0 * delta / abs(a) if a else None
    cls = ""
    if higher_better is not None and abs(delta) > 1e-12:
        cls = "better" if (delta > 0) == higher_better else "worse"
    return {"delta": delta, "pct": pct, "cls": cls}


def headline_rows(a: d.RunData, b: d.RunData) -> list[dict[str, Any]]:
    rows = []
    for metric, hb in HEADLINE:
        va, _ = resolve(a.summary, metric)
        vb, _ = resolve(b.summary, metric)
        va = None if va is MISSING else va
        vb = None if vb is MISSING else vb
        if va is None and vb is None:
            continue
        if isinstance(va, (dict, list)) or isinstance(vb, (dict, list)):
            continue
        rows.append({"metric": metric, "a": va, "b": vb, **_delta(va, vb, hb)})
    return rows


def _tier_table(run: d.RunData) -> list[dict[str, Any]]:
    """A capacity run's per-tier figures at its rated load (its loads pooled would be no load at all), else
    the whole run's."""
    if run.is_capacity:
        rated = rated_tier_table(run)
        if rated is not None:
            return rated
    return d.tier_table(run)


def tier_rows(a: d.RunData, b: d.RunData) -> list[dict[str, Any]]:
    """Per tier, A against B: at each capacity run's rated load, else over the whole run."""
    ta = {r["tier"]: r for r in _tier_table(a)}
    tb = {r["tier"]: r for r in _tier_table(b)}
    rows = []
    for tier in sorted(set(ta) | set(tb)):
        for key in ("requests", "p50_ttft_ms", "p99_ttft_ms", "p50_itl_ms", "p99_itl_ms", "slo_attainment"):
            va, vb = (ta.get(tier) or {}).get(key), (tb.get(tier) or {}).get(key)
            if va is None and vb is None:
                continue
            hb = None if key == "requests" else key == "slo_attainment"
            rows.append({"tier": tier, "metric": key, "a": va, "b": vb, **_delta(va, vb, hb)})
    return rows


def reference_step(run: d.RunData, steps: list[dict]) -> dict | None:
    """The step to compare two runs at: the rated one for a capacity run, else the busiest one."""
    if not steps:
        return None
    rs = rated_step({"steps": steps}) if run.is_capacity else None
    if rs is not None:
        return rs
    return max(steps, key=lambda s: s.get("requests") or 0)
