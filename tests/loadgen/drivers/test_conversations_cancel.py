"""Conversations with real history and the client cancellation mix, through the drivers, against a
test-local server that answers each request with its own text and keeps the bodies it got."""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request

import pytest
from aiohttp import web

from loadgen.drivers.conversations import TEXT_TURN_SEPARATOR, shard, units
from loadgen.drivers.http_request import ClientConfig
from loadgen.drivers.locust.stages import shard as locust_shard
from loadgen.drivers.replayer import Replayer
from loadgen.drivers.sharded import ShardedReplayer
from loadgen.results import latency
from loadgen.results.conversation_stats import planned_of
from loadgen.results.summary import summarize
from loadgen.scenario.model import ScenarioError
from loadgen.scenario.parse import parse_scenario
from loadgen.target.embedded import free_port
from loadgen.target.request_shape import RequestShape
from loadgen.workload.exact_text import TextMaker
from loadgen.workload.specs import RequestSpec
from loadgen.workload.synthetic import Conversations, LengthDist, SyntheticWorkload
from loadgen.workload.text_prompts import to_text
from loadgen.workload.tokenizer import WordTokenizer
from tests.helpers import finished_by_reason

CHUNK_S = 0.02  # the server's pause between content chunks
FAIL_MAX_TOKENS = 13  # a request asking for this many tokens gets a 500


def reply_text(n: int, k: int) -> list[str]:
    return [f"r{n}w{i} " for i in range(k)]


