"""The HTTP front end's side of an engine-core process (engine/server/engine_core.py holds the wire format).

`EngineCoreClient` starts the core process and stands in for the engine where the HTTP layer needs one: the
model's facts (name, context, tokenizer: loaded here too, without the weights, so that parsing, chat
templates and tokenization stay in the front end) and the calls tests and tools make (`stats`,
`check_integrity`, `has_unfinished_requests`, each a round trip that runs between two steps). It is also the
`StepDriver` of the streams (engine/server/engine_loop.py). A reader thread takes the core's messages:
replies resolve their futures, step outputs are rebuilt into the engine's `RequestOutput` objects
(`OutputAssembler`) and handed on. `ProcessEngineLoop` is the `StreamRouter` over it, what `EngineLoop` is
over an in-process engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from engine.model.loader import ModelLoadError, load_tokenizer
from engine.request.config import EngineConfig
from engine.request.outputs import CompletionOutput, RequestOutput
from engine.server.api_errors import APIError
from engine.server.engine_core import OutputDelta, api_error_from_fields
from engine.server.engine_loop import StreamRouter
from engine.server.metrics import ServerMetrics

logger = logging.getLogger("engine.server")

START_TIMEOUT_S = 600.0  # building a large checkpoint's engine can take minutes
CALL_TIMEOUT_S = 30.0
CORE_EXITED = "the engine core process exited"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where `python -m engine.server.engine_core` finds the package


class OutputAssembler:
    """Rebuilds cumulative RequestOutputs from the core's per-step deltas (reader thread only)."""

    def __init__(self) -> None:
        self._prompts: dict[str, list[int]] = {}
        self._choices: dict[str, dict[int, list]] = {}  # request -> choice index -> [token ids, text]

    def build(self, d: OutputDelta) -> RequestOutput:
        if d.prompt_token_ids is not None:
            self._prompts[d.request_id] = d.prompt_token_ids
        prompt = self._prompts.get(d.request_id, [])
        acc = self._choices.setdefault(d.request_id, {})
        outputs = []
        for c in d.choices:
            state = acc.setdefault(c.index, [[], ""])
            state[0].extend(c.new_token_ids)
            state[1] += c.new_text  # what the engine released is final: its text is the deltas joined
            # one token list per choice, growing in place: readers take its length or read it once finished
            outputs.append(CompletionOutput(c.index, state[0], state[1], c.new_token_ids, c.new_text,
                                            c.finish_reason))
        if d.finished:
            self._prompts.pop(d.request_id, None)
            self._choices.pop(d.request_id, None)
        return RequestOutput(d.request_id, d.tier, prompt, outputs, d.finished, d.timing, d.num_cached_tokens,
                             d.error, d.retry_after_s)


