"""Finding a metric in a summary: reading the summary (a ``summary.json`` or a run folder), resolving a
dotted path or alias, the capacity rated step that run-level latency keys are read from, and the rated
capacity's confidence interval (``interval``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadgen.gate.values import MISSING, GateInputError, is_number
from loadgen.results.rundir import REQUESTS, SUMMARY

ALIASES: dict[str, str] = {
    "rated_rps": "rated_capacity.rate_rps",
    "rated_capacity": "rated_capacity.rate_rps",
    "rated_concurrency": "rated_capacity.concurrency",
    "spec_rps": "rated_capacity.spec_rate_rps",
    "rated_output_tok_s": "rated_capacity.output_tok_s",
    "throughput": "request_throughput",
    "goodput": "request_goodput",
    "tok_s": "output_throughput",
    "lateness_p99_ms": "client_lateness.p99_ms",
}

# The headline capacity path for each search axis: the one a never_broke verdict can still answer.
_AXIS_PATH = {"rate": "rated_capacity.rate_rps", "concurrency": "rated_capacity.concurrency"}


def load_summary(path: str | Path) -> dict[str, Any]:
    """A summary.json, or the summary of a run folder (rebuilt from its records when it has none)."""
    p = Path(path)
    if p.is_dir():
        s = p / SUMMARY
        if not s.is_file():
            if not (p / REQUESTS).is_file():
                raise GateInputError(f"{p}: no summary.json or requests.jsonl in this folder")
            return rebuild_summary(p)
        p = s
    if not p.is_file():
        raise GateInputError(f"{p}: not found")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise GateInputError(f"{p}: cannot read: {e}") from None
    except ValueError as e:
        raise GateInputError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise GateInputError(f"{p}: expected a JSON object (a summary.json), found {type(obj).__name__}")
    return obj


def rebuild_summary(run_dir: Path) -> dict[str, Any]:
    """The summary of a fixed-load run folder without one (a run cut short before writing it), from its
    records; a capacity run's cannot be (its search is not in the records): a GateInputError."""
    # Lazy: summarize needs pandas, which a gate over two summary.json files never loads.
    from loadgen.results.rebuild import NotRebuildable, rebuild_fixed_summary

    try:
        summary = rebuild_fixed_summary(run_dir)
    except NotRebuildable as e:
        raise GateInputError(str(e)) from None
    summary["run_id"] = run_dir.name
    return summary


def kind(summary: dict[str, Any]) -> str:
    return str(summary.get("kind") or ("capacity" if isinstance(summary.get("steps"), list) else "run"))


def interval(summary: dict[str, Any], metric: str) -> tuple[float, float, float] | None:
    """(estimate, low, high) of the confidence interval a capacity summary gives the metric (its
    ``rated_capacity`` with ``ci_of`` naming the metric's field), or None; None too where an end is
    unbounded (``ci_unbounded``): the reach standing there is no bound to gate on."""
    path = ALIASES.get(metric, metric)
    head, _, field = path.partition(".")
    rc = summary.get(head) if head == "rated_capacity" else None
    if not isinstance(rc, dict) or rc.get("ci_of") != field or rc.get("ci_unbounded"):
        return None
    est, lo, hi = rc.get("estimate"), rc.get("ci_low"), rc.get("ci_high")
    if not all(is_number(x) for x in (est, lo, hi)) or not lo <= est <= hi:
        return None
    return float(est), float(lo), float(hi)


def rated_step(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The capacity summary's highest passing step (the lightest one when none passed); a step the search
    did not count (disturbed, measured again) is passed over."""
    steps = [s for s in summary.get("steps") or [] if isinstance(s, dict) and is_number(s.get("load"))
             and s.get("counted", True) is not False]
    if not steps:
        return None
    passed = [s for s in steps if s.get("passed") is True]
    return max(passed, key=lambda s: s["load"]) if passed else min(steps, key=lambda s: s["load"])


def dig(obj: Any, path: str) -> Any:
    """The value at a dotted path (list items by index, negative too), or ``MISSING``."""
    for part in path.split("."):
        if isinstance(obj, dict) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and part.lstrip("-").isdigit() and -len(obj) <= int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return MISSING
    return obj


def error_rate(s: dict[str, Any]) -> Any:
    """Failed / requests, from ``failed`` or else the ``errors`` counts (cancellations are not errors)."""
    n = s.get("requests")
    failed = s.get("failed")
    if not is_number(failed) and isinstance(s.get("errors"), dict):
        failed = sum(v for k, v in s["errors"].items() if is_number(v) and k != "cancelled")
    if is_number(n) and is_number(failed):
        return failed / n if n else 0.0
    return MISSING


def resolve(summary: dict[str, Any], metric: str) -> tuple[Any, str]:
    """(value, where it was found); value is ``MISSING`` when absent."""
    path = ALIASES.get(metric, metric)
    v = dig(summary, path)
    if v is MISSING and path == "client_lateness.p99_ms":
        for alt in ("lateness.p99_ms", "lateness.p99_ms_max"):  # run / capacity summaries
            v, path = dig(summary, alt), alt
            if v is not MISSING:
                break
    if v is MISSING and metric == "error_rate":
        v = error_rate(summary)
    if (v is None or v is MISSING) and path.startswith("rated_capacity."):
        verdict_value = _rated_from_verdict(summary, path)
        if verdict_value is not None:
            return verdict_value
    if v is MISSING and kind(summary) == "capacity":
        step = rated_step(summary)
        if step is not None:
            where = f"steps[{step.get('index')}]"
            for base, prefix in ((step.get("summary") or {}, ".summary"), (step, "")):
                sv = error_rate(base) if metric == "error_rate" else dig(base, path)
                if sv is not MISSING:
                    return sv, f"{where}{prefix}.{path}"
    return v, path


def _rated_from_verdict(summary: dict[str, Any], path: str) -> tuple[Any, str] | None:
    """A capacity with no rated step still has a number to gate on: 0 when the SLO was never met, and
    for never_broke the highest load tried (a lower bound: it held)."""
    verdict = summary.get("verdict")
    if verdict == "never_met":
        return 0.0, f"{path} (verdict never_met: 0)"
    if verdict == "never_broke" and path == _AXIS_PATH.get(summary.get("axis") or "rate"):
        passed = [s["load"] for s in summary.get("steps") or []
                  if isinstance(s, dict) and s.get("passed") is True and is_number(s.get("load"))]
        if passed:
            return max(passed), f"{path} (verdict never_broke: highest passing load)"
    return None


def completed(summary: dict[str, Any]) -> int | None:
    """Completed requests behind the summary's latency figures (the rated step's, for a capacity run)."""
    sources: list[dict[str, Any]] = [summary]
    if kind(summary) == "capacity":
        step = rated_step(summary)
        sources = [step.get("summary") or {}, step] if step else []
    for s in sources:
        for key in ("completed", "requests"):
            if is_number(s.get(key)):
                return int(s[key])
    return None
