"""Helpers for the end-to-end tests: the `slobench` CLI as a subprocess, and mock targets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from loadgen.target.embedded import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def serving_engine(config, engine_core: str = "thread"):
    """What a BackgroundServer serves: the engine in this process (thread) or in a core process of its own."""
    from engine import Engine
    from engine.server.core_client import EngineCoreClient

    return EngineCoreClient(config) if engine_core == "process" else Engine(config)


def slobench(*args, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *map(str, args)], cwd=REPO, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def post_json(url: str, body: dict, timeout: float = 60) -> tuple[int, bytes]:
    """(status, raw body) of a JSON POST, errors included: the tests read error bodies as they are."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (loopback)
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def finished_by_reason(url: str) -> dict[str, float]:
    """An engine server's `vllm:request_success_total` per finished reason (stop, length, abort) so far."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:  # noqa: S310 (loopback)
        text = r.read().decode()
    return {s.labels["finished_reason"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "vllm:request_success_total"}


class MockServers:
    """`servers(*mock-server flags) -> url`; every one started is stopped at the end of the test."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def __call__(self, *args) -> str:
        port = free_port()
        p = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "mock-server", "--port", str(port),
                              *map(str, args)], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.procs.append(p)
        wait_healthy(f"http://127.0.0.1:{port}", p, 30)
        return f"http://127.0.0.1:{port}"

    @property
    def last(self) -> subprocess.Popen:
        return self.procs[-1]

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(10)


def run_engine(engine, max_steps: int, arrive=None, last_arrival: int = -1) -> dict[str, list[list[int]]]:
    """Step an in-process engine until every request has finished, checking block integrity after each step;
    ``arrive(step)`` adds the requests due at a step (up to ``last_arrival``). Fails when requests are left
    after ``max_steps`` or KV blocks are held at the end. Returns each finished request's n token lists."""
    done: dict[str, list[list[int]]] = {}
    for step in range(max_steps):
        if arrive is not None and step <= last_arrival:
            arrive(step)
        if step >= last_arrival and not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                done[out.request_id] = [c.token_ids for c in sorted(out.outputs, key=lambda c: c.index)]
        engine.check_integrity()
    assert not engine.has_unfinished_requests(), f"no progress in {max_steps} steps: {engine.stats()}"
    kv = engine.block_manager.stats()
    assert kv.used_blocks == 0 and kv.host_used_blocks == 0, "KV blocks left once every request finished"
    return done
