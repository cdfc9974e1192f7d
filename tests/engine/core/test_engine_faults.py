"""One request never hurts another: a fault in one sequence's part of a step fails its request alone (its KV freed
at once, every other sequence's output unchanged); a request wider than the batch runs as children that queue
for slots; every tier's queue wait is bounded (engine/core/step_faults.py, engine/core/fanout.py, Engine._shed_late)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.request.errors import CapacityExceededError
from engine.server.api_errors import engine_failed_error, shed_error
from engine.server.testing import BackgroundServer
from tests.helpers import post_json

pytestmark = pytest.mark.timeout(120)

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True)
PROMPTS = {"a": [1, 2, 3, 4], "victim": [9, 8, 7, 6, 5], "c": [40, 41, 42]}


def make_engine(**kw) -> Engine:
    kw.setdefault("admission", "queue-length")
    return Engine(EngineConfig(model="tiny", **kw))


def alone(prompt: list[int], params: SamplingParams) -> list[list[int]]:
    out = make_engine().generate([prompt], params)[0]
    return [c.token_ids for c in sorted(out.outputs, key=lambda c: c.index)]


@pytest.fixture(scope="module")
def references() -> dict[str, list[list[int]]]:
    return {"a": alone(PROMPTS["a"], GREEDY), "c": alone(PROMPTS["c"], SEEDED)}


def run_with_victim(engine: Engine, victim_params: SamplingParams):
    """A, the victim and C in one batch, stepped to the end with integrity checked after each step. Returns the
    finished outputs and, for the step the victim failed in, the seq ids still holding KV."""
    ids = {"a": engine.add_request(PROMPTS["a"], GREEDY),
           "victim": engine.add_request(PROMPTS["victim"], victim_params),
           "c": engine.add_request(PROMPTS["c"], SEEDED)}
    victim_seqs: list[int] = []
    done, held_after_failure = {}, None
    while engine.has_unfinished_requests():
        if ids["victim"] in engine.requests:
            victim_seqs = [s.seq_id for s in engine.requests[ids["victim"]].seqs]
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
                if out.request_id == ids["victim"]:
                    held_after_failure = set(victim_seqs) & set(engine.block_manager.tables)
        engine.check_integrity()
    assert engine.block_manager.stats().used_blocks == 0
    return {name: done[rid] for name, rid in ids.items()}, held_after_failure


def tokens(out) -> list[list[int]]:
    return [c.token_ids for c in sorted(out.outputs, key=lambda c: c.index)]


def assert_only_the_victim_failed(outs, held, references, stage: str) -> None:
    victim = outs["victim"]
    assert victim.finished and all(c.finish_reason == "error" for c in victim.outputs)
    assert victim.error.startswith(f"the engine failed while {stage}") and "not affected" in victim.error
    assert held == set(), "the failed request's KV was not freed in the step it failed"
    assert tokens(outs["a"]) == references["a"] and tokens(outs["c"]) == references["c"]
    assert outs["a"].error is None and outs["c"].error is None
    err = engine_failed_error(victim)
    assert err.status == 500 and err.code == "engine_error" and err.type == "server_error"


def test_a_fault_while_sampling_one_sequence_fails_its_request_alone(references):
    engine = make_engine()

    def hook(seq) -> None:  # the test-only hook: the victim's third token cannot be sampled
        if seq.request_id == victim_id[0] and seq.num_output_tokens == 2:
            raise RuntimeError("injected sampling fault")

    victim_id = ["req-?"]
    engine.sampler.fault_hook = hook
    original_add = engine.add_request

    def add(prompt, params, *a, **kw):
        rid = original_add(prompt, params, *a, **kw)
        if prompt == PROMPTS["victim"]:
            victim_id[0] = rid
        return rid

    engine.add_request = add
    outs, held = run_with_victim(engine, SamplingParams(n=2, max_tokens=10, temperature=0.0, ignore_eos=True))
    assert_only_the_victim_failed(outs, held, references, "sampling")
    assert [len(c.token_ids) for c in outs["victim"].outputs] == [2, 2]  # what it had before the fault
    assert engine.num_failed == 1


def test_a_fault_in_the_forward_pass_of_one_sequence_fails_its_request_alone(references):
    engine = make_engine()
    run = engine.runner.run

    def faulty_run(batch, tables, rows):
        if any(item.seq.token_ids[:5] == PROMPTS["victim"] and item.seq.num_output_tokens == 3 for item in batch):
            raise IndexError("injected forward fault")
        return run(batch, tables, rows)

    engine.runner.run = faulty_run
    outs, held = run_with_victim(engine, GREEDY)
    assert_only_the_victim_failed(outs, held, references, "computing")


def test_a_fault_while_detokenizing_one_sequence_fails_its_request_alone(references):
    engine = make_engine()
    append = engine.output_processor.append_token

    def faulty_append(seq, token):
        if seq.token_ids[:5] == PROMPTS["victim"] and seq.num_output_tokens == 4:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return append(seq, token)

    engine.output_processor.append_token = faulty_append
    outs, held = run_with_victim(engine, GREEDY)
    assert_only_the_victim_failed(outs, held, references, "detokenizing or checking stops for")


def test_a_sampled_token_outside_the_vocabulary_fails_only_its_request(references):
    engine = make_engine()
    sample = engine.sampler.sample

    def bad_sample(logits, seqs):
        out = sample(logits, seqs)
        return [10**6 if s.token_ids[:5] == PROMPTS["victim"] else t for s, t in zip(seqs, out, strict=True)]

    engine.sampler.sample = bad_sample
    outs, held = run_with_victim(engine, GREEDY)
    assert_only_the_victim_failed(outs, held, references, "sampling")


def greedy(n: int, max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(n=n, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def test_n_above_the_batch_slots_runs_as_children_with_the_same_greedy_tokens():
    prompt = [5, 17, 29, 31, 2, 8]
    wide = make_engine(max_num_seqs=8).generate([prompt], greedy(4))[0]
    engine = make_engine(max_num_seqs=2)
    rid = engine.add_request(prompt, greedy(4))
    assert len(engine.fanout.children_ids(rid)) == 4
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == rid, "a child's output leaked out instead of its parent's"
            assert len(out.outputs) == 4 and sorted(c.index for c in out.outputs) == [0, 1, 2, 3]
            done[out.request_id] = out
        engine.check_integrity()
        assert engine.scheduler.running_slots() <= 2
    assert done[rid].finished and tokens(done[rid]) == tokens(wide)
    assert done[rid].timing is not None and engine.block_manager.stats().used_blocks == 0
    assert not engine.fanout.groups and not engine.fanout.parent_of


def test_seeded_children_draw_each_completions_own_stream():
    params = SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=5, ignore_eos=True)
    prompt = [3, 1, 4, 1, 5]
    split = make_engine(max_num_seqs=1).generate([prompt], params)[0]
    # child i draws from seed + i, as completion i does: completion 2 is seed 7's first completion
    seed7 = make_engine().generate([prompt], SamplingParams(max_tokens=6, temperature=1.0, seed=7, ignore_eos=True))
    assert tokens(split)[2] == seed7[0].token_ids


def test_a_split_request_aborted_or_failing_frees_every_child():
    engine = make_engine(max_num_seqs=2)
    rid = engine.add_request([1, 2, 3], greedy(3, 30))
    engine.step()
    engine.abort(rid)
    outs = [o for _ in range(4) for o in engine.step()]
    assert any(o.request_id == rid and o.finished for o in outs)
    assert not engine.has_unfinished_requests() and engine.block_manager.stats().used_blocks == 0

    engine.sampler.fault_hook = lambda seq: (_ for _ in ()).throw(RuntimeError("x")) if seq.index == 1 else None
    rid = engine.add_request([1, 2, 3], greedy(3, 30))
    other = engine.add_request([7, 7, 7], greedy(1, 30))
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
        engine.check_integrity()
    assert done[rid].error and done[other].error is None and len(done[other].token_ids) == 30
    assert engine.block_manager.stats().used_blocks == 0


def test_a_request_no_child_of_which_fits_is_still_refused_with_the_reason():
    engine = make_engine(num_kv_blocks=4, block_size=16, max_num_seqs=2)
    with pytest.raises(CapacityExceededError, match="KV cache has only 4"):
        engine.add_request(list(range(60)), greedy(4, 20))


def test_a_tier_waits_no_longer_than_its_bound_then_gets_retry_after():
    engine = make_engine(max_num_seqs=1, tier_max_queue_s={"basic": 0.05, "premium": None})
    engine.add_request([1, 2, 3], greedy(1, 200), tier="premium")  # holds the only slot
    waiting = engine.add_request([4, 5, 6], greedy(1, 4), tier="basic")
    unbounded = engine.add_request([4, 5, 6], greedy(1, 4), tier="premium")  # queued behind the first
    engine.step()
    time.sleep(0.06)
    outs = {o.request_id: o for o in engine.step()}
    shed = outs[waiting]
    assert shed.finished and [c.finish_reason for c in shed.outputs] == ["shed"] and shed.retry_after_s >= 1
    err = shed_error(shed, "basic", engine.config)
    assert err.status == 429 and err.code == "queue_timeout" and err.headers["Retry-After"] == str(shed.retry_after_s)
    assert unbounded in engine.requests, "a tier whose bound is None waits on"
    assert engine.admission.num_shed["basic"] == 1 and engine.admission.rejections["basic"] == 1
    engine.check_integrity()


def sse_events(url: str, body: dict) -> list[dict]:
    req = urllib.request.Request(url + "/v1/completions", json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 (loopback)
        lines = [raw.decode().strip() for raw in resp]
    assert lines[-1] == "data: [DONE]" or lines[-2:] == ["data: [DONE]", ""]
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_over_http_the_failed_request_gets_its_own_error_event_and_its_neighbour_streams_on():
    engine = make_engine()
    victim = [9, 8, 7, 6, 5]
    engine.sampler.fault_hook = lambda seq: (_ for _ in ()).throw(RuntimeError("injected")) if (
        seq.token_ids[:5] == victim and seq.num_output_tokens == 2) else None
    neighbour = {"prompt": [1, 2, 3, 4], "max_tokens": 30, "temperature": 0, "ignore_eos": True}
    with BackgroundServer(engine) as srv:
        alone = "".join(e["choices"][0]["text"] for e in sse_events(srv.url, neighbour))
        results: dict[str, list[dict]] = {}
        thread = threading.Thread(target=lambda: results.update(n=sse_events(srv.url, neighbour)))
        thread.start()
        events = sse_events(srv.url, {"prompt": victim, "max_tokens": 20, "temperature": 0, "ignore_eos": True})
        thread.join(60)
        status, raw = post_json(srv.url + "/v1/completions", {"prompt": victim, "max_tokens": 20, "temperature": 0})
        srv.call(engine.check_integrity)
        assert srv.call(lambda: engine.block_manager.stats().used_blocks) == 0
    error = events[-1]["error"]
    assert error["code"] == "engine_error" and error["type"] == "server_error" and "sampling" in error["message"]
    assert status == 500 and json.loads(raw)["error"]["code"] == "engine_error"  # whole: a 500 of its own
    assert "".join(e["choices"][0]["text"] for e in results["n"]) == alone
    assert all("error" not in e for e in results["n"])
