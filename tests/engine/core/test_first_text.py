"""The first text a client can see (issue: the engine under memory pressure).

A byte-level model's first token can be the start of a multi-byte character: its text is held back until the
character is whole, and the client's first token comes steps after the engine's. What is held, what counts as a
request's first text, that a request preempted before showing anything may still be shed, and how admission's
tail factor learns from the accepted requests' own TTFT.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from types import SimpleNamespace

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.core.admission import AdmissionEstimator, QueueSnapshot
from engine.core.output_processor import OutputProcessor
from engine.model.tokenizer import ByteTokenizer
from engine.request.admission_constants import IDLE_FORGET_S, TAIL_FACTOR_BOUNDS
from engine.request.errors import SLOUnattainableError
from engine.request.outputs import Timing
from engine.request.sampling import SamplingParams as Params
from engine.request.sequence import Sequence
from engine.request.tiers import TIERS
from engine.server.api_responses import front_end_ms, timing_dict

EURO = [0xE2, 0x82, 0xAC]  # "€"


def test_only_a_character_that_can_still_complete_is_held_back():
    tok = ByteTokenizer()
    assert tok.incomplete_tail([0x41, 0xE2]) == 1 and tok.incomplete_tail([0x41, 0xE2, 0x82]) == 2
    assert tok.incomplete_tail([0xE2, 0xE2, 0x82]) == 2  # the first lead byte is invalid for good
    assert tok.incomplete_tail([0x82, 0xAC, 0xF0, 0x9F, 0x98]) == 3  # the window starts inside a character
    assert tok.incomplete_tail(EURO) == 0
    assert tok.incomplete_tail([0x41, 0x85]) == 0  # a stray continuation byte is invalid for good
    assert tok.incomplete_tail([0xE2, 0x41]) == 0  # a lead byte cut short by ASCII: invalid for good
    assert tok.incomplete_tail([0xC0]) == 0  # never a valid lead byte
    assert tok.incomplete_tail([0xE2, 257]) == 0  # a special token ends the byte run
    assert tok.incomplete_tail([]) == 0


def _stream(ids: list[int]) -> list[str]:
    tok = ByteTokenizer()
    proc = OutputProcessor(tok, tok.eos_token_ids, 4096)
    seq = Sequence("r", 0, [65], 1, Params(max_tokens=len(ids), ignore_eos=True), "standard", 0.0)
    return [_step(proc, seq, t) for t in ids]


def _step(proc: OutputProcessor, seq: Sequence, token: int) -> str:
    before = len(seq.text)
    proc.append_token(seq, token)
    return seq.text[before:]


def test_invalid_bytes_show_at_once_and_a_split_character_when_whole():
    ids = [0x85, 0x41, *EURO, 0xE2, 0x41, 0xE2, 0xE2, 0x82, 0xAC]
    pieces = _stream(ids)
    # the stray byte shows at once as U+FFFD; the euro sign waits for its third byte; a lead byte cut short
    # shows as U+FFFD with the byte that cut it, or at once when the byte that cuts it starts a character
    assert pieces == ["\ufffd", "A", "", "", "€", "", "\ufffdA", "", "\ufffd", "", "€"]
    assert "".join(pieces) == ByteTokenizer().decode(ids)


def test_random_byte_streams_stream_the_same_text_and_hold_at_most_a_character():
    rng = random.Random(5)
    tok = ByteTokenizer()
    for _ in range(300):
        ids = [rng.choice([rng.randrange(256), rng.randrange(0x80, 0xC0), rng.randrange(0xC2, 0xF5)])
               for _ in range(rng.randrange(1, 24))]
        pieces = _stream(ids)
        assert "".join(pieces) == tok.decode(ids)  # the last token is final: nothing stays held
        for k in range(1, len(ids)):
            # after k tokens everything is shown but the one incomplete character at the end
            assert "".join(pieces[:k]) == tok.decode(ids[: k - tok.incomplete_tail(ids[:k])]), (ids, k)


def test_first_text_time_and_held_ms_in_the_timing():
    engine = Engine(EngineConfig(model="tiny"))
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    while engine.has_unfinished_requests():
        outs = engine.step()
    out = outs[-1]  # the last step's: the request's finish
    t = out.timing
    assert out.request_id == rid and t.first_text_time is not None
    assert t.first_token_time <= t.first_text_time <= t.finished_time
    assert t.held_ms == pytest.approx((t.first_text_time - t.first_token_time) * 1e3)
    assert timing_dict(t, "standard")["held_ms"] == round(t.held_ms, 3)


def test_the_front_end_share_ends_at_the_first_text_not_the_first_token():
    t = Timing(1.0, 2.0, 3.0, "premium", arrival_time=10.010, first_scheduled_time=10.011,
               first_token_time=10.100, finished_time=11.0, first_text_time=10.300)
    assert t.held_ms == pytest.approx(200.0)
    # read at 10.000, in the engine at 10.010; the first text at 10.300 reached the handler at 10.305
    assert front_end_ms(10.000, 10.305, t) == pytest.approx(15.0)
    assert Timing(1.0, 2.0, 3.0, "premium", 10.0, None, None, 11.0).held_ms == 0.0


def test_a_request_preempted_before_its_first_text_can_still_be_shed():
    """A started request whose text is all held back when a higher tier pushes it out has shown the client
    nothing: once it can no longer keep its promise it is shed (429), like one that never started."""
    engine = Engine(EngineConfig(model="tiny", max_num_seqs=1, tier_ttft_slo_ms={"premium": 60_000, "standard": 50}))
    std = engine.add_request([1, 2, 3], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    engine.step()  # standard prefilled: its first token is out
    request = engine.requests[std]
    assert request.first_token_time is not None
    request.first_text_time = None  # as if that first token were a lead byte still waiting for the rest
    engine.add_request([4, 5, 6], SamplingParams(max_tokens=200, temperature=0, ignore_eos=True), tier="premium")
    engine.scheduler.rebatch_due = True  # premium is admitted at the next step and takes the only slot
    outs = {}
    while engine.has_unfinished_requests() and std not in outs:
        for out in engine.step():
            outs[out.request_id] = out
        engine.check_integrity()
    assert outs[std].finished and [c.finish_reason for c in outs[std].outputs] == ["shed"]
    assert engine.stats().shed_by_tier["standard"] == 1


def test_a_request_that_showed_text_keeps_its_place_when_preempted():
    engine = Engine(EngineConfig(model="tiny", max_num_seqs=1, tier_ttft_slo_ms={"premium": 60_000, "standard": 50}))
    std = engine.add_request([1, 2, 3], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    engine.step()
    engine.requests[std].first_text_time = engine.requests[std].first_token_time  # its text went out
    engine.add_request([4, 5, 6], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True), tier="premium")
    engine.scheduler.rebatch_due = True
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] = out
    assert outs[std].outputs[0].finish_reason == "length" and len(outs[std].outputs[0].token_ids) == 20


def _queued() -> QueueSnapshot:
    return QueueSnapshot({"premium": 2, "standard": 0, "basic": 0}, {"premium": 200, "standard": 0, "basic": 0},
                         {"premium": 8, "standard": 0, "basic": 0})


def test_the_tail_factor_settles_where_one_percent_miss_and_tightens_admission():
    est = AdmissionEstimator(EngineConfig(), {"premium": 8, "standard": 8, "basic": 8})
    est.on_finished(0.4)
    est.on_step(0.02, 0)
    # queue: 2 slots, none free, 8 turning over every 0.4 s -> 0.1 s; + 2 steps of 0.02 s: 0.14 s <= 0.24 s
    est.check("premium", 100, _queued())
    for _ in range(20):  # twenty accepted premium requests got their first text after 0.5 s: over the 0.24 s target
        est.on_outcome("premium", 0.5)
    k = est.tail_factor["premium"]
    assert k == pytest.approx(math.exp(0.05 * 0.99 * 20))
    with pytest.raises(SLOUnattainableError):
        est.check("premium", 100, _queued())  # the same estimate, now scaled by the learned tail
    for _ in range(99):  # one miss in a hundred is what the quantile allows: the factor stays put
        est.on_outcome("premium", 0.1)
    est.on_outcome("premium", None)  # a shed request counts as a miss
    assert est.tail_factor["premium"] == pytest.approx(k, rel=1e-6)
    for _ in range(5000):  # the engine keeps up: admission loosens again, down to its bound
        est.on_outcome("premium", 0.1)
    assert est.tail_factor["premium"] == TAIL_FACTOR_BOUNDS[0]
    est.check("premium", 100, _queued())
    est.on_outcome("basic", 9.0)  # no promise: nothing to learn
    assert "basic" not in est.tail_factor


def test_the_tail_factor_starts_over_once_the_engine_has_been_idle():
    """An overload's tail factor is forgotten after IDLE_FORGET_S with nothing running or queued, not before,
    and not while anything is running."""
    clock = [100.0]
    est = AdmissionEstimator(EngineConfig(), {"premium": 8, "standard": 8, "basic": 8}, clock=lambda: clock[0])
    est.on_finished(0.4)
    est.on_step(0.02, 0)  # the engine's last step, at t = 100
    for _ in range(20):
        est.on_outcome("standard", None)  # a burst of shed requests: admission tightens
    k = est.tail_factor["standard"]
    assert k > 2.5
    idle = QueueSnapshot(dict.fromkeys(TIERS, 0), dict.fromkeys(TIERS, 0), dict.fromkeys(TIERS, 0))
    running = QueueSnapshot(dict.fromkeys(TIERS, 0), dict.fromkeys(TIERS, 0), {"premium": 0, "standard": 3,
                                                                               "basic": 0})
    clock[0] += 0.9 * IDLE_FORGET_S
    est.check("standard", 100, idle)
    assert est.tail_factor["standard"] == k  # a pause shorter than IDLE_FORGET_S is the same busy period
    clock[0] += IDLE_FORGET_S
    est.check("standard", 100, running)
    assert est.tail_factor["standard"] == k  # something still runs: no new busy period
    est.check("standard", 100, idle)
    assert est.tail_factor == {"premium": 1.0, "standard": 1.0}


def test_the_engine_feeds_the_tail_factor_from_its_requests_first_text():
    engine = Engine(EngineConfig(model="tiny", tier_ttft_slo_ms={"premium": 300, "standard": 1}))
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.admission.estimator.tail_factor["standard"] > 1.0  # a 1 ms promise was missed
    assert engine.admission.estimator.tail_factor["premium"] == 1.0
    offline = Engine(EngineConfig(model="tiny", tier_ttft_slo_ms={"premium": 300, "standard": 1}))
    offline.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert offline.admission.estimator.tail_factor["standard"] == 1.0  # generate() is offline work: not judged


def _prefill_progress(first_text_priority: bool, held_steps: int = 3) -> list[int]:
    """A standard request mid-prefill when a premium one arrives whose first text stays held back for
    `held_steps` steps after its prefill (as a character split over byte tokens would): the standard prompt
    tokens computed after each step."""
    engine = Engine(EngineConfig(model="tiny", first_text_priority=first_text_priority))
    std = engine.add_request([1 + i % 200 for i in range(1200)], SamplingParams(max_tokens=4, temperature=0))
    engine.step()  # its first 256-token chunk
    prem = engine.add_request([7, 8, 9], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True), tier="premium")
    engine.scheduler.rebatch_due = True
    engine.step()  # premium, taken from the inbox, prefills
    std_req, prem_req = engine.requests[std], engine.requests[prem]
    assert prem_req.first_token_time is not None
    computed = [std_req.seqs[0].num_computed]
    for i in range(1, 8):
        if i <= held_steps:
            prem_req.first_text_time = None  # its text is still held back
        engine.step()
        computed.append(std_req.seqs[0].num_computed)
    return computed


def test_lower_tiers_prefill_waits_while_a_higher_tiers_first_text_is_held_back():
    # premium's prefill step shares the budget with standard's chunk; the 3 steps its text stays held back
    # after its first token run no standard prefill chunk (decodes only: short steps); then standard goes on
    assert _prefill_progress(True) == [512, 512, 512, 512, 768, 1024, 1200, 1201]
    # without the rule the standard chunks share those steps
    assert _prefill_progress(False) == [512, 768, 1024, 1200, 1201, 1202, 1203, 1203]
    assert _prefill_progress(True, held_steps=0) == _prefill_progress(False)


def test_a_younger_request_of_the_same_tier_waits_for_an_older_ones_held_text():
    engine = Engine(EngineConfig(model="tiny"))
    older = engine.add_request([7, 8, 9], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True), tier="premium")
    engine.step()  # prefilled: its first token is out
    held = engine.requests[older]
    younger = engine.add_request([1 + i % 200 for i in range(600)], SamplingParams(max_tokens=4, temperature=0),
                                 tier="premium")
    engine.scheduler.rebatch_due = True
    computed = []
    for i in range(5):
        if i < 3:
            held.first_text_time = None  # its first character still incomplete
        engine.scheduler.rebatch_due = True
        engine.step()
        computed.append(engine.requests[younger].seqs[0].num_computed)
    assert computed == [0, 0, 0, 256, 512]  # it waits for the older one's text, then prefills


def test_a_token_is_stamped_once_it_is_sampled_not_when_the_forward_pass_ends():
    """The front end's share starts at the first text: the sampling and detokenizing before it are the
    engine's, so the first token's time is taken after the step's sampler returned."""
    engine = Engine(EngineConfig(model="tiny"))
    sampled_at: list[float] = []
    sample = engine.sampler.sample

    def timed_sample(logits, seqs):
        tokens = sample(logits, seqs)
        sampled_at.append(time.monotonic())
        return tokens

    engine.sampler.sample = timed_sample
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    while engine.has_unfinished_requests():
        outs = engine.step()
    t = outs[-1].timing
    assert t.first_token_time >= sampled_at[0] and t.finished_time >= sampled_at[-1]


