"""The engine thread, and the bridge between it and the server's event loop.

`EngineThread` runs `Engine.step()` in a loop and hands each step's outputs, failures and stats to callbacks.
`StreamRouter` is the event-loop side and the engine handle the HTTP app holds: one `RequestStream` per
request, fed with that request's outputs, over a `StepDriver` that runs the steps. `EngineLoop` joins the two
in one process (the engine thread hands a step's outputs to the event loop in one `call_soon_threadsafe`);
`ProcessEngineLoop` (engine/server/core_client.py) joins them across processes instead, with the engine
thread in an engine-core process of its own (engine/server/engine_core.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from engine.server.api_errors import APIError
from engine.server.metrics import ServerMetrics

logger = logging.getLogger("engine.server")

STATS_INTERVAL_S = 0.05  # engine-state gauges refresh at most this often while busy
IDLE_WAIT_S = 0.05  # the idle engine thread wakes this often to run calls and notice shutdown
ENGINE_FAILED = "the engine failed while running this request"


class RequestStream:
    """One request's outputs as the event loop receives them."""

    __slots__ = ("request_id", "tier", "items", "event", "error", "finished", "started")

    def __init__(self, request_id: str, tier: str):
        self.request_id = request_id
        self.tier = tier
        self.items: list[Any] = []
        self.event = asyncio.Event()
        self.error: APIError | None = None
        self.finished = False
        self.started = False  # an output has arrived (the router wakes first outputs' handlers first)

    async def next_batch(self) -> list[Any]:
        """Every output that arrived since the last call (waits for at least one); raises on failure."""
        while not self.items:
            if self.error is not None:
                raise self.error
            await self.event.wait()
            self.event.clear()
        items, self.items = self.items, []
        return items


