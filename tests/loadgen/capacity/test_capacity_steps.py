"""Per-step figures without a server: request values for the SLO judge, the breakdown from scraped
histogram deltas (a target with no per-request timing, like vLLM), the health signals, the verdict's
validity, and the summary contract."""

from __future__ import annotations

import math

import pytest

from loadgen.capacity.run import deciding_steps
from loadgen.capacity.search import CapacitySearch
from loadgen.capacity.search_steps import StepResult
from loadgen.capacity.step_stats import scraped_step_metrics
from loadgen.results.latency import breakdown, slo_value
from loadgen.results.records import RequestRecord
from loadgen.scenario.options import SearchConfig


def rec(status="ok", sched=10.0, first=10.2, tokens=(10.2, 10.3, 10.4), done=10.5, out=3, server=None):
    return RequestRecord("r", 0, "premium", sched, sent_s=sched, first_token_s=first, token_s=list(tokens),
                         done_s=done, output_tokens=out, status=status, server=server)


def test_metric_values_exact_failed_and_censored():
    r = rec()
    assert slo_value(r, "ttft_ms") == pytest.approx(200) and slo_value(r, "e2el_ms") == pytest.approx(400)
    assert slo_value(r, "tpot_ms") == pytest.approx(100)
    rej = rec(status="rejected", first=None, tokens=(), done=10.01, out=None)
    assert slo_value(rej, "ttft_ms") == math.inf and slo_value(rej, "e2el_ms") == math.inf
    cut = rec(status="cancelled", first=None, tokens=(), done=12.0, out=None)  # waited 2 s, then the step ended
    assert slo_value(cut, "ttft_ms") == pytest.approx(2000) and math.isnan(slo_value(cut, "tpot_ms"))
    live = rec(first=None, tokens=(), done=None, out=None)
    assert slo_value(live, "ttft_ms", now_s=10.9) == pytest.approx(900)  # in flight: a lower bound
    mid = rec(status="cancelled", first=10.3, tokens=(10.3,), done=11.0)  # cut while decoding: TTFT is known
    assert slo_value(mid, "ttft_ms") == pytest.approx(300) and slo_value(mid, "e2el_ms") == pytest.approx(1000)
    timeout = rec(status="timeout", first=None, tokens=(), done=400.0, out=None)
    assert slo_value(timeout, "ttft_ms") == math.inf


def sample(t, q_sum, q_n, p_sum, d_sum, rej, kv, fill, running, waiting):
    lab = '{engine="0",model_name="m"}'
    return {"t": t, "metrics": {
        f"vllm:request_queue_time_seconds_sum{lab}": q_sum, f"vllm:request_queue_time_seconds_count{lab}": q_n,
        f"vllm:request_prefill_time_seconds_sum{lab}": p_sum, f"vllm:request_prefill_time_seconds_count{lab}": q_n,
        f"vllm:request_decode_time_seconds_sum{lab}": d_sum, f"vllm:request_decode_time_seconds_count{lab}": q_n,
        'slobench:admission_rejections_total{model_name="m",tier="premium"}': rej,
        'slobench:admission_rejections_total{model_name="m",tier="basic"}': 2 * rej,
        f"vllm:kv_cache_usage_perc{lab}": kv,
        'slobench:batch_fill_ratio{model_name="m",tier="premium"}': fill / 2,
        'slobench:batch_fill_ratio{model_name="m",tier="standard"}': fill / 2,
        f"vllm:num_requests_running{lab}": running, f"vllm:num_requests_waiting{lab}": waiting}}


def test_breakdown_from_histogram_deltas_when_the_target_sends_no_timing():
    metrics = [sample(0.5, 1.0, 10, 0.5, 5.0, 1, 0.1, 0.2, 2, 0),  # before the step
               sample(3.0, 2.0, 20, 1.0, 10.0, 1, 0.3, 0.5, 5, 1),
               sample(5.0, 4.0, 30, 1.5, 15.0, 3, 0.5, 0.7, 7, 3),
               sample(9.0, 5.0, 40, 2.0, 20.0, 4, 0.1, 0.1, 1, 0)]
    sc = scraped_step_metrics(metrics, start=1.0, w0=2.0, w1=6.0, end=10.0)
    hist = sc.pop("breakdown_histograms")
    assert hist["queue_ms"] == pytest.approx(4.0 / 30 * 1000)  # (5 - 1) s over (40 - 10) requests
    assert hist["prefill_ms"] == pytest.approx(1.5 / 30 * 1000) and hist["decode_ms"] == pytest.approx(500)
    assert sc["admission_rejections"] == 9  # (4 + 8) - (1 + 2), every tier
    assert sc["kv_usage"] == pytest.approx(0.4) and sc["kv_usage_max"] == pytest.approx(0.5)  # window samples
    assert sc["batch_fill_ratio"] == pytest.approx(0.6)  # tiers summed, averaged over the window
    assert sc["server_running"] == pytest.approx(6) and sc["server_waiting"] == pytest.approx(2)
    window = [rec(first=10.3, server=None) for _ in range(3)]  # client TTFT 300 ms, no server timing
    bd = breakdown(window, hist)
    assert bd["source"] == "vllm histograms" and bd["mean_network_ms"] == pytest.approx(300 - 133.333 - 50, abs=0.01)
    timed = [rec(first=10.3, server={"queue_ms": 100.0, "prefill_ms": 150.0, "decode_ms": 200.0})]
    bd = breakdown(timed, hist)  # per-request timing wins over the scrape
    assert bd["source"] == "server timing" and bd["source_detail"] == "slobench engine timing object"
    assert bd["mean_network_ms"] == pytest.approx(50) and bd["mean_decode_ms"] == 200
    assert breakdown(window, {})["source"] is None
    assert scraped_step_metrics([], 0, 1, 2, 3)["kv_usage"] is None


def test_validity_rests_on_thedeciding_steps():
    s = CapacitySearch(SearchConfig(start=1, growth=2, tolerance=0.3))
    out = s.run(lambda load, phase: StepResult(load <= 5))
    deciding = deciding_steps(out)
    loads = [out.steps[i].load for i in deciding]
    # each end and its confirmation on a fresh arrival draw
    assert sorted(loads) == [out.rated_load] * 2 + [out.first_fail_load] * 2
    assert [out.steps[i].phase for i in deciding] == ["bisect", "bisect", "confirm", "confirm"]


@pytest.mark.parametrize(("page", "expected"), [
    ({"vllm:num_preemptions_total": (3, 10), "vllm:num_requests_waiting": (0, 0)}, 7),
    # SGLang's retractions: the counter, not the last batch's gauge beside it
    ({"sglang:num_retracted_requests_total": (2, 6), "sglang:num_retracted_reqs": (9, 1),
      "sglang:num_queue_reqs": (0, 0)}, 4),
    ({"tgi_queue_size": (0, 3)}, None),  # TGI does not preempt: nothing to read
])
def test_preemptions_in_a_step_from_each_servers_counter(page, expected):
    lab = '{model_name="m"}'
    metrics = [{"t": t, "metrics": {f"{name}{lab}": vals[i] for name, vals in page.items()}}
               for i, t in enumerate((0.5, 9.0))]
    assert scraped_step_metrics(metrics, start=1.0, w0=2.0, w1=6.0, end=10.0)["preemptions"] == expected
