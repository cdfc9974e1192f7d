"""Engine behaviour on the `tiny` preset: batching, sharing, tiers, preemption, sampling options."""

from __future__ import annotations

import random

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.request.errors import InvalidRequestError, PromptTooLongError, QueueFullError

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def make_engine(**kw) -> Engine:
    kw.setdefault("kv_cache_tokens", 8192)
    return Engine(EngineConfig(model="tiny", **kw))


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(5, 70))] for _ in range(n)]


@pytest.fixture(scope="module")
def reference():
    """Outputs of each prompt run alone, without chunking or caching: what every other mode must match."""
    engine = make_engine(enable_chunked_prefill=False, enable_prefix_caching=False)
    ps = prompts(6)
    return ps, [engine.generate(p, GREEDY)[0].token_ids for p in ps]


def run_all(engine: Engine, ps, params=GREEDY):
    outs = engine.generate(ps, params)
    engine.check_integrity()
    assert engine.stats().kv_usage == 0.0
    return [o.token_ids for o in outs]


def test_batched_matches_one_at_a_time(reference):
    ps, expected = reference
    assert run_all(make_engine(), ps) == expected


def test_chunked_prefill_matches(reference):
    ps, expected = reference
    engine = make_engine(prefill_chunk_size=16, max_num_batched_tokens=24)
    assert run_all(engine, ps) == expected


def test_static_batching_and_contiguous_allocation_match(reference):
    ps, expected = reference
    assert run_all(make_engine(batching="static"), ps) == expected
    assert run_all(make_engine(kv_allocation="contiguous"), ps) == expected


def test_swap_out_and_in_keeps_outputs(reference):
    ps, expected = reference
    # 14 blocks of 16 tokens cannot hold six growing sequences: the watermark swaps some out.
    engine = make_engine(num_kv_blocks=14, kv_watermark=0.7, rebatch_interval=1)
    assert run_all(engine, ps) == expected
    assert engine.stats().num_swap_outs > 0


def test_recompute_preemption_keeps_outputs(reference):
    ps, expected = reference
    engine = make_engine(num_kv_blocks=14, num_host_blocks=0, kv_watermark=0.7, rebatch_interval=1)
    assert run_all(engine, ps) == expected
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.num_swap_outs == 0


def test_shared_system_prompt_shares_blocks_and_keeps_outputs():
    system = list(range(40, 40 + 96))  # six full blocks
    users = [system + [i, i + 1, i + 2] for i in range(4)]
    plain = make_engine(enable_prefix_caching=False)
    expected = run_all(plain, users)

    engine = make_engine()
    engine.generate(users[0], GREEDY)  # warms the cache with the system prompt
    for p in users[1:]:
        engine.add_request(p, GREEDY)
    engine.step()  # all three admitted and prefilled in one step
    shared = engine.stats()
    assert shared.blocks_saved_by_sharing >= 2 * 6
    assert shared.prefix_hit_tokens >= 3 * 96
    while engine.has_unfinished_requests():
        engine.step()
    assert run_all(engine, users) == expected

    plain.add_request(users[1], GREEDY)
    plain.add_request(users[2], GREEDY)
    plain.add_request(users[3], GREEDY)
    plain.step()
    assert shared.used_kv_blocks < plain.stats().used_kv_blocks


