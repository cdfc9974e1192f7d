"""A mock OpenAI-compatible streaming target with exact, configurable timing, to measure the client.

Each request gets its first token ``ttft_ms`` after it arrives and the next ones ``itl_ms`` apart, on an
absolute schedule (no drift from timer overshoot). The final chunk carries ``usage`` and ``timing``
like the reference engine's; ``/metrics`` exposes a few ``vllm:`` series for the scraper (padded with
``metrics_bytes`` of extra series, to bench a large page). ``metrics_flavor`` (sglang | tgi | trtllm) makes
it that server instead: its metric names (trtllm's at ``/prometheus/metrics``), and no ``timing``.

``strict`` makes it a strict OpenAI server, as ``transformers serve`` is: unknown fields are a 422, a prompt
that is not a string a 400, ``usage`` comes only with ``stream_options.include_usage``, there is no
``timing`` and no ``/metrics``; it also answers ``stream: false``. Its refusals are OpenAI's error JSON
(``transformers serve`` answers FastAPI's ``{"detail": ...}``). The default mode is untouched by it.

``slots`` > 0 is the queueing mode (``mock.slots``): at most that many requests are served at once, the
rest wait FIFO; a request's schedule (first token ``ttft_ms + prefill_ms_per_token x prompt tokens``
after its slot, then ``itl_ms`` apart) counts from its slot, and it holds the slot until its last token.
``/metrics`` then shows the running and waiting counts, and the time waited as queue time.

Access, as vLLM's: ``api_key`` (``--api-key``) makes every request under ``/v1`` (models, completions, chat,
responses) need ``Authorization: Bearer <key>``, else 401 ``{"error": "Unauthorized"}``; ``/health`` and
``/metrics`` stay open. ``models`` serves more names than ``model`` (all listed by ``/v1/models``; an answer
carries the name asked for); ``check_model`` answers a request naming another model 404 in vLLM's words
(``The model `x` does not exist.``, type ``NotFoundError``); without it any name is served, as before.
``request_log`` (``--log-requests``), a test aid: one JSON line per HTTP request received, before any check
(method, path, headers with lower-cased names, the JSON body or null), written and flushed per line.
``fcfs`` (``--fcfs``) answers a non-zero ``priority`` 400 in vLLM's words, as a first-come-first-served
server that knows no priorities does; without it the field is accepted and ignored (as vLLM 0.32 accepts it
under FCFS too). ``refuse`` (``--refuse STATUS:EVERY[:RETRY_AFTER]``) answers
every EVERY-th completion request STATUS instead, with that ``Retry-After``: a server that sheds (429, 503,
529) or fails (500), for the client's outcome classes and retries.

It is a bare asyncio protocol (HTTP/1.1 keep-alive, chunked SSE responses, each token one
``transport.write`` from a timer callback) rather than an aiohttp app: the mock must be several times
cheaper per token than the client it measures, and aiohttp's per-chunk coroutine machinery was not.
"""

from __future__ import annotations

import asyncio
import json
import time

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from loadgen.target.mock.config import (
    MockConfig,
    answer_model,
    authorized,
    priority_refusal,
    refusal,
    strict_check,
    unknown_model,
)
from loadgen.target.mock.metrics_page import MockMetrics, metrics_padding
from loadgen.target.mock.slots import SlotQueue, Ticket
from loadgen.target.mock.stream import plan_responses, plan_stream
from loadgen.target.mock.wire import SSE_HEAD, STREAM_END, UNAUTHORIZED, error, model_not_found, response


class _Server:
    def __init__(self, cfg: MockConfig):
        self.cfg = cfg
        self.metrics = MockMetrics(cfg.model, cfg.metrics_flavor)
        self.created = int(time.time())
        self.serve_metrics = cfg.metrics if cfg.metrics is not None else not cfg.strict
        self.padding = metrics_padding(cfg.metrics_bytes)  # built once: a scrape costs the write, not the build
        self.slots = SlotQueue(cfg.slots, self.metrics) if cfg.slots > 0 else None  # queueing mode
        self.completions = 0  # completion requests past the checks, counted for ``refuse``
        # line-buffered: each request's line is one small write, whole on disk when the test reads it
        self.request_log = open(cfg.request_log, "a", buffering=1) if cfg.request_log else None  # noqa: SIM115

    def log_request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        """``--log-requests``: the request as received, one JSON line."""
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        self.request_log.write(json.dumps({"method": method, "path": path, "headers": headers, "body": parsed})
                               + "\n")


