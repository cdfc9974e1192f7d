"""The server-side breakdown in each server's own Prometheus names (vLLM, SGLang, TGI, TRT-LLM), every
breakdown naming its source; batch fill against each; trtllm-serve's /prometheus/metrics found by the
scraper; and the mock's --metrics-flavor pages, whose exact observations give exact breakdowns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from loadgen.capacity.step_stats import scraped_step_metrics
from loadgen.report.data import RunData
from loadgen.report.health import health
from loadgen.results.scraped import breakdown_histogram_means, histogram_mean_delta, scrape_cost
from loadgen.results.server_metrics import SGLANG, TGI, TRTLLM, VLLM, detect
from loadgen.target.scrape import Scraper, find_metrics_page, is_prometheus, parse_metrics
from tests.helpers import ENV, REPO, slobench


def hist(name: str, total: float, n: int, lab: str = "") -> dict[str, float]:
    return {f"{name}_sum{lab}": total, f"{name}_count{lab}": n}


def test_vllm_names_unchanged_and_named():
    lab = '{engine="0",model_name="m"}'
    first = {**hist("vllm:request_queue_time_seconds", 1.0, 10, lab),
             **hist("vllm:request_prefill_time_seconds", 0.5, 10, lab),
             **hist("vllm:request_decode_time_seconds", 5.0, 10, lab)}
    last = {**hist("vllm:request_queue_time_seconds", 3.0, 30, lab),
            **hist("vllm:request_prefill_time_seconds", 1.5, 30, lab),
            **hist("vllm:request_decode_time_seconds", 9.0, 30, lab)}
    h = breakdown_histogram_means(first, last)
    assert h["source"] == "vllm histograms" and h["requests"] == 20
    assert h["queue_ms"] == pytest.approx(100.0) and h["prefill_ms"] == pytest.approx(50.0)
    assert h["decode_ms"] == pytest.approx(200.0)
    assert h["source_detail"] == ("queue = mean vllm:request_queue_time_seconds; prefill = mean "
                                  "vllm:request_prefill_time_seconds; decode = mean vllm:request_decode_time_seconds")
    # only the queue histogram moved: the other parts are unknown, not guessed
    q_only = breakdown_histogram_means(hist("vllm:request_queue_time_seconds", 1.0, 10),
                                       hist("vllm:request_queue_time_seconds", 3.0, 30))
    assert q_only["queue_ms"] == pytest.approx(100.0) and q_only["prefill_ms"] is None and q_only["decode_ms"] is None
    assert breakdown_histogram_means({}, {}) == {"source": None, "queue_ms": None, "prefill_ms": None,
                                                 "decode_ms": None, "requests": 0}


def test_sglang_prefill_and_decode_derived_from_ttft_and_e2e():
    lab = '{model_name="m"}'
    first = {**hist("sglang:queue_time_seconds", 0.0, 0, lab), **hist("sglang:time_to_first_token_seconds", 0, 0, lab),
             **hist("sglang:e2e_request_latency_seconds", 0, 0, lab), f"sglang:num_running_reqs{lab}": 0.0}
    last = {**hist("sglang:queue_time_seconds", 0.4, 4, lab),  # 100 ms queued
            **hist("sglang:time_to_first_token_seconds", 1.2, 4, lab),  # 300 ms to the first token
            **hist("sglang:e2e_request_latency_seconds", 4.0, 4, lab),  # 1000 ms end to end
            f"sglang:num_running_reqs{lab}": 3.0}
    assert detect(last) is SGLANG
    h = breakdown_histogram_means(first, last)
    assert h["source"] == "sglang histograms" and h["requests"] == 4
    assert h["queue_ms"] == pytest.approx(100) and h["prefill_ms"] == pytest.approx(200)
    assert h["decode_ms"] == pytest.approx(700)
    assert "prefill = mean sglang:time_to_first_token_seconds - mean sglang:queue_time_seconds" in h["source_detail"]
    assert "decode = mean sglang:e2e_request_latency_seconds - mean sglang:time_to_first_token_seconds" \
        in h["source_detail"]


def test_tgi_prefill_from_its_prefill_batches():
    pre, dec = '{method="prefill"}', '{method="decode"}'
    first = {**hist("tgi_request_queue_duration", 0, 0), **hist("tgi_request_inference_duration", 0, 0),
             **hist("tgi_request_validation_duration", 0, 0), **hist("tgi_batch_inference_duration", 0, 0, pre),
             **hist("tgi_batch_inference_duration", 0, 0, dec)}
    last = {**hist("tgi_request_queue_duration", 0.1, 2), **hist("tgi_request_inference_duration", 1.0, 2),
            **hist("tgi_request_validation_duration", 0.004, 2), **hist("tgi_batch_inference_duration", 0.12, 2, pre),
            **hist("tgi_batch_inference_duration", 0.9, 90, dec), "tgi_batch_current_size": 2.0}
    assert detect(last) is TGI
    h = breakdown_histogram_means(first, last)
    assert h["source"] == "tgi histograms" and h["requests"] == 2
    assert h["queue_ms"] == pytest.approx(50) and h["prefill_ms"] == pytest.approx(60)  # decode batches left out
    assert h["decode_ms"] == pytest.approx(500 - 60) and h["validation_ms"] == pytest.approx(2)
    assert 'tgi_batch_inference_duration{method="prefill"}' in h["source_detail"]


def test_trtllm_with_and_without_its_prefill_and_decode_histograms():
    lab = '{engine_type="trtllm",model_name="m"}'
    basic = {**hist("trtllm_request_queue_time_seconds", 0.2, 2, lab),
             **hist("trtllm_time_to_first_token_seconds", 0.5, 2, lab),
             **hist("trtllm_e2e_request_latency_seconds", 2.5, 2, lab)}  # 1.x: five basic metrics
    h = breakdown_histogram_means({}, basic)
    assert detect(basic) is TRTLLM and h["source"] == "trtllm histograms"
    assert (h["queue_ms"], h["prefill_ms"], h["decode_ms"]) == pytest.approx((100, 150, 1000))
    full = {**basic, **hist("trtllm_request_prefill_time_seconds", 0.1, 2, lab),
            **hist("trtllm_request_decode_time_seconds", 1.8, 2, lab)}
    h = breakdown_histogram_means({}, full)
    assert (h["prefill_ms"], h["decode_ms"]) == pytest.approx((50, 900))
    assert "prefill = mean trtllm_request_prefill_time_seconds" in h["source_detail"]


def test_detect_prefers_a_page_with_the_breakdown_histograms():
    engine_page = {**hist("vllm:request_queue_time_seconds", 0, 0), "slobench:batch_fill_ratio": 0.1}
    assert detect(engine_page) is VLLM and detect({"tgi_queue_size": 0.0}) is TGI and detect({}) is None


def window(t, **series):
    return {"t": t, "metrics": series}


def test_batch_fill_from_each_servers_gauges():
    lab = '{engine="0",model_name="m"}'
    vllm = [window(t, **{f"vllm:num_requests_running{lab}": r, **hist("vllm:request_queue_time_seconds", 0, 0, lab)})
            for t, r in ((0.5, 0), (2.0, 4), (4.0, 8), (9.0, 0))]
    sc = scraped_step_metrics(vllm, start=1.0, w0=2.0, w1=6.0, end=10.0, max_num_seqs=16)
    assert sc["batch_fill_ratio"] == pytest.approx((4 / 16 + 8 / 16) / 2) and sc["server_running"] == 6
    assert sc["batch_fill_source"] == "vllm:num_requests_running / engine.max_num_seqs (16)"
    no_max = scraped_step_metrics(vllm, start=1.0, w0=2.0, w1=6.0, end=10.0)
    assert no_max["batch_fill_ratio"] is None and no_max["batch_fill_source"] is None  # vLLM does not expose it
    own = [window(3.0, **{'slobench:batch_fill_ratio{tier="premium"}': 0.25, f"vllm:num_requests_running{lab}": 1})]
    sc = scraped_step_metrics(own, 1.0, 2.0, 6.0, 10.0, max_num_seqs=16)
    assert sc["batch_fill_ratio"] == 0.25 and sc["batch_fill_source"] == "slobench:batch_fill_ratio"
    sg = [window(3.0, **{"sglang:num_running_reqs": 12.0, "sglang:max_running_requests": 48.0,
                         "sglang:token_usage": 0.5, "sglang:num_queue_reqs": 2.0})]
    sc = scraped_step_metrics(sg, 1.0, 2.0, 6.0, 10.0, max_num_seqs=16)  # the server's own capacity wins
    assert sc["batch_fill_ratio"] == 0.25 and sc["batch_fill_source"] == "sglang:num_running_reqs / " \
                                                                          "sglang:max_running_requests"
    assert sc["kv_usage"] == 0.5 and sc["server_waiting"] == 2
    tgi = [window(3.0, tgi_batch_current_size=6.0, tgi_queue_size=1.0)]
    sc = scraped_step_metrics(tgi, 1.0, 2.0, 6.0, 10.0, max_num_seqs=24)
    assert sc["batch_fill_ratio"] == 0.25 and sc["batch_fill_source"] == "tgi_batch_current_size / " \
                                                                          "engine.max_num_seqs (24)"
    assert sc["kv_usage"] is None and sc["server_running"] == 6
    trt = [window(3.0, trtllm_num_requests_running=32.0, trtllm_max_batch_size_runtime=64.0)]
    assert scraped_step_metrics(trt, 1.0, 2.0, 6.0, 10.0)["batch_fill_ratio"] == 0.5


def test_report_health_reads_sglang_and_trtllm_kv_and_token_counters(tmp_path):
    for gen, kv in (("sglang:generation_tokens_total", "sglang:token_usage"),
                    ("trtllm_generation_tokens_total", "trtllm_kv_cache_utilization")):
        m = pd.DataFrame({f'{gen}{{model_name="m"}}': [0.0, 100.0, 300.0],
                          f'{kv}{{model_name="m"}}': [0.1, 0.5, 0.25]}, index=[0.0, 1.0, 2.0])
        h = health(RunData(tmp_path, {}, pd.DataFrame(), m))
        assert h["token_rate"]["server tok/s"] == ([1.0, 2.0], [100.0, 200.0])
        assert h["kv_usage"]["KV usage %"] == ([0.0, 1.0, 2.0], [10.0, 50.0, 25.0])


def test_is_prometheus():
    assert is_prometheus(b"# HELP x\nx 1\n", "text/plain; version=0.0.4") and is_prometheus(b"")
    assert not is_prometheus(b'[{"gpuMemUsage": 1}]', "application/json")
    assert not is_prometheus(b' {"a": 1}', "text/plain")


# ---------------------------------------------------------------- the mock's flavours, over HTTP

def fetch(url: str) -> tuple[bytes, str]:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (loopback)
        return r.read(), r.headers.get("Content-Type", "")


def stream(url: str, n: int) -> dict:
    body = {"model": "mock", "prompt": [1, 2, 3], "max_tokens": n, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 (loopback)
        data = [b[6:] for b in r.read().decode().split("\n\n") if b.startswith("data: ") and b[6:] != "[DONE]"]
    return json.loads(data[-1])


@pytest.mark.parametrize("flavor", ["sglang", "tgi", "trtllm"])
def test_mock_flavor_pages_give_exact_breakdowns(mock_server, flavor):
    url = mock_server("--metrics-flavor", flavor, "--ttft-ms", 30, "--itl-ms", 5)
    page_url, note = find_metrics_page(url)
    path = "/prometheus/metrics" if flavor == "trtllm" else "/metrics"
    assert page_url == url + path
    before = parse_metrics(fetch(page_url)[0].decode())
    finals = [stream(url, 4) for _ in range(3)]
    after = parse_metrics(fetch(page_url)[0].decode())
    assert all("timing" not in f for f in finals)  # these servers send no per-request timing
    h = breakdown_histogram_means(before, after)
    assert h["source"] == f"{flavor} histograms" and h["requests"] == 3
    assert h["queue_ms"] == 0 and h["prefill_ms"] == pytest.approx(30.0, abs=1e-9)
    assert h["decode_ms"] >= 15.0 - 0.01  # three gaps of 5 ms: the last token no earlier than its due time
    # the three parts add up to the server's own end-to-end mean: none is counted twice, none left out
    e2e_s, n = histogram_mean_delta(before, after, detect(after).e2e)
    assert n == 3 and h["queue_ms"] + h["prefill_ms"] + h["decode_ms"] == pytest.approx(e2e_s * 1000.0, rel=1e-9)
    if flavor == "trtllm":
        body, ctype = fetch(url + "/metrics")
        assert ctype.startswith("application/json") and json.loads(body) == []
        assert note == "GET /metrics answered JSON, not Prometheus text: ignored"
    else:
        assert note is None


def test_scraper_finds_trtllm_prometheus_path(mock_server, tmp_path):
    url = mock_server("--metrics-flavor", "trtllm")
    out = tmp_path / "metrics.jsonl"
    sc = Scraper(url, out, interval_s=0.2).start()
    sc.go(time.monotonic())
    time.sleep(0.5)
    sc.stop()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines and all("error" not in x for x in lines)
    assert any("trtllm_num_requests_running" in k for k in lines[-1]["metrics"])
    cost = scrape_cost(lines)
    assert cost["path"] == "/prometheus/metrics"
    assert cost["notes"] == ["GET /metrics answered JSON, not Prometheus text: ignored"]


# A stand-in for a load generator: starts a scraper, says its pid, and waits to be killed.
SCRAPER_PARENT = """
import sys, time
from loadgen.target.scrape import Scraper
scraper = Scraper(sys.argv[1], sys.argv[2], interval_s=0.1).start()
scraper.go(time.monotonic())
print(scraper.pid, flush=True)
time.sleep(600)
"""


def test_a_scraper_ends_once_the_process_that_started_it_is_gone(mock_server, tmp_path):
    """A load generator killed outright (SIGKILL) cannot stop its scraper: the scraper notices and ends."""
    url = mock_server()
    out = tmp_path / "metrics.jsonl"
    parent = subprocess.Popen([sys.executable, "-c", SCRAPER_PARENT, url, str(out)], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())

    def alive() -> bool:
        try:
            return "zombie" not in Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False

    try:
        deadline = time.monotonic() + 10
        while not (out.exists() and out.read_text().count("\n") >= 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive()
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive()
    finally:
        if alive():
            os.kill(pid, 9)


def test_run_against_the_sglang_mock_names_its_breakdown(mock_server, tmp_path):
    url = mock_server("--metrics-flavor", "sglang", "--ttft-ms", 20, "--itl-ms", 2, "--tokens", 4)
    scn = tmp_path / "s.yaml"
    scn.write_text("name: sg\nworkload: {input_len: 8, output_len: 4}\n"
                   "load: {arrival: poisson, rate: 20, requests: 20}\n")
    r = slobench("run", scn, "--target", url, "--reports", tmp_path, "--run-id", "sg", "--no-report",
                 "--lateness-bound-ms", 100)
    assert r.returncode == 0, r.stderr
    bd = json.loads((tmp_path / "sg" / "summary.json").read_text())["breakdown"]
    assert bd["source"] == "sglang histograms" and bd["mean_queue_ms"] == 0
    assert bd["mean_prefill_ms"] == pytest.approx(20.0, abs=1e-9) and bd["mean_network_ms"] >= 0
    assert "sglang:time_to_first_token_seconds" in bd["source_detail"]
