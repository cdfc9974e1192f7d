"""Server semantics: reasoning models (TTFT vs TTFOT), multi-token chunks (per-token ITL, chunk gaps),
vLLM's per-request metrics object, and the Responses API, each against the mock's exact schedule."""

import json

import pytest

from loadgen.drivers.stream_recorder import StreamRecorder
from loadgen.results import latency
from loadgen.results.records import RequestRecord, read_records
from loadgen.results.slo import SLO, judge
from loadgen.scenario.parse import load_scenario
from loadgen.target.sse import StreamError, chunk_parts, chunk_usage, decode_chunk
from tests.helpers import slobench


def _feed(events, *, times=None):
    rec = RequestRecord("r", 0, None, 0.0, sent_s=0.0)
    sr = StreamRecorder(rec, keep_text=True)
    for i, ev in enumerate(events):
        data = ev if isinstance(ev, str) else json.dumps(ev)
        sr.feed(f"data: {data}\n\n".encode(), times[i] if times else 0.1 * (i + 1))
    sr.close()
    return rec, sr


def _chat(delta, usage=None, finish=None, **extra):
    obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    if usage is not None:
        obj["usage"] = usage
    return obj


def test_reasoning_deltas_are_tokens_but_not_the_answer():
    events = [_chat({"role": "assistant", "content": ""}), _chat({"reasoning_content": "hm"}),
              _chat({"reasoning": "so"}), _chat({"content": "yes"}), _chat({"content": "!"}, finish="stop"), "[DONE]"]
    rec, sr = _feed(events)
    assert rec.first_token_s == pytest.approx(0.2) and rec.first_output_s == pytest.approx(0.4)
    assert len(rec.token_s) == 4 and rec.reasoning_tokens == 2 and rec.output_tokens == 4 and sr.text == "yes!"
    assert rec.chunk_tokens is None  # no usage deltas: one token per chunk
    assert chunk_parts({"choices": [{"delta": {"reasoning_content": "x"}}]}) == ("", "x")
    # the server's own count wins over the chunks'
    rec, _ = _feed([_chat({"reasoning": "a"}), _chat({"content": "b"}, finish="stop"),
                    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9,
                                              "completion_tokens_details": {"reasoning_tokens": 7},
                                              "prompt_tokens_details": {"cached_tokens": 2}}}, "[DONE]"])
    assert rec.reasoning_tokens == 7 and rec.output_tokens == 9 and rec.cached_tokens == 2 and rec.prompt_tokens == 3


def test_usage_in_every_chunk_gives_tokens_per_chunk_and_per_token_itl():
    u = lambda n: {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}  # noqa: E731
    events = [_chat({"role": "assistant", "content": ""}, u(0)), _chat({"content": "a b"}, u(2)),
              _chat({"content": "c d e"}, u(5)), _chat({"content": "f"}, u(6), finish="length"), "[DONE]"]
    rec, _ = _feed(events, times=[0.0, 0.1, 0.13, 0.15, 0.15])
    assert rec.chunk_tokens == [2, 3, 1] and rec.output_tokens == 6
    assert latency.chunk_gap_ms(rec) == pytest.approx([30.0, 20.0])
    assert latency.itl_ms(rec) == pytest.approx([10.0, 10.0, 10.0, 20.0])  # 30 ms over 3 tokens, then 20 ms
    legacy = {"scheduled_s": 0.0, "token_s": [0.1, 0.13, 0.15], "first_token_s": 0.1, "output_tokens": None}
    assert latency.itl_ms(legacy) == pytest.approx([30.0, 20.0]) and latency.ttfot_ms(legacy) == pytest.approx(100)


def test_vllm_per_request_metrics_map_onto_queue_prefill_decode():
    metrics = {"queue_time_ms": 12.0, "time_to_first_token_ms": 30.0, "generation_time_ms": 200.0,
               "mean_itl_ms": 20.0, "tokens_per_second": 40.0}
    rec, _ = _feed([_chat({"content": "a"}, finish="stop"),
                    {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "metrics": metrics},
                    "[DONE]"], times=[0.05, 0.06, 0.06])
    assert rec.server == {"queue_ms": 12.0, "prefill_ms": 30.0, "decode_ms": 200.0, "source": "vllm metrics"}
    bd = latency.breakdown([rec])
    assert bd["source"] == "server timing" and "--enable-per-request-metrics" in bd["source_detail"]
    assert bd["mean_network_ms"] == pytest.approx(50 - 12 - 30) and bd["mean_decode_ms"] == 200.0
    engine, _ = _feed([_chat({"content": "a"}, finish="stop",
                             timing={"queue_ms": 1, "prefill_ms": 2, "decode_ms": 3, "tier": "standard"}), "[DONE]"])
    assert latency.breakdown([engine])["source_detail"] == "slobench engine timing object"
    assert "p50_front_end_ms" not in latency.breakdown([engine])  # not reported: not invented
    front, _ = _feed([_chat({"content": "a"}, finish="stop", timing={"queue_ms": 1, "prefill_ms": 2, "decode_ms": 3,
                                                                      "front_end_ms": 4.5}), "[DONE]"])
    assert front.server["front_end_ms"] == 4.5
    bd = latency.breakdown([front])
    assert bd["p50_front_end_ms"] == 4.5 and bd["mean_front_end_ms"] == 4.5


