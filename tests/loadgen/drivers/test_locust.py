"""The Locust driver (loadgen/drivers/locust): plain ``locust`` runs against the reference engine and the mock
server, a distributed run, the SLO ramp, parity with the aiohttp replayer, the capacity-step call.

Locust monkey-patches the standard library with gevent when imported, so it only ever runs in
subprocesses here; this process imports the package's Locust-free modules only.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from loadgen.drivers.locust.collect import Collector, bucket_3_significant
from loadgen.drivers.locust.stages import shard, staged_load_from_scenario, staged_load_from_specs
from loadgen.results.latency import quantile
from loadgen.results.records import read_records
from loadgen.results.summary import summarize
from loadgen.scenario.parse import load_scenario
from loadgen.target.embedded import EmbeddedEngine
from tests.helpers import ENV, REPO, slobench

LOCUSTFILE = REPO / "loadgen" / "drivers" / "locust" / "locustfile.py"
KEYS = {"id", "stage", "tier", "scheduled_s", "sent_s", "first_token_s", "token_s", "done_s", "prompt_tokens",
        "output_tokens", "status", "http_status", "error", "server", "prompt_tokens_intended",
        "first_output_s", "reasoning_tokens", "chunk_tokens", "cached_tokens", "conversation", "turn", "cancel_reason",
        "retry_after_s", "retries"}


def locust(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", *map(str, args)],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def scenario(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def stats_by_name(path):
    return {(e["method"], e["name"]): e for e in json.loads(Path(path).read_text())}


# ------------------------------------------------------------------ no Locust process


def test_bucketing_keeps_three_significant_digits():
    for v in (0.01234, 0.8765, 3.14159, 41.749, 147.3, 999.4, 1473.2, 58760.0, 123456.0):
        b = bucket_3_significant(v)
        assert abs(b - v) / v <= 0.005 + 1e-12, (v, b)
    assert bucket_3_significant(41.749) == 41.7 and bucket_3_significant(147.3) == 147
    assert bucket_3_significant(1473.2) == 1470 and bucket_3_significant(0) == 0
    # Locust's own rounding (2 digits) is what we replace: 147 -> 150 is a 2% error, up to 5% near 105
    from_locust = lambda v: round(v) if v < 100 else int(round(v, -1)) if v < 1000 else int(round(v, -2))  # noqa: E731
    assert abs(from_locust(105) - 105) / 105 > 0.04


def test_staged_load_matches_slobench_run_and_shards_cover_the_schedule(tmp_path):
    p = scenario(tmp_path, "name: t\nseed: 3\nworkload: {input_len: {dist: uniform, min: 4, max: 20}, output_len: 6}\n"
                           "tiers: {premium: {weight: 1, slo: {ttft_ms: 300}}, basic: {weight: 2}}\n"
                           "load: {arrival: gamma, burstiness: 0.5, rate: 30, requests: 50}\n")
    specs, _ = load_scenario(p).build()
    staged = staged_load_from_scenario(p)
    assert [(s.id, s.arrival_s, s.prompt, s.tier) for s in staged.stages[0].specs] == \
        [(s.id, s.arrival_s, s.prompt, s.tier) for s in specs]  # the very schedule the aiohttp replayer sends
    assert staged.tier_slos == {"premium": {"ttft_ms": 300.0}} and staged.planned == 50
    sched = staged.schedule()
    parts = [shard(sched, i, 3) for i in range(3)]
    assert sorted(sp.id for part in parts for _, sp in part) == sorted(sp.id for sp in specs)
    # a ramp: one seeded schedule per step, at that step's rate, on one timeline
    ramp = staged_load_from_scenario(p, steps=[10, 40], step_s=4.0)
    s0, s1 = ramp.stages
    assert (s0.start_s, s1.start_s, s1.load) == (0.0, 4.0, 40)
    assert all(0 <= x.arrival_s < 4 for x in s0.specs) and all(4 <= x.arrival_s < 8 for x in s1.specs)
    assert 2 < len(s1.specs) / len(s0.specs) < 8 and all(x.id.startswith("s1-") for x in s1.specs)
    assert staged_load_from_scenario(p, steps=[10, 40], step_s=4.0).stages[1].specs[5].prompt == s1.specs[5].prompt


def test_collector_judges_the_ttft_slo_with_failures_as_broken_promises(tmp_path):
    specs, _ = load_scenario(scenario(tmp_path, "name: t\nworkload: {input_len: 4, output_len: 2}\n"
                                                "tiers: {premium: {weight: 1, slo: {ttft_ms: 100}}}\n"
                                                "load: {arrival: constant, rate: 100, requests: 100}\n")).build()
    staged = staged_load_from_specs(specs, tier_slos={"premium": {"ttft_ms": 100.0}})
    col = Collector(tmp_path / "out", staged, 0.99)

    def rec(i, ttft_ms, status="ok"):
        s = specs[i]
        first = s.arrival_s + ttft_ms / 1000 if status == "ok" else None
        return json.dumps({"id": s.id, "stage": 0, "tier": "premium", "scheduled_s": s.arrival_s, "sent_s": s.arrival_s,
                           "first_token_s": first, "token_s": [first] if first else [], "done_s": s.arrival_s + 0.2,
                           "prompt_tokens": 4, "output_tokens": 2, "status": status, "http_status": 200,
                           "error": None, "server": None})

    col.feed("w1", {"records": [rec(i, 50.0) for i in range(60)],
                    "counters": {"sent": 60}, "finished": False, "sent_by_stage": {0: 60}})
    assert not col.judge(0, final=False)[0].broken and not col.all_in(1)
    col.feed("w1", {"records": [rec(60, 50.0, "rejected")], "counters": {"sent": 61}, "finished": False})
    assert not col.judge(0, final=False)[0].broken  # 1 of 100 over: p99 may still hold
    col.feed("w1", {"records": [rec(61, 500.0)], "counters": {"sent": 62}, "finished": False})
    j = col.judge(0, final=False)[0]
    assert j.broken and j.certain  # 2 of 100 planned over 100 ms: no later request can bring p99 under
    assert quantile([1.0, 2.0, float("inf")], 0.5) == 2.0 and quantile([1.0, float("inf")], 0.99) == float("inf")
    assert len(read_records(col.req_path)) == 62
    col.close()


def test_collector_judges_a_mean_ttft_slo(tmp_path):
    """A tier's mean TTFT SLO (``ttft_ms@mean``): certain once what is in, over the planned requests, is past
    it; at the end, the window's mean against it."""
    specs, _ = load_scenario(scenario(tmp_path, "name: t\nworkload: {input_len: 4, output_len: 2}\n"
                                                "tiers: {premium: {weight: 1}}\n"
                                                "load: {arrival: constant, rate: 100, requests: 10}\n")).build()
    staged = staged_load_from_specs(specs, tier_slos={"premium": {"ttft_ms@mean": 100.0}})
    col = Collector(tmp_path / "out", staged, 0.99)

    def rec(i, ttft_ms):
        s = specs[i]
        first = s.arrival_s + ttft_ms / 1000
        return json.dumps({"id": s.id, "stage": 0, "tier": "premium", "scheduled_s": s.arrival_s, "sent_s": s.arrival_s,
                           "first_token_s": first, "token_s": [first], "done_s": first + 0.01, "prompt_tokens": 4,
                           "output_tokens": 1, "status": "ok", "http_status": 200, "error": None, "server": None})

    col.feed("w1", {"records": [rec(i, 150.0) for i in range(5)], "counters": {"sent": 5}, "finished": False,
                    "sent_by_stage": {0: 5}})
    j = col.judge(0, final=False)[0]
    assert j.statistic == "mean" and not j.broken  # 750 ms over 10 planned: 75 ms, the rest may still save it
    col.feed("w1", {"records": [rec(i, 150.0) for i in range(5, 7)], "counters": {"sent": 7}, "finished": False})
    j = col.judge(0, final=False)[0]
    assert j.broken and j.certain  # 1,050 ms over 10 planned: past 100 ms whatever follows
    col.feed("w1", {"records": [rec(i, 10.0) for i in range(7, 10)], "counters": {"sent": 10}, "finished": True})
    j = col.judge(0, final=True)[0]
    assert j.value_ms == pytest.approx(108.0) and j.broken and j.as_dict()["statistic"] == "mean"
    col.close()


