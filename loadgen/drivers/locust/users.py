"""Locust users that stream LLM responses and time every token themselves.

Locust's ``stream=True`` times the response headers, and ``iter_content(1024)`` waits for 1 KiB of
body, so neither sees a token when it arrives. These users take the connection from the
:class:`~locust.contrib.fasthttp.FastHttpUser`'s own geventhttpclient pool, read the body with
``readline(b"\\n")`` (it returns as soon as one SSE line is complete, whatever is still buffered), and
stamp each content chunk with ``time.monotonic()`` at that moment. The record they write is the
aiohttp replayer's, field for field (``loadgen/drivers/replayer.py``): TTFT at the first non-empty content chunk,
measured from the *scheduled* time; one timestamp per content chunk; ``usage`` and ``timing`` from the
final chunk; the same statuses. Each finished request fires three Locust request events,
``LLM ttft``, ``LLM tpot`` and ``LLM e2e`` (ms, output tokens as the response length); a failed one
fires ``LLM e2e`` with its error.

- :class:`OpenLoopDriver`: one per sending process; it walks that process's shard of the seeded
  schedule and starts each request in its own greenlet at its time (open loop: a slow target makes
  requests overlap, never delays the next send; ``sent_s - scheduled_s`` is the client's lateness).
- :class:`ClosedLoopUser`: N of them per stage; each sends its next request when the previous ends.
"""

from __future__ import annotations

import gc
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import gevent
from gevent.event import Event as GEvent
from gevent.pool import Group
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
from geventhttpclient.url import URL
from locust import FastHttpUser, constant, task

from loadgen.drivers import client_cancel
from loadgen.drivers.conversations import Conversation, fill_record, renamed, units
from loadgen.drivers.http_request import ClientConfig, build_body, retry_after
from loadgen.drivers.locust.collect import Tally
from loadgen.drivers.locust.stages import Stage, StagedLoad, shard
from loadgen.drivers.stream_recorder import StreamRecorder
from loadgen.results import latency
from loadgen.results.outcomes import SHED_HTTP
from loadgen.results.records import RequestRecord
from loadgen.target.discovery import error_text
from loadgen.target.request_shape import RequestShape
from loadgen.target.sse import StreamError

now = time.monotonic


class RequestFailed(Exception):
    """The exception a failed request's ``e2e`` event carries (Locust's failures table shows it)."""


class ClientDeadline(Exception):
    """The tier's deadline (``RequestSpec.deadline_s``) passed: the client gives up on the request."""


class ClientCancel(Exception):
    """The cancellation mix: this user closes the tab now (``drivers.client_cancel``)."""


@dataclass
class ProcState:
    """This process's part of the run: set when the start message arrives."""

    staged: StagedLoad | None = None
    index: int = 0
    count: int = 1
    t0: float = 0.0  # run start on this process's monotonic clock
    cfg: ClientConfig | None = None
    model: str = ""
    events: Any = None
    tally: Tally = field(default_factory=Tally)
    started: GEvent = field(default_factory=GEvent)
    stop_sending: bool = False
    driver_claimed: bool = False
    in_flight: set = field(default_factory=set)  # greenlets with a request under way
    cfg_headers: dict = field(default_factory=lambda: {"Content-Type": "application/json"})
    _closed_next: dict[int, Any] = field(default_factory=dict)

    def start(self, staged: StagedLoad, index: int, count: int, t0_wall: float, cfg: ClientConfig, model: str,
              events: Any) -> None:
        self.staged, self.index, self.count = staged, index, count
        self.cfg, self.model, self.events = cfg, model, events
        self.t0 = now() + (t0_wall - time.time())
        self.tally = Tally()
        self.stop_sending = False
        self.driver_claimed = False
        self._closed_next = {}
        gc.collect()
        gc.freeze()  # as the aiohttp replayer: long-lived objects leave the collector's view
        self.started.set()

    def reset(self) -> None:
        self.started.clear()
        self.staged = None

    def cancel_in_flight(self) -> None:
        for g in list(self.in_flight):
            g.kill(block=False)

    def my_schedule(self) -> list[tuple[int, Any]]:
        return shard(self.staged.schedule(), self.index, self.count)

    def next_closed(self) -> tuple[Stage, Any] | None:
        """Closed loop: the next unit (a request, or a conversation with real history) for a user of this
        process, or None when there is none."""
        if self.stop_sending:
            return None
        t = now() - self.t0
        st = self.staged.stage_at(t)
        if st.duration_s is not None and t >= st.end_s:
            return None
        it = self._closed_next.get(st.index)
        if it is None:
            mine = units(shard(st.specs, self.index, self.count))
            it = self._closed_next[st.index] = _cycle(mine) if st.cycle else iter(mine)
        spec = next(it, None)
        return None if spec is None else (st, spec)


def _cycle(items):
    for rnd in itertools.count():
        if not items:
            return
        for u in items:
            yield u if rnd == 0 else renamed(u, f"-{rnd}")


