"""A mock OpenAI-compatible streaming target with exact, configurable timing, to measure the client.

Each request gets its first token ``ttft_ms`` after it arrives and the next ones ``itl_ms`` apart, on an
absolute schedule (no drift from timer overshoot). The final chunk carries ``usage`` and ``timing``
like the reference engine's; ``/metrics`` exposes a few ``vllm:`` series for the scraper (padded with
``metrics_bytes`` of extra series, to bench a large page).

``strict`` makes it a strict OpenAI server, as ``transformers serve`` is: unknown fields are a 422, a prompt
that is not a string a 400, ``usage`` comes only with ``stream_options.include_usage``, there is no
``timing`` and no ``/metrics``; it also answers ``stream: false``. Its refusals are OpenAI's error JSON
(``transformers serve`` answers FastAPI's ``{"detail": ...}``). The default mode is untouched by it.

It is a bare asyncio protocol (HTTP/1.1 keep-alive, chunked SSE responses, each token one
``transport.write`` from a timer callback) rather than an aiohttp app: the mock must be several times
cheaper per token than the client it measures, and aiohttp's per-chunk coroutine machinery was not.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")


@dataclass(slots=True)
class MockConfig:
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    tokens: int | None = None  # None: the request's max_tokens
    model: str = "mock"
    strict: bool = False
    reject_fields: tuple[str, ...] = ()  # strict: also refuse these known fields (transformers serve: service_tier)
    metrics: bool | None = None  # serve /metrics; None: yes, unless strict
    metrics_bytes: int = 0  # extra series appended to /metrics, at least this many bytes


# The OpenAI request schema, per endpoint (openai-python's CompletionCreateParams): what a strict server knows.
# service_tier is OpenAI's (default | flex | priority) and kept on both, so only --reject-field drops it.
_COMMON_FIELDS = frozenset({"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed",
                            "stop", "n", "user", "frequency_penalty", "presence_penalty", "logit_bias", "logprobs",
                            "service_tier"})
STRICT_FIELDS = {
    "/v1/completions": _COMMON_FIELDS | {"prompt", "best_of", "echo", "suffix"},
    "/v1/chat/completions": _COMMON_FIELDS | {
        "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
        "response_format", "metadata", "store", "modalities", "audio", "prediction", "reasoning_effort",
        "verbosity", "web_search_options", "safety_identifier", "prompt_cache_key", "function_call", "functions"},
}
STRICT_STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})


class _Metrics:
    def __init__(self, model: str) -> None:
        r = self.registry = CollectorRegistry()
        lab = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests running", lab, registry=r).labels(model)
        Gauge("vllm:num_requests_waiting", "Requests waiting", lab, registry=r).labels(model)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens", lab, registry=r).labels(model)
        self.gen = Counter("vllm:generation_tokens", "Generated tokens", lab, registry=r).labels(model)
        self.queue, self.prefill, self.decode = (
            Histogram(f"vllm:request_{n}_time_seconds", f"{n} time", lab, buckets=BUCKETS, registry=r).labels(model)
            for n in ("queue", "prefill", "decode")
        )


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse(obj) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _response(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: keep-alive\r\n\r\n").encode() + body


def _error(status: int, message: str) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return _response(status, json.dumps(body).encode())


def _set_text(names) -> str:
    """A set as Python prints it, sorted so the message is stable: {'ignore_eos', 'min_tokens'}."""
    return "{" + ", ".join(repr(n) for n in sorted(names)) + "}"


def strict_check(cfg: MockConfig, path: str, req) -> tuple[int, str] | None:
    """(status, message) for a request a strict OpenAI server refuses, else None."""
    if not isinstance(req, dict):
        return 400, "the body must be a JSON object"
    unexpected = set(req) - (STRICT_FIELDS[path] - set(cfg.reject_fields))
    opts = req.get("stream_options")
    if isinstance(opts, dict):
        unexpected |= {f"stream_options.{k}" for k in set(opts) - STRICT_STREAM_OPTIONS}
    if unexpected:  # transformers serve's words; vLLM and OpenAI refuse these too, in their own words
        return 422, f"Unexpected fields in the request: {_set_text(unexpected)}"
    if not req.get("model"):
        return 400, "you must provide a model parameter"
    if req["model"] != cfg.model:
        return 404, f"The model '{req['model']}' does not exist"
    if path == "/v1/completions" and not isinstance(req.get("prompt"), str):
        return 400, "prompt must be a string."
    if path == "/v1/chat/completions" and not (isinstance(req.get("messages"), list) and req["messages"]):
        return 400, "messages must be a non-empty array"
    for key in ("max_tokens", "max_completion_tokens"):
        v = req.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            return 400, f"{key} must be a positive integer"
    if req.get("n") not in (None, 1):
        return 400, "only n = 1 is supported"
    return None


def metrics_padding(n_bytes: int) -> bytes:
    """Whole Prometheus series lines of a gauge the scraper does not read, at least n_bytes in all."""
    if n_bytes <= 0:
        return b""
    lines = [b"# HELP mock_padding A large /metrics page: series only the page size needs\n",
             b"# TYPE mock_padding gauge\n"]
    size, i = sum(map(len, lines)), 0
    while size < n_bytes:
        lines.append(b'mock_padding{series="%08d"} 0.0\n' % i)
        size += len(lines[-1])
        i += 1
    return b"".join(lines)


class _Server:
    def __init__(self, cfg: MockConfig):
        self.cfg = cfg
        self.metrics = _Metrics(cfg.model)
        self.created = int(time.time())
        self.serve_metrics = cfg.metrics if cfg.metrics is not None else not cfg.strict
        self.padding = metrics_padding(cfg.metrics_bytes)  # built once: a scrape costs the write, not the build


class _Conn(asyncio.Protocol):
    __slots__ = ("srv", "loop", "tr", "buf", "busy", "handle", "closed")

    def __init__(self, srv: _Server):
        self.srv = srv
        self.loop = asyncio.get_running_loop()
        self.tr = None
        self.buf = b""
        self.busy = False  # a stream is being written: the next request waits (no pipelining mid-stream)
        self.handle = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.tr = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
            self.srv.metrics.running.dec()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            try:
                method, target, _ = head[0].split(" ", 2)
            except ValueError:
                self.tr.write(_error(400, "bad request line"))
                self.tr.close()
                return
            length = 0
            for h in head[1:]:
                k, _, v = h.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip() or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            self._handle(method, target.split("?", 1)[0], body)

    def _handle(self, method: str, path: str, body: bytes) -> None:
        srv, cfg = self.srv, self.srv.cfg
        if method == "GET":
            if path == "/health":
                self.tr.write(_response(200, b"ok", "text/plain"))
            elif path == "/v1/models":
                self.tr.write(_response(200, json.dumps(
                    {"object": "list", "data": [{"id": cfg.model, "object": "model"}]}).encode()))
            elif path == "/metrics" and srv.serve_metrics:
                page = generate_latest(srv.metrics.registry)
                self.tr.write(_response(200, page + srv.padding if srv.padding else page, CONTENT_TYPE_LATEST))
            else:
                self.tr.write(_error(404, f"no route {path}"))
            return
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            self.tr.write(_error(404 if method == "POST" else 405, f"no route {method} {path}"))
            return
        try:
            req = json.loads(body)
        except ValueError:
            self.tr.write(_error(400, "body is not JSON"))
            return
        chat = path.endswith("/chat/completions")
        if cfg.strict:
            if (refused := strict_check(cfg, path, req)) is not None:
                self.tr.write(_error(*refused))
            elif req.get("stream"):
                self._stream(req, chat, req["messages"] if chat else req["prompt"])
            else:
                self._whole(req, chat)
            return
        prompt = req.get("messages") if chat else req.get("prompt")
        if prompt is None or not req.get("stream"):
            self.tr.write(_error(400, "the mock server only streams; send stream: true and a prompt"))
            return
        self._stream(req, chat, prompt)

    def _stream(self, req: dict, chat: bool, prompt) -> None:
        srv, cfg = self.srv, self.srv.cfg
        t_arrive = self.loop.time()
        n_out, n_in = self._lengths(req, chat, prompt)
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        head = {"id": f"cmpl-{id(self):x}{int(t_arrive * 1e6):x}", "created": srv.created, "model": cfg.model,
                "object": "chat.completion.chunk" if chat else "text_completion"}

        def chunk(text, finish=None):
            choice = ({"index": 0, "delta": {"content": text}, "finish_reason": finish} if chat
                      else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
            return _sse({**head, "choices": [choice]})

        token, last = chunk(" tok"), chunk(" tok", "length")
        ttft, itl = cfg.ttft_ms / 1000.0, cfg.itl_ms / 1000.0
        self.busy = True
        srv.metrics.running.inc()
        self.tr.write(_SSE_HEAD)
        if cfg.strict and chat:  # as OpenAI does: the role first, in a chunk with no content (not a token)
            self.tr.write(_sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                     "finish_reason": None}]}))

        def emit(k: int) -> None:
            if self.closed:
                return
            if k < n_out - 1:
                self.tr.write(token)
                self.handle = self.loop.call_at(t_arrive + ttft + (k + 1) * itl, emit, k + 1)
                return
            self.handle = None
            out = [last]
            decode_ms = max(0.0, (self.loop.time() - t_arrive - ttft) * 1000.0)
            if usage:
                final = {**head, "choices": [],
                         "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}}
                if not cfg.strict:  # per-request timing is the reference engine's extension, not OpenAI's
                    final["timing"] = {"queue_ms": 0.0, "prefill_ms": cfg.ttft_ms, "decode_ms": decode_ms,
                                       "tier": req.get("service_tier") or "standard"}
                out.append(_sse(final))
            out.append(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            self.tr.write(b"".join(out))
            m = srv.metrics
            m.running.dec()
            m.prompt.inc(n_in)
            m.gen.inc(n_out)
            m.queue.observe(0.0)
            m.prefill.observe(ttft)
            m.decode.observe(decode_ms / 1000.0)
            self.busy = False
            if self.buf:
                self._next()

        self.handle = self.loop.call_at(t_arrive + ttft, emit, 0)

    def _lengths(self, req: dict, chat: bool, prompt) -> tuple[int, int]:
        """(output tokens, prompt tokens) of a request: --tokens or max_tokens; ids counted, text by length."""
        cfg = self.srv.cfg
        asked = (req.get("max_completion_tokens") or req.get("max_tokens")) if cfg.strict else req.get("max_tokens")
        n_out = cfg.tokens if cfg.tokens is not None else int(asked or 16)
        n_in = len(prompt) if isinstance(prompt, list) and not chat else max(1, len(json.dumps(prompt)) // 4)
        return n_out, n_in

    def _whole(self, req: dict, chat: bool) -> None:
        """A strict server's ``stream: false`` answer: the whole text once its last token is due, with usage."""
        srv, cfg = self.srv, self.srv.cfg
        t_arrive = self.loop.time()
        n_out, n_in = self._lengths(req, chat, req["messages"] if chat else req["prompt"])
        text = " tok" * n_out
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"} if chat
                  else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
        body = {"id": f"cmpl-{id(self):x}{int(t_arrive * 1e6):x}", "created": srv.created, "model": cfg.model,
                "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}}
        ttft = cfg.ttft_ms / 1000.0
        self.busy = True
        srv.metrics.running.inc()

        def done() -> None:
            self.handle = None
            if self.closed:
                return
            self.tr.write(_response(200, json.dumps(body).encode()))
            m = srv.metrics
            m.running.dec()
            m.prompt.inc(n_in)
            m.gen.inc(n_out)
            m.queue.observe(0.0)
            m.prefill.observe(ttft)
            m.decode.observe(max(0.0, self.loop.time() - t_arrive - ttft))
            self.busy = False
            if self.buf:
                self._next()

        self.handle = self.loop.call_at(t_arrive + ttft + (n_out - 1) * cfg.itl_ms / 1000.0, done)


async def _serve(cfg: MockConfig, host: str, port: int, ready=None) -> None:
    srv = _Server(cfg)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(srv), host, port, backlog=4096, reuse_address=True)
    if ready:
        ready(server)
    async with server:
        await server.serve_forever()


def serve(cfg: MockConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    try:
        import uvloop
        new_loop = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        new_loop = asyncio.new_event_loop
    print(f"mock server on http://{host}:{port} (ttft {cfg.ttft_ms} ms, itl {cfg.itl_ms} ms, "
          f"tokens {cfg.tokens or 'max_tokens'}{', strict' if cfg.strict else ''})", flush=True)
    loop = new_loop()
    try:
        loop.run_until_complete(_serve(cfg, host, port))
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()
