"""How much of a workload's prompt tokens a prefix cache could serve from the workload itself.

A request can hit the target's prefix cache only for the leading tokens it shares with an earlier request
of the same run (a shared system prompt, a conversation's history, Mooncake blocks with equal hash ids).
``PrefixShare`` walks the prompts in send order through a trie of their segments and counts those
tokens (a conversation's later turn with real history shares all of its previous prompt and reply): an
upper bound on the hit rate a cold cache can show for this run (a real cache hits less: it caches whole
blocks and evicts). A target that reports more hits than that served prompts it had seen before the
run: its cache was warm (``results.prefix_cache``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from loadgen.workload.specs import RequestSpec, Segment
from loadgen.workload.text_prompts import prompt_segments


class PrefixShare:
    """A running count over the specs fed to it, in send order (a capacity run feeds it step by step)."""

    def __init__(self) -> None:
        self._root: dict[Any, Any] = {}
        self.prompt_tokens = 0
        self.shareable_tokens = 0
        self._history: dict[str, int] = {}  # conversation -> tokens of its last prompt and reply

    def add(self, specs: Iterable[RequestSpec]) -> None:
        # a conversation's turns in order (a later turn's arrival is only the earliest it could be sent)
        for spec in sorted(specs, key=lambda s: (s.conversation is not None and s.follow_up, s.arrival_s, s.turn)):
            segs = _segments_of(spec)
            total = sum(s.tokens for s in segs)
            if spec.follow_up and spec.conversation is not None:
                # a later turn with real history: the driver sends the previous prompt and the server's reply
                # (``max_tokens`` long at most) before the new message, all of it seen by the cache before
                history = self._history.get(spec.conversation, 0)
                self.prompt_tokens += history + total
                self.shareable_tokens += history
                self._history[spec.conversation] = history + total + spec.max_tokens
                continue
            self.prompt_tokens += total
            self.shareable_tokens += self._walk(segs)
            if spec.conversation is not None:
                self._history[spec.conversation] = total + spec.max_tokens

    @property
    def share(self) -> float | None:
        """Shareable tokens over all prompt tokens; None before any prompt."""
        return self.shareable_tokens / self.prompt_tokens if self.prompt_tokens else None

    def _walk(self, segs: tuple[Segment, ...]) -> int:
        """Tokens of ``segs`` shared with a prompt seen before; then the prompt is remembered. A node maps a
        segment's key to its lengths seen, each with the node that follows it."""
        node: dict[Any, dict[int, dict]] | None = self._root
        shared = 0
        insert = self._root
        for seg in segs:
            # a segment cut to m tokens renders as the first m tokens of its key's text: equal keys share the
            # shorter length; the walk goes on past a segment only when one of exactly its length was seen
            if node is not None:
                lengths = node.get(seg.key)
                if lengths:
                    shared += min(max(lengths), seg.tokens)
                    node = lengths.get(seg.tokens)
                else:
                    node = None
            insert = insert.setdefault(seg.key, {}).setdefault(seg.tokens, {})
        return shared


def _segments_of(spec: RequestSpec) -> tuple[Segment, ...]:
    """A spec's segments; a text or chat prompt without recorded structure is one segment of its content."""
    segs = prompt_segments(spec)
    if segs is not None:
        return segs
    text = spec.prompt if isinstance(spec.prompt, str) else json.dumps(spec.prompt, sort_keys=True)
    digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    tokens = spec.prompt_tokens if spec.prompt_tokens is not None else max(1, len(text) // 4)
    return (Segment(("text", digest), int(tokens)),)