# ------------------------------------------------------------------ Locust processes


@pytest.mark.slow
def test_locustfile_headless_against_the_reference_engine(tmp_path):
    scn = scenario(tmp_path, "name: eng\nworkload: {input_len: {dist: uniform, min: 8, max: 24}, output_len: 6}\n"
                             "tiers: {premium: {weight: 1, slo: {ttft_ms: 30000}}}\n"
                             "load: {arrival: poisson, rate: 4, requests: 12}\n")
    with EmbeddedEngine({"model": "tiny"}, log_path=tmp_path / "engine.log") as url:
        r = locust("--host", url, "--slobench-scenario", scn, "--slobench-out", tmp_path / "run",
                   "--json-file", tmp_path / "stats", timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    assert len(recs) == 12 and {x["status"] for x in recs} == {"ok"}
    for x in recs:
        assert set(x) == KEYS and x["stage"] == 0 and x["tier"] == "premium"
        assert x["output_tokens"] == 6 and len(x["token_s"]) >= 1 and x["first_token_s"] == x["token_s"][0]
        assert x["scheduled_s"] <= x["sent_s"] <= x["first_token_s"] <= x["token_s"][-1] <= x["done_s"]
        srv = x["server"]  # the engine's own timing, consistent with what the client saw
        assert (x["first_token_s"] - x["scheduled_s"]) * 1000 >= srv["queue_ms"] + srv["prefill_ms"] - 1.0
    stats = stats_by_name(tmp_path / "stats.json")
    ttft, tpot, e2e = stats["LLM", "ttft"], stats["LLM", "tpot"], stats["LLM", "e2e"]
    assert ttft["num_requests"] == tpot["num_requests"] == e2e["num_requests"] == 12
    assert e2e["total_content_length"] == sum(x["output_tokens"] for x in recs)  # output tokens as length
    exact = [(x["first_token_s"] - x["scheduled_s"]) * 1000 for x in recs]
    assert ttft["total_response_time"] == pytest.approx(sum(exact), abs=0.02)  # records keep µs
    assert ttft["max_response_time"] == pytest.approx(max(exact), abs=0.002)
    # the histogram keys have 3 significant digits: the median from Locust's buckets is within 0.5%
    keys = [float(k) for k in ttft["response_times"]]
    assert all(abs(k - bucket_3_significant(k)) <= 1e-9 * max(k, 1) for k in keys)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] == 12 and summary["driver"] == "locust"
    stages = json.loads((tmp_path / "run" / "locust_stages.json").read_text())
    assert stages["stages"][0]["passed"] is True and stages["totals"]["gathered"] == 12


