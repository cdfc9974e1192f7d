"""Gate rules: what a rule is, its checks and options, the noise-aware defaults, and reading rules from
YAML.

A rule names a metric, a dotted path into summary.json (``rated_capacity.rate_rps``,
``tiers.premium.p99_ttft_ms``) or an alias (``rated_rps``, ``p99_ttft_ms``, ``error_rate``; see
``loadgen.gate.lookup.ALIASES``), and one or more checks:

    within_intervals: 0.9 a capacity rated with confidence intervals (``rated_capacity.ci_low`` /
                          ``ci_high``) on both sides: a regression when the run's estimate is below the
                          baseline's by more than the two intervals allow together: run estimate <
                          baseline estimate - sqrt(baseline's lower half-width^2 + run's upper
                          half-width^2) (the difference's interval, at the runs' confidence, lies
                          wholly below 0: two intervals that do not overlap always fail, ones that
                          overlap fail only when the estimates are far apart for their widths). A
                          side without an interval: ``min_ratio`` with this figure (current >= 0.9 x
                          baseline)
    min_ratio: 0.9        current >= 0.9 x baseline (higher is better: capacity, throughput)
    max_ratio: 1.15       current <= 1.15 x baseline (lower is better: latency)
    max_increase: 0.01    current - baseline <= 0.01 (absolute; error rates)
    max_decrease: 5       baseline - current <= 5
    min: 10 / max: 300    absolute bounds on the current run, no baseline needed
    equals: true          exact value (``baseline``: the baseline's value)
    abs_tolerance: 5      slack added to ratio and increase limits, so sub-millisecond noise on a fast
                          target never fails a ratio rule
    min_samples: 100      skip (not fail) when either run completed fewer requests than this: a p99 of
                          50 samples is nearly the maximum, too noisy to gate on
    required: false       skip when the metric is missing, instead of exit 2
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loadgen.gate.lookup import kind
from loadgen.gate.values import GateInputError, is_number

CHECKS = ("within_intervals", "min_ratio", "max_ratio", "max_increase", "max_decrease", "min", "max", "equals")
OPTIONS = ("abs_tolerance", "min_samples", "required", "description")
RELATIVE = ("within_intervals", "min_ratio", "max_ratio", "max_increase", "max_decrease")

# Defaults, chosen for the noise a load test really has. Capacity: how far apart two ratings may be is
# what their own confidence intervals say (``within_intervals``); runs without one (older summaries, a
# never_broke lower bound) fall back to a 10% drop: the bisection stops within 5% and repeated searches
# spread by a few percent more. Fixed-load runs:
# medians are stable to a few percent, p99s much less (skipped under 100 samples), and every latency
# rule carries an absolute slack so a 1 ms target moving to 1.3 ms is not a "30% regression".
DEFAULT_RULES_CAPACITY: dict[str, dict[str, Any]] = {
    "rated_capacity.rate_rps": {"within_intervals": 0.90},
    "valid": {"equals": True},
}
DEFAULT_RULES_CAPACITY_CONCURRENCY: dict[str, dict[str, Any]] = {
    "rated_capacity.concurrency": {"within_intervals": 0.90},
    "valid": {"equals": True},
}
DEFAULT_RULES_RUN: dict[str, dict[str, Any]] = {
    "median_ttft_ms": {"max_ratio": 1.10, "abs_tolerance": 2.0},
    "p99_ttft_ms": {"max_ratio": 1.25, "abs_tolerance": 5.0, "min_samples": 100},
    "median_tpot_ms": {"max_ratio": 1.10, "abs_tolerance": 1.0, "required": False},
    "p99_itl_ms": {"max_ratio": 1.25, "abs_tolerance": 2.0, "min_samples": 100, "required": False},
    "output_throughput": {"min_ratio": 0.90},
    "error_rate": {"max_increase": 0.01},
    "valid": {"equals": True},
}


@dataclass
class Rule:
    metric: str
    checks: dict[str, Any]
    abs_tolerance: float = 0.0
    min_samples: int = 0
    required: bool = True
    description: str | None = None


def rule_from(metric: Any, spec: Any, where: str) -> Rule:
    """One rule from its metric name and ``{check: limit, option: value}`` mapping; ``where`` names the
    source in the error message."""
    if not isinstance(metric, str) or not metric:
        raise GateInputError(f"{where}: a rule needs a metric name, found {metric!r}")
    if not isinstance(spec, dict):
        raise GateInputError(f"{where}: rule {metric!r} must be a mapping like {{max_ratio: 1.15}}, "
                             f"found {spec!r}")
    unknown = [k for k in spec if k not in CHECKS + OPTIONS + ("metric",)]
    if unknown:
        raise GateInputError(f"{where}: rule {metric!r}: unknown key {unknown[0]!r} (checks: {', '.join(CHECKS)}; "
                             f"options: {', '.join(OPTIONS)})")
    checks = {k: spec[k] for k in CHECKS if k in spec}
    if not checks:
        raise GateInputError(f"{where}: rule {metric!r} has no check (one of {', '.join(CHECKS)})")
    for k, v in checks.items():
        if k != "equals" and not is_number(v):
            raise GateInputError(f"{where}: rule {metric!r}: {k} must be a number, found {v!r}")
    for k in ("abs_tolerance", "min_samples"):
        if k in spec and (not is_number(spec[k]) or spec[k] < 0):
            raise GateInputError(f"{where}: rule {metric!r}: {k} must be a number >= 0, found {spec[k]!r}")
    if "required" in spec and not isinstance(spec["required"], bool):
        raise GateInputError(f"{where}: rule {metric!r}: required must be true or false")
    return Rule(metric, checks, float(spec.get("abs_tolerance", 0.0)), int(spec.get("min_samples", 0)),
                spec.get("required", True), spec.get("description"))


def parse_rules(obj: Any, where: str = "rules") -> tuple[list[Rule], bool]:
    """``{rules: {metric: {check: value}}, defaults: bool}`` or the bare ``{metric: {...}}`` mapping (or a
    list of ``{metric: NAME, ...}``). Returns the rules and whether the defaults are merged in."""
    defaults = False
    if isinstance(obj, dict) and "rules" in obj:
        extra = [k for k in obj if k not in ("rules", "defaults")]
        if extra:
            raise GateInputError(f"{where}: unknown top-level key {extra[0]!r} (expected rules, defaults)")
        defaults = obj.get("defaults", False)
        if not isinstance(defaults, bool):
            raise GateInputError(f"{where}: defaults must be true or false")
        obj = obj["rules"]
    if isinstance(obj, dict):
        rules = [rule_from(str(k), v, where) for k, v in obj.items()]
    elif isinstance(obj, list):
        rules = []
        for i, item in enumerate(obj):
            if not isinstance(item, dict):
                raise GateInputError(f"{where}[{i}]: expected a mapping with a metric key, found {item!r}")
            rules.append(rule_from(item.get("metric"), item, f"{where}[{i}]"))
    else:
        raise GateInputError(f"{where}: expected a mapping of metric -> checks, found {type(obj).__name__}")
    if not rules:
        raise GateInputError(f"{where}: no rules")
    return rules, defaults


def load_rules(path: str | Path) -> tuple[list[Rule], bool]:
    """The rules of a YAML file (see ``parse_rules``); unreadable or bad YAML is a GateInputError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise GateInputError(f"{p}: cannot read rules: {e.strerror or e}") from None
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise GateInputError(f"{p}: bad YAML{at}: {getattr(e, 'problem', None) or e}") from None
    return parse_rules(obj, str(p))


def default_rules(current: dict[str, Any], baseline: dict[str, Any]) -> list[Rule]:
    """The defaults for this pair: capacity rules when either side is a capacity run, else run rules."""
    if "capacity" in (kind(current), kind(baseline)):
        axis = current.get("axis") or baseline.get("axis")
        table = DEFAULT_RULES_CAPACITY_CONCURRENCY if axis == "concurrency" else DEFAULT_RULES_CAPACITY
    else:
        table = DEFAULT_RULES_RUN
    return [rule_from(k, v, "defaults") for k, v in table.items()]
