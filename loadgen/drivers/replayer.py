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
import gc
from collections.abc import Callable, Iterable, Iterator

import aiohttp

from loadgen.drivers import client_cancel
from loadgen.drivers.base import Progress, RecordSink
from loadgen.drivers.conversations import Conversation, Unit, fill_record, renamed, units
from loadgen.drivers.event_loop import now
from loadgen.drivers.http_request import ClientConfig, build_body, retry_after, tier_headers
from loadgen.drivers.stream_recorder import StreamRecorder
from loadgen.results.outcomes import SHED_HTTP
from loadgen.results.records import RequestRecord
from loadgen.target.access import check_target
from loadgen.target.discovery import error_text
from loadgen.target.sse import StreamError
from loadgen.workload.specs import RequestSpec


def cycle_units(items: Iterable[Unit], stop: Callable[[], bool]) -> Iterator[Unit]:
    """Closed loop with a deadline: the units in order, then again (a conversation with new request and
    conversation ids), until ``stop()``."""
    items = list(items)
    k = 0
    while items:
        for u in items:
            if stop():
                return
            yield u if k == 0 else renamed(u, f"-{k}")
        k += 1


class Replayer:
    """The in-process aiohttp driver (``drivers.base.Driver``)."""

    name = "aiohttp"
    start_lead_s = 0.05
    measures_in_flight = True

    def __init__(self, cfg: ClientConfig, sink: RecordSink, progress: Progress | None = None):
        self.cfg = cfg
        self.sink = sink
        self.progress = progress or Progress()
        self.model = cfg.model
        self.abort_reason: str | None = None
        self.stage = 0
        self._no_more = False  # stop_sending(): the feed ends, what is in flight finishes
        self._tasks: set[asyncio.Task] = set()
        self._active: dict[asyncio.Task, RequestRecord] = {}  # requests in flight, for the watchdog
        self._session: aiohttp.ClientSession | None = None
        self._headers = {"Content-Type": "application/json"}
        self._headers.update(cfg.headers)
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
            loop = asyncio.get_running_loop()
            self.model = await loop.run_in_executor(None, check_target, self.cfg.target, None, self.cfg.headers)

    async def warm_up(self, connections: int) -> None:
        """Open ``connections`` keep-alive connections at once (``GET /v1/models`` on each, all in flight
        together, so the pool cannot reuse one); they wait idle in the pool for the run."""
        if self._session is None:
            await self.open()
        url = self.cfg.target + "/v1/models"
        timeout = aiohttp.ClientTimeout(total=10)

        async def one() -> None:
            try:
                async with self._session.get(url, timeout=timeout) as r:
                    await r.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass  # the run itself reports a target that cannot be reached

        await asyncio.gather(*(one() for _ in range(max(0, connections))))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def in_flight(self) -> list[RequestRecord]:
        """The records of the requests in flight now (a live view for monitors; do not modify)."""
        return list(self._active.values())

    def stop_sending(self) -> None:
        self._no_more = True

    def stop(self, reason: str | None = None) -> None:
        """End the run now: nothing more is sent, requests in flight are recorded as cancelled."""
        if reason and not self.abort_reason:
            self.abort_reason = reason
        if self._stop is not None:
            self._stop.set()

    # -------------------------------------------------------------- running

    async def run(self, specs: Iterable[RequestSpec], *, t0: float | None = None, stage: int = 0,
                  concurrency: int = 0, until_s: float | None = None,
                  on_start: Callable[[float], None] | None = None) -> None:
        """``Driver.run``. Without ``t0`` the run starts ``start_lead_s`` from now; ``on_start(t0)`` is
        called before it (to start a scraper on the same instant)."""
        if self._session is None:
            await self.open()
        self._stop = asyncio.Event()
        self._no_more = False
        self.stage = stage
        gc.collect()
        gc.freeze()  # long-lived objects leave the collector's view: no long GC pauses mid-run
        old_threshold = gc.get_threshold()
        gc.set_threshold(50_000, 50, 100)
        self.t0 = now() + self.start_lead_s if t0 is None else t0
        if on_start:
            on_start(self.t0)
        work: Iterable[Unit] = units(specs)
        if concurrency and until_s is not None:
            work = cycle_units(work, lambda: now() - self.t0 >= until_s)
        main = asyncio.ensure_future(self._closed(work, concurrency) if concurrency else self._open(work))
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

    async def _open(self, work: Iterable[Unit]) -> None:
        loop = asyncio.get_running_loop()
        t0 = self.t0
        for unit in work:
            if self._no_more:
                break
            spec = unit.head
            path, body = build_body(spec, self.cfg, self.model)  # built before its send time comes
            # uvloop's timers have 1 ms resolution and may fire a little early: never send early
            while (delay := t0 + spec.arrival_s - now()) > 0:
                await asyncio.sleep(delay)
            if unit.rest:
                task = loop.create_task(self._conversation(unit, spec.arrival_s, path, body))
            else:
                task = loop.create_task(self._one(spec, spec.arrival_s, path, body))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _closed(self, work: Iterable[Unit], concurrency: int) -> None:
        it = iter(work)

        async def user() -> None:
            for unit in it:
                if self._no_more:
                    return
                path, body = build_body(unit.head, self.cfg, self.model)
                if unit.rest:
                    await self._conversation(unit, now() - self.t0, path, body)
                else:
                    await self._one(unit.head, now() - self.t0, path, body)

        users = [asyncio.ensure_future(user()) for _ in range(concurrency)]
        self._tasks.update(users)
        await asyncio.gather(*users, return_exceptions=True)

    async def _conversation(self, unit: Unit, scheduled_s: float, path: str, body: bytes) -> None:
        """A conversation with real history, turn after turn (``drivers.conversations``)."""
        conv = Conversation(unit)
        while (turn := conv.next_turn()) is not None:
            spec, due = turn
            if due is not None:
                while (delay := self.t0 + due - now()) > 0:  # the user's think time after the last reply
                    await asyncio.sleep(delay)
                if self._no_more:
                    return
                scheduled_s = due
                path, body = build_body(spec, self.cfg, self.model)
            rec, reply = await self._one(spec, scheduled_s, path, body, keep_text=True)
            conv.answered(spec, rec, reply)

    async def _one(self, spec: RequestSpec, scheduled_s: float, path: str, body: bytes,
                   keep_text: bool = False) -> tuple[RequestRecord, str]:
        """Send one request and record it; returns the record and (``keep_text``) the reply's text."""
        t0 = self.t0
        prog = self.progress
        rec = RequestRecord(spec.id, self.stage, spec.tier, scheduled_s, prompt_tokens_intended=spec.prompt_tokens)
        fill_record(rec, spec)
        reply = ""
        prog.sent += 1
        prog.in_flight += 1
        task = asyncio.current_task()
        self._active[task] = rec
        timer = deadline = None
        loop = asyncio.get_running_loop()
        if spec.cancel_after_s is not None:  # the user closes the tab t s after the scheduled time
            timer = loop.call_later(max(0.0, t0 + scheduled_s + spec.cancel_after_s - now()),
                                    self._client_cancel, task, rec, spec)
        if spec.deadline_s is not None:  # the tier's deadline: the client gives up on it
            deadline = loop.call_later(max(0.0, t0 + scheduled_s + spec.deadline_s - now()),
                                       self._deadline, task, rec, spec)
        try:
            rec.sent_s = now() - t0
            while True:
                post = self._session.post(self.cfg.target + path, data=body, headers=tier_headers(spec, self.cfg))
                async with post as resp:
                    rec.http_status = resp.status
                    self._conn_errors_in_a_row = 0
                    if resp.status == 200:
                        reply = await self._stream(resp, rec, spec, keep_text)
                        break
                    rec.status = "rejected" if resp.status in SHED_HTTP else "http_error"
                    rec.error = error_text(await resp.read(), resp.status)
                    rec.retry_after_s = retry_after(resp.headers.get("Retry-After"))
                if rec.status != "rejected" or rec.retries >= self.cfg.retries:
                    break
                # resend after the server's Retry-After (bounded); the latency still counts from the schedule
                await asyncio.sleep(min(rec.retry_after_s or 1.0, self.cfg.retry_max_wait_s))
                rec.retries += 1
                rec.status, rec.error, rec.http_status = "ok", None, None
        except asyncio.CancelledError:
            if rec.status != "timeout" and rec.cancel_reason is None:  # the watchdog, a client cancel: set before
                client_cancel.cancelled_by_run(rec)
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
            for t in (timer, deadline):
                if t is not None:
                    t.cancel()
            rec.done_s = now() - t0
            self._active.pop(task, None)
            prog.in_flight -= 1
            prog.finished(rec)
            self.sink.write(rec)
        return rec, reply

    @staticmethod
    def _deadline(task: asyncio.Task, rec: RequestRecord, spec: RequestSpec) -> None:
        if not task.done() and rec.status in ("ok", "rejected"):
            rec.status, rec.error = "timeout", f"client deadline: {spec.deadline_s:g} s after the scheduled time"
            task.cancel()

    @staticmethod
    def _client_cancel(task: asyncio.Task, rec: RequestRecord, spec: RequestSpec) -> None:
        if rec.status == "ok" and not task.done():
            client_cancel.cancelled_by_client(rec, spec, len(rec.token_s))
            task.cancel()

    async def _stream(self, resp: aiohttp.ClientResponse, rec: RequestRecord, spec: RequestSpec,
                      keep_text: bool = False) -> str:
        t0 = self.t0
        recorder = StreamRecorder(rec, keep_text=keep_text)
        after = spec.cancel_after_tokens
        async for data in resp.content.iter_any():
            if client_cancel.feed(recorder, data, now() - t0, after):
                client_cancel.cancelled_by_client(rec, spec, recorder.n_chunks)
                resp.close()  # the connection goes: the server sees the client leave
                return recorder.text
        recorder.close()
        return recorder.text
