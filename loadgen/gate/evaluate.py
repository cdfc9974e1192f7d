"""Evaluating gate rules: one rule against a run and its baseline (``evaluate_rule``), and every rule of
a gate (``gate``), giving a ``GateReport`` with its exit code."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.gate.lookup import ALIASES, completed, interval, load_summary, resolve
from loadgen.gate.pool import pool
from loadgen.gate.rules import RELATIVE, Rule, default_rules, load_rules
from loadgen.gate.values import MISSING, GateInputError, format_value, is_number

EXIT_PASS, EXIT_REGRESSION, EXIT_UNUSABLE = 0, 1, 2


@dataclass
class Result:
    rule: Rule
    status: str  # pass | fail | skip
    baseline: Any = None
    current: Any = None
    message: str = ""
    details: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)  # what a within_intervals check compared

    @property
    def change(self) -> str:
        b, c = self.baseline, self.current
        if is_number(b) and is_number(c):
            if b:
                return f"{100.0 * (c - b) / abs(b):+.1f}%"
            return f"{c - b:+.4g}"
        return ""


@dataclass
class GateReport:
    run: str
    baseline: str
    results: list[Result]

    @property
    def passed(self) -> bool:
        return all(r.status != "fail" for r in self.results)

    @property
    def exit_code(self) -> int:
        return EXIT_PASS if self.passed else EXIT_REGRESSION


def evaluate_rule(rule: Rule, current: dict[str, Any], baseline: dict[str, Any]) -> Result:
    """Pass, fail or skip for one rule; raises GateInputError when a required value is missing or not a
    number."""
    cur, cur_at = resolve(current, rule.metric)
    needs_base = any(k in rule.checks for k in RELATIVE) or rule.checks.get("equals") == "baseline"
    base, base_at = resolve(baseline, rule.metric)
    res = Result(rule, "pass", None if base is MISSING else base, None if cur is MISSING else cur)
    missing = [side for side, v in (("run", cur), ("baseline", base)) if v is MISSING and
               (side == "run" or needs_base)]
    if missing:
        if not rule.required:
            res.status, res.message = "skip", f"{rule.metric} not in the {' and '.join(missing)} summary"
            return res
        raise GateInputError(f"metric {rule.metric!r} ({ALIASES.get(rule.metric, rule.metric)}) missing from the "
                             f"{' and the '.join(missing)} summary")
    if rule.min_samples:
        n = [completed(s) for s in (current, baseline)]
        if any(x is not None and x < rule.min_samples for x in n):
            res.status = "skip"
            res.message = (f"too few samples for {rule.metric} (completed: run {n[0]}, baseline {n[1]}; "
                           f"min_samples {rule.min_samples})")
            return res
    fails = []
    for check, limit in rule.checks.items():
        if check == "equals":
            want = base if limit == "baseline" else limit
            res.details.append(f"equals {format_value(want)}")
            if cur != want:
                fails.append(f"{rule.metric} = {format_value(cur)}, expected {format_value(want)}")
            continue
        if not is_number(cur) or (check in RELATIVE and not is_number(base)):
            if cur is None or (check in RELATIVE and base is None):
                if not rule.required:
                    res.status, res.message = "skip", f"{rule.metric} is null"
                    return res
                side = "run" if cur is None else "baseline"
                raise GateInputError(f"metric {rule.metric!r} is null in the {side} summary ({cur_at})")
            raise GateInputError(f"metric {rule.metric!r} is not a number (run {cur!r} at {cur_at}, "
                                 f"baseline {base!r} at {base_at})")
        if check == "within_intervals":
            ok, desc, res.figures = _interval_check(rule, limit, cur, base, current, baseline)
        else:
            ok, desc = _numeric_check(check, limit, cur, base, rule.abs_tolerance)
        res.details.append(desc)
        if not ok:
            fails.append(f"{rule.metric} = {format_value(cur)}, must be {desc}")
    if fails:
        res.status, res.message = "fail", "; ".join(fails)
    else:
        res.message = f"{rule.metric} = {format_value(cur)} ({', '.join(res.details)})"
    return res


def _interval_check(rule: Rule, limit: float, cur: float, base: float, current: dict[str, Any],
                    baseline: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    """``within_intervals``: (passed, the bound as printed, the figures compared). Both intervals: the
    run's estimate must be at least the baseline's minus the root sum of squares of the baseline's lower
    and the run's upper half-width; else ``min_ratio`` with ``limit``."""
    ri, bi = interval(current, rule.metric), interval(baseline, rule.metric)
    figures: dict[str, Any] = {"run_interval": list(ri[1:]) if ri else None,
                               "run_estimate": ri[0] if ri else None,
                               "baseline_interval": list(bi[1:]) if bi else None,
                               "baseline_estimate": bi[0] if bi else None}
    if ri is None or bi is None:
        ok, desc = _numeric_check("min_ratio", limit, cur, base, rule.abs_tolerance)
        missing = " and ".join(side for side, v in (("run", ri), ("baseline", bi)) if v is None)
        figures.update(rule="fixed ratio", bound=base * limit - rule.abs_tolerance)
        return ok, f"{desc} (no interval in the {missing})", figures
    (r, r_lo, r_hi), (b, b_lo, b_hi) = ri, bi
    slack = math.hypot(b - b_lo, r_hi - r)
    bound = b - slack - rule.abs_tolerance
    figures.update(rule="intervals", bound=bound, slack=slack)
    desc = (f"estimate {r:.4g} ≥ baseline estimate {b:.4g} − √({b - b_lo:.3g}² + {r_hi - r:.3g}²) = {bound:.4g} "
            f"(run interval [{r_lo:.4g}, {r_hi:.4g}], baseline [{b_lo:.4g}, {b_hi:.4g}])")
    return r >= bound, desc, figures