def test_the_engines_held_first_text_is_its_own_part_not_the_networks():
    """held_ms (the reference engine's first token -> first text) is recorded and taken out of network."""
    timing = {"queue_ms": 10, "prefill_ms": 20, "decode_ms": 3}
    plain, _ = _feed([_chat({"content": "a"}, finish="stop", timing=timing), "[DONE]"])  # TTFT 100 ms
    held, _ = _feed([_chat({"content": "a"}, finish="stop", timing={**timing, "held_ms": 30.0}), "[DONE]"])
    assert held.server["held_ms"] == 30.0
    assert latency.breakdown([plain])["mean_network_ms"] == pytest.approx(70.0)
    assert "p50_held_ms" not in latency.breakdown([plain])
    bd = latency.breakdown([held])
    assert bd["mean_network_ms"] == pytest.approx(40.0) and bd["p99_held_ms"] == 30.0


def test_responses_api_events():
    ev = [{"type": "response.created", "response": {"status": "in_progress"}},
          {"type": "response.reasoning_summary_text.delta", "delta": "think"},
          {"type": "response.output_text.delta", "delta": "Hi"},
          {"type": "response.completed", "response": {"usage": {
              "input_tokens": 5, "output_tokens": 8, "output_tokens_details": {"reasoning_tokens": 6},
              "input_tokens_details": {"cached_tokens": 4}}}}]
    rec, sr = _feed(ev)
    assert rec.first_token_s == pytest.approx(0.2) and rec.first_output_s == pytest.approx(0.3) and sr.text == "Hi"
    assert (rec.prompt_tokens, rec.output_tokens, rec.reasoning_tokens, rec.cached_tokens) == (5, 8, 6, 4)
    assert chunk_usage({"type": "response.output_text.delta", "delta": "x"}) is None
    with pytest.raises(StreamError, match="server_error: boom"):
        decode_chunk(json.dumps({"type": "error", "code": "server_error", "message": "boom"}))
    with pytest.raises(StreamError, match="rate_limit: busy"):
        decode_chunk(json.dumps({"type": "response.failed", "response": {"error": {"code": "rate_limit",
                                                                                    "message": "busy"}}}))
    with pytest.raises(StreamError, match="without"):  # no response.completed: cut off
        _feed(ev[:3])


def test_an_slo_on_ttfot_is_parsed_and_judged(tmp_path):
    scn = tmp_path / "s.yaml"
    scn.write_text("name: t\nworkload: {input_len: 4, output_len: 4}\ntiers: {standard: {slo: {ttfot_ms: 300}}}\n"
                   "load: {rate: 1, requests: 2}\ngoodput: {ttfot_ms: 300}\nclient: {endpoint: responses}\n")
    s = load_scenario(scn)
    assert s.tier_slos["standard"] == {"ttfot_ms": 300.0} and s.endpoint == "responses"
    recs = [{"scheduled_s": 0.0, "first_token_s": 0.05, "first_output_s": 0.05 + 0.1 * i, "token_s": [0.05, 0.5],
             "done_s": 0.6, "status": "ok", "output_tokens": 2} for i in range(10)]
    v = latency.slo_values(recs, "ttfot_ms")
    assert v == pytest.approx([50 + 100 * i for i in range(10)])
    assert not judge(v, SLO("ttfot_ms", 300.0, 0.9), 0.95).passed  # p90 ≈ 860 ms
    assert judge(latency.slo_values(recs, "ttft_ms"), SLO("ttft_ms", 300.0, 0.9), 0.95).passed


def _scenario(tmp_path, slo="ttfot_ms: 150"):
    scn = tmp_path / "s.yaml"
    scn.write_text("name: sem\nworkload: {input_len: 12, output_len: 10}\n"
                   f"tiers: {{standard: {{weight: 1, slo: {{{slo}}}}}}}\n"
                   "load: {arrival: poisson, rate: 20, requests: 12}\n")
    return scn


