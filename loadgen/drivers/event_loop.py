"""The run's clock and event loop: ``time.monotonic()`` (system-wide on Linux, so worker processes
share one clock), a fresh uvloop loop per run, and the signals that stop a run gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from typing import Any

# Ctrl-C, and SIGTERM: what a cancelled CI job, `timeout` or `kill` sends. Either stops a run the same way:
# what was measured is saved, and an embedded engine (its own session, so the signal never reaches it) is
# stopped by the run's own clean-up. The reason starts with "interrupted": the commands exit 130 on it.
STOP_SIGNALS = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "interrupted (SIGTERM)"}


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


def add_stop_handlers(loop: asyncio.AbstractEventLoop, stop: Callable[[str], Any]) -> dict:
    """While a run's loop runs, each of ``STOP_SIGNALS`` calls ``stop(reason)``. Returns the handlers they
    had, for ``remove_stop_handlers``."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, reason in STOP_SIGNALS.items():
        loop.add_signal_handler(sig, stop, reason)
    return previous


def remove_stop_handlers(loop: asyncio.AbstractEventLoop, previous: dict) -> None:
    """The signals back to the handlers they had before ``add_stop_handlers``."""
    for sig, handler in previous.items():
        loop.remove_signal_handler(sig)
        if handler is not None:  # None: one set outside Python, which cannot be put back from here
            signal.signal(sig, handler)
