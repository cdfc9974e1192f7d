"""A test harness: the server on a thread of its own, for tests, benchmarks and tools."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from engine.server.api_server import ENGINE_LOOP_KEY, METRICS_KEY, build_app
from engine.server.engine_loop import StreamRouter
from engine.server.metrics import ServerMetrics


class BackgroundServer:
    """The server on a thread of its own with its own event loop: for tests, benchmarks and tools.

    `engine` is an `Engine` (run on a thread of this process) or an `EngineCoreClient` (its own process).

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
    def engine_loop(self) -> StreamRouter:
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
            self.port = runner.addresses[0][1]
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
