"""The engine core in a process of its own (engine/server/engine_core.py, engine/server/core_client.py).

tests/server/test_server.py runs the whole server suite in both modes; these are what only the process mode has:
outputs crossing as deltas, refusals crossing the pipe, the core dying, and both processes stopping."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.model.loader import ModelLoadError
from engine.server.core_client import EngineCoreClient, OutputAssembler
from engine.server.engine_core import EngineCore
from engine.server.testing import BackgroundServer
from loadgen.target.embedded import free_port, wait_healthy
from tests.helpers import ENV, REPO, post_json

pytestmark = pytest.mark.slow


def test_deltas_rebuild_the_engines_own_outputs():
    """Every step's outputs, sent as deltas and rebuilt, equal what the in-process engine hands out."""
    engine = Engine(EngineConfig(model="tiny"))
    core = EngineCore(engine, to_front=None)
    assembler = OutputAssembler()
    engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=12, n=2, temperature=1.0, seed=3))
    engine.add_request("a prompt with a stop string", SamplingParams(max_tokens=20, temperature=0, stop=["e"]))
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            rebuilt = assembler.build(core._delta(out))
            assert rebuilt.request_id == out.request_id and rebuilt.finished == out.finished
            assert rebuilt.prompt_token_ids == out.prompt_token_ids
            assert [(c.index, c.token_ids, c.text, c.new_token_ids, c.new_text, c.finish_reason)
                    for c in rebuilt.outputs] == \
                   [(c.index, c.token_ids, c.text, c.new_token_ids, c.new_text, c.finish_reason) for c in out.outputs]
        steps += 1
    assert steps > 1 and not core._started and not assembler._choices  # nothing kept once finished


def test_refusals_cross_the_pipe_with_status_and_headers():
    engine = EngineCoreClient(EngineConfig(model="tiny", admission="queue-length", num_kv_blocks=8, block_size=16,
                                           max_waiting_per_tier={"premium": 4, "standard": 0, "basic": 4}))
    with BackgroundServer(engine) as server:
        req = urllib.request.Request(server.url + "/v1/completions", b'{"prompt": "hi", "max_tokens": 2}',
                                     {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=30)
        assert info.value.code == 429 and info.value.headers["Retry-After"] == "1"
        assert json.loads(info.value.read())["error"]["code"] == "queue_full"
        status, raw = post_json(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 500,
                                                                 "service_tier": "priority"})
        assert status == 400 and json.loads(raw)["error"]["code"] == "exceeds_engine_capacity"
        status, raw = post_json(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 3,
                                                                 "service_tier": "priority"})
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3
        assert server.call(server.engine.stats).admission_rejections["standard"] == 1


def test_the_core_dying_fails_requests_in_flight_and_health():
    engine = EngineCoreClient(EngineConfig(model="tiny", admission="queue-length"))
    server = BackgroundServer(engine).start()
    try:
        body = json.dumps({"prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True}).encode()
        req = urllib.request.Request(server.url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.readline().startswith(b"data: ")  # the stream is under way
            engine.proc.kill()
            rest = resp.read().decode()
        assert "the engine core process exited" in rest and rest.rstrip().endswith("data: [DONE]")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(server.url + "/health", timeout=10)
        assert info.value.code == 503
        status, raw = post_json(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 503 and json.loads(raw)["error"]["code"] == "engine_dead"
    finally:
        server.stop()


def test_a_core_that_cannot_start_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="unknown model 'no-such-model'"):
        EngineCoreClient(EngineConfig(model="no-such-model"))
    with pytest.raises(ModelLoadError, match="(?i)cuda|torch"):  # no GPU here: the core's Engine() fails
        EngineCoreClient(EngineConfig(model="tiny", device="cuda"))


def _core_pids(parent: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"engine.server.engine_core" in cmd:
            pids.append(int(d.name))
    return pids


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text()
    except OSError:
        return False


# A stand-in for slobench's load generator: starts the server as EmbeddedEngine does (its own session, its pid
# as --parent-pid), says the server's pid, and waits.
PARENT = """
import os, subprocess, sys
server = subprocess.Popen([sys.executable, "-m", "engine.server", "--model", "tiny", "--port", sys.argv[1],
                           "--parent-pid", str(os.getpid())], start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(server.pid, flush=True)
server.wait()
"""


def test_the_server_shuts_down_once_the_process_that_started_it_is_gone():
    """A load generator killed outright (SIGKILL) cannot stop its embedded engine, and the engine's own session
    keeps every signal sent to the load generator's from it: with --parent-pid it notices and ends."""
    port = free_port()
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(port)], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, text=True)
    server = int(parent.stdout.readline())
    try:
        wait_healthy(f"http://127.0.0.1:{port}", None, 120)
        cores = _core_pids(server)
        assert len(cores) == 1 and _alive(server)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 30
        while (_alive(server) or _alive(cores[0])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server) and not _alive(cores[0])
    finally:
        for pid in [server, *_core_pids(server)]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_front_end_and_core():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "engine.server", "--model", "tiny", "--port", str(port)],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc, 120)
        cores = _core_pids(proc.pid)
        assert len(cores) == 1
        status, _ = post_json(url + "/v1/completions", {"prompt": "hi", "max_tokens": 3})
        assert status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{cores[0]}") and time.monotonic() < deadline:
            time.sleep(0.05)
        status_file = Path(f"/proc/{cores[0]}/status")
        assert not status_file.exists() or "zombie" in status_file.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        log = proc.stdout.read().decode()
    assert "Traceback" not in log, log


def test_a_reply_for_a_caller_that_gave_up_does_not_stop_the_reader():
    """A client that disconnects while its admission answer is on the way cancels the future its handler
    awaited; the late reply must neither raise in the reader thread nor leave the request running."""
    engine = EngineCoreClient(EngineConfig(model="tiny", admission="queue-length"))
    try:
        gone = engine.request("call", "has_unfinished_requests")
        gone.cancel()
        time.sleep(0.5)  # the reply arrives for a cancelled future
        assert engine.alive and engine._reader.is_alive()
        assert engine.has_unfinished_requests() is False  # later replies still reach their callers

        with BackgroundServer(engine) as server:
            async def storm():
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                    async def drop(i: int) -> None:  # gone before, during or after the admission answer
                        body = {"prompt": f"p{i}", "max_tokens": 2000, "ignore_eos": True, "stream": True}
                        with contextlib.suppress(asyncio.TimeoutError, aiohttp.ClientError):
                            await s.post(server.url + "/v1/completions", json=body,
                                         timeout=aiohttp.ClientTimeout(total=0.001 * (i % 20)))
                    await asyncio.gather(*(drop(i) for i in range(100)))

            asyncio.run(storm())
            assert engine._reader.is_alive()
            status, raw = post_json(server.url + "/v1/completions", {"prompt": "after", "max_tokens": 3})
            assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3
            server.wait_idle(60)  # every dropped request was aborted, none runs on for its 2000 tokens
            stats = server.call(server.engine.stats)
            assert stats.kv_usage == 0 and stats.num_running == 0
    finally:
        engine.stop()
