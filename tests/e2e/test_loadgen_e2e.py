"""End to end: the slobench CLI against the mock server (and a target that dies mid-run)."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from loadgen.results import latency
from loadgen.results.records import read_records
from loadgen.target.embedded import free_port
from tests.helpers import ENV, REPO, slobench


def test_run_scenario_against_the_mock_server(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 40, "--itl-ms", 5, "--tokens", 8)
    scn = tmp_path / "s.yaml"
    scn.write_text(
        "name: e2e\nworkload: {input_len: 12, output_len: 8}\n"
        "tiers: {premium: {weight: 1, slo: {ttft_ms: 1000}}, basic: {weight: 1}}\n"
        "load: {arrival: poisson, rate: 40, requests: 60}\n"
    )
    r = slobench("run", scn, "--target", url, "--reports", tmp_path, "--run-id", "r1", "--goodput", "ttft:1000",
                 "--lateness-bound-ms", 50)  # generous: pytest, the mock and this client share 2 cores
    assert r.returncode == 0, r.stderr
    run = tmp_path / "r1"
    recs = read_records(run / "requests.jsonl")
    assert len(recs) == 60 and {x["status"] for x in recs} == {"ok"}
    keys = {"id", "stage", "tier", "scheduled_s", "sent_s", "first_token_s", "token_s", "done_s", "prompt_tokens",
            "output_tokens", "status", "http_status", "error", "server", "prompt_tokens_intended",
            "first_output_s", "reasoning_tokens", "chunk_tokens", "cached_tokens", "conversation", "turn",
            "cancel_reason", "retry_after_s", "retries"}
    for x in recs:
        assert set(x) == keys
        assert x["output_tokens"] == 8 and len(x["token_s"]) == 8 and x["prompt_tokens"] == 12
        assert x["prompt_tokens_intended"] == 12
        assert x["first_token_s"] == x["token_s"][0]
        # the mock's first token comes 40 ms after arrival, the next ones 5 ms apart
        assert x["first_token_s"] - x["scheduled_s"] >= 0.039
        assert x["token_s"] == sorted(x["token_s"])
        assert x["scheduled_s"] <= x["sent_s"] <= x["first_token_s"] <= x["done_s"]
        assert x["server"]["prefill_ms"] == 40 and x["tier"] in ("premium", "basic")
    # 7 gaps of 5 ms between first and last token. A client starved of CPU may read several chunks in one
    # go and stamp them alike, so judge the typical request, not every one.
    spreads = sorted(x["token_s"][-1] - x["token_s"][0] for x in recs)
    assert spreads[len(spreads) // 2] >= 0.025
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] == 60 and summary["request_goodput"] > 0 and summary["valid"]
    assert summary["tiers"]["premium"]["slo_attainment"] == 1.0
    # the median of the records' own TTFTs, each no shorter than the mock's 40 ms
    assert 40 <= summary["median_ttft_ms"] == pytest.approx(float(np.median([latency.ttft_ms(x) for x in recs])))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics and any("vllm:generation_tokens_total" in "".join(m.get("metrics", {})) for m in metrics)


def test_replay_trace_closed_loop_and_sharded_workers(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1, "--tokens", 3)
    traces = REPO.parent / "shared" / "traces" / "burstgpt" / "BurstGPT_1.head400.csv"
    if not traces.exists():
        pytest.skip("traces not found")
    r = slobench("replay", traces, "--target", url, "--rate", 50, "--max-requests", 80, "--workers", 2,
                 "--reports", tmp_path, "--run-id", "w2", "--no-scrape", "--json")
    assert r.returncode == 0, r.stderr
    recs = read_records(tmp_path / "w2" / "requests.jsonl")
    assert sorted(int(x["id"][8:]) for x in recs) == list(range(80)) and all(x["status"] == "ok" for x in recs)
    assert json.loads(r.stdout)["completed"] == 80
    r = slobench("replay", traces, "--target", url, "--concurrency", 4, "--max-requests", 20,
                 "--reports", tmp_path, "--run-id", "c4", "--no-scrape")
    assert r.returncode == 0, r.stderr
    recs = read_records(tmp_path / "c4" / "requests.jsonl")
    assert len(recs) == 20 and all(x["sent_s"] == pytest.approx(x["scheduled_s"], abs=0.005) for x in recs)


def start_run(scn: Path, url: str, out: Path) -> tuple[subprocess.Popen, Path]:
    """`slobench run` in the background into `out`, returned once some requests have finished (their records
    are on disk): the process and its requests.jsonl."""
    run = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "run", scn, "--target", url, "--reports", out.parent,
                            "--run-id", out.name, "--no-scrape"], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    req = out / "requests.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (req.exists() and req.stat().st_size > 0):
        time.sleep(0.1)
    return run, req


def test_target_dying_mid_run_saves_partial_records(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 10, "--itl-ms", 50, "--tokens", 40)  # 2 s streams
    proc = mock_server.last
    scn = tmp_path / "s.yaml"
    scn.write_text("workload: {input_len: 8, output_len: 40}\nload: {arrival: constant, rate: 20, requests: 400}\n")
    run, req = start_run(scn, url, tmp_path / "dies")
    proc.kill()
    out, err = run.communicate(timeout=60)
    assert run.returncode == 1, err
    assert "run ended early" in err and "stopped accepting connections" in err
    recs = read_records(req)
    statuses = {x["status"] for x in recs}
    assert "ok" in statuses and "conn_error" in statuses
    assert "stream_error" in statuses  # the streams cut when it died
    assert len(recs) < 400  # the schedule was not played to its end
    summary = json.loads((tmp_path / "dies" / "summary.json").read_text())
    assert summary["requests"] == len(recs) and "stopped accepting connections" in summary["stopped_early"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_ends_the_run_with_records_and_summary(mock_server, tmp_path, sig):
    url = mock_server("--ttft-ms", 10, "--itl-ms", 100, "--tokens", 30)
    scn = tmp_path / "s.yaml"
    scn.write_text("workload: {input_len: 8, output_len: 30}\nload: {arrival: constant, rate: 10, requests: 300}\n")
    run, req = start_run(scn, url, tmp_path / "int")
    run.send_signal(sig)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    recs = read_records(req)
    assert {"ok", "cancelled"} <= {x["status"] for x in recs}
    assert json.loads((tmp_path / "int" / "summary.json").read_text())["cancelled"] > 0


@pytest.mark.parametrize(
    "args,msg",
    [
        (["run", "no/such.yaml"], "no such file, and no built-in scenario of that name"),
        (["replay", "no/such.jsonl"], "trace file not found"),
        (["replay", "x", "--time-scale", "0"], "--time-scale must be > 0"),
        (["replay", "x", "--goodput", "ttft"], "goodput"),
        (["capacity", "--target", "http://127.0.0.1:9"], "no SLO to rate against"),
        (["run", "--slo", "ttft"], "--slo 'ttft': expected METRIC:MS"),
        (["bogus"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, msg):
    r = slobench(*args)
    assert r.returncode == 2
    assert msg in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bad_scenario_names_the_key(tmp_path):
    scn = tmp_path / "bad.yaml"
    scn.write_text("workload: {input_len: {dist: uniform, min: 0, max: 3}}\nload: {requests: 3}\n")
    r = slobench("run", scn)
    assert r.returncode == 2 and "workload.input_len" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_target_is_a_clear_error(tmp_path):
    scn = tmp_path / "s.yaml"
    scn.write_text("workload: {input_len: 4, output_len: 4}\nload: {requests: 3}\n")
    r = slobench("run", scn, "--target", f"http://127.0.0.1:{free_port()}", "--reports", tmp_path)
    # nothing listening is bad input (exit 2, nothing sent), said in one line
    assert r.returncode == 2 and "nothing is listening at" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_mock_server_health_and_models(mock_server):
    url = mock_server()
    with urllib.request.urlopen(url + "/v1/models") as r:
        assert json.load(r)["data"][0]["id"] == "mock"


SHARDED_PARENT = """
import asyncio, multiprocessing, sys, time
from loadgen.drivers.base import Progress
from loadgen.drivers.http_request import ClientConfig
from loadgen.drivers.sharded import ShardedReplayer
from loadgen.workload.specs import RequestSpec

class Sink:
    def write(self, rec):
        pass

async def main():
    rep = ShardedReplayer(ClientConfig(sys.argv[1], model="mock"), Sink(), 2, Progress())
    await rep.open()
    print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
    specs = [RequestSpec(id=str(i), prompt="hi", max_tokens=4, arrival_s=0.1 * i) for i in range(1200)]
    await rep.run(specs, t0=time.monotonic(), stage=0)

asyncio.run(main())
"""


def test_sharded_workers_end_once_the_process_that_started_them_is_gone(mock_server, tmp_path):
    """A load generator killed outright (SIGKILL) cannot tell its replayer workers to stop, and daemon processes
    are only ended by a parent that exits normally: the workers notice, stop sending and end."""
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    parent = subprocess.Popen([sys.executable, "-c", SHARDED_PARENT, url], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]

    def alive(pid: int) -> bool:
        try:
            return "zombie" not in Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False

    try:
        assert len(pids) == 2
        time.sleep(1.5)  # the workers are sending the schedule (two minutes of it)
        assert all(alive(p) for p in pids)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 15
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids)
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, 9)
