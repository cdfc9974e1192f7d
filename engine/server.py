"""OpenAI-compatible HTTP server over the engine: streaming completions and chat, tiers, metrics.

    python -m engine.server --model tiny --port 8000      # or: slobench serve ...

The engine runs on its own thread (engine_loop.py); the aiohttp event loop owns everything HTTP. A
handler that ends early (client disconnect cancels it, or a write fails) aborts its request at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from engine import protocol
from engine.chat import ChatTemplateError, render_chat
from engine.engine_loop import EngineLoop, RequestStream
from engine.errors import EngineError, InvalidRequestError, PromptTooLongError, QueueFullError
from engine.metrics import CONTENT_TYPE, ServerMetrics
from engine.protocol import APIError
from engine.server_args import SWITCH_INTERVAL_MS, add_server_arguments, config_from_args

__all__ = ["BackgroundServer", "add_server_arguments", "build_app", "config_from_args", "main", "run_server", "serve"]

logger = logging.getLogger("engine.server")

RETRY_AFTER_S = 1
MAX_BODY_BYTES = 32 * 1024 * 1024

_JSON_SEPARATORS = (",", ":")
_SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=_JSON_SEPARATORS, ensure_ascii=False)


def _sse(obj: Any) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


_SSE_DONE = b"data: [DONE]\n\n"


# ------------------------------------------------------------------------------------------ engine loop


# ---------------------------------------------------------------------------------------------- app

ENGINE_KEY = web.AppKey("engine", object)
ENGINE_LOOP_KEY = web.AppKey("engine_loop", EngineLoop)
METRICS_KEY = web.AppKey("metrics", ServerMetrics)
STATE_KEY = web.AppKey("state", dict)


def _error_response(err: APIError) -> web.Response:
    return web.Response(
        status=err.status, text=_dumps(err.body()), content_type="application/json", headers=err.headers
    )


def map_engine_error(e: EngineError) -> APIError:
    if isinstance(e, PromptTooLongError):
        return APIError(400, str(e), param=e.param or "prompt", code="context_length_exceeded")
    if isinstance(e, InvalidRequestError):
        return APIError(400, str(e), param=e.param or "prompt", code="invalid_value")
    if isinstance(e, QueueFullError):
        return APIError(
            429,
            str(e),
            param="service_tier",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return APIError(400, str(e), code="invalid_request")


@web.middleware
async def _errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except APIError as e:
        return _error_response(e)
    except EngineError as e:
        return _error_response(map_engine_error(e))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = {
            404: f"no route for {request.path}",
            405: f"method {request.method} is not allowed on {request.path}",
            413: f"the request body is larger than {MAX_BODY_BYTES} bytes",
        }.get(e.status, e.reason)
        return _error_response(APIError(e.status, message, code=e.reason.lower().replace(" ", "_")))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return _error_response(APIError(500, "internal server error", code="internal_error"))


def _auth_middleware(api_key: str):
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def auth(request: web.Request, handler):
        if request.path.startswith("/v1"):
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                return _error_response(
                    APIError(
                        401,
                        "invalid or missing API key (send 'Authorization: Bearer <key>')",
                        code="invalid_api_key",
                    )
                )
        return await handler(request)

    return auth


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise APIError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from e


def _served_models(engine: Any) -> tuple[str, ...]:
    names = [engine.model_name]
    configured = getattr(engine.config, "model", None)
    if configured and configured not in names:
        names.append(configured)
    return tuple(names)


def _vocab_size(engine: Any) -> int | None:
    return getattr(engine.tokenizer, "vocab_size", None)


async def handle_completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    req = protocol.parse_completion_request(await _json_body(request), _served_models(engine), _vocab_size(engine))
    return await _generate(request, req, req.prompt, "cmpl-")


def _special_token_text(tok: Any, token_id: int | None) -> str:
    if token_id is None:
        return ""
    try:
        return tok.decode([token_id], skip_special_tokens=False)
    except Exception:
        return ""


def _chat_prompt(engine: Any, req: protocol.GenerationRequest) -> list[int]:
    """Render the messages with the checkpoint's template (or the plain one) and tokenize them.

    The template writes special tokens itself, so the text is encoded without them; BOS is added only
    when the tokenizer adds one to plain text and the template did not write it.
    """
    tok = engine.tokenizer
    bos = getattr(tok, "bos_token_id", None)
    eos_ids = getattr(tok, "eos_token_ids", None) or []
    try:
        text = render_chat(
            req.messages,
            getattr(tok, "chat_template", None),
            add_generation_prompt=req.add_generation_prompt,
            bos_token=_special_token_text(tok, bos),
            eos_token=_special_token_text(tok, eos_ids[0] if eos_ids else None),
            **req.chat_template_kwargs,
        )
    except ChatTemplateError as e:
        raise protocol.invalid("messages", f"'messages' could not be rendered: {e}") from e
    except TypeError as e:  # chat_template_kwargs clashing with the template's own arguments
        raise protocol.invalid("chat_template_kwargs", f"'chat_template_kwargs' is invalid: {e}") from e
    try:
        ids = tok.encode(text, add_special_tokens=False)
        adds_bos = bos is not None and tok.encode("a")[:1] == [bos]
    except TypeError:  # a tokenizer without add_special_tokens
        ids, adds_bos = tok.encode(text), False
    if adds_bos and ids[:1] != [bos]:
        ids = [bos, *ids]
    if not ids:
        raise protocol.invalid("messages", "'messages' render to an empty prompt")
    return ids


async def handle_chat(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    req = protocol.parse_chat_request(await _json_body(request), _served_models(engine), _vocab_size(engine))
    return await _generate(request, req, _chat_prompt(engine, req), "chatcmpl-")


async def _generate(
    request: web.Request, req: protocol.GenerationRequest, prompt: str | list[int], id_prefix: str
) -> web.StreamResponse:
    app = request.app
    engine = app[ENGINE_KEY]
    eloop = app[ENGINE_LOOP_KEY]
    max_tokens = req.max_tokens
    if max_tokens is None:  # chat without a limit: the rest of the context
        max_tokens = engine.max_model_len - len(prompt)
        if max_tokens < 1:
            raise APIError(
                400,
                f"the prompt is {len(prompt)} tokens long, which leaves no room to generate within "
                f"the model's context of {engine.max_model_len} tokens",
                param="messages",
                code="context_length_exceeded",
            )
    params = req.sampling_params(max_tokens)
    rid = id_prefix + uuid.uuid4().hex
    stream = eloop.submit(prompt, params, req.tier, rid)
    try:
        if req.stream:
            return await _stream_response(request, req, stream)
        return await _full_response(req, stream)
    finally:
        eloop.release(rid)


async def _full_response(req: protocol.GenerationRequest, stream: RequestStream) -> web.Response:
    last = None
    while last is None or not last.finished:
        last = (await stream.next_batch())[-1]
    completion_tokens = sum(len(c.token_ids) for c in last.outputs)
    body = protocol.full_response(
        req.kind,
        stream.request_id,
        protocol.now_s(),
        req.model,
        stream.tier,
        [(c.index, c.text, c.finish_reason) for c in sorted(last.outputs, key=lambda c: c.index)],
        protocol.usage(len(last.prompt_token_ids), completion_tokens),
        protocol.timing_dict(last.timing, stream.tier),
    )
    return web.Response(text=_dumps(body), content_type="application/json")


async def _stream_response(
    request: web.Request, req: protocol.GenerationRequest, stream: RequestStream
) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
    await resp.prepare(request)
    rid, model, created, chat = stream.request_id, req.model, protocol.now_s(), req.kind == "chat"
    n = req.sampling["n"]
    finished_choices: set[int] = set()
    try:
        if chat:  # OpenAI opens each choice with the assistant role
            await resp.write(
                b"".join(
                    _sse(protocol.chat_chunk(rid, created, model, i, {"role": "assistant", "content": ""}, None))
                    for i in range(n)
                )
            )
        last = None
        while last is None or not last.finished:
            try:
                batch = await stream.next_batch()
            except APIError as e:  # engine failure or shutdown: tell the client inside the stream
                await resp.write(_sse(e.body()) + _SSE_DONE)
                return resp
            parts = []
            for out in batch:
                for c in out.outputs:
                    if c.index in finished_choices:
                        continue
                    finish = None if c.finish_reason == "abort" else c.finish_reason
                    # new_text never holds a tail that could still become a stop string: the engine keeps
                    # it back until it is sure, since streamed characters cannot be taken back.
                    delta_text = c.new_text
                    if not delta_text and finish is None:
                        continue
                    if finish is not None:
                        finished_choices.add(c.index)
                    if chat:
                        delta = {"content": delta_text} if delta_text else {}
                        parts.append(_sse(protocol.chat_chunk(rid, created, model, c.index, delta, finish)))
                    else:
                        parts.append(_sse(protocol.completion_chunk(rid, created, model, c.index, delta_text, finish)))
            last = batch[-1]
            if last.finished:
                if req.include_usage:
                    completion_tokens = sum(len(c.token_ids) for c in last.outputs)
                    parts.append(
                        _sse(
                            protocol.usage_chunk(
                                req.kind,
                                rid,
                                created,
                                model,
                                protocol.usage(len(last.prompt_token_ids), completion_tokens),
                                protocol.timing_dict(last.timing, stream.tier),
                            )
                        )
                    )
                parts.append(_SSE_DONE)
            if parts:
                await resp.write(b"".join(parts))
    except (ConnectionResetError, ConnectionError):
        # The client went away; _generate's finally aborts the request and frees its KV.
        return resp
    return resp


async def handle_models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    created = request.app[STATE_KEY]["started"]
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "slobench",
            "root": engine.config.model,
            "max_model_len": engine.max_model_len,
        }
        for name in _served_models(engine)
    ]
    return web.json_response({"object": "list", "data": data})


async def handle_health(request: web.Request) -> web.Response:
    eloop = request.app[ENGINE_LOOP_KEY]
    if not eloop.alive:
        return _error_response(APIError(503, "the engine loop is not running", code="engine_dead"))
    if eloop.closing:
        return _error_response(APIError(503, "the server is shutting down", code="shutting_down"))
    return web.json_response({"status": "ok", "model": request.app[ENGINE_KEY].model_name})


async def handle_metrics(request: web.Request) -> web.Response:
    eloop = request.app[ENGINE_LOOP_KEY]
    with contextlib.suppress(Exception):  # stale gauges beat a failed scrape
        await eloop.call_async(eloop._update_stats, timeout=2.0)
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def build_app(engine: Any, api_key: str | None = None) -> web.Application:
    """The aiohttp application over `engine`; the engine thread starts and stops with the app.

    Run it with `web.AppRunner(app, handler_cancellation=True)` (so a client disconnect cancels its
    handler) or aiohttp's test utilities (which set that themselves).
    """
    middlewares = [_errors_middleware]
    if api_key:
        middlewares.append(_auth_middleware(api_key))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[ENGINE_KEY] = engine
    app[METRICS_KEY] = ServerMetrics(engine.model_name, engine.config.max_num_seqs, engine.max_model_len)
    app[STATE_KEY] = {"started": int(time.time())}

    async def start_engine(app: web.Application) -> None:
        eloop = EngineLoop(engine, app[METRICS_KEY], asyncio.get_running_loop())
        app[ENGINE_LOOP_KEY] = eloop
        eloop.start()

    async def stop_engine(app: web.Application) -> None:
        eloop = app[ENGINE_LOOP_KEY]
        eloop.closing = True
        eloop.abort_all()
        await asyncio.get_running_loop().run_in_executor(None, eloop.stop)

    app.on_startup.append(start_engine)
    app.on_shutdown.append(stop_engine)
    app.router.add_post("/v1/completions", handle_completions)
    app.router.add_post("/v1/chat/completions", handle_chat)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    return app


# ------------------------------------------------------------------------------------------- serving


async def _drain(eloop: EngineLoop, timeout: float) -> None:
    """Shutdown: refuse new work, let requests in flight finish for up to `timeout` s, abort the rest."""
    eloop.closing = True
    deadline = time.monotonic() + timeout
    while eloop.streams and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if eloop.streams:
        logger.info("aborting %d requests still in flight", len(eloop.streams))
        eloop.abort_all()
    await asyncio.sleep(0)  # let the handlers write their last event


async def serve(
    engine: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    drain_timeout: float = 5.0,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or `stop` is set); a second signal skips the drain."""
    app = build_app(engine, api_key)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048, reuse_address=True)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        if signals > 1:
            app[ENGINE_LOOP_KEY].abort_all()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
    logger.info("serving %s on http://%s:%d", engine.model_name, host, bound)
    if ready is not None:
        ready(bound)
    try:
        await stop.wait()
        logger.info("shutting down")
        await site.stop()  # stop accepting connections
        await _drain(app[ENGINE_LOOP_KEY], 0.0 if signals > 1 else drain_timeout)
    finally:
        await runner.cleanup()
        for sig in installed:
            loop.remove_signal_handler(sig)


