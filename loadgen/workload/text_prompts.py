"""Token-id prompts as text of the same length, for servers that take only text (OpenAI's API,
``transformers serve``, TGI, gateways) and for chat endpoints.

A prompt's structure survives as text: its segments (``specs.Segment``: a shared system prompt, a request's
own body, each turn of a conversation, each Mooncake block) each become the deterministic text of their
key (``exact_text``), so equal prefixes are equal text, a conversation's history is a text prefix of its
next turn, and equal hash ids give equal text prefixes — the server's prefix cache sees what it would
have seen in token ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from loadgen.workload.exact_text import TextMaker
from loadgen.workload.specs import BlockPrompt, RequestSpec, Segment
from loadgen.workload.tokenizer import Tokenizer

SPOT_CHECKS = 8  # prompts per call encoded whole by default; one that is off makes every later one checked


def prompt_segments(spec: RequestSpec) -> tuple[Segment, ...] | None:
    """The segments of a spec's prompt; ``None`` for a prompt that is text or chat messages already. Token
    ids without recorded structure are one segment keyed by their content (equal prompts, equal text)."""
    if spec.segments is not None:
        return spec.segments
    p = spec.prompt
    if isinstance(p, BlockPrompt):
        return p.segments()
    if isinstance(p, list) and all(isinstance(t, (int, np.integer)) for t in p[:1]):
        digest = hashlib.blake2b(np.asarray(p, dtype=np.int64).tobytes(), digest_size=16).hexdigest()
        return (Segment(("ids", digest), len(p)),) if p else ()
    return None


def fit_segments(segments: Sequence[Segment], total: int, pad_key: tuple) -> tuple[Segment, ...]:
    """Exactly ``total`` tokens of segments: the last ones cut (a segment cut to ``m`` tokens renders as a
    prefix of its whole text), or a ``pad_key`` segment added when they are short of it."""
    out, left = [], total
    for s in segments:
        if left <= 0:
            break
        out.append(s if s.tokens <= left else Segment(s.key, left))
        left -= out[-1].tokens
    if left > 0:
        out.append(Segment(pad_key, left))
    return tuple(out)


def to_text(specs: Sequence[RequestSpec], source: Tokenizer | TextMaker, *, chat: bool = False,
            overhead_tokens: int = 0, verify: bool | None = None, seed: int = 0) -> TextMaker:
    """Turn every spec's prompt into text in place: a string for ``/v1/completions``, or with ``chat`` one
    user message (``[{"role": "user", "content": text}]``), so a conversation's history stays a prefix of
    the content and the template adds the same tokens to every request.

    ``spec.prompt_tokens`` stays the intended length; the text is ``intended - overhead_tokens`` tokens
    (at least 1): the tokens the server adds itself (the chat template, a BOS), measured by the caller, so
    the server counts the intended length. Text and chat prompts are left as they are (wrapped in a user
    message for ``chat``). ``verify``: ``True`` encodes every prompt whole and repairs what is off,
    ``False`` none, ``None`` the first ``SPOT_CHECKS`` (and all after the first one found off). Returns
    the ``TextMaker`` used (``source`` itself, or one built from the tokenizer with ``seed``): pass it to
    the next call to reuse its checked words and cached texts.
    """
    maker = source if isinstance(source, TextMaker) else TextMaker(source, seed=seed)
    checks = len(specs) if verify else (SPOT_CHECKS if verify is None else 0)
    for spec in specs:
        segs = prompt_segments(spec)
        if segs is None:
            if chat and isinstance(spec.prompt, str):
                spec.prompt = [{"role": "user", "content": spec.prompt}]
            continue
        intended = spec.prompt_tokens if spec.prompt_tokens is not None else sum(s.tokens for s in segs)
        segs = fit_segments(segs, max(1, intended - overhead_tokens), ("pad", spec.id))
        before = maker.mismatches
        text = maker.prompt(segs, check=checks > 0)
        checks -= 1
        if verify is None and maker.mismatches > before:
            checks = len(specs)  # the pool's guarantee failed on this tokenizer: check (and repair) every prompt
        spec.prompt = [{"role": "user", "content": text}] if chat else text
        spec.prompt_tokens = intended
    return maker
