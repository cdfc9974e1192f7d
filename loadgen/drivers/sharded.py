"""The sharded replayer: the aiohttp replayer in N worker processes, one shard of the schedule each.

One Python process streams about 400 req/s (docs/validation.md, "Client accuracy"); past that the schedule is split
round-robin (``specs[i::N]``; a conversation with real history stays whole in one shard,
``drivers.conversations.shard``) over N processes that share one clock (``time.monotonic`` is
system-wide) and one ``t0``, so their requests interleave as the single schedule says. Each finished
record comes back to this process through a queue and goes into the run's sink, like the in-process
replayer's. The workers live from ``open()`` to ``close()``, so a capacity search pays for their start
once. Ctrl-C belongs to the parent: workers ignore it and are told to stop through events. A worker whose
parent is gone (killed outright: it could tell nobody) stops sending and ends by itself within
``ORPHAN_CHECK_S``; daemon processes are only ended by a parent that exits normally.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import signal
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from loadgen.drivers.base import Progress, RecordSink
from loadgen.drivers.conversations import shard
from loadgen.drivers.event_loop import run_sync
from loadgen.drivers.http_request import ClientConfig
from loadgen.drivers.replayer import Replayer
from loadgen.results.records import RequestRecord
from loadgen.target.access import check_target
from loadgen.target.discovery import TargetError
from loadgen.workload.specs import RequestSpec

START_TIMEOUT_S = 120.0
COUNTERS = 2  # per worker in the shared array: sent, in flight
ORPHAN_CHECK_S = 0.5  # how often an idle worker looks whether its parent is still there
ORPHANED = "the process that started this worker is gone"


class _QueueSink:
    """A worker's sink: each finished record goes to the parent."""

    def __init__(self, out: Any):
        self.out = out

    def write(self, rec: RequestRecord) -> None:
        self.out.put(("record", rec, None))


def worker_main(index: int, cfg: ClientConfig, commands: Any, out: Any, counters: Any, stop_now: Any,
                stop_sending: Any) -> None:
    """One worker process: open a replayer, then run each command until ``None``: ``("warm", n)`` opens n
    connections (reported as ``("warm", index, None)``), ``(specs, t0, stage, concurrency, until_s)`` runs
    a shard (reported as ``("done", index, abort_reason)``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and tells us through stop_now
    parent = os.getppid()

    def orphaned() -> bool:  # the parent's pid, not whether it lives: a pid can be reused
        return os.getppid() != parent

    def next_command() -> Any:
        """The parent's next command; None (the end) once the parent is gone."""
        while not orphaned():
            try:
                return commands.get(timeout=ORPHAN_CHECK_S)
            except queue.Empty:
                continue
        out.cancel_join_thread()  # nobody reads what is still queued: do not wait on it at exit
        return None

    async def main() -> None:
        prog = Progress()
        rep = Replayer(cfg, _QueueSink(out), prog)
        await rep.open()
        loop = asyncio.get_running_loop()
        out.put(("ready", index, None))
        try:
            while (cmd := await loop.run_in_executor(None, next_command)) is not None:
                if cmd[0] == "warm":
                    await rep.warm_up(cmd[1])
                    out.put(("warm", index, None))
                    continue
                specs, t0, stage, concurrency, until_s = cmd
                rep.abort_reason = None

                async def watch() -> None:
                    while True:
                        counters[index * COUNTERS: index * COUNTERS + COUNTERS] = [prog.sent, prog.in_flight]
                        if stop_now.is_set():
                            rep.stop("stopped")
                        elif orphaned():
                            rep.stop(ORPHANED)
                        elif stop_sending.is_set():
                            rep.stop_sending()
                        await asyncio.sleep(0.05)

                w = asyncio.ensure_future(watch())
                try:
                    await rep.run(specs, t0=t0, stage=stage, concurrency=concurrency, until_s=until_s)
                finally:
                    w.cancel()
                    counters[index * COUNTERS: index * COUNTERS + COUNTERS] = [prog.sent, prog.in_flight]
                out.put(("done", index, rep.abort_reason))
        finally:
            await rep.close()

    try:
        run_sync(main)
    except Exception as e:  # noqa: BLE001 (reported to the parent, which ends the run with it)
        out.put(("failed", index, f"{type(e).__name__}: {e}"))


