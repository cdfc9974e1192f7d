"""The static-batching baseline's batch (`batching: static`; engine/scheduler/scheduler.py): its members, and
whether it still takes new ones."""

from __future__ import annotations

from engine.request.sequence import Request


class StaticBatch:
    def __init__(self) -> None:
        self.members: set[str] = set()  # the current batch's unfinished members (request ids)
        self.open = True  # new members may still join

    def update(self, running: list[Request]) -> None:
        """Before requests join: a new batch forms once the last one has finished, and an open batch closes once
        decoding has started, until it drains."""
        if not self.members:
            self.open = True
        elif self.open and any(r.seqs[0].num_output_tokens for r in running):
            self.open = False

    def joinable(self) -> set[str] | None:
        """The request ids that may join: None (any) while the batch is open, else the batch's own members (those
        preempted come back)."""
        return None if self.open else self.members

    def add(self, request: Request) -> None:
        self.members.add(request.request_id)

    def discard(self, request: Request) -> None:
        self.members.discard(request.request_id)
