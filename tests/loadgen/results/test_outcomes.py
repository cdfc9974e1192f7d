"""Outcome classes (``results.outcomes``): every record's class from the matching mock behaviour (429 with
Retry-After, 503, 529, a 500, the client's deadline, a late answer, the workload's cancellations), the same
counts in the summary per tier; the shed budget changing a step's verdict exactly as specified; retries that
honour Retry-After and are counted."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from loadgen.capacity.step_stats import tier_entry
from loadgen.results.outcomes import OUTCOMES, outcome, shed_allowance, within_shed_budget
from loadgen.results.records import RequestRecord
from loadgen.results.slo import SLO
from tests.helpers import slobench

MIXED = """\
name: outcomes
seed: 5
workload:
  type: synthetic
  input_len: {dist: fixed, value: 16}
  output_len: {dist: fixed, value: 4}
  cancel: {ratio: 0.15, after_s: 0.02}
tiers:
  standard: {weight: 1, slo: {ttft_ms: 2000}}
  premium: {weight: 1, slo: {ttft_ms: 40}}
  basic: {weight: 1, timeout_s: 0.05}
load: {arrival: poisson, rate: 30, requests: 90}
"""


def records_of(folder) -> list[dict]:
    return [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]


def test_every_outcome_class_from_the_matching_server_behaviour(tmp_path, mock_server):
    url = mock_server("--ttft-ms", 80, "--itl-ms", 1, "--tokens", 4, "--refuse", "429:4:2", "--refuse", "503:5",
                  "--refuse", "529:7", "--refuse", "500:11")
    scn = tmp_path / "mixed.yaml"
    scn.write_text(MIXED)
    r = slobench("run", scn, "--target", url, "--out", tmp_path / "run", "--no-report", "--no-progress", "--no-probe")
    assert r.returncode == 0, r.stderr
    recs = records_of(tmp_path / "run")
    slos = {"standard": {"ttft_ms": 2000.0}, "premium": {"ttft_ms": 40.0}, "basic": {}}
    classes = Counter(outcome(x, slos[x["tier"]]) for x in recs)
    assert set(classes) == set(OUTCOMES), classes  # every class occurs
    for x in recs:
        got = outcome(x, slos[x["tier"]])
        if x["http_status"] in (429, 503, 529):
            assert got == "shed" and x["status"] == "rejected"
            assert x["retry_after_s"] == (2.0 if x["http_status"] == 429 else None)
        elif x["http_status"] == 500:
            assert got == "failed"
        elif x["status"] == "cancelled":
            assert got == "cancelled" and x["cancel_reason"].startswith("client")
        elif x["tier"] == "basic":  # 80 ms to a first token, a 50 ms deadline
            assert got == "timeout" and x["error"].startswith("client deadline")
        else:  # answered in about 80 ms: within standard's 2 s, over premium's 40 ms
            assert got == {"standard": "good", "premium": "late"}[x["tier"]]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["outcomes"] == {k: classes[k] for k in OUTCOMES}
    for tier in slos:
        mine = Counter(outcome(x, slos[tier]) for x in recs if x["tier"] == tier)
        assert summary["tiers"][tier]["outcomes"] == {k: mine[k] for k in OUTCOMES}


def record(i: int, ttft_s: float | None, status: str = "ok") -> RequestRecord:
    r = RequestRecord(f"r{i}", 0, "standard", scheduled_s=float(i), sent_s=float(i), status=status)
    if ttft_s is not None:
        r.first_token_s = r.first_output_s = i + ttft_s
        r.token_s = [i + ttft_s, i + ttft_s + 0.01]
        r.done_s, r.output_tokens = i + ttft_s + 0.01, 2
    else:
        r.done_s, r.http_status = float(i) + 0.001, 429
    return r


@pytest.mark.parametrize(("max_shed", "passed", "unjudged"), [(0.0, False, 0), (0.02, False, 2), (0.03, True, 3),
                                                               (0.05, True, 3)])
def test_the_shed_budget_changes_the_verdict_exactly_as_specified(max_shed, passed, unjudged):
    """100 requests, 3 shed, the rest 50 ms against a p99 of 100 ms: the refusals the budget allows (floor of
    max_shed x 100) are not judged; one more than it allows is a miss, and a p99 over 98 requests with one
    miss fails."""
    rs = [record(i, None, "rejected") if i in (10, 50, 90) else record(i, 0.05) for i in range(100)]
    entry = tier_entry(rs, [SLO("ttft_ms", 100.0, 0.99, max_shed=max_shed)], 0.99, 0.95, seed=0)
    assert entry["passed"] is passed
    assert entry["shed_unjudged"] == unjudged
    assert entry["judged"]["ttft_ms"]["n"] == 100 - unjudged
    assert entry["outcomes"]["shed"] == 3 and entry["outcomes"]["good"] == 97


def test_the_budget_is_a_share_of_the_planned_requests_while_a_step_runs():
    rs = [record(0, None, "rejected"), record(1, 0.05)]
    assert shed_allowance(100, 0.01) == 1 and shed_allowance(99, 0.01) == 0
    assert within_shed_budget(rs, 0.01) == rs  # 1 % of 2 requests allows none
    assert within_shed_budget(rs, 0.01, of=100) == rs[1:]  # ... of the 100 planned, one


def test_retries_honour_retry_after_and_are_counted(tmp_path, mock_server):
    log = tmp_path / "mock.jsonl"
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1, "--tokens", 4, "--refuse", "429:2:0.3", "--log-requests", log)
    scn = tmp_path / "retry.yaml"
    scn.write_text("name: retry\nworkload: {type: synthetic, input_len: {dist: fixed, value: 16}, "
                   "output_len: {dist: fixed, value: 4}}\ntiers: {standard: {slo: {ttft_ms: 2000}}}\n"
                   "load: {arrival: constant, rate: 1, requests: 6}\nclient: {retries: 1}\n")
    r = slobench("run", scn, "--target", url, "--out", tmp_path / "run", "--no-report", "--no-progress", "--no-probe")
    assert r.returncode == 0, r.stderr
    recs = sorted(records_of(tmp_path / "run"), key=lambda x: x["scheduled_s"])
    # every even-numbered completion request is refused: the first is served, then each later one is refused
    # once and served on its resend (one a second, so no two interleave)
    retried = [x for x in recs if x["retries"]]
    assert [x["retries"] for x in recs] == [0, 1, 1, 1, 1, 1]
    assert all(x["status"] == "ok" and x["retry_after_s"] == 0.3 for x in retried)
    for x in retried:  # its latency counts from its first (scheduled) send, through the wait
        assert x["first_token_s"] - x["scheduled_s"] >= 0.3
    posts = [json.loads(line) for line in log.read_text().splitlines() if json.loads(line)["method"] == "POST"]
    assert len(posts) == 11
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["retries"] == 5 and summary["outcomes"]["good"] == 6


def test_retries_with_locust_or_a_budget_with_locust_are_one_line_errors(tmp_path):
    scn = tmp_path / "s.yaml"
    scn.write_text("name: s\nworkload: {type: synthetic}\ntiers: {standard: {slo: {ttft_ms: 100, max_shed: 0.01}}}\n"
                   "load: {rate: 1, requests: 2}\nclient: {retries: 2}\n")
    r = slobench("run", scn, "--target", "http://127.0.0.1:9", "--driver", "locust", "--out", tmp_path / "r")
    assert r.returncode == 2 and "client.retries: the Locust driver" in r.stderr
