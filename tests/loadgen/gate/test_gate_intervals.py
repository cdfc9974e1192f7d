"""slobench gate on two capacity runs that carry confidence intervals on their rated capacity
(``rated_capacity.ci_low`` / ``ci_high``): the default rule asks the intervals, and falls back to the
fixed 0.9 x baseline without them; the figures reach the text, JUnit and the GitHub step summary."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from loadgen import gate as G
from loadgen.cli import main
from tests.run_folders import make_capacity_run


def with_interval(path: Path, est: float, lo: float, hi: float, *, rate: float | None = None) -> Path:
    p = path / "summary.json"
    s = json.loads(p.read_text())
    s["rated_capacity"].update(rate_rps=rate if rate is not None else est, estimate=est, ci_low=lo, ci_high=hi,
                               ci_of="rate_rps", confidence=0.95, boundary="cliff",
                               binding={"tier": "premium", "metric": "ttft_ms"})
    p.write_text(json.dumps(s))
    return path


def without_interval(path: Path) -> Path:
    """The run as a summary from before ratings had intervals (the fixture's runs carry the rating's)."""
    p = path / "summary.json"
    s = json.loads(p.read_text())
    for k in ("estimate", "ci_low", "ci_high", "ci_of", "confidence", "interval"):
        s["rated_capacity"].pop(k, None)
    p.write_text(json.dumps(s))
    return path


@pytest.fixture
def pair(tmp_path):
    return make_capacity_run(tmp_path / "run"), make_capacity_run(tmp_path / "base", seed=3)


def gate(capsys, run, base, tmp_path):
    rc = main(["gate", str(run), "--baseline", str(base), "--junit", str(tmp_path / "j.xml")])
    return rc, capsys.readouterr().out, ET.parse(tmp_path / "j.xml").getroot()


def case(root, name):
    return next(c for c in root.findall("./testsuite/testcase") if c.get("name") == name)


def test_overlapping_intervals_pass_even_past_the_fixed_ratio(pair, tmp_path, capsys, monkeypatch):
    """A 14 % lower rating whose interval overlaps the baseline's: the fixed rule would fail it; the
    intervals say the runs are not told apart."""
    md = tmp_path / "gh.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(md))
    run, base = with_interval(pair[0], 8.6, 7.4, 9.9), with_interval(pair[1], 10.0, 8.9, 11.2)
    rc, out, root = gate(capsys, run, base, tmp_path)
    slack = math.hypot(10.0 - 8.9, 9.9 - 8.6)
    assert rc == 0, out
    assert f"= {10.0 - slack:.4g}" in out and "run interval [7.4, 9.9], baseline [8.9, 11.2]" in out
    tc = case(root, "rated_capacity.rate_rps")
    assert tc.find("failure") is None
    props = {p.get("name"): p.get("value") for p in tc.findall("./properties/property")}
    assert props["rule"] == "intervals" and props["run_interval"] == "[7.4, 9.9]"
    assert props["baseline_interval"] == "[8.9, 11.2]" and float(props["bound"]) == pytest.approx(10.0 - slack, 1e-3)
    assert "baseline_interval: [8.9, 11.2]" in tc.find("system-out").text
    assert "run interval [7.4, 9.9], baseline [8.9, 11.2]" in md.read_text()


def test_separated_intervals_fail_even_inside_the_fixed_ratio(pair, tmp_path, capsys, monkeypatch):
    """A 6 % lower rating with narrow intervals that do not overlap: a real regression, which the fixed
    0.9 rule would let through."""
    md = tmp_path / "gh.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(md))
    run, base = with_interval(pair[0], 9.4, 9.2, 9.6), with_interval(pair[1], 10.0, 9.8, 10.2)
    rc, out, root = gate(capsys, run, base, tmp_path)
    assert rc == 1 and "FAIL  rated_capacity.rate_rps" in out
    f = case(root, "rated_capacity.rate_rps").find("failure")
    assert f is not None and "run interval [9.2, 9.6], baseline [9.8, 10.2]" in f.get("message")
    assert "run_interval: [9.2, 9.6]" in f.text and "baseline_estimate: 10" in f.text
    assert "| ❌ | rated_capacity.rate_rps |" in md.read_text() and "baseline [9.8, 10.2]" in md.read_text()


def test_the_rule_is_the_difference_of_the_two_intervals():
    rule = G.parse_rules({"rated_capacity.rate_rps": {"within_intervals": 0.9}})[0][0]
    base = {"kind": "capacity", "rated_capacity": {"rate_rps": 10.0, "estimate": 10.0, "ci_low": 9.0,
                                                   "ci_high": 11.0, "ci_of": "rate_rps"}}

    def run(est, half):
        return {"kind": "capacity", "rated_capacity": {"rate_rps": est, "estimate": est, "ci_low": est - half,
                                                       "ci_high": est + half, "ci_of": "rate_rps"}}

    bound = 10.0 - math.hypot(1.0, 1.0)  # 8.586
    assert G.evaluate_rule(rule, run(8.6, 1.0), base).status == "pass"
    r = G.evaluate_rule(rule, run(8.55, 1.0), base)  # overlapping intervals, estimates too far apart
    assert r.status == "fail" and r.figures["bound"] == pytest.approx(bound)
    assert G.evaluate_rule(rule, run(12.0, 1.0), base).status == "pass"  # better is never a regression
    # an interval of another metric (ci_of) does not count: the fixed ratio decides
    other = run(8.6, 1.0)
    other["rated_capacity"]["ci_of"] = "concurrency"
    r = G.evaluate_rule(rule, other, base)
    assert r.status == "fail" and r.figures["rule"] == "fixed ratio" and "no interval in the run" in r.details[0]


def test_without_intervals_the_fixed_rule_decides(pair, tmp_path, capsys):
    run = with_interval(pair[0], 8.6, 7.4, 9.9)
    without_interval(pair[1])  # the baseline (an older summary) has none
    rc, out, root = gate(capsys, run, pair[1], tmp_path)
    assert rc == 1 and "≥ 0.9 × baseline = 9 (no interval in the baseline)" in out
    props = {p.get("name"): p.get("value") for p in case(root, "rated_capacity.rate_rps").findall(".//property")}
    assert props["rule"] == "fixed ratio" and props["baseline_interval"] == "null"
    assert props["run_interval"] == "[7.4, 9.9]"


def test_repeated_runs_pool_into_the_interval_of_a_mean(tmp_path, capsys):
    """Three runs a side: each single pair overlaps and passes, but the pooled sides (means, half-widths
    √(Σh²)/n) are told apart: the drop is flagged, with the pooled figures printed."""
    runs = [with_interval(make_capacity_run(tmp_path / f"run{i}", seed=i), est, est - 1.2, est + 1.2)
            for i, est in enumerate((8.8, 9.0, 9.2))]
    bases = [with_interval(make_capacity_run(tmp_path / f"base{i}", seed=10 + i), est, est - 1.2, est + 1.2)
             for i, est in enumerate((9.9, 10.0, 10.1))]
    for r in runs:
        for b in bases:
            assert main(["gate", str(r), "--baseline", str(b)]) == 0
    capsys.readouterr()
    rc = main(["gate", *map(str, runs), "--baseline", *map(str, bases), "--junit", str(tmp_path / "j.xml")])
    out = capsys.readouterr().out
    half = math.sqrt(3 * 1.2**2) / 3  # 0.693
    bound = 10.0 - math.hypot(half, half)
    assert rc == 1, out
    assert f"estimate 9 ≥ baseline estimate 10 − √({half:.3g}² + {half:.3g}²) = {bound:.4g}" in out
    assert "gate 3 runs: run0, run1, run2 vs baseline 3 runs: base0, base1, base2" in out
    props = {p.get("name"): p.get("value") for p in ET.parse(tmp_path / "j.xml").getroot().iter("property")}
    assert props["run"] == "3 runs: run0, run1, run2"


def test_pooling_takes_medians_all_flags_and_the_smallest_sample():
    summaries = [{"kind": "run", "valid": v, "completed": n, "requests": n + f, "failed": f,
                  "tiers": {"premium": {"p99_ttft_ms": p}}}
                 for v, n, f, p in ((True, 500, 0, 100.0), (False, 300, 100, 900.0), (True, 400, 4, 120.0))]
    pooled = G.pool(summaries, ["a", "b", "c"])
    assert pooled["valid"] is False and pooled["completed"] == 300 and pooled["requests"] == 400
    assert G.resolve(pooled, "error_rate")[0] == pytest.approx(4 / 404)  # the median run's error rate
    assert pooled["tiers"]["premium"]["p99_ttft_ms"] == 120.0  # the median: one odd run does not move it
    assert G.pool(summaries[:1], ["a"]) is summaries[0]


def test_pooled_capacity_runs_read_latencies_at_their_rated_steps():
    def cap(p99_at_rated):
        steps = [{"load": 5.0, "passed": True, "summary": {"p99_ttft_ms": 50.0, "completed": 200}},
                 {"load": 10.0, "passed": True, "summary": {"p99_ttft_ms": p99_at_rated, "completed": 150}},
                 {"load": 20.0, "passed": False, "summary": {"p99_ttft_ms": 2000.0, "completed": 100}}]
        return {"kind": "capacity", "steps": steps, "rated_capacity": {"rate_rps": 10.0}}

    pooled = G.pool([cap(100.0), cap(300.0), cap(200.0)], ["a", "b", "c"])
    assert G.resolve(pooled, "p99_ttft_ms")[0] == 200.0  # the median of the three rated steps'
    assert G.completed(pooled) == 150


def test_a_run_without_an_interval_leaves_the_pooled_side_without_one():
    def cap(est, lo, hi):
        return {"kind": "capacity", "rated_capacity": {"rate_rps": est, "estimate": est, "ci_low": lo,
                                                       "ci_high": hi, "ci_of": "rate_rps"}}

    pooled = G.pool([cap(10.0, 9.0, 11.0), cap(12.0, None, None), cap(17.0, 16.0, 18.0)], ["a", "b", "c"])
    assert pooled["rated_capacity"]["rate_rps"] == 13.0  # the mean, where other numbers take the median (12)
    assert pooled["rated_capacity"]["ci_low"] is None and pooled["rated_capacity"]["ci_high"] is None


def test_one_side_of_mixed_kinds_is_refused(tmp_path, capsys):
    cap = make_capacity_run(tmp_path / "cap")
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps({"kind": "run", "valid": True}))
    rc = main(["gate", str(cap), str(fixed), "--baseline", str(cap)])
    err = capsys.readouterr().err
    assert rc == 2 and "runs of one side must be of one kind" in err and "fixed.json (run)" in err


def test_a_run_given_twice_on_one_side_is_refused(tmp_path, capsys):
    run = make_capacity_run(tmp_path / "run")
    base = make_capacity_run(tmp_path / "base", seed=3)
    rc = main(["gate", str(run), str(run / "summary.json"), "--baseline", str(base)])
    err = capsys.readouterr().err
    assert rc == 2 and "given twice on one side of the gate" in err
