"""SLO-aware admission's estimator (engine/core/admission.py) on synthetic histories: the arithmetic, exactly."""

from __future__ import annotations

import math

import pytest

from engine import EngineConfig
from engine.core.admission import AdmissionEstimator, QueueSnapshot
from engine.request.errors import SLOUnattainableError

LIMITS = {"premium": 8, "standard": 8, "basic": 8}


def estimator(**kw) -> AdmissionEstimator:
    est = AdmissionEstimator(EngineConfig(**kw), LIMITS)
    est.on_finished(1.0)  # the first sample sets the mean
    est.on_finished(2.0)  # then EWMA: 0.05 * 2.0 + 0.95 * 1.0
    est.on_step(0.05, 1000)  # half a 0.1 s window: no rate sample yet
    est.on_step(0.05, 0)  # a decode-only step counts for the step time, not for the prefill rate
    est.on_step(0.05, 1000)  # window: 2000 tokens / 0.1 s
    est.on_step(0.05, 250)
    est.on_step(0.05, 250)  # window: 500 tokens / 0.1 s = 5000 tokens/s -> 0.2 * 5000 + 0.8 * 20000
    return est


def snapshot(**kw) -> QueueSnapshot:
    return QueueSnapshot(queued_slots={"premium": 2, "standard": 10, "basic": 30},
                         queued_tokens={"premium": 200, "standard": 1000, "basic": 3000},
                         running_slots={"premium": 2, "standard": 4, "basic": 2}, **kw)


def test_rates_are_ewmas_of_residence_and_windowed_prefill_throughput():
    est = estimator()
    assert est.mean_residence_s == pytest.approx(1.05)
    assert est.prefill_tokens_per_s == pytest.approx(17000.0)
    assert est.step_s == pytest.approx(0.05)


def test_queue_wait_per_tier():
    est, snap = estimator(), snapshot()
    # premium: 2 slots queued, 6 free to it (the 6 lower-tier slots would be preempted): only the tokens count
    assert est.queue_wait_s("premium", snap) == pytest.approx(200 / 17000)
    # standard: 12 slots queued at its rank or above, 2 free, the batch full (8): 10 * 1.05 / 8
    assert est.queue_wait_s("standard", snap) == pytest.approx(10 * 1.05 / 8)
    # basic: 42 queued, none free
    assert est.queue_wait_s("basic", snap) == pytest.approx(42 * 1.05 / 8)
    # the last admission stopped for KV at standard: free slots do not help standard (or basic), premium unchanged
    blocked = snapshot(kv_blocked_tier="standard")
    assert est.queue_wait_s("standard", blocked) == pytest.approx(12 * 1.05 / 8)
    assert est.queue_wait_s("premium", blocked) == pytest.approx(200 / 17000)


def test_an_idle_batch_absorbs_a_burst_before_anyone_waits():
    est = estimator()
    idle = QueueSnapshot({"premium": 0, "standard": 12, "basic": 0}, {"premium": 0, "standard": 0, "basic": 0},
                         {"premium": 0, "standard": 0, "basic": 0})
    # 8 of the 12 start at once; the other 4 wait for slots freed at 8 / 1.05 per second
    assert est.queue_wait_s("standard", idle) == pytest.approx(4 * 1.05 / 8)


def test_check_refuses_what_would_miss_the_promise_with_a_retry_after():
    est, snap = estimator(), snapshot()
    # TTFT = wait + step time * (the step under way + its prefill chunks of 256 tokens); admitted while
    # within 0.8 of the promise
    assert est.ttft_s("premium", 170, snap)[1] == pytest.approx(200 / 17000 + 0.05 * 2)
    est.check("premium", 170, snap)  # 0.112 s <= 0.8 * 300 ms
    est.check("premium", 600, snap)  # 3 chunks: 0.212 s <= 0.24 s
    with pytest.raises(SLOUnattainableError):
        est.check("premium", 1000, snap)  # 4 chunks: 0.262 s > 0.24 s
    with pytest.raises(SLOUnattainableError) as e:
        est.check("standard", 170, snap)  # 1.3125 + 0.1 s > 0.8 * 800 ms
    assert e.value.tier == "standard" and e.value.slo_s == 0.8
    assert e.value.estimate_s == pytest.approx(10 * 1.05 / 8 + 0.1)
    assert e.value.retry_after_s == 1  # ceil(1.4125 - 0.64)
    assert "800 ms" in str(e.value) and "standard" in str(e.value)
    est.check("basic", 170, snap)  # no promise: only the queue bound applies
    big = QueueSnapshot({"premium": 0, "standard": 900, "basic": 0}, snap.queued_tokens, snap.running_slots)
    with pytest.raises(SLOUnattainableError) as e:
        est.check("standard", 10, big)
    assert e.value.retry_after_s == 60  # capped


def test_no_estimate_without_samples_or_without_a_queue():
    cold = AdmissionEstimator(EngineConfig(), LIMITS)
    assert cold.queue_wait_s("basic", snapshot()) == 0.0
    cold.check("standard", 10**6, snapshot())  # nothing measured yet: admit
    est = estimator()
    empty = QueueSnapshot(dict.fromkeys(LIMITS, 0), dict.fromkeys(LIMITS, 0), {"premium": 8, "standard": 0, "basic": 0})
    est.check("premium", 10**6, empty)  # a long prompt alone is no queueing problem


