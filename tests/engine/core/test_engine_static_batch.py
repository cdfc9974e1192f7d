"""The static-batching baseline: a batch starts full, runs until every member finishes, then refills."""

from __future__ import annotations

import random

from engine import Engine, EngineConfig, SamplingParams


def test_static_batch_starts_full_and_refills_only_when_drained():
    engine = Engine(EngineConfig(model="tiny", batching="static", max_num_seqs=32, kv_cache_tokens=16384))
    rng = random.Random(0)
    ids = []
    for i in range(64):
        prompt = [rng.randrange(256) for _ in range(rng.randint(20, 60))]
        ids.append(engine.add_request(prompt, SamplingParams(max_tokens=4 + i % 7, temperature=0, ignore_eos=True)))
    first_batch = set(ids[:32])
    running = lambda: {r.request_id for r in engine.scheduler.running}  # noqa: E731
    engine.step()
    assert running() == first_batch, "the first batch holds 32 requests, not what one step's budget prefills"
    prefill_steps, late = 1, None
    while any(r.seqs[0].num_output_tokens == 0 for r in engine.scheduler.running):
        engine.step()
        prefill_steps += 1
    assert prefill_steps > 1, "32 prompts of 20-60 tokens prefill over several steps of a 512-token budget"
    late = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), tier="premium")
    finished, refilled_at = set(), None
    step = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        step += 1
        finished |= {o.request_id for o in outs if o.finished}
        members = running()
        if refilled_at is None and members - first_batch:
            refilled_at = step
            assert first_batch <= finished, "no new member joins before the whole batch has finished"
            assert len(members) == 32 and late in members, "the next batch starts full, premium first"
        assert len(members) <= 32
        engine.check_integrity()
    assert refilled_at is not None and finished == set(ids) | {late}


def test_static_batch_starts_with_what_is_queued_when_the_queue_is_short():
    engine = Engine(EngineConfig(model="tiny", batching="static", max_num_seqs=32, kv_cache_tokens=8192))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    first = [engine.add_request([i, i + 1, i + 2], params) for i in range(5)]
    engine.step()
    assert {r.request_id for r in engine.scheduler.running} == set(first)
    engine.step()  # every member has its first token: the batch has started decoding
    later = engine.add_request([9, 9, 9], params)
    engine.step()
    assert later not in {r.request_id for r in engine.scheduler.running}
    finished_before_later_ran = set()
    while engine.requests[later].first_scheduled_time is None:
        finished_before_later_ran |= {o.request_id for o in engine.step() if o.finished}
    assert finished_before_later_ran == set(first), "it joins the next batch, once this one has drained"
