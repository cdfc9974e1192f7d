"""The aiohttp replayer: sends a precomputed schedule open-loop (or closed-loop) and records each request.

One session, an unlimited connector by default (``max_connections`` caps it on purpose: the wait for a
connection then shows up as client lateness, ``sent_s - scheduled_s``), no total timeout on streams, a
1 MiB read buffer, an incremental SSE parser. The read timeout (longest silence in a request) is
enforced by one watchdog sweep per second rather than aiohttp's per-read timer, which re-arms a timer
on every chunk and cost more CPU than parsing the chunk. Times come from ``time.monotonic()`` (system-wide on
Linux, so worker processes share one clock) relative to the run start ``t0``. Every latency is measured
from the scheduled time, never from a late send.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from loadgen.drivers.sse import StreamError
from loadgen.drivers.stream_recorder import StreamRecorder
from loadgen.results.records import RecordWriter, RequestRecord
from loadgen.workload.specs import RequestSpec


@dataclass(slots=True)
class ClientConfig:
    target: str  # base URL, e.g. http://127.0.0.1:8000
    model: str | None = None  # None: the first id of GET /v1/models
    max_connections: int = 0  # 0: unlimited
    read_timeout_s: float | None = 300.0  # longest silence inside a stream; no total timeout
    connect_timeout_s: float = 10.0
    api_key: str | None = None
    send_tier: bool = True  # send the request's tier as service_tier
    stage: int = 0
    extra_body: dict[str, Any] = field(default_factory=dict)
    abort_after_conn_errors: int = 10  # consecutive connection failures that end the run (0: never)


@dataclass(slots=True)
class Progress:
    sent: int = 0
    in_flight: int = 0
    done: int = 0
    errors: int = 0
    ttft_ms: deque = field(default_factory=lambda: deque(maxlen=2000))


class TargetError(RuntimeError):
    """The target cannot be used (unreachable, no models, died mid-run)."""


def now() -> float:
    return time.monotonic()


def build_body(spec: RequestSpec, cfg: ClientConfig, model: str) -> tuple[str, bytes]:
    """The endpoint path and JSON body for one request."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": spec.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if cfg.send_tier and spec.tier:
        body["service_tier"] = spec.tier
    if spec.kind == "chat":
        path = "/v1/chat/completions"
        body["messages"] = spec.prompt
    else:
        path = "/v1/completions"
        body["prompt"] = spec.prompt_value()
    if cfg.extra_body:
        body.update(cfg.extra_body)
    return path, json.dumps(body, separators=(",", ":")).encode()


