"""Deterministic texts of an exact token length, and prompts joined from them.

The text of ``(key, n)`` is ``n`` words of the tokenizer's checked pool (``word_pool``), drawn from a
stream seeded by the key and joined by single spaces; its first word is a starter. Its length is known
without encoding it: every word is one token and every pair of pool words stays two, which covers each
word boundary in any text or join of texts. Because the stream is drawn in fixed chunks, the text of
``(key, m)`` is a prefix of the text of ``(key, n)`` for ``m < n`` (a cut Mooncake block, a trimmed turn).

``prompt(..., check=True)`` encodes the joined prompt and repairs it when the count is off (a tokenizer
whose merges reach across more than one space): first each segment on its own, remembered for the next
prompts, then the last segment of this prompt; ``ExactLengthError`` when bounded attempts do not reach it.
"""

from __future__ import annotations

import functools
import hashlib
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadgen.workload.specs import Segment
from loadgen.workload.tokenizer import Tokenizer
from loadgen.workload.word_pool import WordPool, build_pool

CHUNK = 1024  # words drawn per seeded chunk of a key's stream: prefix-consistent and cheap to draw
FIT_ATTEMPTS = 8  # full encodes to repair one text
CACHE = 4096  # segment texts kept (shared prefixes, Mooncake blocks, conversation history)


class ExactLengthError(ValueError):
    """No text of the requested token length was found (one line, for the CLI)."""


def key_hash(key: Any) -> tuple[int, int]:
    """A stable 128-bit hash of a key of ints and strings (Python's ``hash`` of a str changes per process;
    numpy ints are made plain so ``np.int64(3)`` and ``3`` are the same key)."""
    d = hashlib.blake2b(repr(_plain(key)).encode(), digest_size=16).digest()
    return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")


def _plain(x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return tuple(_plain(v) for v in x)
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    return x


class TextMaker:
    """Texts of exact lengths for one tokenizer; build it once per run (the pool takes a few hundred
    encodes) and pass it to every ``text_prompts.to_text`` call."""

    def __init__(self, tokenizer: Tokenizer, *, seed: int = 0, pool: WordPool | None = None):
        self.tokenizer = tokenizer
        self.seed = seed & 0xFFFFFFFFFFFFFFFF
        self.pool = pool if pool is not None else build_pool(tokenizer)
        self._words = np.asarray(self.pool.words, dtype=object)
        self._starters = np.asarray(self.pool.starters, dtype=np.int64)
        self._fixed: dict[tuple[Any, int], str] = {}  # segment texts repaired by a check
        self._cached = functools.lru_cache(maxsize=CACHE)(self._draw)
        self.checks = 0  # prompts encoded whole to check them
        self.mismatches = 0  # of those, prompts whose count was off before repair

    def text(self, key: Any, n: int) -> str:
        """Exactly ``n`` tokens (``n >= 1``), the same text for the same tokenizer, seed, key and ``n``."""
        if n < 1:
            raise ValueError(f"a text needs at least 1 token, got {n}")
        return self._fixed.get((key, n)) or self._cached(key, n)

    def prompt(self, segments: Sequence[Segment], *, check: bool = False) -> str:
        """The segments' texts joined by single spaces: exactly the sum of their tokens. ``check``
        encodes the result and repairs it (see the module docstring) instead of trusting the pool."""
        texts = [self.text(s.key, s.tokens) for s in segments]
        out = self.pool.sep.join(texts)
        if not check or not segments:
            return out
        total = sum(s.tokens for s in segments)
        self.checks += 1
        if self._count(out) == total:
            return out
        self.mismatches += 1
        for i, s in enumerate(segments):
            if self._count(texts[i]) != s.tokens:
                texts[i] = self._fixed[(s.key, s.tokens)] = self.fit("", s.key, s.tokens)
        out = self.pool.sep.join(texts)
        if self._count(out) == total:
            return out
        return self.fit(self.pool.sep.join(texts[:-1]), segments[-1].key, total)  # a junction changes the count

    def fit(self, head: str, key: Any, total: int) -> str:
        """``head`` plus pool words from ``key``'s repair stream, ``total`` tokens in all, found by encoding
        the whole and adding or dropping words by the difference."""
        base = self._count(head) if head else 0
        m, got = total - base, None
        idx = self._indices(("fit", key), max(total - base, 1) + 64)
        for _ in range(FIT_ATTEMPTS):
            if m < 1:
                break
            if m > len(idx):
                idx = self._indices(("fit", key), m + 64)
            tail = self.pool.sep.join(self._words[idx[:m]].tolist())
            text = f"{head}{self.pool.sep}{tail}" if head else tail
            got = self._count(text)
            if got == total:
                return text
            m += total - got
        raise ExactLengthError(f"{self.tokenizer.name}: found no text of exactly {total} tokens "
                               f"(last try: {got if got is not None else base} tokens) in {FIT_ATTEMPTS} attempts")

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def _draw(self, key: Any, n: int) -> str:
        return self.pool.sep.join(self._words[self._indices(key, n)].tolist())

    def _indices(self, key: Any, n: int) -> np.ndarray:
        """The first ``n`` word indices of ``key``'s stream, its first word a starter."""
        h = key_hash(key)
        chunks = [np.random.default_rng([self.seed, *h, j]).integers(0, len(self._words), CHUNK)
                  for j in range(-(-n // CHUNK))]
        idx = np.concatenate(chunks)[:n]
        idx[0] = self._starters[idx[0] % len(self._starters)]
        return idx