def test_distributed_processes_gather_every_record_at_the_master(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 20, "--itl-ms", 2, "--tokens", 5)
    scn = scenario(tmp_path, "name: dist\nworkload: {input_len: 8, output_len: 5}\n"
                             "load: {arrival: poisson, rate: 60, requests: 150}\n")
    r = locust("--host", url, "--processes", 2, "--slobench-scenario", scn, "--slobench-out", tmp_path / "run",
               "--json-file", tmp_path / "stats")
    assert r.returncode == 0, r.stderr[-3000:]
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    stages = json.loads((tmp_path / "run" / "locust_stages.json").read_text())
    tot = stages["totals"]
    assert tot["workers"] == 2 and tot["sent"] == tot["gathered"] == len(recs) == 150
    assert tot["ok"] == 150 and tot["output_tokens"] == 750  # custom counters summed over the workers
    assert len({x["id"] for x in recs}) == 150 and {x["status"] for x in recs} == {"ok"}
    planned = {s.id: s.arrival_s for s in load_scenario(scn).build()[0]}
    assert {x["id"]: x["scheduled_s"] for x in recs} == pytest.approx(planned, abs=1e-6)  # one timeline
    assert stats_by_name(tmp_path / "stats.json")["LLM", "e2e"]["num_requests"] == 150


