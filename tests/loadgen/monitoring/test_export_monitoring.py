"""`slobench export-monitoring`: the Grafana dashboard checked against the dashboard schema's keys, the alerting
rules' structure and thresholds (from the rated step, by the watch's deviation rule), every PromQL expression
balanced; with promtool installed, `promtool check rules` and `promtool test rules` on synthetic series: every
alert fires on an overloaded server and none on a light one within its baseline."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from loadgen.commands.common import UsageError
from loadgen.commands.export_monitoring import cmd_export_monitoring
from loadgen.monitoring.signals import BATCH_FILL, KV, REJECTIONS, SIGNALS, TOKEN_RATE, TTFT, limit
from tests.monitoring_helpers import parser, write_run

FIGURES = {"ttft_p99_ms": 300.0, "output_tok_s": 1000.0, "kv_usage": 0.1, "batch_fill": 0.6, "rejections": 0,
           "running": 10.0, "max_num_seqs": 16}
BASE = {TTFT.key: 300.0, TOKEN_RATE.key: 1000.0, KV.key: 0.1, BATCH_FILL.key: 0.6, REJECTIONS.key: 0.0}
PANEL_TYPES = {"timeseries", "text", "stat", "gauge", "graph", "table", "row"}
promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                              reason="promtool is not installed (scripts/install-promtool.sh)")


def export(tmp_path, *flags) -> tuple[dict, dict, str]:
    run = write_run(tmp_path / "run", **FIGURES)
    args = parser().parse_args(["export-monitoring", str(run), "--out", str(tmp_path / "mon"), *flags])
    assert cmd_export_monitoring(args) == 0
    dash = json.loads((tmp_path / "mon" / "grafana-dashboard.json").read_text())
    text = (tmp_path / "mon" / "prometheus-rules.yml").read_text()
    return dash, yaml.safe_load(text), text


def check_dashboard_schema(d: dict) -> None:
    """The keys Grafana's dashboard schema (schemaVersion 39) needs of a dashboard and its panels."""
    assert isinstance(d["title"], str) and d["title"]
    assert isinstance(d["uid"], str) and 0 < len(d["uid"]) <= 40
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert isinstance(d["version"], int) and isinstance(d["tags"], list)
    assert set(d["time"]) == {"from", "to"} and isinstance(d["annotations"]["list"], list)
    assert [v["name"] for v in d["templating"]["list"] if v["type"] == "datasource"] == ["datasource"]
    ids, cells = set(), set()
    for p in d["panels"]:
        assert isinstance(p["id"], int) and p["id"] not in ids
        ids.add(p["id"])
        assert p["type"] in PANEL_TYPES and isinstance(p["title"], str) and p["title"]
        g = p["gridPos"]
        assert set(g) == {"h", "w", "x", "y"} and all(isinstance(v, int) and v >= 0 for v in g.values())
        assert g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"panel {p['title']!r} overlaps another"
        cells |= area
        if p["type"] == "text":
            assert p["options"]["mode"] in ("markdown", "html") and p["options"]["content"]
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(set(refs)) == len(refs)
        assert all(isinstance(t["expr"], str) and t["expr"] and "legendFormat" in t for t in p["targets"])
        steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert p["fieldConfig"]["defaults"]["thresholds"]["mode"] == "absolute" and steps[0]["value"] is None
        assert isinstance(p["fieldConfig"]["overrides"], list)


def balanced(expr: str) -> bool:
    """Brackets balanced and nested right, outside string literals; quotes closed."""
    pairs, stack, quote = {")": "(", "]": "[", "}": "{"}, [], None
    for ch in expr:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack and quote is None


def panel(dash: dict, signal) -> dict:
    return next(p for p in dash["panels"] if p["title"].startswith(signal.title + " ("))