def test_queue_length_mode_and_configured_promises():
    snap = snapshot()
    estimator(admission="queue-length").check("standard", 170, snap)
    lenient = estimator(tier_ttft_slo_ms={"premium": 300, "standard": 2000})
    lenient.check("standard", 170, snap)
    with pytest.raises(SLOUnattainableError):
        estimator(tier_ttft_slo_ms={"premium": 5}).check("premium", 170, snap)
    estimator(tier_ttft_slo_ms={"premium": 300}).check("standard", 170, snap)  # standard without a promise
    with pytest.raises(ValueError, match="admission"):
        EngineConfig(admission="fifo")
    with pytest.raises(ValueError, match="tier_ttft_slo_ms"):
        EngineConfig(tier_ttft_slo_ms={"gold": 100})


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_tiers_above_keep_arriving_and_take_their_share_first():
    clock = FakeClock()
    est = AdmissionEstimator(EngineConfig(), LIMITS, clock=clock)
    est.on_finished(1.0)
    est.on_step(0.1, 1700)  # 17,000 prefill tokens/s
    snap = snapshot()
    alone = est.queue_wait_s("standard", snap)  # no premium arrivals seen yet: 10 * 1.0 / 8
    assert alone == pytest.approx(10 * 1.0 / 8)
    for _ in range(6):  # premium admitted every 0.5 s: 2 per second, 100 prompt tokens each
        est.on_admitted("premium", 100)
        clock.t += 0.5
    clock.t -= 0.5  # now: right after the last premium arrival
    assert est.arrival_rate("premium") == pytest.approx(2.0)
    # slots turn over at 8 / 1.0 per second, premium takes 2 of them: 10 / (8 - 2)
    assert est.queue_wait_s("standard", snap) == pytest.approx(10 / 6)
    assert est.queue_wait_s("premium", snap) == pytest.approx(200 / 17000)  # nothing above premium
    clock.t += 30.0  # premium went quiet: its rate decays with the silence, 1 / 30 s
    assert est.arrival_rate("premium") == pytest.approx(1 / 30)


def test_a_saturating_tier_above_makes_the_wait_infinite_and_the_request_is_refused():
    clock = FakeClock()
    est = AdmissionEstimator(EngineConfig(), LIMITS, clock=clock)
    est.on_finished(1.0)
    est.on_step(0.1, 1700)
    for _ in range(20):  # premium admitted 10 per second: more than the 8 slots per second that turn over
        est.on_admitted("premium", 100)
        clock.t += 0.1
    clock.t -= 0.1
    assert est.queue_wait_s("standard", snapshot()) == math.inf
    with pytest.raises(SLOUnattainableError) as e:
        est.check("standard", 64, snapshot())
    assert e.value.retry_after_s == 60


def test_shed_deadline_is_the_engines_share_of_the_promise_less_the_requests_own_steps():
    est = estimator()  # step time 0.05 s, 256-token chunks, the engine's share 0.8 of the promise
    assert est.shed_deadline_s("premium", 170) == pytest.approx(0.8 * 0.3 - 0.05 * 2)
    assert est.shed_deadline_s("standard", 600) == pytest.approx(0.8 * 0.8 - 0.05 * 4)
    assert estimator(admission_target_frac=1.0).shed_deadline_s("standard", 600) == pytest.approx(0.8 - 0.05 * 4)
    assert est.shed_deadline_s("basic", 170) is None  # no promise, never shed
    assert estimator(admission="queue-length").shed_deadline_s("standard", 170) is None


def test_a_queued_request_that_can_no_longer_keep_its_promise_is_shed_and_one_that_started_is_not():
    from engine import Engine, SamplingParams

    engine = Engine(EngineConfig(model="tiny", max_num_seqs=1, tier_ttft_slo_ms={"premium": 300, "standard": 40}))
    long = engine.add_request([1, 2, 3], SamplingParams(max_tokens=400, temperature=0, ignore_eos=True))
    engine.step()  # it runs and holds the only slot; the estimator has no finished request yet: admit
    late = engine.add_request([4, 5, 6], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] = out
        engine.check_integrity()
    assert [c.finish_reason for c in outs[late].outputs] == ["shed"] and outs[late].outputs[0].token_ids == []
    assert outs[late].timing.first_scheduled_time is None
    assert outs[long].outputs[0].finish_reason == "length" and len(outs[long].outputs[0].token_ids) == 400
    stats = engine.stats()
    assert stats.shed_by_tier["standard"] == 1 and stats.admission_rejections["standard"] == 1
    assert stats.kv_usage == 0


def test_offline_generate_is_neither_refused_nor_shed():
    """generate() is offline work: a queue far past the standard promise still runs to the end."""
    from engine import Engine, SamplingParams

    engine = Engine(EngineConfig(model="tiny", max_num_seqs=1, tier_ttft_slo_ms={"premium": 300, "standard": 1}))
    outs = engine.generate([[i + 1, 2, 3] for i in range(6)], SamplingParams(max_tokens=30, temperature=0,
                                                                             ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [30] * 6
    assert engine.stats().shed_by_tier["standard"] == 0
