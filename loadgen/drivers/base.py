"""The driver protocol: how a fixed-load run and a capacity step send load, whatever sends it.

A driver sends request specs to one target from an instant ``t0`` on the run's clock and hands every
finished request's record to the run's ``RecordSink`` in this process, as the request ends (the
aiohttp replayer directly, the sharded replayer through a queue from its worker processes, Locust by
following the file its master writes). ``progress`` counts what it has done so far; ``in_flight()``
shows the requests under way where the driver can see them (early stopping needs it), and
``stop_sending()`` / ``stop()`` end a run gently (what is in flight finishes) or now (what is in flight
is recorded as ``cancelled``). docs/ARCHITECTURE.md, "Adding a driver", walks through one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from loadgen.results import latency
from loadgen.results.records import RequestRecord
from loadgen.workload.specs import RequestSpec


@dataclass(slots=True)
class Progress:
    """What a driver has done so far (for live displays; the records are the measurement)."""

    sent: int = 0
    in_flight: int = 0
    done: int = 0
    errors: int = 0
    ttft_ms: deque = field(default_factory=lambda: deque(maxlen=2000))  # recent successful requests

    def finished(self, rec: RequestRecord) -> None:
        """Count one finished request (drivers that count sends themselves call this for the rest)."""
        self.done += 1
        if rec.status != "ok":
            self.errors += 1
        elif (v := latency.ttft_ms(rec)) is not None:
            self.ttft_ms.append(v)


WARM_MAX = 256  # connections opened ahead of a run at most


def connections_needed(specs: Sequence[RequestSpec], concurrency: int = 0, max_connections: int = 0) -> int:
    """How many connections to open before a run: its users (closed loop), else the requests scheduled in
    its first second (those overlap before the pool has grown by itself), capped by the connection cap."""
    if concurrency:
        n = concurrency
    else:
        first = min((s.arrival_s for s in specs), default=0.0)
        n = sum(1 for s in specs if s.arrival_s < first + 1.0)
    n = min(n, WARM_MAX)
    return min(n, max_connections) if max_connections else n


class RecordSink(Protocol):
    """Where a driver puts each finished request's record (``RecordWriter`` and its subclasses)."""

    def write(self, rec: RequestRecord) -> None: ...


class Driver(Protocol):
    name: str  # "aiohttp" | "sharded" | "locust"
    model: str | None  # the model name it sends (found by ``open`` when not configured)
    progress: Progress
    abort_reason: str | None  # why it stopped on its own (the target went away), else None
    start_lead_s: float  # how long before ``t0`` it must be told to run (process start-up)
    measures_in_flight: bool  # ``progress.in_flight`` is a real count (Locust's processes do not say)

    async def open(self) -> None:
        """Connect (open the connection pool, start worker processes), find the model."""

    async def warm_up(self, connections: int) -> None:
        """Open up to this many connections now, before ``t0``, so the first requests of a run do not pay
        for TCP handshakes inside their measured TTFT (drivers whose connections live in another
        program say so in their docstring)."""

    async def run(self, specs: Iterable[RequestSpec], *, t0: float, stage: int, concurrency: int = 0,
                  until_s: float | None = None) -> None:
        """Send ``specs`` and return when every request has ended or the run was stopped. Open loop
        (``concurrency`` 0): each at ``t0 + arrival_s``, whatever the target does. Closed loop:
        ``concurrency`` users, each sending its next spec when its last one ends, from ``t0``; with
        ``until_s`` (run clock) they go round the specs again (new ids) until then. Records carry
        ``stage``."""

    def in_flight(self) -> list[RequestRecord] | None:
        """The records of the requests under way now (a live view: do not modify), or None when this
        driver cannot see them (another process holds them): then a step cannot stop early."""

    def stop_sending(self) -> None:
        """Send nothing more; what is in flight finishes."""

    def stop(self, reason: str | None = None) -> None:
        """End the run now: nothing more is sent, requests in flight are recorded as cancelled."""

    async def close(self) -> None:
        """Release connections and processes; every record is in the sink once this returns."""
