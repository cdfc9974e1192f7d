"""Rating one's own server with flags alone: ``--slo``, the workload's lengths, ``--dataset``, the target's
credentials, headers and extra body (checked at the server), and the one-line errors before any load."""

from __future__ import annotations

import json

import pytest

from loadgen.scenario.flags import ScenarioFlags, SloFlag, parse_length, parse_slo
from loadgen.scenario.model import ScenarioError
from loadgen.scenario.parse import parse_scenario
from loadgen.target.access import base_url
from loadgen.workload.tokenizer import cached_tokenizer_dir
from tests.helpers import slobench

FAST = ["--set", "search.step_duration_s=3", "--set", "search.warmup_s=1", "--set", "search.start=8",
        "--set", "search.max_steps=4", "--set", "search.max_duration_s=45", "--set", "client.lateness_bound_ms=200",
        "--no-progress", "--no-report"]


@pytest.mark.parametrize("text,want", [
    ("ttft:500", SloFlag("ttft_ms", 500.0, None)),
    ("tpot:50@p90", SloFlag("tpot_ms", 50.0, 0.9)),
    ("E2EL:2000@p99.9", SloFlag("e2el_ms", 2000.0, 0.999)),
    ("itl:40@p50", SloFlag("itl_ms", 40.0, 0.5)),
    ("ttfot:1e3", SloFlag("ttfot_ms", 1000.0, None)),
])
def test_slo_flag_forms(text, want):
    assert parse_slo(text) == want


@pytest.mark.parametrize("text,msg", [
    ("ttft", "expected METRIC:MS"),
    ("latency:5", "unknown metric 'latency'"),
    ("ttft:fast", "is not a number of milliseconds"),
    ("ttft:-5", "must be a positive number"),
    ("ttft:inf", "must be a positive number"),
    ("ttft:500@99", "expected a quantile p50 ... p99.9"),
    ("ttft:500@p100", "expected a quantile p50 ... p99.9"),
])
def test_bad_slo_flags_are_one_line_usage_errors(text, msg):
    with pytest.raises(ScenarioError, match="--slo"):
        parse_slo(text)
    r = slobench("capacity", "--slo", text, "--target", "http://127.0.0.1:9")
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_lengths_and_the_precedence_of_flags_over_the_file():
    assert parse_length("512", "--input-len") == 512
    assert parse_length("256:1024", "--input-len") == {"dist": "uniform", "min": 256, "max": 1024}
    for bad in ("0", "9:3", "x", "1:2:3"):
        with pytest.raises(ScenarioError, match="--input-len"):
            parse_length(bad, "--input-len")
    raw = {"workload": {"input_len": 64, "output_len": 8}, "load": {"rate": 2, "requests": 10},
           "tiers": {"premium": {"weight": 1, "slo": {"ttft_ms": 300}}, "basic": {"weight": 1}}}
    flags = ScenarioFlags(slos=[parse_slo("ttft:500"), parse_slo("tpot:50@p90")], input_len="128:256",
                          output_len="32", prefix_len=64, prefix_share=0.5, rate=7.0, requests=20)
    scn = parse_scenario(flags.apply(raw))
    assert scn.synthetic.input_len.min == 128 and scn.synthetic.input_len.max == 256
    assert scn.synthetic.output_len.value == 32
    assert scn.synthetic.shared_prefix.length == 64 and scn.synthetic.shared_prefix.ratio == 0.5
    assert scn.arrivals.rate == 7.0 and scn.requests == 20
    # the tier with an SLO gets the flags' SLOs (each with its quantile); the one without keeps none
    assert {(s.metric, s.threshold_ms, s.quantile) for s in scn.slos()["premium"]} == {
        ("ttft_ms", 500.0, 0.99), ("tpot_ms", 50.0, 0.9)}
    assert scn.slos()["basic"] == []
    assert raw["tiers"]["premium"]["slo"] == {"ttft_ms": 300}  # the file's mapping is not edited in place
    # no tiers: one, standard
    assert list(parse_scenario(ScenarioFlags(slos=[parse_slo("ttft:500")]).apply(
        {"workload": {}, "load": {"requests": 1}})).tiers) == ["standard"]
    with pytest.raises(ScenarioError, match="--rate and --concurrency"):
        ScenarioFlags(rate=1.0, concurrency=2).apply(raw)
    trace = {"workload": {"type": "trace", "path": "x.jsonl"}}
    with pytest.raises(ScenarioError, match="--input-len: the scenario replays a trace"):
        ScenarioFlags(input_len="5").apply(trace)


def test_base_url_takes_the_v1_form_and_the_hf_cache_is_looked_up_not_downloaded(tmp_path, monkeypatch):
    assert base_url("http://h:8000/v1/") == base_url("http://h:8000") == "http://h:8000"
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert cached_tokenizer_dir("org/tiny") == snap
    assert cached_tokenizer_dir("org/absent") is None and cached_tokenizer_dir("no-slash") is None