class ShardedReplayer:
    """``drivers.base.Driver`` over N replayer processes."""

    name = "sharded"
    start_lead_s = 0.2  # the workers are already running: only the command has to reach them
    measures_in_flight = True  # summed from the workers' shared counters, 0.2 s fresh

    def __init__(self, cfg: ClientConfig, sink: RecordSink, workers: int, progress: Progress | None = None):
        if workers < 2:
            raise ValueError("the sharded replayer needs at least 2 workers (1: use the in-process replayer)")
        self.cfg, self.sink, self.workers = cfg, sink, workers
        self.model = cfg.model
        self.progress = progress or Progress()
        self.abort_reason: str | None = None
        ctx = mp.get_context("spawn")
        self._ctx = ctx
        self._out = ctx.Queue()
        self._commands = [ctx.Queue() for _ in range(workers)]
        self._counters = ctx.Array("q", COUNTERS * workers, lock=False)
        self._stop_now, self._stop_sending = ctx.Event(), ctx.Event()
        self._procs: list[Any] = []

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        if self.model is None:
            self.model = await loop.run_in_executor(None, check_target, self.cfg.target, None, self.cfg.headers)
        cfg = replace(self.cfg, model=self.model)
        self._procs = [self._ctx.Process(target=worker_main, daemon=True, name=f"slobench-replayer-{i}",
                                         args=(i, cfg, self._commands[i], self._out, self._counters,
                                               self._stop_now, self._stop_sending))
                       for i in range(self.workers)]
        for p in self._procs:
            p.start()
        ready = 0
        deadline = loop.time() + START_TIMEOUT_S
        while ready < self.workers:
            kind, _index, info = await self._next(deadline)
            if kind == "failed":
                raise TargetError(f"a replayer worker failed to start: {info}")
            ready += kind == "ready"

    async def _next(self, deadline: float | None = None) -> tuple[str, int, Any]:
        """The next message from a worker (records go straight to the sink on the way)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                kind, a, b = self._out.get_nowait()
            except queue.Empty:
                if deadline is not None and loop.time() > deadline:
                    raise TargetError("replayer workers did not start in time") from None
                if any(not p.is_alive() for p in self._procs) and self._out.empty():
                    raise TargetError("a replayer worker process died") from None
                await asyncio.sleep(0.02)
                continue
            if kind == "record":
                self.progress.finished(a)
                self.sink.write(a)
                continue
            return kind, a, b

    def _sync_counters(self) -> None:
        c = list(self._counters)
        self.progress.sent = sum(c[0::COUNTERS])
        self.progress.in_flight = sum(c[1::COUNTERS])

    async def warm_up(self, connections: int) -> None:
        """Each worker opens its share of the connections."""
        share = -(-connections // self.workers)
        for q in self._commands:
            q.put(("warm", share))
        done = 0
        while done < self.workers:
            kind, _index, info = await self._next()
            if kind == "failed":
                raise TargetError(f"a replayer worker failed: {info}")
            done += kind == "warm"

    async def run(self, specs: Iterable[RequestSpec], *, t0: float, stage: int, concurrency: int = 0,
                  until_s: float | None = None) -> None:
        specs = list(specs)
        n = self.workers
        users = -(-concurrency // n) if concurrency else 0  # closed loop: the users split over the workers
        self._stop_now.clear()
        self._stop_sending.clear()
        for q, part in zip(self._commands, shard(specs, n), strict=True):  # a conversation stays on one shard
            q.put((part, t0, stage, users, until_s))
        done = 0
        ticker = asyncio.ensure_future(self._tick())
        try:
            while done < n:
                kind, _index, info = await self._next()
                if kind == "failed":
                    self.stop(f"replayer worker failed: {info}")
                    break
                done += 1
                if info and info != "stopped":
                    self.stop(info)
        finally:
            ticker.cancel()
            self._sync_counters()

    async def _tick(self) -> None:
        while True:
            self._sync_counters()
            await asyncio.sleep(0.2)

    def in_flight(self) -> None:
        return None  # in the worker processes

    def stop_sending(self) -> None:
        self._stop_sending.set()

    def stop(self, reason: str | None = None) -> None:
        if reason and not self.abort_reason:
            self.abort_reason = reason
        self._stop_now.set()

    async def close(self) -> None:
        for q in self._commands:
            q.put(None)
        loop = asyncio.get_running_loop()
        for p in self._procs:
            await loop.run_in_executor(None, p.join, 10)
            if p.is_alive():
                p.terminate()
        while True:  # records that arrived after the last "done" (none expected) still reach the sink
            try:
                kind, a, _ = self._out.get_nowait()
            except queue.Empty:
                break
            if kind == "record":
                self.progress.finished(a)
                self.sink.write(a)
        self._procs = []
