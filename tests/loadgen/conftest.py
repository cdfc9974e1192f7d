"""Fixtures shared by the load generator's tests: `engine_server`, the reference engine's server in this process
(the mock server and the engine in a process of its own are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def engine_server():
    """A fresh `tiny` engine's server on a loopback port, on a thread of this process (`BackgroundServer`: `.url`,
    `.engine`, `.call`, `.wait_idle`), stopped after the test. Queue-length admission: a busy machine makes the
    SLO-aware one refuse requests, and these tests are about what the load generator sends and reads."""
    from engine import Engine, EngineConfig
    from engine.server.testing import BackgroundServer

    server = BackgroundServer(Engine(EngineConfig(model="tiny", admission="queue-length"))).start()
    yield server
    server.stop()
