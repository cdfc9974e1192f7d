"""Starting and stopping the server: build the engine from flags, serve, drain on SIGINT/SIGTERM.

`run_server` is what `slobench serve` and `python -m engine.server` call; `serve` runs the app on the
current event loop until a signal (or `stop`), then lets requests in flight finish before shutting down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from engine.core.engine import Engine
from engine.model.loader import ModelLoadError
from engine.server.api_server import ENGINE_LOOP_KEY, build_app
from engine.server.core_client import EngineCoreClient
from engine.server.engine_loop import StreamRouter
from engine.server.server_args import SWITCH_INTERVAL_MS, config_from_args

logger = logging.getLogger("engine.server")  # the name the server's log lines have always carried


async def _drain(eloop: StreamRouter, timeout: float) -> None:
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
    parent_pid: int | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or `stop` is set, or the process `parent_pid` is gone: `watch_parent`); a
    second signal skips the drain."""
    app = build_app(engine, api_key)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048, reuse_address=True)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
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
    # What exists now (model, tokenizer, templates, the app) lives for the whole run: freezing it out of the
    # collector's view, with a higher first-generation threshold, spares the event loop the collections of a
    # large heap that otherwise stall it for a few hundred ms now and then under heavy traffic.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    logger.info("serving %s on http://%s:%d", engine.model_name, host, bound)
    if ready is not None:
        ready(bound)
    watcher = asyncio.ensure_future(watch_parent(parent_pid, stop)) if parent_pid is not None else None
    try:
        await stop.wait()
        logger.info("shutting down")
        await site.stop()  # stop accepting connections
        await _drain(app[ENGINE_LOOP_KEY], 0.0 if signals > 1 else drain_timeout)
    finally:
        if watcher is not None:
            watcher.cancel()
        await runner.cleanup()
        for sig in installed:
            loop.remove_signal_handler(sig)


async def watch_parent(parent_pid: int, stop: asyncio.Event, interval_s: float = 1.0) -> None:
    """Set `stop` once this process's parent is no longer `parent_pid` (it died: the orphan was handed to
    init or a subreaper). The parent's own pid, not whether that pid lives: a pid can be reused."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            logger.warning("the process that started this server (pid %d) is gone: shutting down", parent_pid)
            stop.set()
            return
        await asyncio.sleep(interval_s)


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
    try:
        config = config_from_args(args)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    # The engine thread drops the GIL in every torch op and must win it back from the HTTP thread; at
    # Python's default 5 ms switch interval that hand-back stalls steps under load (measured here: 0.5 ms
    # sustains ~25% more streaming requests/s on 2 cores, see bench/server_bench.py).
    sys.setswitchinterval(getattr(args, "switch_interval_ms", SWITCH_INTERVAL_MS) / 1e3)
    t0 = time.monotonic()
    try:
        if getattr(args, "engine_core", "process") == "process":
            engine: Any = EngineCoreClient(config)
        else:
            engine = Engine(config)
    except ModelLoadError as e:
        raise SystemExit(f"error: {e}") from None
    logger.info(
        "loaded %s in %.1f s (max_model_len %d)",
        engine.model_name,
        time.monotonic() - t0,
        engine.max_model_len,
    )
    _event_loop_runner()(
        serve(engine, args.host, args.port, args.api_key, drain_timeout=getattr(args, "drain_timeout", 5.0),
              parent_pid=getattr(args, "parent_pid", None))
    )
