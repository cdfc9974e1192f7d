"""The engine core in a process of its own: the scheduler and the model loop, apart from the HTTP front end.

`slobench serve` runs the aiohttp front end (parsing, chat templates, tokenization, SSE) in one process and
this core in another, as vLLM does with its EngineCore: the front end's work no longer competes with the
model loop for one interpreter lock, so under load a step is not held up by HTTP and an HTTP response is
not held up by a step. The front end's side is `engine/server/core_client.py`. Two one-way pipes carry pickled
tuples:

    front -> core   ("add", call_id, request_id, prompt, params, tier)   ("abort", request_id)
                    ("call", call_id, name)                               ("shutdown",)
    core -> front   ("ready", facts) or ("error", message) once, then
                    ("reply", call_id, ok, value)   ("out", [delta, ...])   ("stats", EngineStats)
                    ("failed", message)

A receiver thread takes the front end's messages as they come: `add_request` and `abort` are thread-safe
and only queue work, so an admission answer (accepted, or the 429 with its reason) comes back at once,
mid-step. Calls (`stats`, `check_integrity`, `has_unfinished_requests`) run between steps on the engine
thread. Each step's outputs cross in one message, as deltas (`OutputDelta`: the tokens and text new since
the request's last output); the front end rebuilds the cumulative view, since sending every request's whole
token list each step would make a long stream's traffic grow with the square of its length. Timing is
stamped here, where it happens, on `time.monotonic()`, which on Linux is one clock for every process: the
queue / prefill / decode breakdown stays exact.
"""

from __future__ import annotations

import gc
import signal
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from engine.request.config import EngineConfig
from engine.request.errors import EngineError
from engine.request.outputs import RequestOutput, Timing
from engine.server.api_errors import APIError, map_engine_error
from engine.server.engine_loop import EngineThread

CALLS = ("stats", "check_integrity", "has_unfinished_requests")  # engine methods the front end may call


@dataclass
class ChoiceDelta:
    index: int
    new_token_ids: list[int]
    new_text: str
    finish_reason: str | None


@dataclass
class OutputDelta:
    """One request's output of one step, as it crosses to the front end."""

    request_id: str
    tier: str
    prompt_token_ids: list[int] | None  # only on the request's first output
    choices: list[ChoiceDelta]
    finished: bool
    timing: Timing | None
    num_cached_tokens: int
    error: str | None = None
    retry_after_s: int | None = None


def api_error_fields(err: APIError) -> tuple:
    """An APIError as plain data (an exception with keyword-only arguments does not survive pickling)."""
    return (err.status, err.message, err.param, err.type, err.code, err.headers)


def api_error_from_fields(fields: tuple) -> APIError:
    status, message, param, type_, code, headers = fields
    return APIError(status, message, param=param, type=type_, code=code, headers=headers)


class EngineCore:
    """The engine thread plus a receiver for the front end's messages, in the core process."""

    def __init__(self, engine: Any, to_front: Connection):
        self.engine = engine
        self.to_front = to_front
        self._send_lock = threading.Lock()
        self._started: set[str] = set()  # requests whose prompt ids the front end has
        self.thread = EngineThread(engine, self._send_outputs, lambda m: self._send(("failed", m)),
                                   lambda s: self._send(("stats", s)))

    def _send(self, msg: tuple) -> None:
        try:
            with self._send_lock:
                self.to_front.send(msg)
        except (BrokenPipeError, EOFError, OSError):
            pass  # the front end is gone; the receiver sees it and stops the core

    def _delta(self, out: RequestOutput) -> OutputDelta:
        first = out.request_id not in self._started
        if out.finished:
            self._started.discard(out.request_id)
        elif first:
            self._started.add(out.request_id)
        return OutputDelta(
            out.request_id, out.tier, out.prompt_token_ids if first else None,
            [ChoiceDelta(c.index, c.new_token_ids, c.new_text, c.finish_reason) for c in out.outputs],
            out.finished, out.timing, out.num_cached_tokens, out.error, out.retry_after_s,
        )

    def _send_outputs(self, outs: list[RequestOutput]) -> None:  # engine thread
        self._send(("out", [self._delta(o) for o in outs]))

    def _add(self, call_id: int, request_id: str, prompt: Any, params: Any, tier: str) -> None:
        try:
            self.engine.add_request(prompt, params, tier=tier, request_id=request_id)
        except EngineError as e:
            self._send(("reply", call_id, False, api_error_fields(map_engine_error(e))))
            return
        except Exception as e:  # the in-process server answers these with a 500 too
            err = APIError(500, f"internal server error: {type(e).__name__}", code="internal_error")
            self._send(("reply", call_id, False, api_error_fields(err)))
            return
        self._send(("reply", call_id, True, None))

    def _call(self, call_id: int, name: str) -> None:
        if name not in CALLS:
            self._send(("reply", call_id, False, api_error_fields(APIError(500, f"no engine call {name!r}"))))
            return

        def done(fut) -> None:
            err = fut.exception()
            if err is None:
                self._send(("reply", call_id, True, fut.result()))
            else:
                api_error = APIError(500, f"{type(err).__name__}: {err}")
                self._send(("reply", call_id, False, api_error_fields(api_error)))

        self.thread.call(getattr(self.engine, name)).add_done_callback(done)

    def serve(self, from_front: Connection) -> None:
        """Take the front end's messages until it says shutdown or goes away."""
        self.thread.start()
        try:
            while True:
                try:
                    msg = from_front.recv()
                except (EOFError, OSError):
                    return  # the front end exited: nobody is left to serve
                kind = msg[0]
                if kind == "add":
                    self._add(*msg[1:])
                elif kind == "abort":
                    self.engine.abort(msg[1])
                elif kind == "call":
                    self._call(*msg[1:])
                elif kind == "shutdown":
                    return
        finally:
            self.thread.stop()


def run_engine_core(config: EngineConfig, from_front: Connection, to_front: Connection) -> None:
    """Build the engine, say ready (or why not), serve."""
    from engine.core.engine import Engine  # here, so that the front end's import of this module stays light

    try:
        engine = Engine(config)
    except Exception as e:
        to_front.send(("error", f"{type(e).__name__}: {e}"))
        return
    gc.collect()
    gc.freeze()  # the engine's long-lived objects leave the collector's view (as the front end's: launch.py)
    gc.set_threshold(50_000, 50, 100)
    to_front.send(("ready", {"model_name": engine.model_name, "max_model_len": engine.max_model_len}))
    EngineCore(engine, to_front).serve(from_front)


def main(argv: list[str]) -> None:
    """``python -m engine.server.engine_core READ_FD WRITE_FD``: the process `EngineCoreClient` starts.

    A plain child process on two inherited pipe ends, not a multiprocessing one: spawn would re-import the
    parent's main script, which a user's script or a bench does not guard. The first message is the setup.
    """
    # The front end decides when the core stops (it drains first); the core also ends when the front end
    # goes away, since its pipe then reads end-of-file, so ignoring a signal sent to the whole group is safe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from_front, to_front = Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False)
    kind, config, switch_interval_s = from_front.recv()
    assert kind == "setup", kind
    sys.setswitchinterval(switch_interval_s)
    run_engine_core(config, from_front, to_front)


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy's: what crosses the pipe must pickle under
    # the module's real name (engine.engine_core.OutputDelta), which the front end can unpickle.
    from engine.server.engine_core import main as _main

    _main(sys.argv[1:])