STATE = ProcState()


class _StreamingUser(FastHttpUser):
    abstract = True
    network_timeout = 300.0  # the longest silence inside a stream (set from the run's read timeout)
    connection_timeout = 10.0
    max_retries = 0
    insecure = True

    def _http(self):
        return self.client.client.clientpool.get_client(URL(self.host))

    def send(self, spec, stage: int, scheduled_s: float, path: str, body: bytes, http,
             keep_text: bool = False) -> tuple[RequestRecord, str]:
        """One request, recorded; returns the record and (``keep_text``) the reply's text."""
        st = STATE
        t0, tally = st.t0, st.tally
        rec = RequestRecord(spec.id, stage, spec.tier, scheduled_s, prompt_tokens_intended=spec.prompt_tokens)
        fill_record(rec, spec)
        reply = ""
        timer = None
        if spec.cancel_after_s is not None:  # the user closes the tab t s after the scheduled time
            timer = gevent.Timeout(max(0.0, t0 + scheduled_s + spec.cancel_after_s - now()), ClientCancel())
            timer.start()
        deadline = None
        if spec.deadline_s is not None:  # the tier's deadline: the client gives up on it
            deadline = gevent.Timeout(max(0.0, t0 + scheduled_s + spec.deadline_s - now()), ClientDeadline())
            deadline.start()
        tally.sent += 1
        tally.in_flight += 1
        tally.sent_by_stage[stage] += 1
        me = gevent.getcurrent()
        st.in_flight.add(me)
        resp = None
        try:
            rec.sent_s = now() - t0
            late = latency.lateness_ms(rec)
            if late > tally.late_max_ms:
                tally.late_max_ms = late
            extra = st.cfg.shape.tier_headers.get(spec.tier) if spec.tier else None
            sent_headers = {**st.cfg_headers, **extra} if extra else st.cfg_headers
            resp = http.request("POST", path, body=body, headers=sent_headers)
            rec.http_status = resp.status_code
            if rec.http_status != 200:
                rec.status = "rejected" if rec.http_status in SHED_HTTP else "http_error"
                rec.error = error_text(resp.read(), rec.http_status)
                rec.retry_after_s = retry_after(resp.get("Retry-After"))
            else:
                reply = _stream(resp, rec, t0, spec.cancel_after_tokens, keep_text)
        except ClientCancel:
            client_cancel.cancelled_by_client(rec, spec, len(rec.token_s))
            _drop_connection(resp)
        except ClientDeadline:
            rec.status, rec.error = "timeout", f"client deadline: {spec.deadline_s:g} s after the scheduled time"
            _drop_connection(resp)
        except gevent.GreenletExit:
            client_cancel.cancelled_by_run(rec)
            _drop_connection(resp)
            raise
        except StreamError as e:
            rec.status, rec.error = "stream_error", str(e)
        except (TimeoutError, gevent.Timeout) as e:
            rec.status = "timeout"
            rec.error = f"no data for {self.network_timeout:g}s" if rec.http_status else f"connect timeout ({e})"
        except (HTTPConnectionClosed, HTTPParseError, OSError) as e:
            rec.status = "stream_error" if rec.http_status else "conn_error"
            rec.error = f"{type(e).__name__}: {e}"
        finally:
            for t in (timer, deadline):
                if t is not None:
                    t.close()
            if resp is not None:
                resp.release()
            rec.done_s = now() - t0
            st.in_flight.discard(me)
            tally.in_flight -= 1
            tally.done += 1
            if rec.status == "ok":
                tally.ok += 1
                tally.output_tokens += rec.output_tokens or 0
            else:
                tally.errors += 1
            tally.outbox.append(rec.to_json())
            _fire(st.events, rec)
        return rec, reply

    def converse(self, unit, stage: int, scheduled: float, path: str, body: bytes, http) -> None:
        """A conversation with real history, turn after turn, sleeping the user's think time between them."""
        st = STATE
        conv = Conversation(unit)
        while (turn := conv.next_turn()) is not None:
            spec, due = turn
            if due is not None:
                while (delay := st.t0 + due - now()) > 0:
                    gevent.sleep(delay)
                if st.stop_sending:
                    return
                scheduled = due
                path, body = build_body(spec, st.cfg, st.model)
            rec, reply = self.send(spec, stage, scheduled, path, body, http, keep_text=True)
            conv.answered(spec, rec, reply)


def _stream(resp, rec: RequestRecord, t0: float, cancel_after: int | None = None, keep_text: bool = False) -> str:
    """Read the SSE body line by line as each line completes; recorded as the aiohttp replayer does.
    Raises ClientCancel once ``cancel_after`` content chunks are in."""
    recorder = StreamRecorder(rec, keep_text=keep_text)
    readline = resp.readline
    while True:
        line = readline(b"\n")
        if not line:
            line = resp.read()  # an unterminated last line, if any
            if not line:
                break
        if client_cancel.feed(recorder, line, now() - t0, cancel_after):
            rec.output_tokens = recorder.n_chunks
            raise ClientCancel()
    recorder.close()
    return recorder.text