def test_slo_ramp_stops_with_a_nonzero_exit_when_ttft_breaks(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 40, "--itl-ms", 2, "--tokens", 4)
    scn = scenario(tmp_path, "name: ramp\nworkload: {input_len: 8, output_len: 4}\n"
                             "tiers: {premium: {weight: 1, slo: {ttft_ms: 25}}, basic: {weight: 1}}\n"
                             "load: {arrival: poisson, rate: 5, requests: 10}\n")
    r = locust("--host", url, "--slobench-scenario", scn, "--slobench-steps", "20,40,80", "--slobench-step-s", 4,
               "--slobench-out", tmp_path / "run")
    assert r.returncode == 3, r.stderr[-3000:]
    v = json.loads((tmp_path / "run" / "locust_stages.json").read_text())
    # it stopped at the first step: the two after it were never judged, and nothing was sent in them
    assert [(s["stage"], s["passed"]) for s in v["stages"]] == [(0, False), (1, None), (2, None)]
    assert v["slo_broken"]["stage"] == 0 and v["slo_broken"]["tier"] == "premium"
    assert v["slo_broken"]["value_ms"] > 25 and v["highest_passing_load"] is None
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    assert recs and {x["stage"] for x in recs} == {0} and v["totals"]["gathered"] == len(recs)
    # a target that meets the SLO goes through every step and exits 0
    scn2 = scenario(tmp_path, scn.read_text().replace("ttft_ms: 25", "ttft_ms: 500"), "ok.yaml")
    r = locust("--host", url, "--slobench-scenario", scn2, "--slobench-steps", "10,20", "--slobench-step-s", 2,
               "--slobench-out", tmp_path / "run2")
    assert r.returncode == 0, r.stderr[-3000:]
    v = json.loads((tmp_path / "run2" / "locust_stages.json").read_text())
    assert [s["passed"] for s in v["stages"]] == [True, True] and v["highest_passing_load"] == 20


def test_locust_and_aiohttp_drivers_send_one_schedule_and_record_it_alike(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 50, "--itl-ms", 4, "--tokens", 8)
    scn = scenario(tmp_path, "name: parity\nseed: 7\nworkload: {input_len: 16, output_len: 8}\n"
                             "load: {arrival: poisson, rate: 15, requests: 120}\n")
    out, scheduled = {}, {}
    for driver in ("aiohttp", "locust"):
        r = slobench("run", scn, "--target", url, "--driver", driver, "--reports", tmp_path, "--run-id", driver,
                     "--no-scrape", "--lateness-bound-ms", 50, "--json")
        assert r.returncode == 0, r.stderr[-3000:]
        out[driver] = json.loads((tmp_path / driver / "summary.json").read_text())
        recs = read_records(tmp_path / driver / "requests.jsonl")
        assert len(recs) == 120 and all(x["status"] == "ok" and len(x["token_s"]) == 8 for x in recs)
        # each TTFT no shorter than the mock's own queue + prefill, as the record carries them from its stream
        # (less 1 ms: the mock's uvloop timers have 1 ms resolution and may fire a little early)
        assert all(x["server"]["prefill_ms"] == 50 and (x["first_token_s"] - x["sent_s"]) * 1000
                   >= x["server"]["queue_ms"] + x["server"]["prefill_ms"] - 1.0 for x in recs)
        scheduled[driver] = {x["id"]: x["scheduled_s"] for x in recs}
    # the very same schedule, request by request (how closely each driver keeps it and times the tokens is
    # bench/locust_bench.py's measurement), and the summaries built the same way from the same record format
    assert scheduled["locust"] == pytest.approx(scheduled["aiohttp"], abs=1e-6)
    assert set(out["aiohttp"]) - {"driver"} <= set(out["locust"]) | {"driver"}