def test_continuous_batching_admits_when_a_request_finishes():
    engine = make_engine(max_num_seqs=2, rebatch_interval=8)
    short = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    engine.add_request([4, 5, 6], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    waiting = engine.add_request([7, 8, 9], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    finished_step = joined_step = None
    for step in range(1, 40):
        for out in engine.step():
            if out.request_id == short and out.finished:
                finished_step = step
        if joined_step is None and waiting not in [r.request_id for r in engine.scheduler.waiting["standard"]]:
            joined_step = step
    assert finished_step is not None and joined_step == finished_step + 1, (
        "a finished request's slot is refilled at the next step, not at the next re-batching interval"
    )


def test_premium_preempts_saturating_basic_within_one_interval():
    interval = 4
    engine = make_engine(max_num_seqs=4, rebatch_interval=interval)
    basic = [engine.add_request(p, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), tier="basic")
             for p in prompts(4, seed=1)]
    for _ in range(3):
        engine.step()
    assert engine.stats().running_by_tier["basic"] == 4
    premium = engine.add_request([9, 9, 9], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                                 tier="premium")
    steps_waited = 0
    while True:
        engine.step()
        steps_waited += 1
        request = engine.requests.get(premium)
        if request is None or request.first_scheduled_time is not None:
            break
    assert steps_waited <= interval
    done = set()
    while engine.has_unfinished_requests():
        done |= {o.request_id for o in engine.step() if o.finished}
    assert set(basic) | {premium} <= done, "basic requests still finish after being pushed aside"
    engine.check_integrity()


def test_premium_gets_the_token_budget_before_lower_tiers_running_prefills():
    """Basic requests mid-prefill of long prompts hold the whole token budget; an arriving premium request
    still starts at the next admission step, with its whole first chunk in that step's batch."""
    engine = make_engine(max_num_seqs=8, max_num_batched_tokens=256, prefill_chunk_size=128, rebatch_interval=1,
                         admission="queue-length")
    rng = random.Random(3)
    for _ in range(4):
        engine.add_request([rng.randrange(1, 250) for _ in range(1500)],
                           SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), tier="basic")
    engine.step()
    engine.step()
    assert engine.stats().running_by_tier["basic"] >= 2  # two 128-token chunks fill each step's budget
    premium = engine.add_request([rng.randrange(1, 250) for _ in range(200)],
                                 SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), tier="premium")
    def computed() -> dict[str, int]:
        return {rid: r.seqs[0].num_computed for rid, r in engine.requests.items() if r.seqs}

    before = computed()
    engine.step()
    after = computed()
    assert after[premium] == 128  # its whole first chunk; the basic prefills share what is left
    assert sum(after[rid] - before.get(rid, 0) for rid in after if rid != premium) == 128


def test_premium_reserved_slots_hold_back_lower_tiers():
    engine = make_engine(max_num_seqs=4, premium_reserved_slots=2)
    for p in prompts(4, seed=2):
        engine.add_request(p, GREEDY, tier="standard")
    engine.step()
    assert engine.stats().running_by_tier["standard"] == 2


def test_waiting_queue_bound_rejects_and_counts():
    engine = make_engine(max_waiting_per_tier={"premium": 1, "standard": 2, "basic": 1})
    engine.add_request([1], GREEDY)
    engine.add_request([2], GREEDY)
    with pytest.raises(QueueFullError) as e:
        engine.add_request([3], GREEDY)
    assert e.value.tier == "standard"
    assert engine.stats().admission_rejections["standard"] == 1


def test_bad_prompts_get_clear_errors():
    engine = make_engine(max_model_len=64)
    with pytest.raises(PromptTooLongError, match="maximum context length is 64"):
        engine.add_request([1] * 100, GREEDY)
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.add_request("", SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequestError, match="out of range"):
        engine.add_request([1, 100000], GREEDY)
    with pytest.raises(InvalidRequestError, match="service_tier"):
        engine.add_request([1], GREEDY, tier="gold")


def test_n_sequences_fork_from_one_prompt():
    engine = make_engine()
    single = engine.generate([5, 6, 7] * 7, GREEDY)[0].token_ids
    out = engine.generate([5, 6, 7] * 7, SamplingParams(n=3, max_tokens=12, temperature=0, ignore_eos=True))[0]
    assert [o.token_ids for o in out.outputs] == [single] * 3
    sampled = engine.generate([5, 6, 7] * 7, SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=7))[0]
    again = engine.generate([5, 6, 7] * 7, SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=7))[0]
    assert [o.token_ids for o in sampled.outputs] == [o.token_ids for o in again.outputs]
    assert len({tuple(o.token_ids) for o in sampled.outputs}) > 1, "each of the n draws has its own seed"
    engine.check_integrity()