def test_the_dashboard_has_the_schemas_keys_and_a_panel_per_signal_thresholded_at_the_rated_step(tmp_path):
    dash, _, _ = export(tmp_path)
    check_dashboard_schema(dash)
    assert [p["type"] for p in dash["panels"]] == ["text"] + ["timeseries"] * 5
    assert "rated step 1" in dash["panels"][0]["options"]["content"]
    for s in SIGNALS:
        p = panel(dash, s)
        steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[1]["value"] == pytest.approx(limit(s, BASE[s.key], 0.25))
        # high is bad: red above the limit; low is bad: red below it
        assert [st["color"] for st in steps] == (["green", "red"] if s.bad == "high" else ["red", "green"])
        last = p["targets"][-1]  # the rated step's figure as a constant line
        assert (last["expr"], last["legendFormat"]) == (f"vector({BASE[s.key]:.6g})", "rated step 1")
        assert all(balanced(t["expr"]) for t in p["targets"])
    ttft_exprs = [t["expr"] for t in panel(dash, TTFT)["targets"]]
    assert ("1000 * histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
            "[$__rate_interval])))") in ttft_exprs
    assert any("slobench:time_to_first_token_seconds_bucket" in e and "by (le, tier)" in e for e in ttft_exprs)
    assert [t["expr"] for t in panel(dash, REJECTIONS)["targets"]][0].startswith(
        "sum(rate(slobench:admission_rejections_total")  # vLLM has none: only the engine's series


def test_vllm_names_alone_leave_out_the_rejections_and_say_so(tmp_path, capsys):
    dash, rules, _ = export(tmp_path, "--flavor", "vllm")
    check_dashboard_schema(dash)
    out = capsys.readouterr().out
    assert "no admission rejections/s panel" in out and "no admission rejections/s alert" in out
    assert [g["name"] for g in rules["groups"]] == ["slobench-health-vllm"]
    assert {r["labels"]["signal"] for r in rules["groups"][0]["rules"]} == set(BASE) - {REJECTIONS.key}
    assert all("slobench:" not in t["expr"] for p in dash["panels"][1:] for t in p["targets"])
    fill = next(r for r in rules["groups"][0]["rules"] if r["labels"]["signal"] == BATCH_FILL.key)
    assert "sum(avg_over_time(vllm:num_requests_running[1m])) / 16 < 0.43" in fill["expr"]  # max_num_seqs 16


def test_one_rule_per_signal_with_the_rated_steps_threshold_and_the_baseline_in_labels_and_annotations(tmp_path):
    _, rules, text = export(tmp_path, "--flavor", "slobench", "--sustain-s", "45", "--tolerance", "0.5")
    assert text.startswith("# slobench export-monitoring: thresholds from rated step 1")
    (group,) = rules["groups"]
    assert group["name"] == "slobench-health-slobench" and len(group["rules"]) == 5
    for r in group["rules"]:
        s = next(x for x in SIGNALS if x.key == r["labels"]["signal"])
        lim = limit(s, BASE[s.key], 0.5)
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"} and r["for"] == "45s"
        assert re.fullmatch(r"Slobench[A-Za-z0-9]+", r["alert"]) and balanced(r["expr"])
        assert r["labels"] == {"severity": "warning", "signal": s.key, "flavor": "slobench", "baseline_step": "1"}
        assert float(r["annotations"]["baseline"]) == pytest.approx(BASE[s.key])
        assert float(r["annotations"]["limit"]) == pytest.approx(lim, rel=1e-5)
        assert r["annotations"]["baseline_source"].startswith("summary.json steps[1].")
        assert (f"> {lim:.6g}" if s.bad == "high" else f"< {lim:.6g}") in r["expr"]
        # a low token rate or batch fill alerts only under load: a queue, or as many running as at the rated step
        assert ("and on() (sum(avg_over_time(slobench:num_requests_waiting[1m])) >= 1 or "
                "sum(avg_over_time(slobench:num_requests_running[1m])) >= 10)" in r["expr"]) == (s.bad == "low")


def test_the_default_out_folder_is_the_runs_monitoring_folder(tmp_path, capsys):
    run = write_run(tmp_path / "run", **FIGURES)
    assert cmd_export_monitoring(parser().parse_args(["export-monitoring", str(run / "summary.json")])) == 0
    assert (run / "monitoring" / "grafana-dashboard.json").is_file()
    assert (run / "monitoring" / "prometheus-rules.yml").is_file()
    assert "baseline: rated step 1 (load 8)" in capsys.readouterr().out


