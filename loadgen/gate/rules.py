"""CI performance gate: compare a run's ``summary.json`` with a baseline's, rule by rule.

    slobench gate RUN_DIR --baseline BASELINE(.json | run folder) [--rules gate.yaml] [--junit junit.xml]

Exit 0 when every rule passes, 1 on a regression, 2 when the input is unusable (missing files, bad
YAML, an unknown rule, a metric missing from either side) with a one-line message. JUnit XML gets one
testcase per rule; with ``$GITHUB_STEP_SUMMARY`` set a markdown table is appended to it.

A rule names a metric, a dotted path into summary.json (``rated_capacity.rate_rps``,
``tiers.premium.p99_ttft_ms``) or an alias (``rated_rps``, ``p99_ttft_ms``, ``error_rate``; see
``ALIASES``), and one or more checks:

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

In a capacity summary the run-level latency keys (``p99_ttft_ms`` ...) are looked up in the rated
step's ``summary`` (the highest passing step; the lightest step when none passed).
"""

from __future__ import annotations

import html
import json
import math
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXIT_PASS, EXIT_REGRESSION, EXIT_UNUSABLE = 0, 1, 2

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
CHECKS = ("min_ratio", "max_ratio", "max_increase", "max_decrease", "min", "max", "equals")
OPTIONS = ("abs_tolerance", "min_samples", "required", "description")
RELATIVE = ("min_ratio", "max_ratio", "max_increase", "max_decrease")

