"""The engine server against real clients on a loopback port, with the `tiny` preset."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import Engine, EngineConfig, SamplingParams
from engine.server.testing import BackgroundServer
from tests.helpers import finished_by_reason, post_json, serving_engine

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


ENGINE_CORE = {"mode": "thread"}  # the module runs once per mode (the engine_core fixture)


@pytest.fixture(scope="module", params=["thread", "process"], autouse=True)
def engine_core(request):
    """Every test here twice: the engine on a thread of the server, and in an engine-core process."""
    ENGINE_CORE["mode"] = request.param
    return request.param


def make_server(api_key: str | None = None, **config) -> BackgroundServer:
    engine = serving_engine(EngineConfig(model="tiny", **config), ENGINE_CORE["mode"])
    return BackgroundServer(engine, api_key=api_key).start()


@pytest.fixture(scope="module")
def srv(engine_core):
    # SLO-aware admission (tests/server/test_server_admission.py) refuses part of a burst when the engine is slow,
    # as on a busy CI machine; this module's tests are about the protocol, streaming and KV bookkeeping
    server = make_server(admission="queue-length")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ref_engine():
    """A second engine with the same weights (same preset and seed), for in-process reference outputs."""
    return Engine(EngineConfig(model="tiny"))


def client(server: BackgroundServer, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def assert_clean(server: BackgroundServer) -> None:
    """No request left anywhere, no KV block held, block accounting intact."""
    server.wait_idle()
    stats = server.call(server.engine.stats)
    assert stats.kv_usage == 0 and stats.num_running == 0 and stats.num_waiting == 0
    server.call(server.engine.check_integrity)


async def stream_sse(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    """POST a streaming request; return status, chunks, text, usage, client-side TTFT."""
    t0 = time.monotonic()
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return {"status": resp.status, "headers": resp.headers, "body": await resp.json()}
        chunks, text, ttft, done = [], "", None, False
        async for line in resp.content:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            chunks.append(chunk)
            for choice in chunk.get("choices", []):
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.monotonic() - t0
                text += piece
        return {"status": 200, "chunks": chunks, "text": text, "ttft": ttft, "done": done,
                "usage": chunks[-1].get("usage") if chunks else None,
                "timing": chunks[-1].get("timing") if chunks else None}  # fmt: skip


# ------------------------------------------------------------------------------------ openai client


def test_openai_client_streams_completions_and_chat(srv):
    c = client(srv)
    for prompt in ("The quick brown fox", [256, 72, 101, 108, 108, 111]):
        stream = c.completions.create(
            model="tiny", prompt=prompt, max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = list(stream)
        assert chunks[-1].usage.completion_tokens == 6
        assert chunks[-1].usage.prompt_tokens == (len(prompt) + 1 if isinstance(prompt, str) else len(prompt))
        assert chunks[-1].model_extra["timing"]["tier"] == "standard"
        assert [ch.choices[0].finish_reason for ch in chunks[:-1] if ch.choices][-1] == "length"

    stream = c.chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": "brief"}, {"role": "user", "content": "hi"}],
        max_completion_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}, service_tier="priority",
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens > 10
    assert chunks[-1].model_extra["timing"]["tier"] == "premium"

    r = c.completions.create(model="tiny", prompt="abc", max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4 and r.usage.prompt_tokens == 4 and r.choices[0].finish_reason == "length"
    assert set(r.model_extra["timing"]) == {"queue_ms", "prefill_ms", "decode_ms", "tier", "front_end_ms", "held_ms"}
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 3
    assert [m.id for m in c.models.list().data] == ["tiny"]
    assert_clean(srv)


def test_greedy_stream_equals_full_equals_generate(srv, ref_engine):
    c = client(srv)
    prompts = ["Hello, world", "a", [256, 1, 2, 3, 4, 5, 6, 7, 8, 9], "x" * 300]
    for prompt in prompts:
        ref = ref_engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0.0))[0]
        full = c.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        chunks = list(c.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True))
        streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        assert full.choices[0].text == streamed == ref.text
        assert full.usage.completion_tokens == len(ref.token_ids)
    # chat goes through the same path once rendered
    messages = [{"role": "user", "content": "hi there"}]
    ref = ref_engine.generate("<|user|>\nhi there\n<|assistant|>\n", SamplingParams(max_tokens=8, temperature=0))[0]
    full = c.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    chunks = c.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert full.choices[0].message.content == streamed == ref.text
    assert_clean(srv)


def test_n_seed_and_stop_strings(srv, ref_engine):
    c = client(srv)
    ref = ref_engine.generate("stop test", SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))[0]
    stop = ref.text[5:7]
    cut = ref.text[: ref.text.find(stop)]
    r = c.completions.create(
        model="tiny", prompt="stop test", max_tokens=16, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    chunks = list(
        c.completions.create(
            model="tiny", prompt="stop test", max_tokens=16, temperature=0, stop=stop, stream=True,
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == cut
    # n > 1 with a seed: n distinct samples, reproducible
    kw = {"model": "tiny", "prompt": "sample", "max_tokens": 8, "temperature": 1.0, "n": 3, "seed": 7}
    a, b = c.completions.create(**kw), c.completions.create(**kw)
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    assert [ch.text for ch in a.choices] == [ch.text for ch in b.choices]
    assert len({ch.text for ch in a.choices}) > 1
    chunks = list(c.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    texts = {
        i: "".join(ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].index == i) for i in range(3)
    }
    assert [texts[i] for i in range(3)] == [ch.text for ch in a.choices]
    assert chunks[-1].usage.completion_tokens == a.usage.completion_tokens
    # min_tokens holds back EOS; max_tokens caps
    r = c.completions.create(model="tiny", prompt="m", max_tokens=9, temperature=0, extra_body={"min_tokens": 9})
    assert r.usage.completion_tokens == 9
    assert_clean(srv)


# --------------------------------------------------------------------------------- load and aborts


def test_200_concurrent_streams_complete_and_free_kv(srv):
    async def run():
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            bodies = [
                {"prompt": f"request number {i}", "max_tokens": 4 + i % 5, "ignore_eos": True, "stream": True,
                 "stream_options": {"include_usage": True}, "service_tier": ("premium", "standard", "basic")[i % 3]}
                for i in range(200)
            ]  # fmt: skip
            return await asyncio.gather(*(stream_sse(s, srv.url + "/v1/completions", b) for b in bodies))

    results = asyncio.run(run())
    assert all(r["status"] == 200 and r["done"] for r in results)
    assert [r["usage"]["completion_tokens"] for r in results] == [4 + i % 5 for i in range(200)]
    # the server's own share of each TTFT: within the client's view of it (one machine, one monotonic clock)
    assert all(0 <= r["timing"]["front_end_ms"] <= r["ttft"] * 1e3 + 1 for r in results if r["ttft"] is not None)
    assert sum(r["ttft"] is not None for r in results) >= 150
    assert_clean(srv)


def test_disconnects_abort_and_free_kv(srv):
    async def run():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

            async def read_then_drop(i: int) -> None:
                body = {"prompt": f"long {i}", "max_tokens": 4000, "ignore_eos": True, "stream": True}
                resp = await s.post(srv.url + "/v1/completions", json=body)
                n = 0
                async for line in resp.content:
                    n += line.startswith(b"data: ")
                    if n >= 3:
                        break
                resp.close()  # drops the connection mid-stream

            async def non_stream_timeout(i: int) -> None:
                body = {"prompt": f"long {i}", "max_tokens": 4000, "ignore_eos": True}
                with pytest.raises(asyncio.TimeoutError):
                    await s.post(srv.url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.3))

            await asyncio.gather(*(read_then_drop(i) for i in range(12)), *(non_stream_timeout(i) for i in range(4)))

    before = finished_by_reason(srv.url)
    asyncio.run(run())
    srv.wait_idle()
    # every one of the 16 ended as aborted (none ran to its 4000 tokens), as the server's own counters say
    after = finished_by_reason(srv.url)
    assert {k: after[k] - before[k] for k in after} == {"abort": 16, "length": 0, "stop": 0}
    assert_clean(srv)
    r = client(srv).completions.create(model="tiny", prompt="still here", max_tokens=2)
    assert r.usage.completion_tokens >= 1


# ------------------------------------------------------------------------------------- bad requests

LONG = "x" * 9000  # more bytes (= tokens) than tiny's 8192-token context
MALFORMED = [
    # (path, raw body or JSON, status, field the message must name)
    ("/v1/completions", b"{not json", 400, "JSON"),
    ("/v1/completions", b"", 400, "body"),
    ("/v1/completions", [1, 2], 400, "JSON object"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": 42}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, "two"]}, 400, "prompt[1]"),
    ("/v1/completions", {"prompt": [1, 100000]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [-1]}, 400, "prompt"),
    ("/v1/completions", {"prompt": LONG, "max_tokens": 1}, 400, "context"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 100000}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "10"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2.5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_k": -7}, 400, "top_k"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "'n'"),
    ("/v1/completions", {"prompt": "hi", "n": 1000}, 400, "'n'"),
    ("/v1/completions", {"prompt": "hi", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "seed": "abc"}, 400, "seed"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {"prompt": "hi", "service_tier": "gold"}, 400, "service_tier"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 10, "max_tokens": 2}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": "hi", "ignore_eos": "no"}, 400, "ignore_eos"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 3}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [1, 99999]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-7"}, 404, "model"),
    ("/v1/completions", {"prompt": "hi", "model": 7}, 400, "model"),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 1}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "type"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     400, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400, "context"),
    ("/v1/nowhere", {"prompt": "hi"}, 404, "/v1/nowhere"),
]  # fmt: skip


def test_malformed_requests_get_readable_4xx(srv):
    assert len(MALFORMED) >= 20

    async def run():
        async with aiohttp.ClientSession() as s:
            out = []
            for path, body, status, needle in MALFORMED:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                async with s.post(srv.url + path, data=data, headers={"Content-Type": "application/json"}) as r:
                    out.append((path, body, status, needle, r.status, await r.text()))
            async with s.get(srv.url + "/v1/completions") as r:
                out.append(("GET /v1/completions", None, 405, "GET", r.status, await r.text()))
            return out

    for path, body, status, needle, got_status, text in asyncio.run(run()):
        case = f"{path} {str(body)[:80]}"
        assert got_status == status, f"{case}: {got_status} {text}"
        err = json.loads(text)["error"]
        assert set(err) == {"message", "type", "param", "code"}, case
        assert needle.lower() in err["message"].lower(), f"{case}: {err['message']}"
        assert "Traceback" not in text
    r = client(srv).completions.create(model="tiny", prompt="fine", max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert_clean(srv)


def test_full_queue_gets_429_with_retry_after():
    server = make_server(max_num_seqs=1, max_waiting_per_tier={"premium": 4, "standard": 4, "basic": 2})
    try:

        async def run():
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                body = {"prompt": "fill", "max_tokens": 30, "ignore_eos": True, "stream": True, "service_tier": "flex"}
                return await asyncio.gather(*(stream_sse(s, server.url + "/v1/completions", body) for _ in range(12)))

        results = asyncio.run(run())
        rejected = [r for r in results if r["status"] == 429]
        assert rejected and any(r["status"] == 200 and r["done"] for r in results)
        assert all(r["headers"]["Retry-After"].isdigit() for r in rejected)
        assert all(r["body"]["error"]["code"] == "queue_full" and "basic" in r["body"]["error"]["message"]
                   for r in rejected)  # fmt: skip
        samples = scrape(server)
        assert samples[("slobench:admission_rejections_total", "basic")] == len(rejected)
        assert samples[("slobench:admission_rejections_total", "premium")] == 0
        assert_clean(server)
    finally:
        server.stop()


def test_api_key():
    server = make_server(api_key="sekret")
    try:
        for key in ("wrong", None):
            req = urllib.request.Request(
                server.url + "/v1/completions", data=b'{"prompt": "hi"}',
                headers={"Authorization": f"Bearer {key}"} if key else {},
            )  # fmt: skip
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(req)
            assert info.value.code == 401
            assert json.loads(info.value.read())["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client(server, "wrong").models.list()
        r = client(server, "sekret").completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert r.usage.completion_tokens >= 1
        assert urllib.request.urlopen(server.url + "/health").status == 200  # health needs no key
    finally:
        server.stop()


# ----------------------------------------------------------------------------------------- metrics


def scrape(server: BackgroundServer) -> dict:
    """{(name, tier or None): value} summed over the other labels; also {(name, labels): value}."""
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, s.labels.get("tier"))
            if "le" in s.labels:
                key = (s.name, s.labels.get("tier"), s.labels["le"])
            out[key] = out.get(key, 0.0) + s.value
    return out


def test_metrics_agree_with_requests_served():
    server = make_server()
    try:
        c = client(server)
        timings, usages, tiers = [], [], []
        for i in range(9):
            tier = ("premium", "standard", "basic")[i % 3]
            kw = {"model": "tiny", "prompt": f"metrics {i}", "max_tokens": 3 + i, "temperature": 0,
                  "extra_body": {"ignore_eos": True, "service_tier": tier}}  # fmt: skip
            if i % 2:
                r = c.completions.create(**kw)
                timings.append(r.model_extra["timing"])
                usages.append(r.usage)
            else:
                chunks = list(c.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
                timings.append(chunks[-1].model_extra["timing"])
                usages.append(chunks[-1].usage)
            tiers.append(tier)
        server.wait_idle()
        m = scrape(server)
        n = len(timings)
        for hist in (
            "time_to_first_token_seconds",
            "e2e_request_latency_seconds",
            "request_queue_time_seconds",
            "request_prefill_time_seconds",
            "request_decode_time_seconds",
            "request_inference_time_seconds",
            "request_prompt_tokens",
            "request_generation_tokens",
        ):
            assert m[(f"vllm:{hist}_count", None)] == n, hist
        assert m[("vllm:request_success_total", None)] == n
        for part in ("queue", "prefill", "decode"):
            total = sum(t[f"{part}_ms"] for t in timings) / 1e3
            assert m[(f"vllm:request_{part}_time_seconds_sum", None)] == pytest.approx(total, abs=1e-4)
        e2e = sum(t["queue_ms"] + t["prefill_ms"] + t["decode_ms"] for t in timings) / 1e3
        assert m[("vllm:e2e_request_latency_seconds_sum", None)] == pytest.approx(e2e, abs=1e-4)
        assert m[("vllm:generation_tokens_total", None)] == sum(u.completion_tokens for u in usages)
        assert m[("vllm:prompt_tokens_total", None)] == sum(u.prompt_tokens for u in usages)
        assert m[("vllm:inter_token_latency_seconds_count", None)] == sum(u.completion_tokens - 1 for u in usages)
        assert m[("vllm:time_to_first_token_seconds_bucket", None, "0.001")] <= n  # 1 ms bucket exists
        for tier in ("premium", "standard", "basic"):
            assert m[("slobench:time_to_first_token_seconds_count", tier)] == tiers.count(tier)
            for name in (
                "slobench:batch_fill_ratio",
                "slobench:kv_cache_usage_perc",
                "slobench:output_tokens_per_second",
                "slobench:admission_rejections_total",
            ):
                assert (name, tier) in m, name
        assert m[("vllm:num_requests_running", None)] == 0 and m[("vllm:kv_cache_usage_perc", None)] == 0
    finally:
        server.stop()


def test_premium_gets_lower_ttft_than_basic_under_saturation():
    server = make_server(max_num_seqs=4)
    try:

        async def run():
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                url = server.url + "/v1/completions"

                def body(tier: str) -> dict:
                    return {"prompt": f"{tier} traffic", "max_tokens": 24, "ignore_eos": True, "stream": True,
                            "service_tier": tier}  # fmt: skip

                # Enough basic work that the flood still fills the batch and the queue when the mixed requests
                # come: the faster engine runs 24 of them in ~0.24 s offline, barely past the 0.2 s wait, and it flaked.
                flood = [asyncio.create_task(stream_sse(s, url, body("basic"))) for _ in range(96)]
                await asyncio.sleep(0.2)  # the basic flood saturates the batch and fills the queue
                mixed = [asyncio.create_task(stream_sse(s, url, body(t))) for t in ["basic", "premium"] * 6]
                return await asyncio.gather(*flood), await asyncio.gather(*mixed)

        flood, mixed = asyncio.run(run())
        assert all(r["status"] == 200 and r["done"] for r in flood + mixed)
        premium = [r["ttft"] for r in mixed[1::2]]
        basic = [r["ttft"] for r in mixed[0::2]]
        assert statistics.median(premium) < statistics.median(basic)
        assert max(premium) < min(basic)
        assert_clean(server)
    finally:
        server.stop()


# --------------------------------------------------------------------------------------- lifecycle


def test_sigterm_stops_the_server_cleanly(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.server", "--port", str(port), "--drain-timeout", "0.5"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
                time.sleep(0.1)

        async def run():
            async with aiohttp.ClientSession() as s:
                body = {"prompt": "long", "max_tokens": 4000, "ignore_eos": True, "stream": True}
                task = asyncio.create_task(stream_sse(s, url + "/v1/completions", body))
                await asyncio.sleep(0.5)
                proc.send_signal(signal.SIGTERM)
                return await asyncio.wait_for(task, 20)

        result = asyncio.run(run())
        assert result["status"] == 200 and result["done"]  # the in-flight stream was ended, not cut
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log = proc.stdout.read().decode()
    assert "Traceback" not in log, log


def test_engine_failure_fails_requests_in_flight_and_server_recovers():
    if ENGINE_CORE["mode"] == "process":
        pytest.skip("a step is patched in this process; the core process's death: tests/server/test_engine_core.py")
    server = make_server()
    engine = server.engine
    real_step = engine.step
    failures = {"left": 1}

    def flaky_step():
        if failures["left"] and engine.has_unfinished_requests():
            failures["left"] -= 1
            raise RuntimeError("simulated kernel failure")
        return real_step()

    engine.step = flaky_step
    try:
        req = urllib.request.Request(
            server.url + "/v1/completions", data=b'{"prompt": "boom", "max_tokens": 50, "ignore_eos": true}'
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req)
        assert info.value.code == 500
        body = json.loads(info.value.read())
        assert body["error"]["code"] == "engine_error" and "Traceback" not in body["error"]["message"]
        r = client(server).completions.create(model="tiny", prompt="after", max_tokens=3)
        assert r.usage.completion_tokens >= 1
        assert urllib.request.urlopen(server.url + "/health").status == 200
        assert_clean(server)
    finally:
        server.stop()


def test_chat_uses_the_checkpoints_template(hf_checkpoint):
    """A Hugging Face folder's tokenizer_config.json template, tokenized exactly as transformers does."""
    transformers = pytest.importorskip("transformers")
    config = EngineConfig(model=str(hf_checkpoint), max_model_len=256)
    server = BackgroundServer(serving_engine(config, ENGINE_CORE["mode"])).start()
    try:
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_checkpoint))
        ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert ids.count(hf_tok.bos_token_id) == 1  # the template writes <s>; nobody adds a second
        c = client(server)
        model = c.models.list().data[0].id
        r = c.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
        assert r.usage.prompt_tokens == len(ids)
        full = c.completions.create(model=model, prompt=ids, max_tokens=6, temperature=0)
        assert r.choices[0].message.content == full.choices[0].text
        assert_clean(server)
    finally:
        server.stop()


def post(url: str, body: dict) -> tuple[int, dict]:
    status, raw = post_json(url, body, timeout=10)
    return status, json.loads(raw)


def test_tokenize_and_detokenize_round_trip(srv):
    """vLLM's /tokenize and /detokenize: what a load generator measures text prompts with."""
    status, obj = post(srv.url + "/tokenize", {"model": "tiny", "prompt": "hello world",
                                                     "add_special_tokens": False})
    assert status == 200 and obj["count"] == len(obj["tokens"]) == len(b"hello world")
    assert obj["tokens"] == srv.engine.tokenizer.encode("hello world", add_special_tokens=False)
    status, back = post(srv.url + "/detokenize", {"model": "tiny", "tokens": obj["tokens"]})
    assert status == 200 and back["prompt"] == "hello world"
    status, err = post(srv.url + "/tokenize", {"prompt": 5})
    assert status == 400 and err["error"]["param"] == "prompt"
    status, err = post(srv.url + "/detokenize", {"tokens": ["a"]})
    assert status == 400 and err["error"]["param"] == "tokens"
