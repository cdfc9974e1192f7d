"""OpenAI response shapes and their encoding: chunks, full responses, usage, JSON, server-sent events.

Beyond OpenAI's fields, responses carry slobench's `timing` (where the request's time went) and `service_tier`.
"""

from __future__ import annotations

import json
import time
from typing import Any

_JSON_SEPARATORS = (",", ":")
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
SSE_DONE = b"data: [DONE]\n\n"


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=_JSON_SEPARATORS, ensure_ascii=False)


def sse_event(obj: Any) -> bytes:
    return b"data: " + dumps(obj).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; with ``cached_tokens`` (prompt tokens served from the prefix cache) also
    ``prompt_tokens_details.cached_tokens``, as OpenAI and vLLM report it."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def front_end_ms(received: float, first_out: float, timing: Any) -> float | None:
    """This process's share of the TTFT: reading, parsing, templating and tokenizing the request until the
    engine took it, and the engine's first text until its handler had it (output processing, the pipe in
    the two-process server, the event loop); one monotonic clock for both processes."""
    if timing is None or timing.first_token_time is None:
        return None
    first_text = timing.first_text_time or timing.first_token_time
    return ((timing.arrival_time - received) + (first_out - first_text)) * 1e3


def timing_dict(timing: Any, tier: str, front_ms: float | None = None) -> dict[str, Any] | None:
    """The `timing` object of a response: the engine's queue / prefill / decode and, when the front end
    measured it, its own share of the TTFT (`front_end_ms`: request read -> engine arrival, plus the
    engine's first text -> its first output in the handler). `held_ms`: the engine's first token -> its first
    text, the steps an incomplete character was held back (a byte-level model), which sit between the
    engine's prefill and the client's first token."""
    if timing is None:
        return None
    out = {
        "queue_ms": round(timing.queue_ms, 3),
        "prefill_ms": round(timing.prefill_ms, 3),
        "decode_ms": round(timing.decode_ms, 3),
        "tier": getattr(timing, "tier", None) or tier,
        "held_ms": round(getattr(timing, "held_ms", 0.0), 3),
    }
    if front_ms is not None:
        out["front_end_ms"] = round(front_ms, 3)
    return out


def completion_chunk(rid: str, created: int, model: str, index: int, text: str, finish: str | None) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
    }


def chat_chunk(rid: str, created: int, model: str, index: int, delta: dict, finish: str | None) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def usage_chunk(kind: str, rid: str, created: int, model: str, usage_: dict, timing: dict | None) -> dict:
    chunk = {
        "id": rid,
        "object": "text_completion" if kind == "completion" else "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }
    if timing is not None:
        chunk["timing"] = timing
    return chunk


def full_response(
    kind: str,
    rid: str,
    created: int,
    model: str,
    tier: str,
    choices: list[tuple[int, str, str | None]],
    usage_: dict,
    timing: dict | None,
) -> dict:
    """choices: (index, text, finish_reason) for each of the n completions."""
    if kind == "completion":
        body_choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
            for i, text, finish in choices
        ]
        obj = "text_completion"
    else:
        body_choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            for i, text, finish in choices
        ]
        obj = "chat.completion"
    response = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "service_tier": tier,
        "choices": body_choices,
        "usage": usage_,
    }
    if timing is not None:
        response["timing"] = timing
    return response


def now_s() -> int:
    return int(time.time())