def _numeric_check(check: str, limit: float, cur: float, base: Any, tol: float) -> tuple[bool, str]:
    """(passed, the bound as the outputs print it) for one numeric check."""
    if check == "min_ratio":
        bound = base * limit - tol
        return cur >= bound, (f"≥ {format_value(limit)} × baseline" + (f" − {format_value(tol)}" if tol else "")
                              + f" = {bound:.4g}")
    if check == "max_ratio":
        bound = base * limit + tol
        return cur <= bound, (f"≤ {format_value(limit)} × baseline" + (f" + {format_value(tol)}" if tol else "")
                              + f" = {bound:.4g}")
    if check == "max_increase":
        bound = base + limit + tol
        return cur <= bound, f"≤ baseline + {format_value(limit + tol)} = {bound:.4g}"
    if check == "max_decrease":
        bound = base - limit - tol
        return cur >= bound, f"≥ baseline − {format_value(limit + tol)} = {bound:.4g}"
    if check == "min":
        return cur >= limit, f"≥ {format_value(limit)}"
    return cur <= limit, f"≤ {format_value(limit)}"


def gate(run: str | Path | Sequence[str | Path], baseline: str | Path | Sequence[str | Path],
         rules: str | Path | None = None) -> GateReport:
    """Evaluate every rule; raises GateInputError on unusable input. Either side may be several runs (repeats
    of one measurement): they are pooled into one summary first (``gate.pool``)."""
    runs, bases = _paths(run), _paths(baseline)
    cur = pool([load_summary(p) for p in runs], [Path(p).name for p in runs])
    base = pool([load_summary(p) for p in bases], [Path(p).name for p in bases])
    if rules is not None:
        rule_list, with_defaults = load_rules(rules)
        if with_defaults:
            named = {r.metric for r in rule_list}
            rule_list = [r for r in default_rules(cur, base) if r.metric not in named] + rule_list
    else:
        rule_list = default_rules(cur, base)
    results = [evaluate_rule(r, cur, base) for r in rule_list]
    return GateReport(str(cur.get("run_id") or Path(runs[0]).name), str(base.get("run_id") or Path(bases[0]).name),
                      results)


def _paths(side: str | Path | Sequence[str | Path]) -> list[str | Path]:
    """One side's runs; a run given twice (a folder and its summary.json count as one) would pool as two
    independent repeats and narrow the side's interval for nothing, so it is refused."""
    paths = [side] if isinstance(side, (str, Path)) else list(side)
    if not paths:
        raise GateInputError("no run given for one side of the gate")
    seen: dict[Path, str | Path] = {}
    for p in paths:
        key = (Path(p) / "summary.json" if Path(p).is_dir() else Path(p)).resolve()
        if key in seen:
            raise GateInputError(f"{p}: the same run as {seen[key]}, given twice on one side of the gate "
                                 "(repeats are pooled as independent runs)")
        seen[key] = p
    return paths
