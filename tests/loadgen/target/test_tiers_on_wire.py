"""Tiers that reach the server: each tier's ``priority`` and headers sent as configured and received (asserted
from the mock's own request log); a server that refuses ``priority`` (the mock's ``--fcfs``) is probed and
the run goes on without it, said once; the default mapping per server flavour."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml

from loadgen.scenario.model import ScenarioError
from loadgen.scenario.parse import parse_scenario
from loadgen.target.request_shape import tier_priorities
from tests.helpers import slobench

SCENARIO = """\
name: three-tiers
workload: {{type: synthetic, input_len: {{dist: fixed, value: 16}}, output_len: {{dist: fixed, value: 4}}}}
tiers:
  premium: {{weight: 1, slo: {{ttft_ms: 300}}, headers: {{x-tenant-class: gold}}}}
  standard: {{weight: 1, slo: {{ttft_ms: 800}}{standard}}}
  basic: {{weight: 1}}
seed: 3
load: {{arrival: poisson, rate: 40, requests: 30}}
{client}"""


def run(tmp_path, url: str, *, standard: str = "", client: str = "") -> tuple[object, list[dict]]:
    scn = tmp_path / "tiers.yaml"
    scn.write_text(SCENARIO.format(standard=standard, client=client))
    r = slobench("run", scn, "--target", url, "--out", tmp_path / "run", "--no-report", "--no-progress")
    return r, [json.loads(x) for x in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()] \
        if (tmp_path / "run" / "requests.jsonl").exists() else []


def received(log) -> list[dict]:
    """The load's requests as the mock received them (the probe's asked for 2 tokens)."""
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    return [r for r in rows if isinstance(r["body"], dict) and r["body"].get("max_tokens") == 4]


def test_each_tier_carries_its_priority_and_headers(tmp_path, mock_server):
    log = tmp_path / "mock.jsonl"
    url = mock_server("--ttft-ms", 2, "--itl-ms", 1, "--log-requests", log)
    r, records = run(tmp_path, url, standard=", priority: 7")
    assert r.returncode == 0, r.stderr
    got = received(log)
    assert len(got) == len(records) == 30
    seen = Counter((g["body"]["service_tier"], g["body"].get("priority"), g["headers"].get("x-tenant-class"))
                   for g in got)
    # premium and basic by rank (vLLM's convention, lowest first), standard as set; the header on premium only
    assert set(seen) == {("premium", 0, "gold"), ("standard", 7, None), ("basic", 2, None)}
    notes = json.loads((tmp_path / "run" / "summary.json").read_text())["request_fit"]["notes"]
    assert [n for n in notes if "priority" in n] == [
        "each tier's requests carry a priority (premium 0, standard 7, basic 2; vllm serves the lowest value first "
        "when it schedules by priority: vLLM with --scheduling-policy priority; under FCFS it accepts the field and "
        "ignores it)"]


def test_a_server_that_refuses_priority_is_probed_and_the_run_goes_on_without_it(tmp_path, mock_server):
    log = tmp_path / "mock.jsonl"
    url = mock_server("--ttft-ms", 2, "--itl-ms", 1, "--fcfs", "--log-requests", log)
    r, records = run(tmp_path, url)
    assert r.returncode == 0, r.stderr
    assert len(records) == 30 and all(x["status"] == "ok" for x in records)
    assert all("priority" not in g["body"] for g in received(log))
    assert all(g["headers"].get("x-tenant-class") == ("gold" if g["body"]["service_tier"] == "premium" else None)
               for g in received(log))
    assert (r.stdout + r.stderr).count("priority not accepted by the server") == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["request_fit"]["dropped"] == ["priority"]
    assert "Priority scheduling is not enabled" in summary["target_probe"]["rejections"]["priority"]


def test_asking_for_priority_from_a_server_that_refuses_it_is_one_line_and_exit_2(tmp_path, mock_server):
    log = tmp_path / "mock.jsonl"
    url = mock_server("--ttft-ms", 2, "--itl-ms", 1, "--fcfs", "--log-requests", log)
    r, _ = run(tmp_path, url, client="client: {send_priority: true}")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "client.send_priority: the target rejects priority" in r.stderr
    assert received(log) == []  # nothing of the load was sent


def test_send_priority_false_sends_none(tmp_path, mock_server):
    log = tmp_path / "mock.jsonl"
    url = mock_server("--ttft-ms", 2, "--itl-ms", 1, "--log-requests", log)
    r, _ = run(tmp_path, url, client="client: {send_priority: false}")
    assert r.returncode == 0, r.stderr
    got = received(log)
    assert len(got) == 30 and all("priority" not in g["body"] for g in got)


def test_the_default_priorities_follow_each_servers_convention():
    assert tier_priorities(["basic", "premium", "standard"], "vllm") == {"premium": 0, "standard": 1, "basic": 2}
    assert tier_priorities(["basic", "premium", "standard"], "sglang") == {"premium": 2, "standard": 1, "basic": 0}
    assert tier_priorities(["standard", "premium"], "unknown", {"standard": -3}) == {"premium": 0, "standard": -3}


@pytest.mark.parametrize(("tier", "error"), [
    ("{weight: 1, priority: high}", "tiers.premium.priority: expected an integer or null"),
    ("{weight: 1, headers: [x]}", "tiers.premium.headers: expected a mapping"),
    ("{weight: 1, headers: {x-class: 1}}", "tiers.premium.headers.x-class: expected a string"),
])
def test_bad_tier_priority_or_headers_are_one_line_errors(tier, error):
    text = f"name: t\nworkload: {{type: synthetic}}\ntiers: {{premium: {tier}}}\nload: {{rate: 1, requests: 1}}\n"
    with pytest.raises(ScenarioError, match=error.replace(".", r"\.")):
        parse_scenario(yaml.safe_load(text))


def test_each_tier_gets_its_own_rated_load_at_the_mix():
    """The lowest crossing over each tier's SLOs; a tier whose SLOs held everywhere says so (open above)."""
    from loadgen.capacity.run import tier_capacity

    crossings = [{"tier": "premium", "metric": "ttft_ms", "load": 41.0, "open": None},
                 {"tier": "standard", "metric": "ttft_ms", "load": 33.0, "open": None},
                 {"tier": "standard", "metric": "tpot_ms", "load": 29.5, "open": None},
                 {"tier": "basic", "metric": "e2el_ms", "load": 60.0, "open": "above"}]
    assert tier_capacity({"crossings": crossings}) == {
        "premium": {"load": 41.0, "open": None, "metric": "ttft_ms"},
        "standard": {"load": 29.5, "open": None, "metric": "tpot_ms"},
        "basic": {"load": 60.0, "open": "above", "metric": "e2el_ms"}}
