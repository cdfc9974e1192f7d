"""A gate's result as people and CI read it: text lines for the terminal, JUnit XML (one testcase per
rule) and the markdown table for ``$GITHUB_STEP_SUMMARY``."""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from typing import Any

from loadgen.gate.evaluate import GateReport
from loadgen.gate.values import format_value

_TAG = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}
_ICON = {"pass": "✅", "fail": "❌", "skip": "⏭️"}


def text_lines(rep: GateReport) -> list[str]:
    """One line per rule, then the verdict."""
    out = []
    for r in rep.results:
        nums = f"baseline {format_value(r.baseline)} -> run {format_value(r.current)}"
        if r.change:
            nums += f" ({r.change})"
        out.append(f"{_TAG[r.status]}  {r.rule.metric}: {nums}; {r.message}" if r.status != "pass"
                   else f"{_TAG[r.status]}  {r.rule.metric}: {nums}; {', '.join(r.details)}")
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
            body = (f"baseline: {format_value(r.baseline)}\nrun: {format_value(r.current)}\n"
                    f"change: {r.change or '-'}\nrule: {', '.join(r.details) or r.rule.checks}\n"
                    + "".join(f"{k}: {_fig(v)}\n" for k, v in r.figures.items()))
            if r.figures:
                tprops = ET.SubElement(tc, "properties")
                for k, v in r.figures.items():
                    ET.SubElement(tprops, "property", name=k, value=_fig(v))
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


def _fig(v: Any) -> str:
    """A figure of a rule (a number, an interval [low, high], a name) as the outputs print it."""
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    return format_value(v)


def _md(x: Any) -> str:
    """A markdown table cell: HTML-escaped, pipes and newlines neutralised."""
    return html.escape(str(x)).replace("|", "&#124;").replace("\n", " ").replace("`", "&#96;")


def markdown(rep: GateReport | None, error: str | None = None) -> str:
    """The GitHub step summary: a verdict heading and one table row per rule."""
    if rep is None:
        return f"### slobench gate: ⚠️ unusable input\n\n{_md(error)}\n\n"
    head = "✅ pass" if rep.passed else "❌ regression"
    lines = [f"### slobench gate: {head}", "", f"run **{_md(rep.run)}** vs baseline **{_md(rep.baseline)}**", "",
             "| | metric | baseline | run | change | rule |", "|---|---|---:|---:|---:|---|"]
    for r in rep.results:
        rule = ", ".join(r.details) if r.status != "skip" else r.message
        lines.append(f"| {_ICON[r.status]} | {_md(r.rule.metric)} | {_md(format_value(r.baseline))} "
                     f"| {_md(format_value(r.current))} | {_md(r.change)} | {_md(rule)} |")
    return "\n".join(lines) + "\n\n"