def _log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_capacity_with_flags_alone_against_a_server_that_needs_a_key(mock_server, tmp_path):
    """No scenario file: the SLO, the lengths, the key, a header and an extra body field from flags; the
    server receives all three on every completion request, and the run rates it."""
    log = tmp_path / "requests.log"
    url = mock_server("--api-key", "sekret", "--log-requests", log, "--slots", 2, "--ttft-ms", 20, "--itl-ms", 10,
                      "--check-model")
    out = tmp_path / "run"
    r = slobench("capacity", "--target", url + "/v1", "--slo", "ttft:100@p90", "--input-len", 16, "--output-len", 4,
                 "--api-key", "sekret", "--header", "X-Tenant: perf", "--extra-body", '{"user": "bench"}',
                 "--out", out, *FAST, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] in ("rated", "never_broke") and summary["steps"]
    sent = [e for e in _log(log) if e["path"] in ("/v1/completions", "/v1/chat/completions")]
    assert len(sent) > 20
    assert all(e["headers"].get("authorization") == "Bearer sekret" and e["headers"].get("x-tenant") == "perf"
               and e["body"].get("user") == "bench" for e in sent)
    assert {e["body"]["max_tokens"] for e in sent} >= {4}
    # the key is in no file of the run folder; the header's value neither
    for f in out.iterdir():
        if f.is_file() and f.suffix in (".json", ".jsonl", ".csv"):
            assert "sekret" not in f.read_text(errors="replace"), f.name


def test_a_refused_key_a_wrong_model_and_nothing_listening_end_before_any_load(mock_server, tmp_path):
    log = tmp_path / "requests.log"
    url = mock_server("--api-key", "sekret", "--log-requests", log, "--check-model")
    common = ["--slo", "ttft:500", "--input-len", 8, "--output-len", 4, "--out", tmp_path / "x", *FAST]
    r = slobench("capacity", "--target", url, *common, env={"OPENAI_API_KEY": ""})
    assert r.returncode == 2 and "needs an API key" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = slobench("capacity", "--target", url, *common, "--api-key", "wrong")
    assert r.returncode == 2 and "API key was refused" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = slobench("run", "--target", url, "--model", "nope", "--requests", 3, *common[:6],
                 env={"OPENAI_API_KEY": "sekret"})
    assert r.returncode == 2 and "does not serve model 'nope'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert {e["path"] for e in _log(log)} - {"/health"} == {"/v1/models"}  # nothing but the check was sent
    r = slobench("run", "--target", "http://127.0.0.1:9", "--requests", 3)
    assert r.returncode == 2 and "nothing is listening at http://127.0.0.1:9" in r.stderr


def test_run_from_a_prompts_dataset(mock_server, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "Tell me a story."}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}) + "\n")
    log = tmp_path / "requests.log"
    url = mock_server("--log-requests", log, "--ttft-ms", 5, "--itl-ms", 1)
    r = slobench("run", "--target", url, "--dataset", data, "--output-len", 5, "--rate", 20, "--requests", 2,
                 "--slo", "ttft:500", "--out", tmp_path / "run", "--no-report", "--no-scrape", "--json",
                 "--lateness-bound-ms", 200)
    assert r.returncode == 0, r.stderr
    bodies = [e["body"] for e in _log(log) if e["method"] == "POST"]
    story = [b for b in bodies if b.get("prompt") == "Tell me a story."
             or (b.get("messages") or [{}])[-1].get("content") == "Tell me a story."]
    hi = [b for b in bodies if b.get("messages") == [{"role": "user", "content": "Hi"}]]
    assert [b["max_tokens"] for b in story] == [5] and [b["max_tokens"] for b in hi] == [3], bodies[-2:]
    assert json.loads(r.stdout)["goodput_slo"] == {"ttft_ms": 500.0}  # --slo without --goodput: its threshold


def test_locust_sends_the_key_headers_and_extra_body_too(mock_server, tmp_path):
    """The Locust driver gets them through its environment (never its command line) and sends them all."""
    log = tmp_path / "requests.log"
    url = mock_server("--api-key", "sekret", "--log-requests", log, "--ttft-ms", 5, "--itl-ms", 1)
    r = slobench("run", "--target", url, "--driver", "locust", "--api-key", "sekret", "--header", "X-Tenant: perf",
                 "--extra-body", '{"user": "bench"}', "--requests", 6, "--rate", 10, "--input-len", 8,
                 "--output-len", 3, "--out", tmp_path / "run", "--no-report", "--no-scrape",
                 "--lateness-bound-ms", 500, timeout=300)
    assert r.returncode == 0, r.stderr
    sent = [e for e in _log(log) if e["path"] == "/v1/completions" and e["body"].get("max_tokens") == 3]
    assert len(sent) == 6
    assert all(e["headers"].get("authorization") == "Bearer sekret" and e["headers"].get("x-tenant") == "perf"
               and e["body"].get("user") == "bench" for e in sent)
    files = [f for f in (tmp_path / "run").rglob("*") if f.is_file()]
    assert any(f.name == "locust.log" for f in files)
    assert not [f.name for f in files if b"sekret" in f.read_bytes()]  # the key is in no file, Locust's included