def _settle(fut: concurrent.futures.Future, result: Any = None, exception: BaseException | None = None) -> None:
    """Resolve a caller's future unless the caller gave up on it: an HTTP handler cancelled by its client's
    disconnect cancels the future it awaited (asyncio.wrap_future), and a late reply is then nobody's."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if exception is None:
            fut.set_result(result)
        else:
            fut.set_exception(exception)


class EngineCoreClient:
    """An engine in a child process, seen from the front end."""

    def __init__(self, config: EngineConfig, switch_interval_s: float | None = None,
                 start_timeout_s: float = START_TIMEOUT_S):
        self.config = config
        self.model_config, self.tokenizer = load_tokenizer(config.model)  # fails fast on a bad model name
        self.on_outputs: Callable[[list[RequestOutput]], None] = lambda outs: None
        self.on_stats: Callable[[Any], None] = lambda stats: None
        self.on_failure: Callable[[str], None] = lambda message: None
        self.step_errors = 0  # steps that raised in the core
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._exited = threading.Event()
        self._assembler = OutputAssembler()
        # A fresh interpreter on two inherited pipe ends (not fork: this process may hold torch's threads)
        core_r, front_w = os.pipe()
        front_r, core_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-m", "engine.server.engine_core", str(core_r), str(core_w)],
                                     pass_fds=(core_r, core_w), cwd=PACKAGE_ROOT)
        os.close(core_r)
        os.close(core_w)
        self._to_core = Connection(front_w, readable=False)
        self._from_core = Connection(front_r, writable=False)
        switch = sys.getswitchinterval() if switch_interval_s is None else switch_interval_s
        self._send(("setup", config, switch))
        facts = self._await_ready(start_timeout_s)
        self.model_name: str = facts["model_name"]
        self.max_model_len: int = facts["max_model_len"]
        self._reader = threading.Thread(target=self._read, name="engine-core-reader", daemon=True)
        self._reader.start()

    def _await_ready(self, timeout_s: float) -> dict:
        if not self._from_core.poll(timeout_s):
            self.proc.kill()
            raise ModelLoadError(f"the engine core did not start within {timeout_s:.0f} s")
        try:
            kind, payload = self._from_core.recv()
        except EOFError:
            self.proc.wait(5)
            code = self.proc.returncode
            raise ModelLoadError(f"the engine core process exited while starting (exit code {code})") from None
        if kind != "ready":
            self.proc.wait(5)
            raise ModelLoadError(payload)
        return payload

    # ---- the core's messages (reader thread) -----------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                try:
                    msg = self._from_core.recv()
                except (EOFError, OSError):
                    return
                try:
                    self._dispatch(msg)
                except Exception:  # one message gone wrong must not take every later reply with it
                    logger.exception("engine core message %r failed", msg[0])
        finally:
            self._exited.set()
            with self._lock:
                pending, self._pending = list(self._pending.values()), {}
            for fut in pending:
                _settle(fut, exception=APIError(503, CORE_EXITED, code="engine_dead"))
            self.on_failure(CORE_EXITED)

    def _dispatch(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "out":
            self.on_outputs([self._assembler.build(d) for d in msg[1]])
        elif kind == "reply":
            _, call_id, ok, value = msg
            with self._lock:
                fut = self._pending.pop(call_id, None)
            if fut is not None and ok:
                _settle(fut, result=value)
            elif fut is not None:
                _settle(fut, exception=api_error_from_fields(value))
        elif kind == "stats":
            self.on_stats(msg[1])
        elif kind == "failed":
            self.step_errors += 1
            self.on_failure(msg[1])

    # ---- to the core ------------------------------------------------------------------------------
    def start(self) -> None:
        """Nothing to start: the core runs from the constructor on (it says ready before the model's facts
        are known)."""

    @property
    def alive(self) -> bool:
        return not self._exited.is_set() and self.proc.poll() is None

    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            self._to_core.send(msg)

    def request(self, kind: str, *args: Any) -> concurrent.futures.Future:
        """Send a message that the core answers; the future gets the reply (or the core's APIError)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        call_id = next(self._ids)
        with self._lock:
            if self._exited.is_set():
                fut.set_exception(APIError(503, CORE_EXITED, code="engine_dead"))
                return fut
            self._pending[call_id] = fut
        try:
            self._send((kind, call_id, *args))
        except (BrokenPipeError, OSError):
            with self._lock:
                self._pending.pop(call_id, None)
            fut.set_exception(APIError(503, CORE_EXITED, code="engine_dead"))
        return fut

    def add_request(self, prompt: str | list[int], params: Any, tier: str, request_id: str) \
            -> concurrent.futures.Future:
        # Text is tokenized here, in the front end, as the in-process engine would (an empty prompt goes on
        # as is, for the engine's own error).
        if isinstance(prompt, str) and prompt:
            prompt = self.tokenizer.encode(prompt)
        return self.request("add", request_id, prompt, params, tier)

    def abort(self, request_id: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):  # the core is gone, and the request with it
            self._send(("abort", request_id))

    def _call_in_core(self, name: str, timeout: float = CALL_TIMEOUT_S) -> Any:
        return self.request("call", name).result(timeout)

    # the engine methods that tests and tools call (each runs between two steps in the core)
    def stats(self) -> Any:
        return self._call_in_core("stats")

    def check_integrity(self) -> None:
        self._call_in_core("check_integrity")

    def has_unfinished_requests(self) -> bool:
        return self._call_in_core("has_unfinished_requests")

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` (one of the engine methods above: a round trip that runs between two steps in the core)
        and get its result from the future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            fut.set_result(fn())
        except BaseException as e:
            fut.set_exception(e)
        return fut

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the core: ask, then wait, then kill."""
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._send(("shutdown",))
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("the engine core did not stop within %.0f s; killing it", timeout)
                self.proc.kill()
                self.proc.wait(5)
        self._to_core.close()
        self._reader.join(5)


class ProcessEngineLoop(StreamRouter):
    """Per-request streams over an engine-core process."""

    def __init__(self, client: EngineCoreClient, metrics: ServerMetrics, loop: asyncio.AbstractEventLoop):
        super().__init__(metrics, loop)
        self.engine = self.driver = client
        client.on_outputs = self._on_outputs
        client.on_stats = metrics.update_stats
        client.on_failure = self._on_failure

    async def _add(self, prompt: str | list[int], params: Any, tier: str, request_id: str) -> None:
        try:
            await asyncio.wrap_future(self.engine.add_request(prompt, params, tier, request_id))
        except asyncio.CancelledError:  # the client left while the core was answering: it may have said yes
            self.engine.abort(request_id)
            raise

    async def refresh_stats(self, timeout: float = 2.0) -> None:
        stats = await asyncio.wait_for(asyncio.wrap_future(self.engine.request("call", "stats")), timeout)
        self.metrics.update_stats(stats)
