"""Conversations with real history, for every driver: which requests go together, what turn k+1 sends, and
when it is due.

A workload's conversation with ``history: real`` arrives as specs whose turns >= 1 are ``follow_up``: their
prompt is only the new user message. A driver sends such a conversation as one unit (:func:`units`), in
one task, greenlet or user: the first turn at its arrival time, then each later turn ``think_time_s`` after
the previous reply ended — that instant is the turn's ``scheduled_s``, from which its latencies are
measured — with the previous prompt, the server's actual reply and the new message
(:meth:`Conversation.next_turn`):

- chat messages: the previous messages + ``{"role": "assistant", "content": reply}`` + the new user message;
- text: the previous prompt + the reply + ``"\\n"`` + the new user text.

Token-id prompts cannot carry a reply (its token ids are not known), so ``target.prepare`` renders these
conversations as chat (or text) before the run. A conversation ends at its first turn that is not ``ok``
(failed, rejected, cancelled by the client or the run); its later turns are not sent and leave no record
(the summary counts them, ``results.conversation_stats``). Nor is a turn sent once its due time is at or
after ``send_by_s`` (a capacity step's window end), or when the driver stops sending.

Sharding (:func:`shard`) keeps a conversation in one shard: units are dealt round-robin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loadgen.results.records import RequestRecord
from loadgen.workload.specs import RequestSpec

TEXT_TURN_SEPARATOR = "\n"  # between a reply and the next user text (text prompts)


@dataclass(slots=True)
class Unit:
    """What one task sends: a request, or a whole conversation with real history (head + follow-ups)."""

    head: RequestSpec
    rest: list[RequestSpec] = field(default_factory=list)

    @property
    def specs(self) -> list[RequestSpec]:
        return [self.head, *self.rest]


def units(specs: Iterable[RequestSpec]) -> list[Unit]:
    """Specs grouped into units, in the order of their first spec; a follow-up joins its conversation's
    earlier spec (the follow-ups in turn order). A follow-up with no earlier turn is an error."""
    out: list[Unit] = []
    open_convs: dict[str, Unit] = {}
    for s in specs:
        if s.follow_up:
            u = open_convs.get(s.conversation)
            if u is None:
                raise ValueError(f"{s.id}: turn {s.turn} of conversation {s.conversation!r} has no earlier turn "
                                 "among the specs (its history is unknown)")
            u.rest.append(s)
            continue
        u = Unit(s)
        out.append(u)
        if s.conversation is not None:
            open_convs[s.conversation] = u
    for u in out:
        u.rest.sort(key=lambda s: s.turn)
    return out


def shard(specs: Iterable[RequestSpec], count: int) -> list[list[RequestSpec]]:
    """``count`` shards of the specs, whole units dealt round-robin (plain specs: ``specs[i::count]``)."""
    out: list[list[RequestSpec]] = [[] for _ in range(count)]
    for i, u in enumerate(units(specs)):
        out[i % count].extend(u.specs)
    for part in out:
        part.sort(key=lambda s: s.arrival_s)
    return out


def renamed(unit: Unit, suffix: str) -> Unit:
    """The unit again with new request and conversation ids (a closed loop going round its specs)."""
    def r(s: RequestSpec) -> RequestSpec:
        return dataclasses.replace(s, id=f"{s.id}{suffix}",
                                   conversation=None if s.conversation is None else f"{s.conversation}{suffix}")
    return Unit(r(unit.head), [r(s) for s in unit.rest])


def fill_record(rec: RequestRecord, spec: RequestSpec) -> None:
    """The record's conversation and turn (any conversation, real history or not)."""
    if spec.conversation is not None:
        rec.conversation, rec.turn = spec.conversation, spec.turn


class Conversation:
    """One unit's history so far: the prompt last sent and the reply to it."""

    def __init__(self, unit: Unit):
        self.unit = unit
        self._next = 0  # index into unit.specs
        self._prompt: Any = None  # the prompt the last turn sent
        self._last: RequestRecord | None = None
        self.reply: str = ""
        self.ended: str | None = None  # why it ended early: "failed" | "window" | None

    @property
    def keep_text(self) -> bool:
        """Whether the driver must keep the replies' text (there is a turn that sends it back)."""
        return bool(self.unit.rest)

    def next_turn(self) -> tuple[RequestSpec, float | None] | None:
        """The next request to send and when (run clock; ``None``: the head, at its own arrival time), or
        ``None`` when the conversation is over."""
        specs = self.unit.specs
        if self.ended or self._next >= len(specs):
            return None
        spec = specs[self._next]
        if self._next == 0:
            self._next = 1
            return spec, None
        last = self._last
        due = (last.done_s or 0.0) + spec.think_time_s
        if spec.send_by_s is not None and due >= spec.send_by_s:
            self.ended = "window"
            return None
        self._next += 1
        return dataclasses.replace(spec, prompt=self._with_history(spec), prompt_tokens=None, segments=None), due

    def answered(self, sent: RequestSpec, rec: RequestRecord, reply: str) -> None:
        """A turn ended with this record and reply text; a turn that is not ``ok`` ends the conversation."""
        self._prompt, self._last, self.reply = sent.prompt_value(), rec, reply
        if rec.status != "ok":
            self.ended = "failed"

    def _with_history(self, spec: RequestSpec) -> Any:
        prev, new = self._prompt, spec.prompt
        if isinstance(prev, list) and prev and isinstance(prev[0], dict):
            user = new if isinstance(new, list) and new and isinstance(new[0], dict) else \
                [{"role": "user", "content": str(new)}]
            return [*prev, {"role": "assistant", "content": self.reply}, *user]
        if isinstance(prev, str) and isinstance(new, str):
            return prev + self.reply + TEXT_TURN_SEPARATOR + new
        raise ValueError(f"{spec.id}: a conversation with real history needs text or chat prompts (token ids cannot "
                         "carry the server's reply); target.prepare renders them, or set history: synthetic")