def _drop_connection(resp) -> None:
    """Close the connection of an unfinished response (the server sees the client leave) rather than return
    it to the pool with a stream still on it."""
    sock = getattr(resp, "_sock", None)
    if sock is None:
        return
    pool = getattr(resp, "_pool", None)
    if pool is not None:
        pool.release_socket(sock)
    else:
        sock.close()
    resp._sock = None
    resp._pool = None


def _fire(events, rec: RequestRecord) -> None:
    if events is None or rec.status == "cancelled":
        return
    fire = events.request.fire
    ctx = {"id": rec.id, "stage": rec.stage, "tier": rec.tier}
    if rec.status == "ok" and rec.token_s:
        out = rec.output_tokens or 0
        ttft, tpot, e2e = latency.ttft_ms(rec), latency.tpot_ms(rec), latency.e2el_ms(rec)
        fire(request_type="LLM", name="ttft", response_time=ttft, response_length=out, exception=None, context=ctx)
        if tpot is not None:
            fire(request_type="LLM", name="tpot", response_time=tpot, response_length=out, exception=None, context=ctx)
        fire(request_type="LLM", name="e2e", response_time=e2e, response_length=out, exception=None, context=ctx)
    else:
        ms = 1000.0 * (latency.sojourn_s(rec) or 0.0)
        fire(request_type="LLM", name="e2e", response_time=ms, response_length=0,
             exception=RequestFailed(f"{rec.status}: {rec.error}"), context=ctx)


def _units_by_stage(schedule: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """(stage, unit) in send order: a conversation with real history is one unit (``drivers.conversations``)."""
    out = []
    for stage, items in itertools.groupby(schedule, key=lambda x: x[0]):
        out += [(stage, u) for u in units([sp for _, sp in items])]
    return out


class OpenLoopDriver(_StreamingUser):
    """One per sending process: sends its shard of the schedule open-loop, a greenlet per request."""

    wait_time = constant(0)
    concurrency = 100_000  # connections in this process's pool (the aiohttp replayer's is unlimited too)

    def on_start(self) -> None:
        self._group = Group()

    def on_stop(self) -> None:
        self._group.kill(block=True)

    @task
    def drive(self) -> None:
        st = STATE
        st.started.wait()
        if st.driver_claimed:  # a second driver in this process (Locust placed two here): stay idle
            gevent.sleep(3600)
            return
        st.driver_claimed = True
        http = self._http()
        cfg, model, t0 = st.cfg, st.model, st.t0
        group = self._group
        for stage, unit in _units_by_stage(st.my_schedule()):
            spec = unit.head
            path, body = build_body(spec, cfg, model)  # built before its send time comes
            while (delay := t0 + spec.arrival_s - now()) > 0:  # never send early
                gevent.sleep(delay)
            if st.stop_sending:
                break
            if unit.rest:
                group.spawn(self.converse, unit, stage, spec.arrival_s, path, body, http)
            else:
                group.spawn(self.send, spec, stage, spec.arrival_s, path, body, http)
        st.tally.finished = True
        group.join()
        while True:
            gevent.sleep(3600)


class ClosedLoopUser(_StreamingUser):
    """Closed loop: sends its next request as soon as the previous one ends (N users = concurrency N)."""

    wait_time = constant(0)
    concurrency = 1

    @task
    def next_request(self) -> None:
        st = STATE
        st.started.wait()
        item = st.next_closed()
        if item is None:
            st.tally.finished = True
            gevent.sleep(0.5)
            return
        stage, unit = item
        path, body = build_body(unit.head, st.cfg, st.model)
        if unit.rest:
            self.converse(unit, stage.index, now() - st.t0, path, body, self._http())
        else:
            self.send(unit.head, stage.index, now() - st.t0, path, body, self._http())


def client_config(opts: dict[str, Any]) -> ClientConfig:
    return ClientConfig(
        target="", model=opts.get("model"), max_connections=int(opts.get("max_connections") or 0),
        read_timeout_s=float(opts.get("read_timeout") or 300.0),
        headers={**({"Authorization": f"Bearer {opts['api_key']}"} if opts.get("api_key") else {}),
                 **(opts.get("headers") or {})},
        extra_body=dict(opts.get("extra_body") or {}),
        shape=RequestShape(**opts["shape"]) if opts.get("shape") else RequestShape(),
    )


def headers(cfg: ClientConfig) -> dict[str, str]:
    return {"Content-Type": "application/json", "Accept": "text/event-stream", **cfg.headers}


def apply_client_settings(cfg: ClientConfig) -> None:
    """Timeouts and the connection cap from the run's options, on both user classes."""
    for cls in (OpenLoopDriver, ClosedLoopUser):
        cls.network_timeout = cfg.read_timeout_s or 1e9
    OpenLoopDriver.concurrency = cfg.max_connections or 100_000
    STATE.cfg_headers = headers(cfg)