class BackgroundServer:
    """The server on a thread of its own with its own event loop: for tests, benchmarks and tools.

    with BackgroundServer(engine) as srv:
        openai.OpenAI(base_url=srv.url + "/v1", api_key="x") ...
    """

    def __init__(self, engine: Any, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None):
        self.engine = engine
        self.host = host
        self.port = port
        self.api_key = api_key
        self.app = build_app(engine, api_key)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="http-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def engine_loop(self) -> EngineLoop:
        return self.app[ENGINE_LOOP_KEY]

    @property
    def metrics(self) -> ServerMetrics:
        return self.app[METRICS_KEY]

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port, backlog=2048)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            self._runner = runner
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def start(self) -> BackgroundServer:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run `fn` on the engine thread between steps and return its result."""
        return self.engine_loop.call(fn).result(timeout)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until no request is in flight, in the server or in the engine."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.engine_loop.streams and not self.call(self.engine.has_unfinished_requests):
                return
            time.sleep(0.02)
        raise TimeoutError("the server did not become idle")

    def stop(self) -> None:
        loop = self._loop
        if loop is None or not self._thread.is_alive():
            return
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(30)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------------------------- CLI


def _event_loop_runner() -> Callable[[Any], Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return lambda coro: uvloop.run(coro)


def run_server(args: argparse.Namespace) -> None:
    """Build the engine from `args` and serve until SIGINT/SIGTERM."""
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "info")).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from engine import Engine

    try:
        config = config_from_args(args)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    # The engine thread drops the GIL in every torch op and must win it back from the HTTP thread; at
    # Python's default 5 ms switch interval that hand-back stalls steps under load (measured here: 0.5 ms
    # sustains ~25% more streaming requests/s on 2 cores, see bench/server_bench.py).
    sys.setswitchinterval(getattr(args, "switch_interval_ms", SWITCH_INTERVAL_MS) / 1e3)
    t0 = time.monotonic()
    engine = Engine(config)
    logger.info(
        "loaded %s in %.1f s (max_model_len %d)",
        engine.model_name,
        time.monotonic() - t0,
        engine.max_model_len,
    )
    _event_loop_runner()(
        serve(engine, args.host, args.port, args.api_key, drain_timeout=getattr(args, "drain_timeout", 5.0))
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.server", description=__doc__.splitlines()[0])
    add_server_arguments(parser)
    run_server(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
