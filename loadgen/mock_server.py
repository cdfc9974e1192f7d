"""A mock OpenAI-compatible streaming target with exact, configurable timing, to measure the client.

Each request gets its first token ``ttft_ms`` after it arrives and the next ones ``itl_ms`` apart, on an
absolute schedule (no drift from sleep overshoot). The final chunk carries ``usage`` and ``timing``
like the reference engine's. ``/metrics`` exposes a few ``vllm:`` series so the scraper has something
to read.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass(slots=True)
class MockConfig:
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    tokens: int | None = None  # None: the request's max_tokens
    model: str = "mock"


class _Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.running = Gauge("vllm:num_requests_running", "Requests running", ["model_name"], registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", ["model_name"], registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens", ["model_name"], registry=r)
        self.gen = Counter("vllm:generation_tokens", "Generated tokens", ["model_name"], registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Queue time", ["model_name"],
                               buckets=BUCKETS, registry=r)
        self.prefill = Histogram("vllm:request_prefill_time_seconds", "Prefill time", ["model_name"],
                                 buckets=BUCKETS, registry=r)
        self.decode = Histogram("vllm:request_decode_time_seconds", "Decode time", ["model_name"],
                                buckets=BUCKETS, registry=r)


def create_app(cfg: MockConfig) -> web.Application:
    m = _Metrics()
    app = web.Application()
    created = int(time.time())

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": cfg.model, "object": "model"}]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(m.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def complete(request: web.Request) -> web.StreamResponse:
        t_arrive = time.monotonic()
        try:
            req = await request.json()
        except ValueError:
            return _error(400, "body is not JSON")
        chat = request.path.endswith("/chat/completions")
        prompt = req.get("messages") if chat else req.get("prompt")
        if prompt is None or not req.get("stream"):
            return _error(400, "the mock server only streams; send stream: true and a prompt")
        n_out = cfg.tokens if cfg.tokens is not None else int(req.get("max_tokens") or 16)
        n_in = len(prompt) if isinstance(prompt, list) and not chat else max(1, len(json.dumps(prompt)) // 4)
        usage_wanted = (req.get("stream_options") or {}).get("include_usage", False)
        rid = f"cmpl-{id(request):x}"
        model_label = m.running.labels(cfg.model)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        model_label.inc()
        if chat:
            head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": cfg.model}
            def chunk(text, finish=None):
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
                return {**head, "choices": [choice]}
        else:
            head = {"id": rid, "object": "text_completion", "created": created, "model": cfg.model}
            def chunk(text, finish=None):
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
                return {**head, "choices": [choice]}
        token = b"data: " + json.dumps(chunk(" tok"), separators=(",", ":")).encode() + b"\n\n"
        loop = asyncio.get_running_loop()
        start = loop.time() - (time.monotonic() - t_arrive)
        ttft, itl = cfg.ttft_ms / 1000.0, cfg.itl_ms / 1000.0
        try:
            for k in range(n_out):
                delay = start + ttft + k * itl - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if k == n_out - 1:
                    last = chunk(" tok", "length")
                    await resp.write(b"data: " + json.dumps(last, separators=(",", ":")).encode() + b"\n\n")
                else:
                    await resp.write(token)
            t_end = time.monotonic()
            decode_ms = max(0.0, (t_end - t_arrive) * 1000.0 - cfg.ttft_ms)
            if usage_wanted:
                final = {**head, "choices": [],
                         "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                                   "total_tokens": n_in + n_out},
                         "timing": {"queue_ms": 0.0, "prefill_ms": cfg.ttft_ms, "decode_ms": decode_ms,
                                    "tier": req.get("service_tier") or "standard"}}
                await resp.write(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            m.prompt.labels(cfg.model).inc(n_in)
            m.gen.labels(cfg.model).inc(n_out)
            m.queue.labels(cfg.model).observe(0.0)
            m.prefill.labels(cfg.model).observe(ttft)
            m.decode.labels(cfg.model).observe(decode_ms / 1000.0)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            model_label.dec()
        return resp

    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "code": status}},
                             status=status)


def serve(cfg: MockConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    print(f"mock server on http://{host}:{port} (ttft {cfg.ttft_ms} ms, itl {cfg.itl_ms} ms, "
          f"tokens {cfg.tokens or 'max_tokens'})", flush=True)
    web.run_app(create_app(cfg), host=host, port=port, print=None, access_log=None, backlog=4096)
