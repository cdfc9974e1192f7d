"""Request specs: what one request sends, and when.

A workload is a list of :class:`RequestSpec`, sorted by arrival time. Prompts are token ids (sent to
``/v1/completions``), text (``/v1/completions``) or chat messages (``/v1/chat/completions``). Long
trace prompts stay compact as :class:`BlockPrompt` and become token ids only when the request is sent.
For servers that take only text, segments (:class:`Segment`) describe a prompt's structure (shared
prefixes, blocks, conversation history) so ``workload.text_prompts`` can render it as text with the same sharing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

# Token ids are drawn from [lo, hi): inside every real vocabulary and the reference engine's byte-level
# tiny model (258 ids) alike. Set ``token_range`` for anything else.
DEFAULT_TOKEN_RANGE = (10, 250)


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a prompt as text renders it: the first ``tokens`` tokens of the deterministic text of
    ``key`` (plain ints and strings). Equal keys give equal texts, so prompts whose segments start alike
    start with the same text, as their token ids do."""

    key: tuple[Any, ...]
    tokens: int


@dataclass(frozen=True, slots=True)
class BlockPrompt:
    """A prompt made of deterministic blocks: block ``h`` is always the same ``block_size`` tokens.

    Two prompts that start with the same hash ids therefore start with the same tokens, which is what
    Mooncake's ``hash_ids`` mean. The last block is cut so the prompt has exactly ``num_tokens``.
    """

    hash_ids: tuple[int, ...]
    num_tokens: int
    block_size: int = 512
    seed: int = 0
    token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE

    def tokens(self) -> list[int]:
        if not self.hash_ids:
            return []
        parts = [_block(self.seed, h, self.block_size, self.token_range) for h in self.hash_ids]
        return np.concatenate(parts)[: self.num_tokens].tolist()

    def segments(self) -> tuple[Segment, ...]:
        """One segment per block, cut as :meth:`tokens` cuts them: equal hash ids, equal segments."""
        out, left = [], self.num_tokens
        for h in self.hash_ids:
            if left <= 0:
                break
            out.append(Segment(("block", self.seed, self.block_size, int(h)), min(self.block_size, left)))
            left -= self.block_size
        return tuple(out)


@functools.lru_cache(maxsize=4096)
def _block(seed: int, hash_id: int, block_size: int, token_range: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng([seed & 0xFFFFFFFF, hash_id & 0xFFFFFFFFFFFF, 0x5EED])
    return rng.integers(token_range[0], token_range[1], size=block_size, dtype=np.int64)


Prompt = Union[list[int], str, list[dict[str, str]], BlockPrompt]  # noqa: UP007 (runtime alias, py3.10)


@dataclass(slots=True)
class RequestSpec:
    id: str
    arrival_s: float
    prompt: Prompt
    max_tokens: int
    tier: str | None = None
    ignore_eos: bool = True
    prompt_tokens: int | None = None  # known (intended) input length; None for text of unknown length
    conversation: str | None = None  # multi-turn: conversation id and turn index
    turn: int = 0
    # the prompt's structure for text (synthetic workloads set it); None: derived from the prompt itself
    segments: tuple[Segment, ...] | None = None
    # a conversation with real history, turn >= 1: ``prompt`` is the new user message only; the driver sends
    # the previous turn's prompt + the server's reply + this message (``drivers.conversations``), due
    # ``think_time_s`` after the previous reply ended (``arrival_s`` is only the earliest it could be), and
    # not at all when that is at or after ``send_by_s`` (run clock; a capacity step's window end)
    follow_up: bool = False
    think_time_s: float = 0.0
    send_by_s: float | None = None
    # the cancellation mix (a user closing the tab): close the stream after this many content chunks, or
    # this many seconds after the scheduled time
    cancel_after_tokens: int | None = None
    cancel_after_s: float | None = None
    # the tier's client deadline (``tiers.<t>.timeout_s``): this many seconds after the scheduled time the
    # client gives up on the request (its record's status: timeout)
    deadline_s: float | None = None

    @property
    def cancel_reason(self) -> str | None:
        """The record's ``cancel_reason`` when the client closes this request's stream on purpose."""
        if self.cancel_after_tokens is not None:
            return f"client: after {self.cancel_after_tokens} tokens"
        if self.cancel_after_s is not None:
            return f"client: after {self.cancel_after_s:g} s"
        return None

    @property
    def kind(self) -> str:
        if isinstance(self.prompt, str):
            return "text"
        if isinstance(self.prompt, BlockPrompt):
            return "tokens"
        if self.prompt and isinstance(self.prompt[0], dict):
            return "chat"
        return "tokens"

    def prompt_value(self) -> Any:
        """The prompt as it goes into the request body (token ids materialised)."""
        return self.prompt.tokens() if isinstance(self.prompt, BlockPrompt) else self.prompt


@dataclass(slots=True)
class CancelMix:
    """``workload.cancel``: a seeded share ``ratio`` of requests closes its stream after ``after_tokens``
    content chunks, or ``after_s`` seconds after its scheduled time (exactly one of the two)."""

    ratio: float
    after_tokens: int | None = None
    after_s: float | None = None

    def apply(self, specs: list[RequestSpec], seed: int = 0) -> None:
        """Mark the chosen specs in place; the draw depends on the seed and the specs' order only."""
        rng = np.random.default_rng([seed & 0xFFFFFFFF, 0xCA7CE1])
        chosen = rng.random(len(specs)) < self.ratio
        for spec, c in zip(specs, chosen, strict=True):
            if c:
                spec.cancel_after_tokens, spec.cancel_after_s = self.after_tokens, self.after_s