async def start_server(bodies: list[dict], ended: list[int]) -> tuple[web.AppRunner, str]:
    """A streaming server that logs each body, marking those whose client left mid-stream; ``ended[0]`` counts the
    handlers that have returned."""

    async def models(_):
        return web.json_response({"data": [{"id": "m"}]})

    async def complete(request: web.Request):
        try:
            return await answer(request)
        finally:
            ended[0] += 1

    async def answer(request: web.Request):
        body = await request.json()
        n = len(bodies)
        bodies.append(body)
        if body["max_tokens"] == FAIL_MAX_TOKENS:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        chat = "messages" in body
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for piece in reply_text(n, body["max_tokens"]):
                delta = {"choices": [{"index": 0, "delta": {"content": piece}} if chat else
                                     {"index": 0, "text": piece}]}
                await resp.write(b"data: " + json.dumps(delta).encode() + b"\n\n")
                await asyncio.sleep(CHUNK_S)
        except ConnectionError:
            body["client_left"] = True  # the client closed the stream
            return resp
        turns = len(body.get("messages", [])) // 2
        usage = {"prompt_tokens": 100, "completion_tokens": body["max_tokens"],
                 "prompt_tokens_details": {"cached_tokens": 10 * turns}}
        end = {"choices": [{"index": 0, "finish_reason": "length", "delta": {}, "text": ""}], "usage": usage}
        await resp.write(b"data: " + json.dumps(end).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


class Sink(list):
    def write(self, rec):
        self.append(rec)


def conversation_specs(n_conv: int, turns: int = 3, think: float = 0.2, chat: bool = True, out: int = 3):
    wl = SyntheticWorkload(input_len=LengthDist("fixed", value=4), output_len=LengthDist("fixed", value=out),
                           conversations=Conversations(turns=turns, think_time_s=think))
    specs = wl.generate([0.05 * i for i in range(n_conv * turns)], seed=1)
    to_text(specs, TextMaker(WordTokenizer()), chat=chat)
    return specs


def run_driver(specs, workers: int = 1):
    bodies: list[dict] = []
    ended = [0]

    async def main():
        runner, url = await start_server(bodies, ended)
        sink = Sink()
        cfg = ClientConfig(target=url, model="m", shape=RequestShape(include_usage=False))
        drv = Replayer(cfg, sink) if workers == 1 else ShardedReplayer(cfg, sink, workers)
        try:
            await drv.open()
            await drv.run(specs, t0=asyncio.get_running_loop().time() * 0 + _now() + 0.3, stage=0)
        finally:
            await drv.close()
            # the server notices a client that left at its next write: let every handler see it before cleanup
            # (which would cancel them unmarked)
            for _ in range(300):
                if ended[0] >= len(bodies):
                    break
                await asyncio.sleep(0.01)
            await runner.cleanup()
        return sink

    return asyncio.run(main()), bodies


def _now():
    from loadgen.drivers.event_loop import now

    return now()


def by_turn(records, conv):
    return sorted((r for r in records if r.conversation == conv), key=lambda r: r.turn)


def reply_of(body_index: int, bodies) -> str:
    return "".join(reply_text(body_index, bodies[body_index]["max_tokens"]))


def test_chat_turns_carry_the_real_reply_after_the_think_time():
    specs = conversation_specs(2)
    users = {(s.conversation, s.turn): s.prompt for s in specs}
    recs, bodies = run_driver(specs)
    assert len(recs) == 6 and all(r.status == "ok" for r in recs)
    for conv in ("c0", "c1"):
        turns = by_turn(recs, conv)
        assert [r.turn for r in turns] == [0, 1, 2] and all(r.conversation == conv for r in turns)
        for k in (1, 2):
            assert turns[k].scheduled_s == turns[k - 1].done_s + 0.2  # think time after the reply ended
            assert turns[k].sent_s >= turns[k].scheduled_s  # never before its think time is over
            assert turns[k].prompt_tokens_intended is None  # the history is the server's: no intended length
        # the server's bodies: turn k sends turn k-1's messages + its reply, verbatim + the new user message
        sent = {}
        for i, b in enumerate(bodies):
            first = b["messages"][0]["content"]
            if first == users[(conv, 0)][0]["content"]:
                sent[len(b["messages"]) // 2] = i
        b0, b1, b2 = (bodies[sent[k]]["messages"] for k in (0, 1, 2))
        assert b0 == users[(conv, 0)]
        assert b1 == [*b0, {"role": "assistant", "content": reply_of(sent[0], bodies)}, *users[(conv, 1)]]
        assert b2 == [*b1, {"role": "assistant", "content": reply_of(sent[1], bodies)}, *users[(conv, 2)]]
    dicts = [json.loads(r.to_json()) for r in recs]
    for d in dicts:  # what the server reported (10 per earlier turn), where the recorder does not read it yet
        d["cached_tokens"] = 10 * d["turn"] if d["cached_tokens"] is None else d["cached_tokens"]
    summary = summarize(dicts, planned=planned_of(specs))
    # a later turn's lateness (sent after its think time) is the client's, counted as every request's is
    assert summary["client_lateness"]["max_ms"] == max(latency.lateness_ms(d) for d in dicts)
    assert summary["conversations"] == {
        "conversations": 2, "turns_planned": 6, "turns_sent": 6, "turns_completed": 6, "turns_not_sent": 0,
        "not_sent_by_reason": {},
        "prefix_cache": {"hit_rate": (10 + 20) * 2 / 400, "cached_tokens": 60, "prompt_tokens": 400, "turns": 4,
                         "per_conversation": {"conversations": 2, "median": 30 / 200, "min": 30 / 200},
                         "source": "usage.prompt_tokens_details.cached_tokens"}}


def test_text_turns_and_a_failed_turn_ends_its_conversation():
    specs = conversation_specs(2, chat=False, think=0.05)
    for s in specs:
        if s.conversation == "c1" and s.turn == 1:
            s.max_tokens = FAIL_MAX_TOKENS
    users = {(s.conversation, s.turn): s.prompt for s in specs}
    recs, bodies = run_driver(specs)
    c0 = by_turn(recs, "c0")
    first = [i for i, b in enumerate(bodies) if b["prompt"] == users[("c0", 0)]][0]
    second = [b for b in bodies if b["prompt"].startswith(users[("c0", 0)]) and b["prompt"] != users[("c0", 0)]]
    assert len(c0) == 3 and all(r.status == "ok" for r in c0)
    assert second[0]["prompt"] == users[("c0", 0)] + reply_of(first, bodies) + TEXT_TURN_SEPARATOR + users[("c0", 1)]
    c1 = by_turn(recs, "c1")
    assert [(r.turn, r.status) for r in c1] == [(0, "ok"), (1, "http_error")]  # turn 2 was never sent
    s = summarize([json.loads(r.to_json()) for r in recs], planned=planned_of(specs))["conversations"]
    assert (s["turns_planned"], s["turns_sent"], s["turns_completed"], s["turns_not_sent"]) == (6, 5, 4, 1)
    assert s["not_sent_by_reason"] == {"previous turn failed": 1}


def test_a_turn_due_after_the_window_is_not_sent():
    specs = conversation_specs(1, think=0.2)
    for s in specs:
        if s.follow_up:
            s.send_by_s = 0.4  # turn 1 is due at ~0.06 + 0.2, turn 2 later than 0.4
    recs, _ = run_driver(specs)
    assert [r.turn for r in by_turn(recs, "c0")] == [0, 1]
    s = summarize([json.loads(r.to_json()) for r in recs], planned=planned_of(specs))["conversations"]
    assert s["turns_not_sent"] == 1 and s["not_sent_by_reason"] == {"run ended": 1}


def test_sharded_conversations_stay_on_one_shard():
    specs = conversation_specs(3, think=0.05)
    parts = shard(specs, 2)
    assert [sorted({s.conversation for s in p}) for p in parts] == [["c0", "c2"], ["c1"]]
    assert [len(units(p)) for p in parts] == [2, 1]
    pairs = [(0, s) for s in specs]
    assert sorted({s.conversation for _, s in locust_shard(pairs, 1, 2)}) == ["c1"]
    recs, bodies = run_driver(specs, workers=2)
    assert len(recs) == 9 and all(r.status == "ok" for r in recs)
    assert sorted(len(b["messages"]) for b in bodies) == [1, 1, 1, 3, 3, 3, 5, 5, 5]
    for conv in ("c0", "c1", "c2"):
        turns = by_turn(recs, conv)
        assert [t.scheduled_s for t in turns[1:]] == [t.done_s + 0.05 for t in turns[:-1]]


def test_cancellation_mix_after_tokens_and_after_seconds():
    specs = [RequestSpec("a", 0.0, "hello a", 10, cancel_after_tokens=3),
             RequestSpec("b", 0.0, "hello b", 20, cancel_after_s=0.1),
             RequestSpec("c", 0.0, "hello c", 2, cancel_after_tokens=5),  # ends before its cancel: ok
             RequestSpec("d", 0.0, "hello d", 4)]
    recs, bodies = run_driver(specs)
    r = {x.id: x for x in recs}
    assert sorted(b["prompt"] for b in bodies if b.get("client_left")) == ["hello a", "hello b"]
    assert (r["a"].status, r["a"].cancel_reason, len(r["a"].token_s), r["a"].output_tokens) == \
        ("cancelled", "client: after 3 tokens", 3, 3)
    assert (r["b"].status, r["b"].cancel_reason) == ("cancelled", "client: after 0.1 s")
    # cut mid-stream (some of its 20 tokens, not all), and not before its 0.1 s were up (asyncio's timers may
    # fire up to the clock's resolution early)
    assert 1 <= len(r["b"].token_s) < 20 and r["b"].done_s - r["b"].scheduled_s >= 0.1 - 1e-6
    assert r["c"].status == r["d"].status == "ok" and r["c"].cancel_reason is None
    dicts = [json.loads(x.to_json()) for x in recs]
    assert [math.isnan(latency.slo_value(d, "ttft_ms")) for d in dicts] == \
        [d["id"] in ("a", "b") for d in dicts]  # no SLO sample from a planned cancellation
    assert len(latency.slo_values(dicts, "ttft_ms")) == 2
    s = summarize(dicts, planned=planned_of(specs))
    assert s["cancellations"] == {"planned": 3, "client": 2, "first_token_before_cancel": 2, "run_stopped": 0,
                                  "by_reason": {"client: after 0.1 s": 1, "client: after 3 tokens": 1}}
    assert s["cancelled"] == 2 and s["failed"] == 0 and s["conversations"] is None


def test_cancel_mix_is_seeded_and_validated():
    base = {"workload": {"input_len": 4, "output_len": 4}, "load": {"requests": 200, "rate": 10}}
    scn = parse_scenario({**base, "workload": {**base["workload"], "cancel": {"ratio": 0.25, "after_s": 2}}})
    a, _ = scn.build()
    b, _ = scn.build()
    assert [s.cancel_after_s for s in a] == [s.cancel_after_s for s in b]
    assert 30 <= sum(s.cancel_after_s == 2.0 for s in a) <= 70 and all(s.cancel_after_tokens is None for s in a)
    bad = {
        "ratio": (1.5, "workload.cancel.ratio: expected a fraction in [0, 1], found 1.5"),
        "neither": ({}, "workload.cancel: expected exactly one of after_tokens or after_s, found neither"),
        "both": ({"after_tokens": 2, "after_s": 1},
                 "workload.cancel: expected exactly one of after_tokens or after_s, found both"),
        "tokens": ({"after_tokens": 0}, "workload.cancel.after_tokens: expected a value >= 1, found 0"),
        "unknown": ({"after_tokens": 2, "after": 1}, "workload.cancel.after: unknown key"),
    }
    for name, (extra, msg) in bad.items():
        cancel = {"ratio": extra} if name == "ratio" else {"ratio": 0.1, **extra}
        if name == "ratio":
            cancel = {"ratio": 1.5, "after_tokens": 2}
        with pytest.raises(ScenarioError) as e:
            parse_scenario({**base, "workload": {**base["workload"], "cancel": cancel}})
        assert msg in str(e.value), name
    with pytest.raises(ScenarioError, match="workload.conversations.history: expected one of real, synthetic"):
        parse_scenario({**base, "workload": {**base["workload"], "conversations": {"history": "fake"}}})


def test_engine_reports_cached_prompt_tokens_and_frees_a_cancelled_stream(engine_server):
    srv = engine_server

    def usage(prompt: str) -> dict:
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 2}).encode()
        req = urllib.request.Request(srv.url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["usage"]

    prompt = "0123456789" * 4  # 40 byte tokens + BOS: two full 16-token blocks can be shared
    assert usage(prompt)["prompt_tokens_details"] == {"cached_tokens": 0}
    again = usage(prompt)
    assert again["prompt_tokens_details"] == {"cached_tokens": 32} and again["prompt_tokens"] == 41  # with the BOS

    async def main():
        sink = Sink()
        drv = Replayer(ClientConfig(target=srv.url, model="tiny", shape=RequestShape(include_usage=True)), sink)
        await drv.open()
        await drv.run([RequestSpec("x", 0.0, "long one", 3000, cancel_after_tokens=4)], t0=_now() + 0.1)
        await drv.close()
        return sink

    (rec,) = asyncio.run(main())
    assert (rec.status, len(rec.token_s), rec.cancel_reason) == ("cancelled", 4, "client: after 4 tokens")
    srv.wait_idle()
    stats = srv.call(srv.engine.stats)
    assert stats.kv_usage == 0 and stats.num_running == 0  # the disconnect freed its KV
    # the engine ended it as aborted, not after its 3000 tokens; the two before ran to their length
    assert finished_by_reason(srv.url) == {"abort": 1, "length": 2, "stop": 0}