async def discover_model(session: aiohttp.ClientSession, target: str) -> str:
    try:
        async with session.get(target + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                raise TargetError(f"GET {target}/v1/models returned HTTP {r.status}; pass --model")
            data = (await r.json()).get("data") or []
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise TargetError(f"cannot reach {target}: {type(e).__name__}: {e}") from e
    if not data:
        raise TargetError(f"{target}/v1/models lists no model; pass --model")
    return data[0]["id"]


class Replayer:
    def __init__(self, cfg: ClientConfig, writer: RecordWriter, progress: Progress | None = None):
        self.cfg = cfg
        self.writer = writer
        self.progress = progress or Progress()
        self.model = cfg.model
        self.abort_reason: str | None = None
        self._tasks: set[asyncio.Task] = set()
        self._active: dict[asyncio.Task, RequestRecord] = {}  # requests in flight, for the watchdog
        self._session: aiohttp.ClientSession | None = None
        self._headers = {"Content-Type": "application/json"}
        if cfg.api_key:
            self._headers["Authorization"] = f"Bearer {cfg.api_key}"
        self._conn_errors_in_a_row = 0
        self._stop: asyncio.Event | None = None
        self.t0 = 0.0

    # -------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.cfg.max_connections, limit_per_host=0, ttl_dns_cache=None)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.cfg.connect_timeout_s, sock_read=None)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, read_bufsize=1 << 20, auto_decompress=False,
            headers=self._headers,
        )
        if self.model is None:
            self.model = await discover_model(self._session, self.cfg.target)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def active_records(self) -> list[RequestRecord]:
        """The records of the requests in flight now (a live view for monitors; do not modify)."""
        return list(self._active.values())

    def stop(self, reason: str | None = None) -> None:
        """End the run now: nothing more is sent, requests in flight are recorded as cancelled."""
        if reason and not self.abort_reason:
            self.abort_reason = reason
        if self._stop is not None:
            self._stop.set()

    # -------------------------------------------------------------- running

    async def run(
        self, specs: Sequence[RequestSpec], t0: float | None = None, concurrency: int = 0,
        on_start: Callable[[float], None] | None = None, start_delay_s: float = 0.05,
    ) -> None:
        """Send ``specs`` (sorted by ``arrival_s``) open-loop from ``t0``, or closed-loop with
        ``concurrency`` users; returns when every request has ended or the run was stopped. Without
        ``t0`` the run starts ``start_delay_s`` after set-up; ``on_start(t0)`` is called before it."""
        if self._session is None:
            await self.open()
        self._stop = asyncio.Event()
        gc.collect()
        gc.freeze()  # long-lived objects leave the collector's view: no long GC pauses mid-run
        old_threshold = gc.get_threshold()
        gc.set_threshold(50_000, 50, 100)
        self.t0 = now() + start_delay_s if t0 is None else t0
        if on_start:
            on_start(self.t0)
        main = asyncio.ensure_future(self._closed(specs, concurrency) if concurrency else self._open(specs))
        stopper = asyncio.ensure_future(self._stop.wait())
        dog = asyncio.ensure_future(self._watchdog())
        try:
            await asyncio.wait({main, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (main, stopper, dog, *self._tasks):
                t.cancel()
            await asyncio.gather(main, stopper, dog, *self._tasks, return_exceptions=True)
            gc.set_threshold(*old_threshold)
            gc.unfreeze()

    async def _watchdog(self) -> None:
        limit = self.cfg.read_timeout_s
        if not limit:
            return
        while True:
            await asyncio.sleep(1.0)
            t = now() - self.t0
            for task, rec in list(self._active.items()):
                last = rec.token_s[-1] if rec.token_s else rec.sent_s
                if last is not None and t - last > limit and rec.status == "ok":
                    rec.status, rec.error = "timeout", f"no data for {limit:g}s"
                    task.cancel()

    async def _open(self, specs: Sequence[RequestSpec]) -> None:
        loop = asyncio.get_running_loop()
        t0 = self.t0
        for spec in specs:
            path, body = build_body(spec, self.cfg, self.model)  # built before its send time comes
            # uvloop's timers have 1 ms resolution and may fire a little early: never send early
            while (delay := t0 + spec.arrival_s - now()) > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(self._one(spec, spec.arrival_s, path, body))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _closed(self, specs: Sequence[RequestSpec], concurrency: int) -> None:
        it = iter(specs)

        async def user() -> None:
            for spec in it:
                path, body = build_body(spec, self.cfg, self.model)
                await self._one(spec, now() - self.t0, path, body)

        users = [asyncio.ensure_future(user()) for _ in range(concurrency)]
        self._tasks.update(users)
        await asyncio.gather(*users, return_exceptions=True)

    async def _one(self, spec: RequestSpec, scheduled_s: float, path: str, body: bytes) -> None:
        t0 = self.t0
        prog = self.progress
        rec = RequestRecord(spec.id, self.cfg.stage, spec.tier, scheduled_s, prompt_tokens=spec.prompt_tokens)
        prog.sent += 1
        prog.in_flight += 1
        task = asyncio.current_task()
        self._active[task] = rec
        try:
            rec.sent_s = now() - t0
            async with self._session.post(self.cfg.target + path, data=body) as resp:
                rec.http_status = resp.status
                self._conn_errors_in_a_row = 0
                if resp.status != 200:
                    rec.status = "rejected" if resp.status == 429 else "http_error"
                    rec.error = _error_text(await resp.read(), resp.status)
                else:
                    await self._stream(resp, rec)
        except asyncio.CancelledError:
            if rec.status != "timeout":  # the watchdog sets timeout before it cancels
                rec.status, rec.error = "cancelled", "run stopped"
        except StreamError as e:
            rec.status, rec.error = "stream_error", str(e)
        except asyncio.TimeoutError:
            rec.status = "timeout"
            rec.error = f"no data for {self.cfg.read_timeout_s}s" if rec.http_status else "connect timeout"
        except (aiohttp.ClientError, OSError) as e:
            if rec.http_status is None:
                rec.status = "conn_error"
                self._conn_errors_in_a_row += 1
                n = self.cfg.abort_after_conn_errors
                if n and self._conn_errors_in_a_row >= n:
                    self.stop(f"target {self.cfg.target} stopped accepting connections "
                              f"({n} connection failures in a row; last: {type(e).__name__}: {e})")
            else:
                rec.status = "stream_error"
            rec.error = f"{type(e).__name__}: {e}"
        finally:
            rec.done_s = now() - t0
            self._active.pop(task, None)
            prog.in_flight -= 1
            prog.done += 1
            if rec.status != "ok":
                prog.errors += 1
            elif rec.first_token_s is not None:
                prog.ttft_ms.append((rec.first_token_s - scheduled_s) * 1000.0)
            self.writer.write(rec)

    async def _stream(self, resp: aiohttp.ClientResponse, rec: RequestRecord) -> None:
        t0 = self.t0
        recorder = StreamRecorder(rec)
        async for data in resp.content.iter_any():
            recorder.feed(data, now() - t0)
        recorder.close()


def _error_text(raw: bytes, status: int) -> str:
    try:
        obj = json.loads(raw)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message") if isinstance(err, dict) else None
        return f"HTTP {status}: {msg or json.dumps(err)[:300]}"
    except ValueError:
        return f"HTTP {status}: {raw[:300].decode('utf-8', 'replace')}"


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