# Defaults, chosen for the noise a load test really has. Capacity: the bisection stops within 5% and
# repeated searches spread by a few percent more, so a 10% drop is a regression. Fixed-load runs:
# medians are stable to a few percent, p99s much less (skipped under 100 samples), and every latency
# rule carries an absolute slack so a 1 ms target moving to 1.3 ms is not a "30% regression".
DEFAULT_RULES_CAPACITY: dict[str, dict[str, Any]] = {
    "rated_capacity.rate_rps": {"min_ratio": 0.90},
    "valid": {"equals": True},
}
DEFAULT_RULES_CAPACITY_CONCURRENCY: dict[str, dict[str, Any]] = {
    "rated_capacity.concurrency": {"min_ratio": 0.90},
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


class GateInputError(Exception):
    """Unusable input: exit 2 with this one-line message."""


@dataclass
class Rule:
    metric: str
    checks: dict[str, Any]
    abs_tolerance: float = 0.0
    min_samples: int = 0
    required: bool = True
    description: str | None = None


@dataclass
class Result:
    rule: Rule
    status: str  # pass | fail | skip
    baseline: Any = None
    current: Any = None
    message: str = ""
    details: list[str] = field(default_factory=list)

    @property
    def change(self) -> str:
        b, c = self.baseline, self.current
        if _isnum(b) and _isnum(c):
            if b:
                return f"{100.0 * (c - b) / abs(b):+.1f}%"
            return f"{c - b:+.4g}"
        return ""


def _isnum(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ------------------------------------------------------------------ inputs


def load_summary(path: str | Path) -> dict[str, Any]:
    """A summary.json, or the summary of a run folder (rebuilt from its records when it has none)."""
    p = Path(path)
    if p.is_dir():
        s = p / "summary.json"
        if not s.is_file():
            if not (p / "requests.jsonl").is_file():
                raise GateInputError(f"{p}: no summary.json or requests.jsonl in this folder")
            from loadgen.report.data import load_run

            return load_run(p).summary
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


def _rule_from(metric: str, spec: Any, where: str) -> Rule:
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
        if k != "equals" and not _isnum(v):
            raise GateInputError(f"{where}: rule {metric!r}: {k} must be a number, found {v!r}")
    for k in ("abs_tolerance", "min_samples"):
        if k in spec and (not _isnum(spec[k]) or spec[k] < 0):
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
        rules = [_rule_from(str(k), v, where) for k, v in obj.items()]
    elif isinstance(obj, list):
        rules = []
        for i, item in enumerate(obj):
            if not isinstance(item, dict):
                raise GateInputError(f"{where}[{i}]: expected a mapping with a metric key, found {item!r}")
            rules.append(_rule_from(item.get("metric"), item, f"{where}[{i}]"))
    else:
        raise GateInputError(f"{where}: expected a mapping of metric -> checks, found {type(obj).__name__}")
    if not rules:
        raise GateInputError(f"{where}: no rules")
    return rules, defaults


def load_rules(path: str | Path) -> tuple[list[Rule], bool]:
    import yaml

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
    if "capacity" in (kind(current), kind(baseline)):
        axis = current.get("axis") or baseline.get("axis")
        table = DEFAULT_RULES_CAPACITY_CONCURRENCY if axis == "concurrency" else DEFAULT_RULES_CAPACITY
    else:
        table = DEFAULT_RULES_RUN
    return [_rule_from(k, v, "defaults") for k, v in table.items()]


# ------------------------------------------------------------------ metric lookup


def kind(summary: dict[str, Any]) -> str:
    return str(summary.get("kind") or ("capacity" if isinstance(summary.get("steps"), list) else "run"))


def rated_step(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The capacity summary's highest passing step (the lightest one when none passed)."""
    steps = [s for s in summary.get("steps") or [] if isinstance(s, dict) and _isnum(s.get("load"))]
    if not steps:
        return None
    passed = [s for s in steps if s.get("passed") is True]
    return max(passed, key=lambda s: s["load"]) if passed else min(steps, key=lambda s: s["load"])


_MISSING = object()


def _dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(obj, dict) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and part.lstrip("-").isdigit() and -len(obj) <= int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return _MISSING
    return obj


def _error_rate(s: dict[str, Any]) -> Any:
    n = s.get("requests")
    failed = s.get("failed")
    if not _isnum(failed) and isinstance(s.get("errors"), dict):
        failed = sum(v for k, v in s["errors"].items() if _isnum(v) and k != "cancelled")
    if _isnum(n) and _isnum(failed):
        return failed / n if n else 0.0
    return _MISSING


def resolve(summary: dict[str, Any], metric: str) -> tuple[Any, str]:
    """(value, where it was found); value is ``_MISSING`` when absent."""
    path = ALIASES.get(metric, metric)
    v = _dig(summary, path)
    if v is _MISSING and path == "client_lateness.p99_ms":
        for alt in ("lateness.p99_ms", "lateness.p99_ms_max"):  # run / capacity summaries
            v, path = _dig(summary, alt), alt
            if v is not _MISSING:
                break
    if v is _MISSING and metric == "error_rate":
        v = _error_rate(summary)
    if (v is None or v is _MISSING) and path.startswith("rated_capacity."):
        if summary.get("verdict") == "never_met":
            return 0.0, f"{path} (verdict never_met: 0)"
        axis = summary.get("axis") or "rate"
        if summary.get("verdict") == "never_broke" and path == {"rate": "rated_capacity.rate_rps",
                                                               "concurrency": "rated_capacity.concurrency"}.get(axis):
            passed = [s["load"] for s in summary.get("steps") or []
                      if isinstance(s, dict) and s.get("passed") is True and _isnum(s.get("load"))]
            if passed:  # a lower bound: the highest load tried, and it held
                return max(passed), f"{path} (verdict never_broke: highest passing load)"
    if v is _MISSING and kind(summary) == "capacity":
        step = rated_step(summary)
        if step is not None:
            where = f"steps[{step.get('index')}]"
            for base, prefix in ((step.get("summary") or {}, ".summary"), (step, "")):
                sv = _error_rate(base) if metric == "error_rate" else _dig(base, path)
                if sv is not _MISSING:
                    return sv, f"{where}{prefix}.{path}"
    return v, path


def completed(summary: dict[str, Any]) -> int | None:
    """Completed requests behind the summary's latency figures (the rated step's, for a capacity run)."""
    sources: list[dict[str, Any]] = [summary]
    if kind(summary) == "capacity":
        step = rated_step(summary)
        sources = [step.get("summary") or {}, step] if step else []
    for s in sources:
        for key in ("completed", "requests"):
            if _isnum(s.get(key)):
                return int(s[key])
    return None


# ------------------------------------------------------------------ evaluation


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if _isnum(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    return str(v)


def evaluate_rule(rule: Rule, current: dict[str, Any], baseline: dict[str, Any]) -> Result:
    cur, cur_at = resolve(current, rule.metric)
    needs_base = any(k in rule.checks for k in RELATIVE) or rule.checks.get("equals") == "baseline"
    base, base_at = resolve(baseline, rule.metric)
    res = Result(rule, "pass", None if base is _MISSING else base, None if cur is _MISSING else cur)
    missing = [side for side, v in (("run", cur), ("baseline", base)) if v is _MISSING and
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
            ok = cur == want
            res.details.append(f"equals {_fmt(want)}")
            if not ok:
                fails.append(f"{rule.metric} = {_fmt(cur)}, expected {_fmt(want)}")
            continue
        if not _isnum(cur) or (check in RELATIVE and not _isnum(base)):
            if cur is None or (check in RELATIVE and base is None):
                if not rule.required:
                    res.status, res.message = "skip", f"{rule.metric} is null"
                    return res
                side = "run" if cur is None else "baseline"
                raise GateInputError(f"metric {rule.metric!r} is null in the {side} summary ({cur_at})")
            raise GateInputError(f"metric {rule.metric!r} is not a number (run {cur!r} at {cur_at}, "
                                 f"baseline {base!r} at {base_at})")
        tol = rule.abs_tolerance
        if check == "min_ratio":
            bound = base * limit - tol
            ok = cur >= bound
            desc = f"≥ {_fmt(limit)} × baseline" + (f" − {_fmt(tol)}" if tol else "") + f" = {bound:.4g}"
        elif check == "max_ratio":
            bound = base * limit + tol
            ok = cur <= bound
            desc = f"≤ {_fmt(limit)} × baseline" + (f" + {_fmt(tol)}" if tol else "") + f" = {bound:.4g}"
        elif check == "max_increase":
            bound = base + limit + tol
            ok = cur <= bound
            desc = f"≤ baseline + {_fmt(limit + tol)} = {bound:.4g}"
        elif check == "max_decrease":
            bound = base - limit - tol
            ok = cur >= bound
            desc = f"≥ baseline − {_fmt(limit + tol)} = {bound:.4g}"
        elif check == "min":
            ok, desc = cur >= limit, f"≥ {_fmt(limit)}"
        else:
            ok, desc = cur <= limit, f"≤ {_fmt(limit)}"
        res.details.append(desc)
        if not ok:
            fails.append(f"{rule.metric} = {_fmt(cur)}, must be {desc}")
    if fails:
        res.status, res.message = "fail", "; ".join(fails)
    else:
        res.message = f"{rule.metric} = {_fmt(cur)} ({', '.join(res.details)})"
    return res


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


def gate(run: str | Path, baseline: str | Path, rules: str | Path | None = None) -> GateReport:
    """Evaluate every rule; raises GateInputError on unusable input."""
    cur = load_summary(run)
    base = load_summary(baseline)
    if rules is not None:
        rule_list, with_defaults = load_rules(rules)
        if with_defaults:
            named = {r.metric for r in rule_list}
            rule_list = [r for r in default_rules(cur, base) if r.metric not in named] + rule_list
    else:
        rule_list = default_rules(cur, base)
    results = [evaluate_rule(r, cur, base) for r in rule_list]
    return GateReport(str(cur.get("run_id") or Path(run).name), str(base.get("run_id") or Path(baseline).name),
                      results)


# ------------------------------------------------------------------ outputs


def text_lines(rep: GateReport) -> list[str]:
    out = []
    for r in rep.results:
        tag = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}[r.status]
        nums = f"baseline {_fmt(r.baseline)} -> run {_fmt(r.current)}"
        if r.change:
            nums += f" ({r.change})"
        out.append(f"{tag}  {r.rule.metric}: {nums}; {r.message}" if r.status != "pass"
                   else f"{tag}  {r.rule.metric}: {nums}; {', '.join(r.details)}")
    n_fail = sum(r.status == "fail" for r in rep.results)
    verdict = "pass" if rep.passed else f"REGRESSION ({n_fail} of {len(rep.results)} rules failed)"
    out.append(f"gate {rep.run} vs baseline {rep.baseline}: {verdict}")
    return out


def junit_xml(rep: GateReport | None, error: str | None = None, run: str = "", baseline: str = "") -> bytes:
    """One testcase per rule (failure / skipped); for unusable input, one testcase with an error."""
    suite = ET.Element("testsuite", name="slobench.gate")
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="run", value=rep.run if rep else run)
    ET.SubElement(props, "property", name="baseline", value=rep.baseline if rep else baseline)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if rep is None:
        tc = ET.SubElement(suite, "testcase", classname="slobench.gate", name="gate input", time="0")
        ET.SubElement(tc, "error", message=error or "unusable input", type="unusable_input").text = error
        counts.update(tests=1, errors=1)
    else:
        for r in rep.results:
            tc = ET.SubElement(suite, "testcase", classname="slobench.gate", name=r.rule.metric, time="0")
            counts["tests"] += 1
            body = (f"baseline: {_fmt(r.baseline)}\nrun: {_fmt(r.current)}\nchange: {r.change or '-'}\n"
                    f"rule: {', '.join(r.details) or r.rule.checks}\n")
            if r.status == "fail":
                ET.SubElement(tc, "failure", message=r.message, type="regression").text = body
                counts["failures"] += 1
            elif r.status == "skip":
                ET.SubElement(tc, "skipped", message=r.message)
                counts["skipped"] += 1
            else:
                ET.SubElement(tc, "system-out").text = body
    for k, v in counts.items():
        suite.set(k, str(v))
    suite.set("time", "0")
    root = ET.Element("testsuites", name="slobench", tests=str(counts["tests"]), failures=str(counts["failures"]),
                      errors=str(counts["errors"]), skipped=str(counts["skipped"]))
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _md(x: Any) -> str:
    """A markdown table cell: HTML-escaped, pipes and newlines neutralised."""
    return html.escape(str(x)).replace("|", "&#124;").replace("\n", " ").replace("`", "&#96;")


def markdown(rep: GateReport | None, error: str | None = None) -> str:
    if rep is None:
        return f"### slobench gate: ⚠️ unusable input\n\n{_md(error)}\n\n"
    icon = {"pass": "✅", "fail": "❌", "skip": "⏭️"}
    head = "✅ pass" if rep.passed else "❌ regression"
    lines = [f"### slobench gate: {head}", "", f"run **{_md(rep.run)}** vs baseline **{_md(rep.baseline)}**", "",
             "| | metric | baseline | run | change | rule |", "|---|---|---:|---:|---:|---|"]
    for r in rep.results:
        rule = ", ".join(r.details) if r.status != "skip" else r.message
        lines.append(f"| {icon[r.status]} | {_md(r.rule.metric)} | {_md(_fmt(r.baseline))} | {_md(_fmt(r.current))} "
                     f"| {_md(r.change)} | {_md(rule)} |")
    return "\n".join(lines) + "\n\n"


def main(run: str, baseline: str, rules: str | None, junit: str | None, stdout, stderr) -> int:
    """The ``slobench gate`` command: never a traceback, exit 0 / 1 / 2."""
    rep, error = None, None
    try:
        rep = gate(run, baseline, rules)
    except GateInputError as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 (a CI gate must answer with an exit code, not a traceback)
        error = f"unexpected {type(e).__name__}: {e}"
    try:
        if junit:
            Path(junit).parent.mkdir(parents=True, exist_ok=True)
            Path(junit).write_bytes(junit_xml(rep, error, str(run), str(baseline)))
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as f:
                f.write(markdown(rep, error))
    except OSError as e:
        error = error or f"cannot write the gate's output: {e}"
        rep = None
    if rep is None:
        print(f"error: gate: {error}", file=stderr)
        return EXIT_UNUSABLE
    for line in text_lines(rep):
        print(line, file=stdout)
    return rep.exit_code