class _Conn(asyncio.Protocol):
    __slots__ = ("srv", "loop", "tr", "buf", "busy", "handle", "closed", "ticket")

    def __init__(self, srv: _Server):
        self.srv = srv
        self.loop = asyncio.get_running_loop()
        self.tr = None
        self.buf = b""
        self.busy = False  # a stream is being written: the next request waits (no pipelining mid-stream)
        self.handle = None
        self.closed = False
        self.ticket: Ticket | None = None  # queueing mode: this connection's request's place

    def connection_made(self, transport) -> None:
        self.tr = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
            self.srv.metrics.abort()
        if self.ticket is not None:
            self.srv.slots.leave(self.ticket, self.loop.time())
            self.ticket = None

    def _admit(self, t_arrive: float, serve) -> None:
        """Serve the request now (no queue), or when the slot queue gives it a slot: ``serve(start_s)``."""
        if self.srv.slots is None:
            serve(t_arrive)
        else:
            self.ticket = self.srv.slots.arrive(t_arrive, serve)

    def _done(self, t_free: float) -> None:
        """The answer is written; its slot is free from ``t_free`` (its last token's due time)."""
        if self.ticket is not None:
            ticket, self.ticket = self.ticket, None
            self.srv.slots.finish(ticket, t_free)
        self.busy = False
        if self.buf:
            self._next()

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
                self.tr.write(error(400, "bad request line"))
                self.tr.close()
                return
            headers: dict[str, str] = {}
            for h in head[1:]:
                k, _, v = h.partition(":")
                k, v = k.strip().lower(), v.strip()
                headers[k] = f"{headers[k]}, {v}" if k in headers else v  # a repeated header: one, comma-joined
            length = int(headers.get("content-length") or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            self._handle(method, target.split("?", 1)[0], headers, body)

    def _handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        srv, cfg = self.srv, self.srv.cfg
        if srv.request_log is not None:
            srv.log_request(method, path, headers, body)
        if not authorized(cfg, path, headers):
            self.tr.write(UNAUTHORIZED)
            return
        if method == "GET":
            if path == "/health":
                self.tr.write(response(200, b"ok", "text/plain"))
            elif path == "/v1/models":
                self.tr.write(response(200, json.dumps(
                    {"object": "list", "data": [{"id": m, "object": "model"} for m in cfg.served()]}).encode()))
            elif path == srv.metrics.path and srv.serve_metrics:
                page = generate_latest(srv.metrics.registry)
                self.tr.write(response(200, page + srv.padding if srv.padding else page, CONTENT_TYPE_LATEST))
            elif path == "/metrics" and srv.serve_metrics and srv.metrics.json_page is not None:
                self.tr.write(response(200, srv.metrics.json_page))  # trtllm-serve: JSON iteration stats
            else:
                self.tr.write(error(404, f"no route {path}"))
            return
        routes = ("/v1/completions", "/v1/chat/completions", "/v1/responses") if cfg.responses \
            else ("/v1/completions", "/v1/chat/completions")
        if method != "POST" or path not in routes:
            self.tr.write(error(404 if method == "POST" else 405, f"no route {method} {path}"))
            return
        try:
            req = json.loads(body)
        except ValueError:
            self.tr.write(error(400, "body is not JSON"))
            return
        if (name := unknown_model(cfg, req)) is not None:
            self.tr.write(model_not_found(name))
            return
        if (refused := priority_refusal(cfg, req)) is not None:
            self.tr.write(error(400, refused))
            return
        srv.completions += 1
        if (refused := refusal(cfg, srv.completions)) is not None:
            status, retry_after_s = refused
            self.tr.write(error(status, f"refused by --refuse {status}", retry_after_s))
            return
        chat = path.endswith("/chat/completions")
        api = "responses" if path == "/v1/responses" else "chat" if chat else "completions"
        key = {"responses": "input", "chat": "messages", "completions": "prompt"}[api]
        if cfg.strict:
            if (refused := strict_check(cfg, path, req)) is not None:
                self.tr.write(error(*refused))
            elif req.get("stream"):
                self._stream(req, api, req[key])
            elif api == "responses":
                self.tr.write(error(400, "the mock's Responses API only streams; send stream: true"))
            else:
                self._whole(req, chat)
            return
        prompt = req.get(key)
        if prompt is None or not req.get("stream"):
            self.tr.write(error(400, "the mock server only streams; send stream: true and a prompt"))
            return
        self._stream(req, api, prompt)

    def _stream(self, req: dict, api: str, prompt) -> None:
        srv, cfg = self.srv, self.srv.cfg
        t_arrive = self.loop.time()
        chat = api == "chat"
        n_out, n_in = self._lengths(req, api != "completions", prompt)
        rid = f"{id(self):x}{int(t_arrive * 1e6):x}"
        if api == "responses":
            plan = plan_responses(cfg, req, f"resp_{rid}", srv.created, n_out, n_in)
        else:
            head = {"id": f"cmpl-{rid}", "created": srv.created, "model": answer_model(cfg, req),
                    "object": "chat.completion.chunk" if chat else "text_completion"}
            plan = plan_stream(cfg, req, chat, head, n_out, n_in)
        emissions = plan.emissions
        prefill = cfg.prefill_ms(n_in) / 1000.0
        self.busy = True
        self.tr.write(SSE_HEAD + plan.opening)

        def serve(t_start: float) -> None:  # the request has its slot (at once without a queue)
            queue_s = t_start - t_arrive
            srv.metrics.start()

            def emit(k: int) -> None:
                if self.closed:
                    return
                if k < len(emissions) - 1:
                    self.tr.write(emissions[k][1])
                    self.handle = self.loop.call_at(t_start + emissions[k + 1][0], emit, k + 1)
                    return
                self.handle = None
                decode_ms = max(0.0, (self.loop.time() - t_start - prefill) * 1000.0)
                self.tr.write(emissions[k][1] + plan.closing(decode_ms, queue_s * 1000.0) + STREAM_END)
                srv.metrics.finish(prefill, decode_ms / 1000.0, n_in, n_out, queue_s)
                self._done(t_start + emissions[k][0])

            self.handle = self.loop.call_at(t_start + emissions[0][0], emit, 0)

        self._admit(t_arrive, serve)

    def _lengths(self, req: dict, chat: bool, prompt) -> tuple[int, int]:
        """(output tokens, prompt tokens) of a request: --tokens or max_tokens (max_output_tokens for the
        Responses API); ids counted, text by length."""
        cfg = self.srv.cfg
        asked = (req.get("max_completion_tokens") or req.get("max_tokens")) if cfg.strict else req.get("max_tokens")
        asked = asked or req.get("max_output_tokens")
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
        body = {"id": f"cmpl-{id(self):x}{int(t_arrive * 1e6):x}", "created": srv.created,
                "model": answer_model(cfg, req),
                "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}}
        prefill = cfg.prefill_ms(n_in) / 1000.0
        self.busy = True

        def serve(t_start: float) -> None:
            srv.metrics.start()
            t_end = t_start + prefill + (n_out - 1) * cfg.itl_ms / 1000.0

            def done() -> None:
                self.handle = None
                if self.closed:
                    return
                self.tr.write(response(200, json.dumps(body).encode()))
                srv.metrics.finish(prefill, max(0.0, self.loop.time() - t_start - prefill), n_in, n_out,
                                   t_start - t_arrive)
                self._done(t_end)

            self.handle = self.loop.call_at(t_end, done)

        self._admit(t_arrive, serve)


async def _serve(cfg: MockConfig, host: str, port: int, ready=None) -> None:
    srv = _Server(cfg)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(srv), host, port, backlog=4096, reuse_address=True)
    if ready:
        ready(server)
    try:
        async with server:
            await server.serve_forever()
    finally:
        if srv.request_log is not None:
            srv.request_log.close()


def serve(cfg: MockConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    try:
        import uvloop
        new_loop = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        new_loop = asyncio.new_event_loop
    queue = (f", {cfg.slots} slots FIFO, prefill {cfg.prefill_ms_per_token} ms/token" if cfg.slots
             else f", prefill {cfg.prefill_ms_per_token} ms/token" if cfg.prefill_ms_per_token else "")
    print(f"mock server on http://{host}:{port} (ttft {cfg.ttft_ms} ms, itl {cfg.itl_ms} ms, "
          f"tokens {cfg.tokens or 'max_tokens'}{queue}{', strict' if cfg.strict else ''})", flush=True)
    loop = new_loop()
    try:
        loop.run_until_complete(_serve(cfg, host, port))
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()