def _run(tmp_path, url, name, *args):
    r = slobench("run", _scenario(tmp_path), "--target", url, "--out", tmp_path / name, "--no-progress",
                 "--no-report", "--lateness-bound-ms", 50, *args)
    assert r.returncode == 0, r.stderr
    return read_records(tmp_path / name / "requests.jsonl"), json.loads((tmp_path / name / "summary.json").read_text())


def test_reasoning_model_against_the_mock_ttft_ttfot_and_vllm_metrics(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 50, "--itl-ms", 10, "--tokens", 10, "--reasoning-tokens", 5,
                      "--reasoning-field", "reasoning", "--per-request-metrics")
    recs, s = _run(tmp_path, url, "r", "--endpoint", "chat")
    assert {r["status"] for r in recs} == {"ok"}
    assert all(r["reasoning_tokens"] == 5 and r["output_tokens"] == 10 for r in recs)
    assert s["median_ttft_ms"] == pytest.approx(50, abs=5) and s["median_ttfot_ms"] == pytest.approx(100, abs=5)
    assert s["total_reasoning_tokens"] == 60 and s["total_answer_tokens"] == 60
    assert s["tiers"]["standard"]["median_ttfot_ms"] == pytest.approx(100, abs=5)
    assert s["tiers"]["standard"]["slo_attainment"] == 1.0  # ttfot_ms: 150, judged
    bd = s["breakdown"]
    assert bd["source"] == "server timing" and "vLLM per-request metrics" in bd["source_detail"]
    assert bd["mean_queue_ms"] == 0.0 and bd["mean_prefill_ms"] == 50.0 and bd["mean_decode_ms"] == pytest.approx(90)


def test_multi_token_chunks_against_the_mock(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 50, "--itl-ms", 10, "--tokens", 10, "--tokens-per-chunk", 3)
    recs, s = _run(tmp_path, url, "r")
    assert all(r["chunk_tokens"] == [3, 3, 3, 1] and len(r["token_s"]) == 4 for r in recs)
    assert s["request_fit"]["shape"]["continuous_usage"] is True
    # per token: every token 10 ms after the one before (a 30 ms gap over 3 tokens); chunk gaps 30 ms, 10 ms
    assert s["median_itl_ms"] == pytest.approx(10, abs=2) and s["mean_itl_ms"] == pytest.approx(10, abs=2)
    assert s["median_chunk_gap_ms"] == pytest.approx(30, abs=3)
    assert s["median_tpot_ms"] == pytest.approx(70 / 9, abs=1)  # (E2EL − TTFT) / (10 − 1)


def test_continuous_usage_can_be_turned_off(mock_server, tmp_path):
    """``client.continuous_usage: false`` sends only include_usage: chunks are one token each again."""
    url = mock_server("--ttft-ms", 20, "--itl-ms", 5, "--tokens", 6, "--tokens-per-chunk", 3)
    scn = _scenario(tmp_path)
    scn.write_text(scn.read_text() + "client: {continuous_usage: false}\n")
    r = slobench("run", scn, "--target", url, "--out", tmp_path / "off", "--no-progress", "--no-report",
                 "--lateness-bound-ms", 50)
    assert r.returncode == 0, r.stderr
    recs = read_records(tmp_path / "off" / "requests.jsonl")
    s = json.loads((tmp_path / "off" / "summary.json").read_text())
    assert s["request_fit"]["shape"]["continuous_usage"] is False
    assert any("client.continuous_usage: false" in n for n in s["request_fit"]["notes"])
    assert all(r["chunk_tokens"] is None and len(r["token_s"]) == 2 and r["output_tokens"] == 6 for r in recs)


def test_responses_api_end_to_end_and_a_target_without_it(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 30, "--itl-ms", 10, "--tokens", 6, "--reasoning-tokens", 2)
    recs, s = _run(tmp_path, url, "r", "--endpoint", "responses")
    assert {r["status"] for r in recs} == {"ok"} and s["request_fit"]["shape"]["endpoint"] == "responses"
    assert all(r["output_tokens"] == 6 and r["reasoning_tokens"] == 2 and r["cached_tokens"] == 0 for r in recs)
    assert s["median_ttft_ms"] == pytest.approx(30, abs=5) and s["median_ttfot_ms"] == pytest.approx(50, abs=5)
    assert s["target_probe"]["responses"] is True
    bare = mock_server("--no-responses")
    r = slobench("run", _scenario(tmp_path), "--target", bare, "--out", tmp_path / "x", "--endpoint", "responses",
                 "--no-progress")
    assert r.returncode != 0 and "/v1/responses" in r.stderr and not (tmp_path / "x" / "requests.jsonl").exists()
