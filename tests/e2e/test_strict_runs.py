"""slobench against strict OpenAI-compatible servers: a real ``transformers serve`` and the strict mock.

The probe finds what each rejects (``ignore_eos``, token-id prompts, ``service_tier`` on transformers'
completions), the run sends only what is accepted, prompts become text of their exact intended length
(counted by the server itself, in its usage), and the summary names what was dropped. A field the user
asked for explicitly that the server rejects stops the run before any load, with one line naming it."""

from __future__ import annotations

import json

import pytest

from loadgen.results.records import read_records
from tests.helpers import slobench

SCENARIO = """name: strict
workload:
  input_len: {{dist: uniform, min: 16, max: 64}}
  output_len: 8
  shared_prefix: {{num_prompts: 2, length: 24, ratio: 0.5}}
tiers: {{premium: {{weight: 1, slo: {{ttft_ms: 5000}}}}, standard: {{weight: 2, slo: {{ttft_ms: 10000}}}}}}
load: {{arrival: poisson, rate: {rate}, requests: {requests}}}
{extra}"""


def scenario(tmp_path, rate=8, requests=40, extra=""):
    p = tmp_path / "strict.yaml"
    p.write_text(SCENARIO.format(rate=rate, requests=requests, extra=extra))
    return p


def check_exact_prompts(recs):
    ok = [x for x in recs if x["status"] == "ok"]
    assert len(ok) >= 0.99 * len(recs)
    # the server's own count (its usage) is the intended length, request by request
    assert all(x["prompt_tokens"] == x["prompt_tokens_intended"] for x in ok), \
        [(x["prompt_tokens"], x["prompt_tokens_intended"]) for x in ok][:5]


@pytest.mark.slow
def test_run_against_transformers_serve(transformers_serve, serve_checkpoint, tmp_path):
    r = slobench("run", scenario(tmp_path), "--target", transformers_serve.url, "--model", transformers_serve.model,
                 "--tokenizer", serve_checkpoint, "--out", tmp_path / "run", "--no-progress", "--no-report",
                 "--lateness-bound-ms", 50, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    assert len(recs) == 40
    check_exact_prompts(recs)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    fit = s["request_fit"]
    assert {"ignore_eos", "service_tier", "token_prompts"} <= set(fit["dropped"])
    assert fit["shape"]["text_prompts"] and not fit["shape"]["ignore_eos"] and fit["overhead_tokens"] >= 0
    assert any("output lengths are not enforced" in n for n in fit["notes"])
    assert s["prompt_length"]["flagged"] is False and s["prompt_length"]["mean_abs_drift"] == 0
    assert s["target_probe"]["rejections"]["token_prompts"].startswith("HTTP 400")
    assert "not sent: ignore_eos" in r.stdout


@pytest.mark.slow
def test_capacity_against_transformers_serve(transformers_serve, serve_checkpoint, tmp_path):
    search = "search: {start: 2, growth: 2, max_load: 4, step_duration_s: 3, warmup_s: 0.5, early_pass: false}\n"
    r = slobench("capacity", scenario(tmp_path, extra=search), "--target", transformers_serve.url,
                 "--model", transformers_serve.model, "--tokenizer", serve_checkpoint, "--out", tmp_path / "cap",
                 "--no-progress", "--no-report", "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    assert s["verdict"] in ("rated", "never_broke") and len(s["steps"]) >= 2
    recs = read_records(tmp_path / "cap" / "requests.jsonl")
    assert {x["stage"] for x in recs} == {st["index"] for st in s["steps"]}
    check_exact_prompts(recs)
    assert "token_prompts" in s["request_fit"]["dropped"] and s["prompt_length"]["mean_abs_drift"] == 0


def test_strict_mock_run_adapts_and_says_what_was_dropped(strict_mock, tmp_path):
    r = slobench("run", scenario(tmp_path, rate=20, requests=30), "--target", strict_mock, "--out", tmp_path / "run",
                 "--no-progress", "--no-report", "--lateness-bound-ms", 50)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    assert len(recs) == 30 and all(x["status"] == "ok" for x in recs)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    # service_tier is OpenAI's own; priority is not (the scenario's two tiers would send it)
    assert set(s["request_fit"]["dropped"]) == {"ignore_eos", "priority", "token_prompts"}
    assert s["request_fit"]["shape"]["service_tier"] is True
    # no tokenizer for a mock: lengths are approximate, and the summary says so and by how much
    assert s["request_fit"]["tokenizer"].startswith("none")
    assert any("--tokenizer DIR" in n for n in s["request_fit"]["notes"])
    assert s["prompt_length"]["requests_compared"] == 30
    assert "not sent: ignore_eos, priority, token_prompts" in r.stdout


def test_an_explicit_field_the_target_rejects_stops_before_any_load(strict_mock, tmp_path):
    scn = scenario(tmp_path, requests=5).read_text()
    scn = scn.replace("  output_len: 8\n", "  output_len: 8\n  ignore_eos: true\n")
    (tmp_path / "explicit.yaml").write_text(scn)
    r = slobench("run", tmp_path / "explicit.yaml", "--target", strict_mock, "--out", tmp_path / "run",
                 "--no-progress", "--no-report")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]  # one line, no traceback
    assert "workload.ignore_eos: the target rejects ignore_eos" in r.stderr
    assert not (tmp_path / "run" / "requests.jsonl").exists()


def test_no_probe_sends_everything(strict_mock, tmp_path):
    """--no-probe trusts the target: against a strict one every request is refused, and the summary says
    why (a 422 naming the field), which is what the probe exists to avoid."""
    r = slobench("run", scenario(tmp_path, requests=5), "--target", strict_mock, "--out", tmp_path / "run",
                 "--no-progress", "--no-report", "--no-probe")
    assert r.returncode == 1 and "no request succeeded" in r.stderr
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    assert {x["http_status"] for x in recs} == {422} and "ignore_eos" in recs[0]["error"]
