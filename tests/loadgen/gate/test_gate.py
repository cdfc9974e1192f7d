"""slobench gate: pass, regression and unusable input, with their exit codes, JUnit XML and the GitHub
step summary; rules files, aliases, noise handling."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from loadgen import gate as G
from loadgen.cli import main
from tests.run_folders import make_capacity_run, make_fixed_run

from .test_gate_intervals import without_interval

REPO = Path(__file__).resolve().parents[3]


def run_gate(capsys, *args) -> tuple[int, str, str]:
    rc = main(["gate", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def junit(path: Path) -> dict:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    cases = root.findall("./testsuite/testcase")
    return {"root": root.attrib, "cases": {c.get("name"): c for c in cases},
            "failed": [c.get("name") for c in cases if c.find("failure") is not None],
            "skipped": [c.get("name") for c in cases if c.find("skipped") is not None],
            "errors": [c.get("name") for c in cases if c.find("error") is not None]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("runs")  # read-only for the gate: shared by the module's tests
    return {
        "cap": make_capacity_run(tmp_path / "cap"),
        "cap_same": make_capacity_run(tmp_path / "cap_same", seed=3),
        "cap_slow": without_interval(make_capacity_run(tmp_path / "cap_slow", scale=0.8, seed=1)),
        "never": make_capacity_run(tmp_path / "never", knee=0.5),
        "fixed": make_fixed_run(tmp_path / "fixed", ttft_ms=80),
        "fixed_same": make_fixed_run(tmp_path / "fixed_same", ttft_ms=82, seed=5),
        "fixed_slow": make_fixed_run(tmp_path / "fixed_slow", ttft_ms=120, seed=2),
        "failed": make_fixed_run(tmp_path / "failed", fail_all=True),
    }


# ------------------------------------------------------------------ pass


def test_pass_capacity_with_defaults(runs, tmp_path, capsys, monkeypatch):
    md = tmp_path / "step_summary.md"
    md.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(md))
    rc, out, err = run_gate(capsys, runs["cap_same"], "--baseline", runs["cap"] / "summary.json",
                            "--junit", tmp_path / "j.xml")
    assert rc == 0, out + err
    assert "PASS  rated_capacity.rate_rps" in out and out.strip().endswith("pass")
    j = junit(tmp_path / "j.xml")
    assert set(j["cases"]) == {"rated_capacity.rate_rps", "valid"} and not j["failed"]
    assert j["root"]["tests"] == "2" and j["root"]["failures"] == "0"
    text = md.read_text()
    assert text.startswith("earlier step\n") and "slobench gate: ✅ pass" in text
    assert "| ✅ | rated_capacity.rate_rps | 10 | 10 |" in text


def test_pass_fixed_run_with_defaults(runs, tmp_path, capsys):
    rc, out, err = run_gate(capsys, runs["fixed_same"], "--baseline", runs["fixed"], "--junit", tmp_path / "j.xml")
    assert rc == 0, out + err
    j = junit(tmp_path / "j.xml")
    assert set(j["cases"]) == set(G.DEFAULT_RULES_RUN)
    assert not j["failed"] and not j["errors"]


# ------------------------------------------------------------------ regression


def test_capacity_regression(runs, tmp_path, capsys, monkeypatch):
    md = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(md))
    rc, out, _ = run_gate(capsys, runs["cap_slow"], "--baseline", runs["cap"], "--junit", tmp_path / "j.xml")
    assert rc == 1
    assert "FAIL  rated_capacity.rate_rps: baseline 10 -> run 8 (-20.0%)" in out
    assert "REGRESSION (1 of 2 rules failed)" in out
    j = junit(tmp_path / "j.xml")
    assert j["failed"] == ["rated_capacity.rate_rps"] and j["root"]["failures"] == "1"
    f = j["cases"]["rated_capacity.rate_rps"].find("failure")
    assert f.get("type") == "regression" and "≥ 0.9 × baseline = 9" in f.get("message")
    assert "❌ regression" in md.read_text() and "| ❌ | rated_capacity.rate_rps |" in md.read_text()


def test_never_met_is_a_regression_not_bad_input(runs, capsys):
    rc, out, _ = run_gate(capsys, runs["never"], "--baseline", runs["cap"])
    assert rc == 1 and "baseline 10 -> run 0" in out


def test_latency_regression_on_a_fixed_run(runs, tmp_path, capsys):
    rc, out, _ = run_gate(capsys, runs["fixed_slow"], "--baseline", runs["fixed"], "--junit", tmp_path / "j.xml")
    assert rc == 1
    j = junit(tmp_path / "j.xml")
    assert "median_ttft_ms" in j["failed"] and "p99_ttft_ms" in j["failed"]
    assert "output_throughput" not in j["failed"] and "valid" not in j["failed"]


def test_every_request_failed_is_a_regression(runs, tmp_path, capsys):
    rules = tmp_path / "r.yaml"
    rules.write_text("rules:\n  error_rate: {max_increase: 0.01}\n  valid: {equals: baseline}\n")
    rc, out, _ = run_gate(capsys, runs["failed"], "--baseline", runs["fixed"], "--rules", rules)
    assert rc == 1 and "FAIL  error_rate: baseline 0 -> run 1" in out


def test_rules_file_with_aliases_and_defaults(runs, tmp_path, capsys):
    rc, out, err = run_gate(capsys, runs["cap_same"], "--baseline", runs["cap"], "--rules", REPO / "examples/gate.yaml",
                            "--junit", tmp_path / "j.xml")
    assert rc == 0, out + err
    j = junit(tmp_path / "j.xml")
    assert {"rated_capacity.rate_rps", "median_ttft_ms", "p99_ttft_ms", "error_rate", "valid"} <= set(j["cases"])
    # the rated step has 30 requests: too few for a p99 gate
    assert j["skipped"] == ["p99_ttft_ms"]
    rules = tmp_path / "strict.yaml"
    rules.write_text("rated_rps: {min_ratio: 1.0}\ntiers.premium.p99_ttft_ms: {max: 1}\n")
    rc, out, _ = run_gate(capsys, runs["cap_slow"], "--baseline", runs["cap"], "--rules", rules)
    assert rc == 1
    assert "FAIL  rated_rps" in out and "FAIL  tiers.premium.p99_ttft_ms" in out


def test_noise_handling():
    base = {"kind": "run", "completed": 500, "median_ttft_ms": 1.0, "p99_ttft_ms": 2.0, "valid": True}
    cur = {**base, "median_ttft_ms": 1.4, "p99_ttft_ms": 2.2}
    rules, _ = G.parse_rules({"median_ttft_ms": {"max_ratio": 1.1, "abs_tolerance": 0.5}})
    assert G.evaluate_rule(rules[0], cur, base).status == "pass"  # +40% but only 0.4 ms
    rules, _ = G.parse_rules({"median_ttft_ms": {"max_ratio": 1.1}})
    assert G.evaluate_rule(rules[0], cur, base).status == "fail"
    rules, _ = G.parse_rules({"p99_ttft_ms": {"max_ratio": 1.0, "min_samples": 1000}})
    assert G.evaluate_rule(rules[0], cur, base).status == "skip"
    rules, _ = G.parse_rules({"p99_itl_ms": {"max_ratio": 1.0, "required": False}})
    assert G.evaluate_rule(rules[0], cur, base).status == "skip"


def test_capacity_latency_keys_come_from_the_rated_step(runs):
    s = G.load_summary(runs["cap"])
    v, where = G.resolve(s, "p99_ttft_ms")
    step = next(st for st in s["steps"] if st["load"] == 10.0 and st["phase"] == "bisect")
    assert v == step["summary"]["p99_ttft_ms"] and where.startswith(f"steps[{step['index']}].summary")
    assert G.resolve(s, "rated_rps")[0] == 10.0
    assert G.resolve(s, "lateness_p99_ms")[0] == 1.2
    never = dict(s, verdict="never_broke", rated_capacity=None)
    assert G.resolve(never, "rated_rps")[0] == 10.0


# ------------------------------------------------------------------ unusable input


@pytest.mark.parametrize("case, message", [
    ("missing_run", "not found"),
    ("missing_baseline", "no summary.json or requests.jsonl"),
    ("bad_json", "not valid JSON"),
    ("bad_yaml", "bad YAML at line 3, column 1"),
    ("unknown_check", "unknown key 'max_ration'"),
    ("no_check", "has no check"),
    ("not_a_number", "max_ratio must be a number"),
    ("missing_metric", "metric 'p99_tpot_msx' (p99_tpot_msx) missing from the run and the baseline summary"),
    ("missing_on_baseline", "missing from the baseline summary"),
    ("rules_file_missing", "cannot read rules"),
])
def test_unusable_input_exits_2_with_one_line(runs, tmp_path, capsys, monkeypatch, case, message):
    run, base, rules = runs["fixed"], runs["fixed_same"], tmp_path / "rules.yaml"
    rules.write_text("valid: {equals: true}\n")
    if case == "missing_run":
        run = tmp_path / "nope" / "summary.json"
    elif case == "missing_baseline":
        base = tmp_path
    elif case == "bad_json":
        (tmp_path / "b.json").write_text("{nope")
        base = tmp_path / "b.json"
    elif case == "bad_yaml":
        rules.write_text("rules:\n  p99_ttft_ms: {max_ratio: [1.15\n")
    elif case == "unknown_check":
        rules.write_text("p99_ttft_ms: {max_ration: 1.15}\n")
    elif case == "no_check":
        rules.write_text("p99_ttft_ms: {abs_tolerance: 3}\n")
    elif case == "not_a_number":
        rules.write_text("p99_ttft_ms: {max_ratio: fast}\n")
    elif case == "missing_metric":
        rules.write_text("p99_tpot_msx: {max_ratio: 1.1}\n")
    elif case == "missing_on_baseline":
        rules.write_text("rated_rps: {max_ratio: 1.1}\n")
        run = runs["cap"]
    elif case == "rules_file_missing":
        rules = tmp_path / "missing.yaml"
    md = tmp_path / "gh.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(md))
    rc, out, err = run_gate(capsys, run, "--baseline", base, "--rules", rules, "--junit", tmp_path / "j.xml")
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: gate: ") and message in err, err
    j = junit(tmp_path / "j.xml")
    assert j["errors"] == ["gate input"] and j["root"]["errors"] == "1"
    assert "unusable input" in md.read_text()


def test_cli_gate_subprocess_never_prints_a_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "loadgen.cli", "gate", str(tmp_path), "--baseline", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    r = subprocess.run([sys.executable, "-m", "loadgen.cli", "gate", str(tmp_path)], cwd=REPO, capture_output=True,
                       text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert r.returncode == 2 and "--baseline" in r.stderr  # argparse: one line, exit 2


def test_markdown_and_junit_escape_run_strings(tmp_path):
    s = {"kind": "run", "run_id": "a|b<script>", "valid": True, "median_ttft_ms": 1.0}
    (tmp_path / "s.json").write_text(json.dumps(s))
    rules = tmp_path / "r.yaml"
    rules.write_text("'median_ttft_ms': {max_ratio: 1.0}\n")
    rep = G.gate(tmp_path / "s.json", tmp_path / "s.json", rules)
    md = G.markdown(rep)
    assert "<script>" not in md and "a&#124;b&lt;script&gt;" in md
    root = ET.fromstring(G.junit_xml(rep))
    assert root.find("./testsuite/properties/property[@name='run']").get("value") == "a|b<script>"


def test_example_workflow_uses_real_commands():
    """examples/github-workflow.yml is valid YAML and every slobench command in it parses."""
    import shlex

    import yaml

    from loadgen.cli import build_parser

    wf = yaml.safe_load((REPO / "examples/github-workflow.yml").read_text())
    steps = wf["jobs"]["capacity"]["steps"]
    cmds = [s["run"] for s in steps if "run" in s and ".venv/bin/slobench" in s["run"]]
    assert len(cmds) == 3
    for cmd in cmds:
        line = " ".join(cmd.replace("\\\n", " ").split()).replace('"$SCENARIO"', "loadgen/scenarios/chat.yaml")
        line = line.replace("$RUN_ID", "r1")
        argv = shlex.split(line.split(".venv/bin/slobench", 1)[1])
        if argv[0] == "capacity" and "slobench capacity" not in (REPO / "loadgen/cli.py").read_text():
            continue  # the capacity command lands separately (issue 5)
        args = build_parser().parse_args(argv)
        assert args.cmd in ("capacity", "gate", "report")
    assert (REPO / "examples/gate.yaml").is_file()
    G.load_rules(REPO / "examples/gate.yaml")
