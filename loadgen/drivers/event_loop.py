"""The run's clock and event loop: ``time.monotonic()`` (system-wide on Linux, so worker processes
share one clock) and a fresh uvloop loop per run."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any


def now() -> float:
    return time.monotonic()


@contextlib.contextmanager
def uvloop_policy():
    """Use uvloop when it is installed (it is a declared dependency on Linux/macOS)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        yield asyncio.new_event_loop
        return
    yield uvloop.new_event_loop


def run_sync(coro_factory: Callable[[], Any]) -> Any:
    """Run a coroutine on a fresh uvloop event loop."""
    with uvloop_policy() as new_loop:
        loop = new_loop()
        try:
            asyncio.set_event_loop(loop)
            return loop.run_until_complete(coro_factory())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            asyncio.set_event_loop(None)
            loop.close()
