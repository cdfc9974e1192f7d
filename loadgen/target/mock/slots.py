"""The mock's queueing mode (``--slots C``): at most C requests are served at once, the rest wait in
arrival order (FIFO, no tiers, no priority) for a slot.

A request holds its slot from the moment it gets it until its last token is due; the next one waiting
gets the slot at that *due* time, not when the timer that wrote the token fired, so a late event loop
never shifts anyone's schedule (absolute-time scheduling, as for the tokens themselves). A client that
leaves while waiting is taken out of the queue; one that leaves while served frees its slot then.

This is the queue ``loadgen.capacity.truth`` simulates exactly: a FIFO c-server queue whose service time is
the request's prefill (``ttft_ms + prefill_ms_per_token x prompt tokens``) plus its decode (its tokens
``itl_ms`` apart).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from loadgen.target.mock.metrics_page import MockMetrics

WAITING, SERVED, DONE = "waiting", "served", "done"


class Ticket:
    """One request's place: waiting for a slot, being served (from ``start_s``), or done."""

    __slots__ = ("t_arrive", "grant", "state", "start_s")

    def __init__(self, t_arrive: float, grant: Callable[[float], None]) -> None:
        self.t_arrive = t_arrive
        self.grant = grant  # called with the slot's start time (loop clock) once it has one
        self.state = WAITING
        self.start_s: float | None = None


class SlotQueue:
    """C slots and one FIFO queue; the running / waiting gauges of ``metrics`` follow them."""

    def __init__(self, slots: int, metrics: MockMetrics) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.free = slots
        self.queue: deque[Ticket] = deque()
        self.metrics = metrics

    def arrive(self, t_arrive: float, grant: Callable[[float], None]) -> Ticket:
        """A request arrived at ``t_arrive``: served at once when a slot is free, else queued."""
        ticket = Ticket(t_arrive, grant)
        if self.free > 0 and not self.queue:
            self.free -= 1
            self._serve(ticket, t_arrive)
        else:
            self.queue.append(ticket)
            self.metrics.queued(1)
        return ticket

    def finish(self, ticket: Ticket, t_free: float) -> None:
        """``ticket``'s last token was due at ``t_free``: its slot goes to the next one waiting, from then
        (or from its arrival, if it came later: the release timer may fire after an arrival)."""
        if ticket.state != SERVED:
            return
        ticket.state = DONE
        if self.queue:
            nxt = self.queue.popleft()
            self.metrics.queued(-1)
            self._serve(nxt, max(t_free, nxt.t_arrive))
        else:
            self.free += 1

    def leave(self, ticket: Ticket, now: float) -> None:
        """The client went away: out of the queue, or its slot freed now."""
        if ticket.state == WAITING:
            self.queue.remove(ticket)
            self.metrics.queued(-1)
            ticket.state = DONE
        elif ticket.state == SERVED:
            self.finish(ticket, now)

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def served(self) -> int:
        return self.slots - self.free

    @staticmethod
    def _serve(ticket: Ticket, start_s: float) -> None:
        ticket.state = SERVED
        ticket.start_s = start_s
        ticket.grant(start_s)