def test_capacity_step_call_puts_records_on_the_callers_clock(mock_server, tmp_path):
    """The Locust driver through the driver protocol, as a capacity step uses it: records on the caller's
    clock, with the step's stage, handed to the caller's sink as they arrive."""
    from loadgen.capacity.step import StepRecordWriter
    from loadgen.drivers.event_loop import run_sync
    from loadgen.drivers.http_request import ClientConfig
    from loadgen.drivers.locust.driver import LocustDriver

    url = mock_server("--ttft-ms", 10, "--itl-ms", 1, "--tokens", 3)
    specs, _ = load_scenario(scenario(tmp_path, "name: st\nworkload: {input_len: 4, output_len: 3}\n"
                                                "load: {arrival: constant, rate: 20, requests: 20}\n")).build()
    t0 = time.monotonic()
    start = 3.0  # Locust needs a moment to start; the step begins at t0 + 3 s on our clock
    for s in specs:
        s.arrival_s += start
    sink = StepRecordWriter(tmp_path / "all.jsonl")
    driver = LocustDriver(ClientConfig(url), sink, tmp_path / "step")

    async def step():
        await driver.open()
        await driver.run(specs, t0=t0, stage=4)
        await driver.close()

    run_sync(step)
    ended = time.monotonic()
    sink.close()
    recs = sink.step_records
    assert driver.in_flight() is None and driver.abort_reason is None
    assert len(recs) == 20 and {r.stage for r in recs} == {4} and all(r.status == "ok" for r in recs)
    sched = np.array([r.scheduled_s for r in recs])
    assert np.allclose(np.sort(sched), [s.arrival_s for s in specs])
    # on the caller's clock: each sent no earlier than scheduled, and done before the call returned
    assert all(r.scheduled_s <= r.sent_s <= r.done_s <= ended - t0 for r in recs)
    assert len(read_records(tmp_path / "all.jsonl")) == 20
    assert summarize([json.loads(r.to_json()) for r in recs])["completed"] == 20
    assert driver.progress.done == 20 and driver.progress.errors == 0


def test_locust_carries_conversations_and_the_cancellation_mix(mock_server, tmp_path):
    """Through `slobench run --driver locust`: each later turn waits for the previous reply plus the think
    time, records name their conversation and turn, and the planned cancellations end after their k tokens."""
    url = mock_server("--ttft-ms", 20, "--itl-ms", 5, "--tokens", 6)
    scn = scenario(tmp_path, "name: conv\nseed: 4\nworkload:\n  input_len: 8\n  output_len: 6\n"
                             "  conversations: {turns: 3, think_time_s: 0.3}\n"
                             "  cancel: {ratio: 0.25, after_tokens: 2}\n"
                             "load: {arrival: poisson, rate: 10, requests: 24}\n")
    r = slobench("run", scn, "--target", url, "--driver", "locust", "--out", tmp_path / "run", "--no-scrape",
                 "--no-report", "--lateness-bound-ms", 50)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = read_records(tmp_path / "run" / "requests.jsonl")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert recs and all(x["conversation"] is not None and x["turn"] is not None for x in recs)
    convs: dict[str, list[dict]] = {}
    for x in recs:
        convs.setdefault(x["conversation"], []).append(x)
    followed = 0
    for turns in convs.values():
        turns.sort(key=lambda x: x["turn"])
        assert [x["turn"] for x in turns] == list(range(len(turns)))  # none skipped, none twice
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert prev["status"] == "ok"  # a conversation goes on only after a completed turn
            assert nxt["scheduled_s"] == pytest.approx(prev["done_s"] + 0.3, abs=0.002)
            followed += 1
    assert followed > 0
    cancelled = [x for x in recs if x["status"] == "cancelled"]
    assert cancelled and all(x["cancel_reason"] == "client: after 2 tokens" and len(x["token_s"]) == 2
                             for x in cancelled)
    assert summary["cancellations"]["client"] == len(cancelled)
    assert summary["conversations"]["turns_sent"] == len(recs)