class EngineThread:
    """`engine.step()` in a loop on a thread of its own; calls run between steps.

    on_outputs(outs) gets each step's outputs, on_failure(message) a step that raised (the engine's
    requests in flight are then lost), on_stats(stats) the engine's stats at most every STATS_INTERVAL_S
    while busy and once when it goes idle.
    """

    def __init__(self, engine: Any, on_outputs: Callable[[list[Any]], None], on_failure: Callable[[str], None],
                 on_stats: Callable[[Any], None]):
        self.engine = engine
        self.on_outputs = on_outputs
        self.on_failure = on_failure
        self.on_stats = on_stats
        self.step_errors = 0
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run_calls(self) -> None:
        while True:
            try:
                fn, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # delivered to the caller
                fut.set_exception(e)

    def update_stats(self) -> None:
        try:
            self.on_stats(self.engine.stats())
        except Exception:
            logger.exception("engine stats failed")

    def _run(self) -> None:
        engine = self.engine
        last_stats = 0.0
        idle_stats_done = False
        while not self._stop.is_set():
            self._run_calls()
            if engine.has_unfinished_requests():
                idle_stats_done = False
                try:
                    outs = engine.step()
                except Exception:
                    self.step_errors += 1
                    logger.exception("engine step failed; failing the requests in flight")
                    self.on_failure(ENGINE_FAILED)
                    time.sleep(0.01)
                    continue
                if outs:
                    self.on_outputs(outs)
                now = time.monotonic()
                if now - last_stats >= STATS_INTERVAL_S:
                    last_stats = now
                    self.update_stats()
            else:
                if not idle_stats_done:
                    idle_stats_done = True
                    self.update_stats()
                engine.wait_for_work(IDLE_WAIT_S)
        self._run_calls()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` on the engine thread between steps (e.g. `engine.stats`, `engine.check_integrity`)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if not self.alive:
            fut.set_exception(RuntimeError("the engine loop is not running"))
            return fut
        self._calls.put((fn, fut))
        return fut

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)


class StepDriver(Protocol):
    """What runs the engine's steps for a `StreamRouter`: `EngineThread` on a thread of this process, or
    `EngineCoreClient` (engine/server/core_client.py) with the engine in a core process of its own."""

    step_errors: int  # steps that raised, each failing the requests then in flight

    @property
    def alive(self) -> bool: ...

    def start(self) -> None: ...

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` between two steps of the engine; the future gets its result."""

    def stop(self, timeout: float = 10.0) -> None: ...


class StreamRouter:
    """The engine handle the HTTP app holds: each request's stream, fed by `_deliver`; ending a stream early
    aborts its request.

    Its two kinds, `EngineLoop` (below) and `ProcessEngineLoop` (engine/server/core_client.py), set `engine`
    (what takes requests and aborts) and `driver` (what runs the steps), and say how a request reaches the
    engine (`_add`) and how the engine-state gauges are refreshed (`refresh_stats`).
    """

    engine: Any
    driver: StepDriver

    def __init__(self, metrics: ServerMetrics, loop: asyncio.AbstractEventLoop):
        self.metrics = metrics
        self.loop = loop
        self.streams: dict[str, RequestStream] = {}  # event-loop thread only
        self.closing = False

    def start(self) -> None:
        self.driver.start()

    @property
    def alive(self) -> bool:
        return self.driver.alive

    @property
    def step_errors(self) -> int:
        return self.driver.step_errors

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` between two steps of the engine and get its result from the future."""
        return self.driver.call(fn)

    def stop(self, timeout: float = 10.0) -> None:
        self.driver.stop(timeout)

    async def refresh_stats(self, timeout: float = 2.0) -> None:
        """The engine-state gauges, fresh (for a /metrics scrape)."""
        raise NotImplementedError

    async def _add(self, prompt: str | list[int], params: Any, tier: str, request_id: str) -> None:
        raise NotImplementedError

    def _abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def submit(self, prompt: str | list[int], params: Any, tier: str, request_id: str) -> RequestStream:
        """Hand a request to the engine; raises its refusal (an EngineError or APIError) at once."""
        if self.closing:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if not self.alive:
            raise APIError(503, "the engine loop is not running", code="engine_dead")
        stream = RequestStream(request_id, tier)
        self.streams[request_id] = stream
        try:
            await self._add(prompt, params, tier, request_id)
        except BaseException:
            self.streams.pop(request_id, None)
            raise
        return stream

    def release(self, request_id: str) -> None:
        """The handler is done with this request: abort it in the engine unless it already finished."""
        if self.streams.pop(request_id, None) is not None:
            self._abort(request_id)

    def _on_outputs(self, outs: list[Any]) -> None:  # the thread that receives the engine's outputs
        self.metrics.record_outputs(outs)
        self._post(self._deliver, outs)

    def _on_failure(self, message: str) -> None:  # the same thread: the engine lost its requests in flight
        self._post(self._fail_all, message)

    def _post(self, fn: Callable, *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is listening any more
            self.loop.call_soon_threadsafe(fn, *args)

    def _deliver(self, outs: list[Any]) -> None:
        streams = self.streams
        first: list[RequestStream] = []
        later: list[RequestStream] = []
        for out in outs:
            stream = streams.get(out.request_id)
            if stream is None:
                continue
            stream.items.append(out)
            if out.finished:
                stream.finished = True
                del streams[out.request_id]
            (later if stream.started else first).append(stream)
            stream.started = True
        # Handlers wake in the order their events are set: a request's first output goes out before the next
        # tokens of the streams already flowing, since its client is still waiting for its first token and
        # each handler the loop runs ahead of it (an SSE chunk each) would add to that wait.
        for stream in first + later:
            stream.event.set()

    def _fail_all(self, message: str, status: int = 500, code: str = "engine_error") -> None:
        for rid, stream in list(self.streams.items()):
            self._abort(rid)
            stream.error = APIError(status, message, code=code)
            stream.event.set()
        self.streams.clear()

    def abort_all(self) -> None:
        """Shutdown: end every request in flight (their streams end with an error event)."""
        self._fail_all("the server is shutting down", status=503, code="shutting_down")


class EngineLoop(StreamRouter):
    """The engine on a thread of this process, its outputs routed to per-request streams."""

    def __init__(self, engine: Any, metrics: ServerMetrics, loop: asyncio.AbstractEventLoop):
        super().__init__(metrics, loop)
        self.engine = engine
        self.driver = EngineThread(engine, self._on_outputs, self._on_failure, metrics.update_stats)

    async def _add(self, prompt: str | list[int], params: Any, tier: str, request_id: str) -> None:
        self.engine.add_request(prompt, params, tier=tier, request_id=request_id)

    async def refresh_stats(self, timeout: float = 2.0) -> None:
        await asyncio.wait_for(asyncio.wrap_future(self.driver.call(self.driver.update_stats)), timeout)
