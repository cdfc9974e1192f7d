"""The scheduler's queues: per tier, the waiting requests and the swapped ones, each kept in rank order.

A request's rank is (tier, arrival, arrival order): premium before standard before basic, older before younger.
Queued requests join the batch in rank order and the scheduler preempts only downwards (see
engine/scheduler/scheduler.py), so the queues stay sorted by it wherever a preempted request comes back. They also
keep, per tier, how many batch slots and prefill tokens are queued: what the admission estimate reads
(engine/core/admission.py), from another thread, without walking the queues.
"""

from __future__ import annotations

import bisect
import itertools

from engine.request.sequence import Request
from engine.request.tiers import TIER_RANK, TIERS


def rank(request: Request) -> tuple[int, float, int]:
    """The scheduler's order: lower is served first and may preempt higher."""
    return TIER_RANK[request.tier], request.arrival_time, request.order


def queued_prefill_tokens(request: Request) -> int:
    """Tokens a queued request still has to prefill before it samples again (0 once its KV is kept)."""
    live = [s for s in request.seqs if not s.is_finished]
    return sum(s.num_uncomputed for s in live) if live else len(request.prompt_ids)


class RequestQueues:
    def __init__(self) -> None:
        self.waiting: dict[str, list[Request]] = {tier: [] for tier in TIERS}
        self.swapped: dict[str, list[Request]] = {tier: [] for tier in TIERS}
        self.queued_slots = dict.fromkeys(TIERS, 0)  # batch slots (n per request) the queued requests need
        self.queued_tokens = dict.fromkeys(TIERS, 0)  # prefill tokens they still need
        self._held: dict[int, tuple[int, int]] = {}  # id(request) -> (slots, tokens) counted above
        self._order = itertools.count()

    def new_arrival(self, request: Request) -> None:
        request.order = next(self._order)
        self.put_waiting(request)

    def put_waiting(self, request: Request) -> None:
        self._put(self.waiting[request.tier], request, queued_prefill_tokens(request))

    def put_swapped(self, request: Request) -> None:
        self._put(self.swapped[request.tier], request, 0)

    def _put(self, queue: list[Request], request: Request, tokens: int) -> None:
        bisect.insort(queue, request, key=rank)
        self._held[id(request)] = (request.params.n, tokens)
        self.queued_slots[request.tier] += request.params.n
        self.queued_tokens[request.tier] += tokens

    def take(self, request: Request) -> bool:
        """Remove the request from whichever queue holds it; whether one did."""
        for queues in (self.waiting, self.swapped):
            queue = queues[request.tier]
            i = bisect.bisect_left(queue, rank(request), key=rank)
            if i < len(queue) and queue[i] is request:
                del queue[i]
                slots, tokens = self._held.pop(id(request))
                self.queued_slots[request.tier] -= slots
                self.queued_tokens[request.tier] -= tokens
                return True
        return False

    def is_swapped(self, request: Request) -> bool:
        queue = self.swapped[request.tier]
        i = bisect.bisect_left(queue, rank(request), key=rank)
        return i < len(queue) and queue[i] is request

    def first(self, tier: str, members: set[str] | None = None) -> Request | None:
        """The tier's best-ranked queued request, swapped or waiting (only `members` when given)."""
        best = None
        for queue in (self.waiting[tier], self.swapped[tier]):
            for request in queue:
                if members is None or request.request_id in members:
                    if best is None or rank(request) < rank(best):
                        best = request
                    break
        return best

    def num_waiting(self, tier: str | None = None) -> int:
        return sum(len(self.waiting[t]) for t in ([tier] if tier else TIERS))

    def num_swapped(self) -> int:
        return sum(len(q) for q in self.swapped.values())

    def __iter__(self):
        for tier in TIERS:
            yield from self.waiting[tier]
            yield from self.swapped[tier]
