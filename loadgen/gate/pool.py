"""Several runs of one side of a gate as one summary: repeated runs gate on what they share.

A single capacity run's rating near a wide knee moves by several percent from seed to seed, and its
interval says so: wide enough that two single runs rarely flag unchanged code, and too wide to see a drop of
a tenth. Repeating the runs narrows what each side knows:

- ``rated_capacity``: the mean of the runs' ratings (``rate_rps``, ``estimate``, ``concurrency`` and the
  spec capacities made of them) with the interval of a mean of independent estimates: each side's
  half-width is √(Σ hᵢ²) / n, the runs' own half-widths hᵢ (so three runs of equal intervals give one 1/√3
  as wide). Only when every run has an interval of the same field; otherwise the pooled side has none and
  the rule falls back to its ratio.
- every other number: the median of the runs that have it (a latency, a rate: one odd run does not move
  it), except the sample counts (``completed``, ``requests``): the smallest, so ``min_samples`` still
  holds for each run; ``failed`` is set so that failed / requests is the median of the runs' error rates;
- a flag (``valid``): true only when it is true in every run;
- a capacity run's steps: one step, the runs' rated steps pooled as above, so a rule on a latency at the
  rated step (``p99_ttft_ms``) reads the median of the runs' rated steps;
- anything else (text, lists): the first run's.
"""

from __future__ import annotations

import math
from typing import Any

from loadgen.gate.lookup import error_rate, kind, rated_step
from loadgen.gate.values import GateInputError, is_number
from loadgen.results.latency import percentile

COUNTS = ("completed", "requests")  # sample counts: the smallest run's, for min_samples
# rated_capacity's figures the pooled interval is around, and those derived from them (spec = rated x (1 - headroom))
MEANS = ("rate_rps", "estimate", "concurrency", "spec_rate_rps", "spec_concurrency")


def merge(values: list[Any], key: str = "") -> Any:
    """One value from the runs' values at one path (missing ones left out)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, dict) for v in present):
        keys = list(dict.fromkeys(k for v in present for k in v))
        out = {k: merge([v.get(k) for v in present], k) for k in keys}
        rates = [error_rate(v) for v in present]
        if "requests" in out and all(is_number(r) for r in rates) and is_number(out["requests"]):
            out["failed"] = percentile(rates, 50) * out["requests"]  # the runs' median error rate
        return out
    if all(isinstance(v, bool) for v in present):
        return all(present)
    if all(is_number(v) for v in present):
        return min(present) if key in COUNTS else percentile(present, 50)
    return present[0]


def pooled_rating(ratings: list[dict[str, Any]]) -> dict[str, Any]:
    """``rated_capacity`` of several runs: the mean, and the interval of a mean when every run has one."""
    out = merge(ratings)
    n = len(ratings)
    for field in MEANS:
        values = [r.get(field) for r in ratings]
        out[field] = sum(values) / n if all(is_number(v) for v in values) else None
    fields = {r.get("ci_of") for r in ratings}
    spans = [(r.get("estimate"), r.get("ci_low"), r.get("ci_high")) for r in ratings]
    if len(fields) == 1 and None not in fields and all(all(is_number(x) for x in s) for s in spans):
        est = out["estimate"]
        out["ci_low"] = est - math.sqrt(sum((e - lo) ** 2 for e, lo, _ in spans)) / n
        out["ci_high"] = est + math.sqrt(sum((hi - e) ** 2 for e, _, hi in spans)) / n
    else:
        out["ci_low"] = out["ci_high"] = None
    out["ci_unbounded"] = sorted({e for r in ratings for e in r.get("ci_unbounded") or []})
    out.pop("interval", None)  # each run's own fit: no longer what ci_low / ci_high describe
    out["pooled_runs"] = n
    return out


def pool(summaries: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """One summary for a side of the gate; ``names`` label the runs (their folders) in errors and output."""
    if len(summaries) == 1:
        return summaries[0]
    kinds = {kind(s) for s in summaries}
    if len(kinds) > 1:
        listed = ", ".join(f"{name} ({kind(s)})" for name, s in zip(names, summaries, strict=True))
        raise GateInputError(f"runs of one side must be of one kind, found {listed}")
    axes = {s.get("axis") for s in summaries}
    if len(axes) > 1:
        raise GateInputError(f"runs of one side must search one axis, found {sorted(map(str, axes))}")
    out = merge(summaries)
    if kinds == {"capacity"}:
        rated = [rated_step(s) for s in summaries]
        out["steps"] = [merge(rated)] if all(isinstance(x, dict) for x in rated) else []
    ratings = [s.get("rated_capacity") for s in summaries]
    if all(isinstance(r, dict) for r in ratings):
        out["rated_capacity"] = pooled_rating(ratings)
    elif any(isinstance(r, dict) for r in ratings):
        out["rated_capacity"] = None  # a run without a rating: the side has none to pool
    out["run_id"] = f"{len(summaries)} runs: " + ", ".join(names)
    return out
