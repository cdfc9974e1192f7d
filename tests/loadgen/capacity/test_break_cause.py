"""The cause of the break (``capacity.cause``): each rule on two steps' figures, in its order."""

from __future__ import annotations

import pytest

from loadgen.capacity.cause import break_cause


def step(index: int, *, queue=10.0, prefill=20.0, waiting=0.0, kv=0.4, preemptions=0, late=1.0, disturbed=False,
         gaps=(10.0, 20.0), requests=200, breakdown=True) -> dict:
    return {"index": index, "requests": requests, "disturbed": disturbed, "server_waiting": waiting,
            "kv_usage_max": kv, "preemptions": preemptions,
            "breakdown": {"mean_queue_ms": queue, "mean_prefill_ms": prefill, "mean_decode_ms": 300.0}
            if breakdown else {"mean_queue_ms": None, "mean_prefill_ms": None},
            "summary": {"client_lateness": {"p99_ms": late}, "median_chunk_gap_ms": gaps[0],
                        "p99_chunk_gap_ms": gaps[1]}}


@pytest.mark.parametrize(("failing", "metric", "cause"), [
    (step(2, queue=400.0, prefill=30.0, waiting=12.0), "ttft_ms", "queue"),
    (step(2, queue=15.0, prefill=350.0), "ttft_ms", "prefill_interference"),
    (step(2, queue=400.0, preemptions=40), "ttft_ms", "kv"),
    (step(2, queue=400.0, kv=0.99), "ttft_ms", "kv"),
    (step(2, queue=400.0, preemptions=40, late=35.0), "ttft_ms", "client"),
    (step(2, disturbed=True), "ttft_ms", "client"),
    (step(2, gaps=(10.0, 45.0)), "tpot_ms", "prefill_interference"),
    (step(2, gaps=(10.0, 60.0), queue=300.0), "itl_ms", "prefill_interference"),
    (step(2, gaps=(10.0, 20.0), queue=300.0), "itl_ms", "decode"),
    (step(2, breakdown=False, waiting=9.0), "ttft_ms", "queue"),
])
def test_each_rule_names_its_cause(failing, metric, cause):
    got = break_cause(step(1), failing, metric, lateness_bound_ms=10.0)
    assert got["cause"] == cause, got["why"]
    assert got["rated_step"] == 1 and got["failing_step"] == 2 and got["metric"] == metric


def test_the_evidence_gives_both_steps_and_the_change():
    got = break_cause(step(1, queue=10.0), step(2, queue=410.0, prefill=30.0), "ttft_ms", 10.0)
    assert got["evidence"]["mean_queue_ms"] == {"rated": 10.0, "failing": 410.0, "change": 400.0}
    assert got["why"] == "mean time queued grew by 400 ms, prefill by 10 ms"


def test_a_few_preemptions_already_there_at_the_rated_step_do_not_explain_the_break():
    rated, failing = step(1, preemptions=10), step(2, queue=300.0, preemptions=10)  # 1 in 20 requests
    assert break_cause(rated, failing, "ttft_ms", 10.0)["cause"] == "queue"


def test_one_preemption_in_ten_requests_is_a_binding_kv_pool_even_when_it_did_not_grow():
    rated, failing = step(1, preemptions=20), step(2, queue=300.0, preemptions=20)  # 1 in 10 requests
    got = break_cause(rated, failing, "ttft_ms", 10.0)
    assert got["cause"] == "kv" and got["why"] == "20 preemptions in the failing step (rated step: 20)"


def test_a_per_token_slo_is_never_put_down_to_the_queue():
    got = break_cause(step(1), step(2, queue=900.0, prefill=20.0, waiting=30.0), "tpot_ms", 10.0)
    assert got["cause"] == "decode" and "every gap grew" in got["why"]


def test_nothing_to_read_is_undetermined_and_no_failing_step_is_none():
    bare = step(2, breakdown=False, waiting=None, kv=None, preemptions=None)
    assert break_cause(step(1, breakdown=False, waiting=None), bare, "ttft_ms", 10.0)["cause"] == "undetermined"
    assert break_cause(step(1), None, "ttft_ms", 10.0) is None


def test_a_break_made_of_refusals_is_a_full_queue_unless_the_budget_allowed_them():
    failing = step(2, queue=10.0, prefill=40.0)
    failing["tiers"] = {"standard": {"outcomes": {"good": 80, "late": 2, "shed": 9}, "shed_unjudged": 0}}
    got = break_cause(step(1), failing, "ttft_ms", 10.0)
    assert got["cause"] == "queue" and "refused 9 requests" in got["why"]
    failing["tiers"]["standard"]["shed_unjudged"] = 9  # all within the budget: the prefill growth is left
    assert break_cause(step(1), failing, "ttft_ms", 10.0)["cause"] == "prefill_interference"
