"""``slobench export-monitoring``: a Grafana dashboard (JSON) and Prometheus alerting rules (YAML) for the five
signals, in vLLM's names, the reference engine's ``slobench:`` names or both, with every threshold taken
from a capacity run's rated step by the deviation rule of ``signals`` (the one ``slobench watch`` applies).

The dashboard has a text panel naming the baseline and one time-series panel per signal: the signal as the
alert reads it, its per-tier (or p50) lines, the rated step's figure as a constant line, and the limit as a
threshold line. The rules file has one group per flavor and one alert per signal with a baseline, ``for:``
the sustain time, its labels and annotations saying the baseline, the limit and where both come from."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loadgen.monitoring.baseline import Baseline
from loadgen.monitoring.promql import EXPORT_FLAVORS, alert_expr, queries, under_load
from loadgen.monitoring.signals import SIGNALS, Signal, limit

DASHBOARD_FILE, RULES_FILE = "grafana-dashboard.json", "prometheus-rules.yml"
SCHEMA_VERSION = 39  # Grafana 10/11 dashboards
GRAFANA_UNITS = {"ms": "ms", "tok/s": "short", "ratio": "percentunit", "1/s": "reqps"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ALERT_NAMES = {"ttft_p99_ms": "TTFTP99High", "output_tok_s": "OutputTokenRateLow", "kv_usage": "KVUsageHigh",
               "batch_fill": "BatchFillLow", "rejections_per_s": "AdmissionRejectionsHigh"}


@dataclass
class ExportOptions:
    flavors: tuple[str, ...] = EXPORT_FLAVORS
    tolerance: float = 0.25
    sustain_s: float = 30.0
    rule_range: str = "1m"  # the range of the rules' rates and averages
    max_num_seqs: int | None = None  # vLLM's batch slots (default: the baseline run's engine.max_num_seqs)
    notes: list[str] = field(default_factory=list)  # what was left out, filled in by the builders


def duration(seconds: float) -> str:
    return f"{math.ceil(seconds)}s"


def baseline_text(b: Baseline, s: Signal, tol: float) -> str:
    v = b.value(s.key)
    rule = (f"x {1 + tol:g} + {s.floor:g} {s.unit}" if s.bad == "high" else
            f"x {1 - tol:g} - {s.floor:g} {s.unit}, under load")
    return (f"baseline {s.fmt.format(v)} {s.unit} ({b.figures[s.key].source}); "
            f"limit {s.fmt.format(limit(s, v, tol))} {s.unit} = baseline {rule}")


def seqs(b: Baseline, o: ExportOptions) -> int | None:
    return o.max_num_seqs or b.max_num_seqs


def panel(pid: int, s: Signal, b: Baseline, o: ExportOptions, x: int, y: int) -> dict[str, Any] | None:
    targets, ref = [], iter("ABCDEFGHIJKLMNOP")
    for flavor in o.flavors:
        q = queries(flavor, "$__rate_interval", seqs(b, o)).get(s.key)
        if q is None:
            continue
        for expr, legend in ((q.expr, q.legend), *q.extra):
            targets.append({"refId": next(ref), "datasource": DATASOURCE, "expr": expr,
                            "legendFormat": f"{flavor}: {legend}" if len(o.flavors) > 1 else legend})
    if not targets:
        return None
    v = b.value(s.key)
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if v is not None:
        lim = limit(s, v, o.tolerance)
        targets.append({"refId": next(ref), "datasource": DATASOURCE, "expr": f"vector({v:.6g})",
                        "legendFormat": f"rated step {b.step}"})
        steps = ([{"color": "green", "value": None}, {"color": "red", "value": lim}] if s.bad == "high" else
                 [{"color": "red", "value": None}, {"color": "green", "value": lim}])
    return {
        "id": pid, "type": "timeseries", "title": f"{s.title} ({s.unit})", "datasource": DATASOURCE,
        "description": baseline_text(b, s, o.tolerance) if v is not None else "no baseline at the rated step",
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y}, "targets": targets,
        "fieldConfig": {"defaults": {"unit": GRAFANA_UNITS[s.unit], "min": 0, "color": {"mode": "palette-classic"},
                                     "thresholds": {"mode": "absolute", "steps": steps},
                                     "custom": {"thresholdsStyle": {"mode": "line"}, "lineWidth": 1}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
    }


def dashboard(b: Baseline, o: ExportOptions) -> dict[str, Any]:
    head = (f"Baseline: rated step {b.step} (load {b.load:.4g}) of the capacity run `{b.path}`, verdict "
            f"{b.verdict}. Limits: tolerance {o.tolerance:g}, sustained for {duration(o.sustain_s)}; TTFT p99, KV "
            "usage and rejections are bad above their limit, output tokens/s and batch fill below it while "
            "the server is under load (a queue, or as many running as at the rated step).")
    panels: list[dict[str, Any]] = [{"id": 1, "type": "text", "title": "Baseline",
                                     "gridPos": {"h": 4, "w": 24, "x": 0, "y": 0},
                                     "options": {"mode": "markdown", "content": head}}]
    for s in SIGNALS:
        k = len(panels) - 1  # the timeseries panels two a row under the text panel
        p = panel(len(panels) + 1, s, b, o, 12 * (k % 2), 4 + 8 * (k // 2))
        if p is None:
            o.notes.append(f"dashboard: no {s.title} panel ({'/'.join(o.flavors)} names have no series for it)")
            continue
        panels.append(p)
    uid = hashlib.sha256(f"{b.path}|{b.step}|{','.join(o.flavors)}".encode()).hexdigest()[:12]
    return {
        "uid": f"slobench-{uid}", "title": f"slobench health: {Path(b.path).name} rated step {b.step}",
        "description": head, "tags": ["slobench", *o.flavors], "timezone": "browser", "editable": True,
        "schemaVersion": SCHEMA_VERSION, "version": 1, "refresh": "10s", "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"}, "timepicker": {},
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "options": [],
                                 "regex": ""}]},
        "panels": panels,
    }


def rules(b: Baseline, o: ExportOptions) -> dict[str, Any]:
    groups = []
    for flavor in o.flavors:
        qs = queries(flavor, o.rule_range, seqs(b, o))
        load = under_load(flavor, o.rule_range, b.running)
        out = []
        for s in SIGNALS:
            v, q = b.value(s.key), qs.get(s.key)
            if v is None or q is None:
                o.notes.append(f"rules ({flavor}): no {s.title} alert ("
                               + ("no baseline at the rated step" if v is None else f"{flavor} has no series for it")
                               + ")")
                continue
            lim = limit(s, v, o.tolerance)
            out.append({
                "alert": f"Slobench{ALERT_NAMES[s.key]}", "expr": alert_expr(q, s.bad, lim, load),
                "for": duration(o.sustain_s),
                "labels": {"severity": "warning", "signal": s.key, "flavor": flavor,
                           "baseline_step": str(b.step)},
                "annotations": {
                    "summary": f"{s.title} {'above' if s.bad == 'high' else 'below'} the rated step's "
                               f"{s.fmt.format(v)} {s.unit} by more than the tolerance "
                               f"for {duration(o.sustain_s)}",
                    "description": f"{baseline_text(b, s, o.tolerance)}; capacity run {b.path}, rated step "
                                   f"{b.step} (load {b.load:.4g}). A sustained drift says capacity or engine "
                                   "parameters need adjusting.",
                    "baseline": f"{v:.6g}", "limit": f"{lim:.6g}", "baseline_source": b.figures[s.key].source,
                },
            })
        groups.append({"name": f"slobench-health-{flavor}", "rules": out})
    return {"groups": groups}


def write(b: Baseline, o: ExportOptions, out_dir: Path) -> tuple[Path, Path]:
    """Write the dashboard and the rules into ``out_dir``; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dash, rule_file = out_dir / DASHBOARD_FILE, out_dir / RULES_FILE
    dash.write_text(json.dumps(dashboard(b, o), indent=2) + "\n", encoding="utf-8")
    rule_file.write_text(f"# slobench export-monitoring: thresholds from rated step {b.step} of {b.path}\n"
                         + yaml.safe_dump(rules(b, o), sort_keys=False, width=1000), encoding="utf-8")
    return dash, rule_file
