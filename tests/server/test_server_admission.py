"""The server under pressure: SLO-aware admission (429 + Retry-After), requests that can never fit (400),
and one request's overflowing seed not failing the others."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import aiohttp
import pytest

from engine import Engine, EngineConfig
from engine.server.testing import BackgroundServer

pytestmark = pytest.mark.slow

STEP_DELAY_S = 0.01  # a slow engine: every step takes at least this long


def slow_server(**config) -> BackgroundServer:
    engine = Engine(EngineConfig(model="tiny", max_num_seqs=2, **config))
    real_step = engine.step

    def slow_step():
        time.sleep(STEP_DELAY_S)
        return real_step()

    engine.step = slow_step
    return BackgroundServer(engine).start()


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with session.post(url, json=body) as resp:
        text = await resp.text()
        return {"status": resp.status, "headers": dict(resp.headers), "body": json.loads(text) if text else None}


def body(tier: str, max_tokens: int = 8, **extra) -> dict:
    return {"prompt": f"{tier} request", "max_tokens": max_tokens, "ignore_eos": True, "service_tier": tier, **extra}


def burst(server: BackgroundServer, bodies: list[dict]) -> list[dict]:
    async def run():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            return await asyncio.gather(*(post(s, server.url + "/v1/completions", b) for b in bodies))

    return asyncio.run(run())


def warm_up(server: BackgroundServer) -> None:
    """A few requests one after another: the engine has measured how long a request holds its slot."""
    for _ in range(3):
        assert burst(server, [body("standard")])[0]["status"] == 200


def metric(server: BackgroundServer, name: str, tier: str) -> float:
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and f'tier="{tier}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{tier={tier}}} not exported")


def test_a_burst_against_a_slow_engine_gets_429_for_standard_while_premium_is_admitted():
    server = slow_server()
    try:
        warm_up(server)
        # 2 slots, each request holding one ~9 steps of >= 10 ms: about 20 standard requests a second.
        results = burst(server, [body("standard") for _ in range(40)] + [body("premium") for _ in range(4)])
        standard, premium = results[:40], results[40:]
        rejected = [r for r in standard if r["status"] == 429]
        assert rejected, "a queue of 40 standard requests cannot start within 800 ms"
        assert all(r["status"] == 200 for r in premium), "premium's own queue is short: it is admitted"
        assert all(r["status"] == 200 for r in standard if r not in rejected)
        for r in rejected:
            assert r["headers"]["Retry-After"].isdigit() and int(r["headers"]["Retry-After"]) >= 1
            err = r["body"]["error"]
            assert err["code"] == "slo_unattainable" and err["type"] == "rate_limit_error"
            assert "800 ms" in err["message"] and "standard" in err["message"]
        assert metric(server, "slobench:admission_rejections_total", "standard") == len(rejected)
        assert metric(server, "slobench:admission_rejections_total", "premium") == 0
        for tier in ("premium", "standard", "basic"):
            assert metric(server, "slobench:estimated_queue_wait_seconds", tier) >= 0
            assert 0.5 <= metric(server, "slobench:admission_tail_factor", tier) <= 20.0
        server.wait_idle()
        server.call(server.engine.check_integrity)
    finally:
        server.stop()


def test_queue_length_admission_queues_the_same_burst():
    server = slow_server(admission="queue-length")
    try:
        warm_up(server)
        results = burst(server, [body("standard") for _ in range(40)])
        assert all(r["status"] == 200 for r in results)
        assert metric(server, "slobench:estimated_queue_wait_seconds", "standard") >= 0
    finally:
        server.stop()


def test_never_fitting_requests_get_400_and_an_overflowing_seed_fails_nobody():
    server = BackgroundServer(Engine(EngineConfig(model="tiny", num_kv_blocks=16, block_size=16))).start()
    try:
        too_big, overflow, other = burst(server, [
            {"prompt": "x" * 100, "max_tokens": 200},  # 299 slots: 19 blocks of a 16-block pool
            {"prompt": "seed", "max_tokens": 6, "n": 3, "temperature": 1.0, "seed": 2**64 - 1},
            body("standard", max_tokens=12),
        ])  # fmt: skip
        assert too_big["status"] == 400
        err = too_big["body"]["error"]
        assert err["code"] == "exceeds_engine_capacity" and err["param"] == "max_tokens"
        assert "KV-cache blocks" in err["message"] and "16" in err["message"]
        assert overflow["status"] == 200 and len(overflow["body"]["choices"]) == 3
        assert other["status"] == 200 and other["body"]["usage"]["completion_tokens"] == 12
        assert server.engine_loop.step_errors == 0
        server.wait_idle()
        server.call(server.engine.check_integrity)
    finally:
        server.stop()


def test_a_request_shed_from_the_queue_is_a_plain_429_streamed_or_not():
    """Once queued past what its promise allows, a request that never started is answered 429, headers
    included, even when it asked for a stream (the status waits for the engine's first output)."""
    from engine.server.core_client import EngineCoreClient

    config = EngineConfig(model="tiny", max_num_seqs=1, tier_ttft_slo_ms={"premium": 300, "standard": 40})
    with BackgroundServer(EngineCoreClient(config)) as server:
        url = server.url + "/v1/completions"

        async def go():
            async with aiohttp.ClientSession() as s:
                hog = asyncio.create_task(post(s, url, {"prompt": "a", "max_tokens": 600, "ignore_eos": True,
                                                        "service_tier": "premium"}))
                await asyncio.sleep(0.3)  # the hog holds the only batch slot
                late = await asyncio.gather(
                    post(s, url, {"prompt": "b", "max_tokens": 4, "stream": True}),
                    post(s, url, {"prompt": "c", "max_tokens": 4}))
                return await hog, late

        hog, late = asyncio.run(go())
        assert hog["status"] == 200 and hog["body"]["usage"]["completion_tokens"] == 600
        for r in late:
            assert r["status"] == 429 and r["headers"]["Retry-After"] == "1"
            assert r["body"]["error"]["code"] == "slo_unattainable"
            assert "held this request" in r["body"]["error"]["message"]
        stats = server.call(server.engine.stats)
        assert stats.shed_by_tier["standard"] == 2 and stats.kv_usage == 0
