"""A request wider than the batch: its n completions run as n children that queue for slots, as vLLM's do.

A request whose n sequences could never run together (n above its tier's batch slots, or n copies of its KV
beyond the pool while one copy fits) is split at intake into n requests of one sequence each, `<id>#<i>`: each
queues, is admitted and is preempted on its own, and they share the prompt's KV through the prefix cache when
they run together. Child i samples from completion i's random stream (seed + i) and reports index i, so the
completions are those the request would have had in one piece. `FanOut.merge` turns the children's outputs of
a step back into one output of the parent, which finishes when every child has; a child that fails fails the
parent (its siblings are aborted).
"""

from __future__ import annotations

import dataclasses
import threading

from engine.request.outputs import CompletionOutput, RequestOutput, Timing
from engine.request.sequence import Request
from engine.request.timing import request_timing


@dataclasses.dataclass
class ChildGroup:
    parent_id: str
    children: list[Request]
    done: bool = False

    @property
    def started(self) -> bool:
        """A child has shown its client something: the group's answer is under way."""
        return any(c.first_text_time is not None for c in self.children)


def _standing(child: Request) -> CompletionOutput:
    """A child's completion as it stands, nothing new this step."""
    if not child.seqs:
        return CompletionOutput(child.child_index, [], "", [], "", None)
    seq = child.seqs[0]
    return CompletionOutput(seq.index, list(seq.output_ids), seq.text[: seq.emitted_text_len], [], "",
                            seq.finish_reason)


class FanOut:
    """The engine's split requests: parent id -> its children (the children's ids map back)."""

    def __init__(self) -> None:
        self.groups: dict[str, ChildGroup] = {}
        self.parent_of: dict[str, str] = {}  # every child not yet finished -> its parent
        self._lock = threading.Lock()  # add (any thread) vs merge (the engine thread)

    def split(self, request_id: str, prompt_ids: list[int], params, tier: str, sheddable: bool) -> list[Request]:
        params_one = dataclasses.replace(params, n=1)
        children = [Request(f"{request_id}#{i}", prompt_ids, params_one, tier, sheddable=sheddable,
                            parent_id=request_id, child_index=i) for i in range(params.n)]
        with self._lock:
            self.groups[request_id] = ChildGroup(request_id, children)
            self.parent_of.update((c.request_id, request_id) for c in children)
        return children

    def children_ids(self, request_id: str) -> list[str]:
        group = self.groups.get(request_id)
        return [c.request_id for c in group.children] if group else []

    def group_of(self, request: Request) -> ChildGroup | None:
        return self.groups.get(request.parent_id) if request.parent_id else None

    def merge(self, outputs: dict[str, RequestOutput]) -> tuple[dict[str, RequestOutput], list[str]]:
        """The step's outputs with the children's replaced by their parents'; and the children to abort (the
        siblings of a child that failed)."""
        touched: dict[str, ChildGroup] = {}
        merged: dict[str, RequestOutput] = {}
        news: dict[str, RequestOutput] = {}
        for rid, out in outputs.items():
            parent = self.parent_of.get(rid)
            if parent is None:
                merged[rid] = out
                continue
            if out.finished:
                with self._lock:
                    del self.parent_of[rid]
            group = self.groups.get(parent)
            if group is not None:  # else its parent has answered already (a sibling failed): nobody listens
                news[rid] = out
                touched[parent] = group
        to_abort: list[str] = []
        for pid, group in touched.items():
            outs = [news.get(c.request_id) for c in group.children]
            error = next((o.error for o in outs if o is not None and o.error), None)
            completions = []
            for child, out in zip(group.children, outs, strict=True):
                completions.append(out.outputs[0] if out is not None and out.outputs else _standing(child))
            finished = error is not None or all(c.is_finished for c in group.children)
            shed = [o for o in outs if o is not None and o.retry_after_s is not None]
            if finished:
                to_abort += [c.request_id for c in group.children if not c.is_finished]
                with self._lock:
                    self.groups.pop(pid, None)
            first = next(o for o in outs if o is not None)
            merged[pid] = RequestOutput(pid, first.tier, first.prompt_token_ids, completions, finished,
                                        group_timing(group) if finished else None, first.num_cached_tokens, error,
                                        shed[0].retry_after_s if shed and finished else None)
        return merged, to_abort


def group_timing(group: ChildGroup) -> Timing:
    """The parent's timing: its first child's queue and prefill (the first completion's tokens are the client's
    first), decoding until the last child finished."""
    lead = group.children[0]
    timing = request_timing(lead)
    end = max(c.finished_time or timing.finished_time for c in group.children)
    first = lead.first_token_time or end
    return dataclasses.replace(timing, finished_time=end, decode_ms=(end - first) * 1e3)
