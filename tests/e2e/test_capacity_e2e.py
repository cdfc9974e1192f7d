"""``slobench capacity`` end to end: against the mock server (clear verdicts, Ctrl-C) and the embedded
reference engine (a short ramp that breaks), checking the run folder against the summary contract."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadgen.results.records import read_records
from tests.helpers import ENV, REPO, slobench

TOP_KEYS = {"kind", "run_id", "scenario", "target", "driver", "started_at", "duration_s", "verdict", "verdict_text",
            "axis", "slo", "headroom", "rated_capacity", "steps", "valid", "lateness", "versions", "git_commit",
            "machine"}
RATED_KEYS = {"rate_rps", "requested_rps", "window_s", "concurrency", "concurrency_littles_law", "concurrency_measured",
              "concurrency_agree", "output_tok_s", "spec_rate_rps", "estimate", "ci_low", "ci_high", "boundary",
              "binding", "confirmed"}
STEP_KEYS = {"index", "load", "phase", "passed", "stopped_early", "duration_s", "requests", "tiers", "breakdown",
             "kv_usage", "batch_fill_ratio", "admission_rejections", "summary"}
TIER_KEYS = {"requests", "ttft_ms_q", "ci_low_ms", "ci_high_ms", "passed", "p50_ttft_ms", "p99_ttft_ms"}
BREAKDOWN_KEYS = {"mean_queue_ms", "mean_prefill_ms", "mean_network_ms", "mean_decode_ms", "source"}


def check_contract(s: dict) -> None:
    assert set(s) >= TOP_KEYS, TOP_KEYS - set(s)
    assert s["kind"] == "capacity" and s["driver"] == "aiohttp" and {"name", "path"} <= set(s["scenario"])
    assert s["verdict"] in ("rated", "never_met", "never_broke", "invalid") and s["axis"] in ("rate", "concurrency")
    assert s["search_verdict"] in ("rated", "never_met", "never_broke")
    assert {"slobench", "python"} <= set(s["versions"])
    for tier, slo in s["slo"].items():
        assert slo is None or set(slo) == {"metric", "quantile", "threshold_ms"}, (tier, slo)
    if s["rated_capacity"] is not None:
        assert set(s["rated_capacity"]) >= RATED_KEYS
    for i, st in enumerate(s["steps"]):
        assert set(st) >= STEP_KEYS, STEP_KEYS - set(st)
        assert st["index"] == i and isinstance(st["passed"], bool)
        assert st["phase"] in ("ramp", "bisect", "confirm", "refine")
        assert {"draw", "attempt", "remeasured_of", "counted"} <= set(st)
        assert set(st["breakdown"]) >= BREAKDOWN_KEYS
        for e in st["tiers"].values():
            assert set(e) >= TIER_KEYS
        assert {"mean_ttft_ms", "p99_ttft_ms", "request_throughput", "output_throughput", "errors",
                "client_lateness"} <= set(st["summary"])
    json.dumps(s, allow_nan=False)  # strict JSON: no NaN / Infinity anywhere


def scenario(tmp_path: Path, search: str, tiers: str = "{standard: {slo: {ttft_ms: 300}}}") -> Path:
    p = tmp_path / "scn.yaml"
    p.write_text(f"name: cap-test\nworkload: {{input_len: 8, output_len: 4}}\ntiers: {tiers}\n"
                 f"search: {search}\nclient: {{lateness_bound_ms: 200}}\n")
    return p


def test_target_too_slow_is_never_met(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 400, "--itl-ms", 1)  # every first token 400 ms > the 300 ms SLO
    # one draw for every step (a fresh one at 1 req/s may hold too few requests for a certain breach)
    scn = scenario(tmp_path, "{start: 4, growth: 2, min_load: 1, step_duration_s: 2.5, warmup_s: 0.5,"
                             " arrivals: common}")
    r = slobench("capacity", scn, "--target", url, "--out", tmp_path / "run", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no rated capacity" in r.stdout and "never met" in r.stdout and "Traceback" not in r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    check_contract(s)
    assert s["verdict"] == "never_met" and s["rated_capacity"] is None
    assert [st["load"] for st in s["steps"]] == [4, 2, 1] and not any(st["passed"] for st in s["steps"])
    # the breach is certain within the first half second of each window: no step runs its full length
    assert all(st["stopped_early"] for st in s["steps"])
    assert s["target"] == url


def test_target_too_fast_never_broke_and_records_have_stages(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    scn = scenario(tmp_path, "{start: 5, growth: 2, max_load: 20, step_duration_s: 2.5, warmup_s: 0.5,"
                             " early_pass: false}")
    r = slobench("capacity", scn, "--target", url, "--out", tmp_path / "run", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    check_contract(s)
    assert s["verdict"] == "never_broke" and "at least" in s["verdict_text"]
    assert [st["load"] for st in s["steps"]] == [5, 10, 20] and all(st["passed"] for st in s["steps"])
    rc = s["rated_capacity"]
    # the rating is what the step offered (its Poisson draw over the window), the load asked for beside it
    assert rc["requested_rps"] == 20 and rc["rate_rps"] == pytest.approx(s["steps"][-1]["offered_rps"])
    last = s["steps"][-1]["window_s"]
    assert rc["window_s"] == pytest.approx(last[1] - last[0])  # the judged length the rating holds for
    assert rc["spec_rate_rps"] == pytest.approx(0.8 * rc["rate_rps"]) and rc["lower_bound"]
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    stages = {x["stage"] for x in recs}
    assert stages == {0, 1, 2}
    # ramp steps keep step_duration_s however few their requests (bisection and confirming steps are lengthened)
    assert [round(st["window_s"][1] - st["start_s"], 1) for st in s["steps"]] == [2.5, 2.5, 2.5]
    for st in s["steps"]:  # the measured window lies inside its own stage, warm-up excluded
        w0, w1 = st["window_s"]
        mine = [x for x in recs if x["stage"] == st["index"]]
        inside = [x for x in mine if w0 <= x["scheduled_s"] < w1]
        assert len(inside) == st["requests"] and len(mine) > len(inside)
        sent = [x for x in inside if x["sent_s"] is not None and w0 <= x["sent_s"] < w1]
        assert st["offered_rps"] == pytest.approx(len(sent) / (w1 - w0), rel=1e-3)  # what was sent, not asked
    assert all(x["status"] == "ok" for x in recs)


def test_exact_window_counts_send_each_step_s_load_exactly_up_to_every_mark(mock_server, tmp_path):
    """``search.window_counts: exact``: each step schedules exactly load x mark requests before each of its
    marks (the warm-up's possible ends, 0.5 and 1 s here, and the step's end), so its window offers its load."""
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    scn = scenario(tmp_path, "{start: 6, growth: 2, max_load: 24, step_duration_s: 2.5, warmup_s: 0.5,"
                             " early_pass: false, window_counts: exact}")
    r = slobench("capacity", scn, "--target", url, "--out", tmp_path / "run", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["search"]["window_counts"] == "exact" and [st["load"] for st in s["steps"]] == [6, 12, 24]
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    for st in s["steps"]:
        at = [x["scheduled_s"] - st["start_s"] for x in recs if x["stage"] == st["index"]]
        assert [sum(t < m for t in at) for m in (0.5, 1.0, 2.5)] == [round(st["load"] * m) for m in (0.5, 1.0, 2.5)]


def test_the_time_budget_ends_the_search_with_what_it_measured(mock_server, tmp_path):
    """A ramp from 5 to 160 req/s needs six 2.5 s steps; an 8 s budget stops it sooner, still a verdict."""
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    scn = scenario(tmp_path, "{start: 5, growth: 2, max_load: 160, step_duration_s: 2.5, warmup_s: 0.5,"
                             " early_pass: false, max_duration_s: 8}")
    r = slobench("capacity", scn, "--target", url, "--out", tmp_path / "run", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    check_contract(s)
    assert s["ended_by"].startswith("the time budget ended the search (search.max_duration_s 8 s: ")
    assert s["verdict"] == "never_broke" and 1 <= len(s["steps"]) < 6 and s["ended_by"] in s["verdict_text"]
    assert s["search"]["max_duration_s"] == 8


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_saves_the_finished_steps(mock_server, tmp_path, sig):
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    scn = scenario(tmp_path, "{start: 2, growth: 2, max_load: 64, step_duration_s: 2, warmup_s: 0.5,"
                             " early_pass: false}")
    p = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "capacity", str(scn), "--target", url, "--out",
                          str(tmp_path / "run"), "--no-progress"], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    summary = tmp_path / "run" / "summary.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (summary.exists() and json.loads(summary.read_text())["steps"]):
        time.sleep(0.2)
    time.sleep(0.5)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    s = json.loads(summary.read_text())
    check_contract(s)
    assert s["interrupted"] and not s["complete"] and s["verdict_text"].startswith("INCOMPLETE")
    assert s["stopped_early"] == ("interrupted (Ctrl-C)" if sig == signal.SIGINT else "interrupted (SIGTERM)")
    assert len(s["steps"]) >= 1 and all(st["passed"] for st in s["steps"])
    assert read_records(tmp_path / "run" / "requests.jsonl")


@pytest.mark.slow
def test_capacity_against_the_embedded_engine(tmp_path):
    """A short ramp on the tiny engine that must break: 8 req/s, then 200 (far past what 2 cores serve)."""
    pytest.importorskip("torch")
    scn = tmp_path / "short.yaml"
    scn.write_text(
        "name: cap-engine\nseed: 3\nengine: {model: tiny, max_num_seqs: 16}\n"
        "workload: {input_len: {dist: uniform, min: 32, max: 160}, output_len: 24}\n"
        "tiers: {premium: {weight: 1, slo: {ttft_ms: 300}}, standard: {weight: 2, slo: {ttft_ms: 800}},"
        " basic: {weight: 1}}\n"
        "search: {start: 8, growth: 25, max_steps: 3, step_duration_s: 5, warmup_s: 1, early_pass: false,"
        " min_samples: 0}\n"  # short steps, however few premium requests (the rule has its own tests)
        "client: {lateness_bound_ms: 200}\n")
    r = slobench("capacity", scn, "--out", tmp_path / "run", "--no-progress", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    check_contract(s)
    steps = s["steps"]
    assert [st["load"] for st in steps][:2] == [8, 200]
    assert not steps[1]["passed"] and steps[1]["stopped_early"]  # 200 req/s: the queue runs away
    assert s["slo"]["basic"] is None and steps[0]["tiers"]["basic"]["passed"] is None
    assert steps[0]["passed"]  # 8 req/s is comfortable for tiny (16 slots)
    assert s["verdict"] == "rated" and s["rated_capacity"]["requested_rps"] >= 8
    assert steps[2]["phase"] == "bisect" and 8 < steps[2]["load"] < 200
    # the budget spent, the bracket is confirmed (a confirmation that disagrees reopens it: more bisection)
    assert steps[3]["phase"] == "confirm" and {st["phase"] for st in steps[3:]} <= {"confirm", "bisect"}
    rc = s["rated_capacity"]
    assert rc["spec_rate_rps"] == pytest.approx(0.8 * rc["rate_rps"])
    assert rc["concurrency_measured"] > 0 and rc["concurrency_littles_law"] > 0
    assert "rated capacity" in r.stdout
    assert all(st["summary"]["errors"].get("http_error", 0) == 0 for st in steps)  # no 5xx: the server held up
    ok = steps[0]
    bd = ok["breakdown"]
    assert bd["source"] == "server timing" and bd["mean_queue_ms"] >= 0 and bd["mean_prefill_ms"] > 0
    assert bd["mean_decode_ms"] > 0
    assert bd["mean_network_ms"] > -1  # client TTFT >= server queue + prefill (the clocks are nested)
    assert ok["kv_usage"] is not None and 0 <= ok["kv_usage"] <= 1
    assert ok["batch_fill_ratio"] is not None and ok["admission_rejections"] == 0
    bounds = [(e["ci_low_ms"], e["ttft_ms_q"], e["ci_high_ms"]) for st in steps for e in st["tiers"].values()
              if e["ttft_ms_q"] is not None and e["ci_low_ms"] is not None]  # ci_high None: unbounded (a failure)
    assert bounds and all(lo <= q <= (math.inf if hi is None else hi + 1e-6) for lo, q, hi in bounds)
    assert (tmp_path / "run" / "engine.log").exists()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert "slobench:batch_fill_ratio" in metrics and "vllm:kv_cache_usage_perc" in metrics


def test_live_display_renders_steps_and_progress():
    import io

    from rich.console import Console

    from loadgen.capacity.display import CapacityDisplay, step_line

    buf = io.StringIO()
    d = CapacityDisplay("slobench capacity: t", "req/s", ["premium", "standard"],
                        console=Console(file=buf, force_terminal=True, width=200))
    d.start_step(0, 4.0, "ramp", 20.0)
    d.update(5.0, "sent 20  in flight 3")
    step = {"index": 0, "load": 4.0, "phase": "ramp", "passed": False, "stopped_early": True, "offered_rps": 3.9,
            "tiers": {"premium": {"ttft_ms_q": 412.0, "passed": False}, "standard": {"ttft_ms_q": 95.0,
                                                                                     "passed": True}},
            "breakdown": {"mean_queue_ms": 300.0, "mean_prefill_ms": 40.0, "mean_network_ms": 2.0,
                          "mean_decode_ms": 150.0},
            "kv_usage": 0.25, "batch_fill_ratio": 0.5, "admission_rejections": 0}
    d.end_step(step)
    d.close()
    out = buf.getvalue()
    assert "slobench capacity: t" in out and "412" in out and "FAIL" in out and "25%" in out and "50%" in out
    line = step_line(step, "req/s")
    assert "FAIL (stopped early)" in line and "premium q=412ms FAIL" in line and "queue 300" in line


def test_run_summaries_carry_kind_and_metadata(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    scn = tmp_path / "run.yaml"
    scn.write_text("name: meta-run\nworkload: {input_len: 8, output_len: 4}\nload: {rate: 20, requests: 10}\n")
    r = slobench("run", scn, "--target", url, "--reports", tmp_path, "--run-id", "r", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    for k in ("kind", "run_id", "scenario", "target", "driver", "started_at", "valid", "versions", "git_commit",
              "machine"):
        assert k in s, k
    assert s["kind"] == "run" and s["scenario"]["name"] == "meta-run" and s["target"] == url
    assert s["driver"] == "aiohttp" and s["run_id"] == "r" and s["completed"] == 10


def test_concurrency_axis_rates_users_and_their_throughput(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 20, "--itl-ms", 5)  # 20 + 3 x 5 ms a request: ~28 requests/s per user
    scn = scenario(tmp_path, "{axis: concurrency, start: 2, growth: 2, max_load: 8, step_duration_s: 2.5,"
                             " warmup_s: 0.5, early_pass: false}")
    r = slobench("capacity", scn, "--target", url, "--out", tmp_path / "run", "--json", "--no-progress",
                 "--no-report")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    check_contract(s)
    assert s["axis"] == "concurrency" and s["verdict"] == "never_broke"
    assert [st["load"] for st in s["steps"]] == [2, 4, 8]
    rc = s["rated_capacity"]
    last = s["steps"][-1]
    assert rc["concurrency"] == 8 and rc["load"] == 8
    assert rc["rate_rps"] == pytest.approx(last["throughput_rps"]) and rc["rate_rps"] > 2 * 8  # users x ~25/s
    assert rc["concurrency_measured"] == pytest.approx(8, abs=1)  # closed loop: always 8 in flight
    assert rc["concurrency_agree"]


@pytest.mark.slow
def test_capacity_through_locust(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    scn = scenario(tmp_path, "{start: 5, growth: 2, max_load: 10, step_duration_s: 2.5, warmup_s: 0.5,"
                             " early_pass: false}")
    r = slobench("capacity", scn, "--target", url, "--out", tmp_path / "run", "--json", "--no-progress",
                 "--no-report", "--driver", "locust")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["driver"] == "locust" and s["verdict"] == "never_broke"
    assert [st["load"] for st in s["steps"]] == [5, 10] and all(st["passed"] for st in s["steps"])
    assert all(st["concurrency_measured"] is None for st in s["steps"])  # Locust's in-flight count is not seen
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    assert {x["stage"] for x in recs} == {0, 1} and all(x["status"] == "ok" for x in recs)
    for st in s["steps"]:
        w0, w1 = st["window_s"]
        inside = [x for x in recs if x["stage"] == st["index"] and w0 <= x["scheduled_s"] < w1]
        assert len(inside) == st["requests"] > 0
        assert st["tiers"]["standard"]["p50_ttft_ms"] >= 5  # the mock's first token comes 5 ms in


def test_capacity_through_the_sharded_replayer(mock_server, tmp_path):
    """--workers 2 with the aiohttp driver: the same steps through two replayer processes that live for the
    whole search; their records reach the run's file and the step's judgement through the parent."""
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    scn = scenario(tmp_path, "{start: 5, growth: 2, max_load: 10, step_duration_s: 2.5, warmup_s: 0.5}")
    r = slobench("capacity", scn, "--target", url, "--out", tmp_path / "run", "--json", "--no-progress",
                 "--no-report", "--workers", 2)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["verdict"] == "never_broke" and s["workers"] == 2
    assert [st["load"] for st in s["steps"]] == [5, 10] and all(st["passed"] for st in s["steps"])
    assert not any(st["stopped_early"] for st in s["steps"])  # in-flight requests are in the workers: no early pass
    assert all(st["concurrency_measured"] is not None for st in s["steps"])  # from the workers' counters
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    assert {x["stage"] for x in recs} == {0, 1} and all(x["status"] == "ok" for x in recs)
    assert len({x["id"] for x in recs}) == len(recs)
    for st in s["steps"]:
        w0, w1 = st["window_s"]
        inside = [x for x in recs if x["stage"] == st["index"] and w0 <= x["scheduled_s"] < w1]
        assert len(inside) == st["requests"] > 0