def test_a_first_output_wakes_its_handler_before_the_flowing_streams():
    """The router sets a step's first outputs' events before the others', so the handler whose client is still
    waiting for its first token runs first (handlers wake in the order their events are set)."""
    from engine.server.engine_loop import RequestStream, StreamRouter

    async def scenario() -> list[str]:
        router = StreamRouter(metrics=None, loop=asyncio.get_running_loop())
        for rid in ("old-1", "new", "old-2"):
            router.streams[rid] = RequestStream(rid, "standard")
        out = {rid: SimpleNamespace(request_id=rid, finished=False) for rid in router.streams}
        woke: list[str] = []

        async def handler(rid: str) -> None:
            stream = router.streams[rid]
            if rid.startswith("old"):
                await stream.next_batch()  # an earlier step's output: these streams are flowing
            await stream.next_batch()
            woke.append(rid)

        tasks = [asyncio.create_task(handler(rid)) for rid in out]
        router._deliver([out["old-1"], out["old-2"]])
        for _ in range(3):
            await asyncio.sleep(0)  # every handler is now waiting for its next output
        assert woke == []
        router._deliver([out["old-1"], out["new"], out["old-2"]])
        await asyncio.gather(*tasks)
        return woke

    assert asyncio.run(scenario()) == ["new", "old-1", "old-2"]
