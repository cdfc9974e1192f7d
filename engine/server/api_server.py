"""The OpenAI-compatible HTTP app over the engine: routes, middlewares and handlers.

Completions and chat, streamed or whole, with tiers; /v1/models, /health and /metrics. The engine runs on
its own thread (engine_loop.py) or in an engine-core process (engine_core.py, core_client.py); the aiohttp
event loop owns everything HTTP. A handler that ends early
(client disconnect cancels it, or a write fails) aborts its request at once. Starting and stopping a
server is launch.py's job; testing.py runs one on a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from engine.request.errors import EngineError
from engine.server.api_errors import APIError, engine_failed_error, map_engine_error, shed_error
from engine.server.api_requests import GenerationRequest, parse_chat_request, parse_completion_request
from engine.server.api_responses import (
    SSE_DONE,
    SSE_HEADERS,
    chat_chunk,
    completion_chunk,
    dumps,
    front_end_ms,
    full_response,
    now_s,
    sse_event,
    timing_dict,
    usage,
    usage_chunk,
)
from engine.server.chat import chat_prompt_ids
from engine.server.core_client import EngineCoreClient, ProcessEngineLoop
from engine.server.engine_loop import EngineLoop, RequestStream, StreamRouter
from engine.server.metrics import CONTENT_TYPE, ServerMetrics

# The server's modules (app, launch, engine loop) log under one name, the one its log lines have always carried.
logger = logging.getLogger("engine.server")

MAX_BODY_BYTES = 32 * 1024 * 1024

ENGINE_KEY = web.AppKey("engine", object)
ENGINE_LOOP_KEY = web.AppKey("engine_loop", StreamRouter)
METRICS_KEY = web.AppKey("metrics", ServerMetrics)
STATE_KEY = web.AppKey("state", dict)


def _error_response(err: APIError) -> web.Response:
    return web.Response(
        status=err.status, text=dumps(err.body()), content_type="application/json", headers=err.headers
    )


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
    received = time.monotonic()
    engine = request.app[ENGINE_KEY]
    req = parse_completion_request(await _json_body(request), _served_models(engine), _vocab_size(engine))
    return await _generate(request, req, req.prompt, "cmpl-", received)


async def handle_chat(request: web.Request) -> web.StreamResponse:
    received = time.monotonic()
    engine = request.app[ENGINE_KEY]
    req = parse_chat_request(await _json_body(request), _served_models(engine), _vocab_size(engine))
    prompt = chat_prompt_ids(engine.tokenizer, req.messages, req.add_generation_prompt, req.chat_template_kwargs)
    return await _generate(request, req, prompt, "chatcmpl-", received)


async def _generate(
    request: web.Request, req: GenerationRequest, prompt: str | list[int], id_prefix: str, received: float
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
    stream = await eloop.submit(prompt, params, req.tier, rid)
    try:
        # The answer's status waits for the engine's first visible output (text, or the finish): a request shed
        # before it showed anything (SLO-aware admission, engine/core/admission_control.py) is still a plain
        # 429, streamed or not. Outputs without text (an incomplete character held back) are kept for the stream.
        first = await stream.next_batch()
        while not any(o.finished or any(c.new_text for c in o.outputs) for o in first):
            first += await stream.next_batch()
        clock = (received, time.monotonic())  # for the front end's share of the TTFT
        refused = shed_error(first[-1], req.tier, app[ENGINE_KEY].config) or engine_failed_error(first[-1])
        if refused is not None:  # shed (429), or the engine failed this request alone before it showed anything
            raise refused
        if req.stream:
            return await _stream_response(request, req, stream, first, clock)
        return await _full_response(req, stream, first, clock)
    finally:
        eloop.release(rid)


async def _full_response(req: GenerationRequest, stream: RequestStream, first: list[Any],
                         clock: tuple[float, float]) -> web.Response:
    last = first[-1]
    while not last.finished:
        last = (await stream.next_batch())[-1]
    if (failed := engine_failed_error(last)) is not None:
        raise failed
    completion_tokens = sum(len(c.token_ids) for c in last.outputs)
    body = full_response(
        req.kind,
        stream.request_id,
        now_s(),
        req.model,
        stream.tier,
        [(c.index, c.text, c.finish_reason) for c in sorted(last.outputs, key=lambda c: c.index)],
        usage(len(last.prompt_token_ids), completion_tokens, last.num_cached_tokens),
        timing_dict(last.timing, stream.tier, front_end_ms(*clock, last.timing)),
    )
    return web.Response(text=dumps(body), content_type="application/json")


async def _stream_response(
    request: web.Request, req: GenerationRequest, stream: RequestStream, first: list[Any], clock: tuple[float, float]
) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    rid, model, created, chat = stream.request_id, req.model, now_s(), req.kind == "chat"
    n = req.sampling["n"]
    finished_choices: set[int] = set()
    try:
        # OpenAI opens each choice with the assistant role; it goes out with the first tokens
        opening = [sse_event(chat_chunk(rid, created, model, i, {"role": "assistant", "content": ""}, None))
                   for i in range(n)] if chat else []
        last, batch = None, first
        while last is None or not last.finished:
            if batch is None:
                try:
                    batch = await stream.next_batch()
                except APIError as e:  # engine failure or shutdown: tell the client inside the stream
                    await resp.write(sse_event(e.body()) + SSE_DONE)
                    return resp
            parts, opening = opening, []
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
                        parts.append(sse_event(chat_chunk(rid, created, model, c.index, delta, finish)))
                    else:
                        parts.append(sse_event(completion_chunk(rid, created, model, c.index, delta_text, finish)))
            last = batch[-1]
            if (failed := engine_failed_error(last)) is not None:  # this request alone: its own error event
                await resp.write(b"".join(parts) + sse_event(failed.body()) + SSE_DONE)
                return resp
            if last.finished:
                if req.include_usage:
                    completion_tokens = sum(len(c.token_ids) for c in last.outputs)
                    parts.append(
                        sse_event(
                            usage_chunk(
                                req.kind,
                                rid,
                                created,
                                model,
                                usage(len(last.prompt_token_ids), completion_tokens, last.num_cached_tokens),
                                timing_dict(last.timing, stream.tier, front_end_ms(*clock, last.timing)),
                            )
                        )
                    )
                parts.append(SSE_DONE)
            if parts:
                await resp.write(b"".join(parts))
            batch = None
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


async def handle_tokenize(request: web.Request) -> web.Response:
    """vLLM's ``POST /tokenize`` (``prompt``, ``add_special_tokens``): a load generator measures text with it."""
    body = await _json_body(request)
    prompt = body.get("prompt") if isinstance(body, dict) else None
    if not isinstance(prompt, str):
        raise APIError(400, "'prompt' must be a string", param="prompt", code="invalid_type")
    special = body.get("add_special_tokens", True)
    engine = request.app[ENGINE_KEY]
    ids = engine.tokenizer.encode(prompt, add_special_tokens=special is not False)
    return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len})


async def handle_detokenize(request: web.Request) -> web.Response:
    body = await _json_body(request)
    ids = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise APIError(400, "'tokens' must be an array of token ids", param="tokens", code="invalid_type")
    return web.json_response({"prompt": request.app[ENGINE_KEY].tokenizer.decode(ids)})


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
        await eloop.refresh_stats(timeout=2.0)
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def build_app(engine: Any, api_key: str | None = None) -> web.Application:
    """The aiohttp application over `engine`; the engine thread starts and stops with the app.

    `engine` is an in-process `Engine` (its thread runs in this process) or an `EngineCoreClient` (the engine
    runs in a core process of its own, which stops with the app).

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
        loop_type = ProcessEngineLoop if isinstance(engine, EngineCoreClient) else EngineLoop
        eloop = loop_type(engine, app[METRICS_KEY], asyncio.get_running_loop())
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
    app.router.add_post("/tokenize", handle_tokenize)
    app.router.add_post("/detokenize", handle_detokenize)
    return app