def test_stop_conditions():
    engine = make_engine()
    base = engine.generate("abc", SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    assert len(base.token_ids) == 20 and base.outputs[0].finish_reason == "length"
    first = base.token_ids[3]
    stopped = engine.generate("abc", SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[first]))[0]
    assert stopped.token_ids == base.token_ids[:4] and stopped.outputs[0].finish_reason == "stop"
    late = engine.generate("abc", SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[first],
                                                  min_tokens=10))[0]
    assert len(late.token_ids) >= 10
    # a stop string taken from the greedy text: its first two plain characters from the sixth on (the tiny
    # model's bytes are often not UTF-8, and a replacement character is no text a client would stop at)
    text = base.text
    plain = [i for i in range(5, len(text) - 1) if "\ufffd" not in text[i : i + 2]]
    assert plain, f"the greedy text has no two plain characters in a row to stop at: {text!r}"
    needle = text[plain[0] : plain[0] + 2]
    cut = engine.generate("abc", SamplingParams(max_tokens=20, temperature=0, stop=[needle], ignore_eos=True))[0]
    assert cut.text == text[: text.find(needle)] and cut.outputs[0].finish_reason == "stop"


def test_abort_frees_blocks():
    engine = make_engine()
    rid = engine.add_request(list(range(100)), SamplingParams(max_tokens=50, temperature=0))
    engine.step()
    assert engine.stats().used_kv_blocks > 0
    engine.abort(rid)
    outs = engine.step()
    assert [o.outputs[0].finish_reason for o in outs if o.request_id == rid] == ["abort"]
    assert engine.stats().used_kv_blocks == 0
    engine.check_integrity()


def test_timing_is_consistent():
    engine = make_engine()
    out = engine.generate(list(range(50)), SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))[0]
    t = out.timing
    assert t.queue_ms >= 0 and t.prefill_ms > 0 and t.decode_ms > 0
    assert t.arrival_time <= t.first_scheduled_time <= t.first_token_time <= t.finished_time
    assert len(t.token_times) == 5


def test_streamed_text_never_shows_a_stop_string():
    engine = make_engine()
    base = engine.generate("abc", SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0].text
    clean = [i for i in range(4, 16) if "\ufffd" not in base[i : i + 3]]
    assert clean, "the tiny model's greedy text should have a plain stretch to use as a stop string"
    stop = base[clean[0] : clean[0] + 3]
    rid = engine.add_request("abc", SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[stop]))
    streamed, final = "", None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == rid:
                streamed += out.outputs[0].new_text
                final = out
    assert final.finished and final.outputs[0].finish_reason == "stop"
    assert streamed == final.text == base[: base.find(stop)]


def test_stop_prefix_overlap():
    from engine.core.output_processor import stop_prefix_overlap

    assert stop_prefix_overlap("hello wor", ["world"]) == 3
    assert stop_prefix_overlap("hello", ["world", "lo!"]) == 2
    assert stop_prefix_overlap("hello", []) == 0


def test_n_sequences_survive_recompute_preemption():
    params = SamplingParams(n=2, max_tokens=24, temperature=0, ignore_eos=True)
    ps = prompts(4, seed=5)
    expected = [[o.token_ids for o in r.outputs] for r in make_engine().generate(ps, params)]
    engine = make_engine(num_kv_blocks=12, num_host_blocks=0, prefill_chunk_size=16, rebatch_interval=1)
    got = [[o.token_ids for o in r.outputs] for r in engine.generate(ps, params)]
    assert got == expected
    assert engine.stats().num_preemptions > 0
    engine.check_integrity()


def test_swapped_basic_request_does_not_block_premium_admission():
    engine = make_engine(num_kv_blocks=12, kv_watermark=0.8, rebatch_interval=1, max_num_seqs=8)
    long = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    for p in prompts(4, seed=6):
        engine.add_request(p, long, tier="basic")
    while engine.scheduler.num_swapped() == 0 and engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.num_swapped() > 0, "the tight pool should push a basic request to host memory"
    premium = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                                 tier="premium")
    for _ in range(3):
        engine.step()
    assert premium not in engine.requests or engine.requests[premium].first_scheduled_time is not None