def test_bad_input_is_a_one_line_usage_error(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"kind": "run", "requests": 3}))
    with pytest.raises(UsageError, match="not a capacity run"):
        cmd_export_monitoring(parser().parse_args(["export-monitoring", str(tmp_path / "run")]))
    run = write_run(tmp_path / "ok", **FIGURES)
    with pytest.raises(UsageError, match="not a PromQL duration"):
        cmd_export_monitoring(parser().parse_args(["export-monitoring", str(run), "--rule-range", "one minute"]))
    with pytest.raises(UsageError, match="invalid choice"):
        parser().parse_args(["export-monitoring", str(run), "--flavor", "sglang"])


# ---------------------------------------------------------------------------------------------- promtool

@promtool
def test_promtool_checks_the_rules(tmp_path):
    export(tmp_path)
    r = subprocess.run(["promtool", "check", "rules", str(tmp_path / "mon" / "prometheus-rules.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 9 rules found" in r.stdout  # 5 in the engine's names, 4 in vLLM's (no rejections)


def series(waiting: float, ttft_le: str, kv: float, rejections_per_15s: int, fill: float) -> list[dict]:
    """Five minutes of both flavors' series at a 15 s scrape: every first token in the bucket ``ttft_le``,
    ten generated tokens a scrape (far under the baseline's 1000/s), ``waiting`` queued, two running."""
    out = []
    for prefix, lab in (("slobench:", 'tier="standard"'), ("vllm:", 'model_name="m"')):
        for le in ("0.1", "1", "+Inf"):
            n = 10 if le == "+Inf" or float(le) >= float(ttft_le) else 0
            out.append({"series": f'{prefix}time_to_first_token_seconds_bucket{{le="{le}",{lab}}}',
                        "values": f"0+{n}x20"})
        out += [{"series": f"{prefix}generation_tokens_total{{{lab}}}", "values": "0+10x20"},
                {"series": f"{prefix}num_requests_waiting{{{lab}}}", "values": f"{waiting}x20"},
                {"series": f"{prefix}num_requests_running{{{lab}}}", "values": "2x20"},
                {"series": f"{prefix}kv_cache_usage_perc{{{lab}}}", "values": f"{kv}x20"}]
    out += [{"series": 'slobench:admission_rejections_total{tier="standard"}', "values": f"0+{rejections_per_15s}x20"},
            {"series": 'slobench:batch_fill_ratio{tier="standard"}', "values": f"{fill}x20"}]
    return out


@promtool
def test_promtool_fires_every_alert_on_an_overloaded_server_and_none_on_a_light_one(tmp_path):
    _, rules, _ = export(tmp_path)
    by_name: dict[str, list[dict]] = {}
    for g in rules["groups"]:
        for r in g["rules"]:
            by_name.setdefault(r["alert"], []).append({"exp_labels": {**r["labels"]},
                                                        "exp_annotations": r["annotations"]})
    # overloaded: a queue of 3, first tokens at 0.1-1 s (p99 991 ms > 380), KV 0.9 > 0.145, 2 rejections/s,
    # 10 tokens/15 s < 749/s, fill 0.1 (engine) and 2/16 (vLLM) < 0.43: every alert of both flavors fires
    overloaded = {"interval": "15s", "input_series": series(3, "1", 0.9, 30, 0.1),
                  "alert_rule_test": [{"eval_time": "3m", "alertname": name, "exp_alerts": alerts}
                                      for name, alerts in by_name.items()]}
    # light traffic within the baseline: no queue (a low rate and fill are not judged), first tokens under
    # 0.1 s (p99 99 ms), KV 0.05, no rejections: nothing fires
    light = {"interval": "15s", "input_series": series(0, "0.1", 0.05, 0, 0.1),
             "alert_rule_test": [{"eval_time": "3m", "alertname": name, "exp_alerts": []} for name in by_name]}
    spec = tmp_path / "mon" / "rules-test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": ["prometheus-rules.yml"], "evaluation_interval": "15s",
                                    "tests": [overloaded, light]}, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(by_name) == 5 and sum(len(a) for a in by_name.values()) == 9
