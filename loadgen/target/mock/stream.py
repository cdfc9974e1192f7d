"""What one streamed answer of the mock looks like: its chunks, when each is due, and the final chunk.

The server (``mock.server``) writes ``opening`` at once, each of ``emissions`` at its time after the
request arrived (on an absolute schedule, so timer overshoot never accumulates), then ``closing``.

The schedule, exact and known: the answer's ``n_out`` tokens are grouped into chunks of
``tokens_per_chunk`` (K), the first ``reasoning_tokens`` (R) as reasoning chunks (chat:
``delta.reasoning_content`` or ``delta.reasoning``; Responses: ``response.reasoning_text.delta``) and the
rest as answer chunks, no chunk mixing the two. The first chunk is due at ``ttft_ms`` (plus
``prefill_ms_per_token`` x the prompt's tokens); every later chunk of k tokens ``k × itl_ms`` after the one
before, so every token's ITL is exactly ``itl_ms``. With K = 1 the first answer token is due at
``ttft_ms + R × itl_ms``. The times count from the request's slot (queueing mode, ``mock.slots``), which is
its arrival when there is no queue; ``closing`` is told the time it waited for the slot.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadgen.target.mock.config import MockConfig, answer_model
from loadgen.target.mock.wire import chunk, sse

DONE = chunk(b"data: [DONE]\n\n")


@dataclass(slots=True)
class StreamPlan:
    opening: bytes  # written with the response head (a strict chat server's role chunk)
    emissions: list[tuple[float, bytes]]  # (seconds after arrival, the chunks due then), in time order
    closing: Callable[..., bytes]  # (decode ms, queue ms=0) → the last bytes: usage, timing, [DONE]
    n_out: int
    n_in: int


def token_groups(cfg: MockConfig, n_out: int, reasoning: bool) -> list[tuple[int, bool]]:
    """(tokens, is reasoning) of each chunk, in order."""
    r = min(cfg.reasoning_tokens, n_out) if reasoning else 0
    k = max(1, cfg.tokens_per_chunk)
    out = [(min(k, r - i), True) for i in range(0, r, k)]
    return out + [(min(k, n_out - r - i), False) for i in range(0, n_out - r, k)]


def due_times(cfg: MockConfig, groups: list[tuple[int, bool]], n_in: int = 0) -> list[float]:
    """Seconds after its slot each chunk is due: the first at the prefill time (``cfg.prefill_ms``), each
    later one its tokens × itl after."""
    ttft, itl = cfg.prefill_ms(n_in) / 1000.0, cfg.itl_ms / 1000.0
    out, t = [], ttft
    for i, (k, _) in enumerate(groups):
        t = ttft if i == 0 else t + k * itl
        out.append(t)
    return out


def vllm_metrics(cfg: MockConfig, groups: list[tuple[int, bool]], n_out: int, n_in: int = 0,
                 queue_ms: float = 0.0) -> dict[str, float]:
    """vLLM's per-request ``metrics`` object (``--enable-per-request-metrics``) for this schedule: the
    queue it waited, first token after queue + prefill, generation = first token to last."""
    due = due_times(cfg, groups, n_in)
    gen_ms = (due[-1] - due[0]) * 1000.0 if due else 0.0
    ttft = queue_ms + cfg.prefill_ms(n_in)
    out = {"queue_time_ms": queue_ms, "time_to_first_token_ms": ttft, "generation_time_ms": gen_ms,
           "tokens_per_second": n_out / (ttft + gen_ms) * 1000.0 if ttft + gen_ms > 0 else 0.0}
    if n_out > 1:
        out["mean_itl_ms"] = gen_ms / (n_out - 1)
    return out


def plan_stream(cfg: MockConfig, req: dict[str, Any], chat: bool, head: dict[str, Any], n_out: int,
                n_in: int) -> StreamPlan:
    """The chunks of one completions or chat answer of ``n_out`` tokens (the schedule above)."""
    opts = req.get("stream_options") or {}
    usage = bool(opts.get("include_usage"))
    continuous = usage and bool(opts.get("continuous_usage_stats")) and not cfg.strict  # vLLM's rule
    groups = token_groups(cfg, n_out, reasoning=chat)

    def content(k: int, think: bool, finish: str | None, done: int) -> bytes:
        text = " tok" * k
        if chat:
            choice = {"index": 0, "delta": {cfg.reasoning_field if think else "content": text},
                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = {**head, "choices": [choice]}
        if continuous:
            obj["usage"] = {"prompt_tokens": n_in, "completion_tokens": done, "total_tokens": n_in + done}
        return sse(obj)

    opening = b""
    if cfg.strict and chat:  # as OpenAI does: the role first, in a chunk with no content (not a token)
        opening = sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "finish_reason": None}]})
    emissions, done = [], 0
    for i, (t, (k, think)) in enumerate(zip(due_times(cfg, groups, n_in), groups, strict=True)):
        done += k
        emissions.append((t, content(k, think, "length" if i == len(groups) - 1 else None, done)))
    n_think = sum(k for k, think in groups if think)

    def closing(decode_ms: float, queue_ms: float = 0.0) -> bytes:
        out = []
        if usage:
            u: dict[str, Any] = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
            if n_think:
                u["completion_tokens_details"] = {"reasoning_tokens": n_think}
            final = {**head, "choices": [], "usage": u}
            if cfg.per_request_metrics:  # vLLM --enable-per-request-metrics: on the final usage chunk
                final["metrics"] = vllm_metrics(cfg, groups, n_out, n_in, queue_ms)
            elif not cfg.strict and cfg.metrics_flavor == "vllm":  # the reference engine's extension only
                final["timing"] = {"queue_ms": queue_ms, "prefill_ms": cfg.prefill_ms(n_in), "decode_ms": decode_ms,
                                   "tier": req.get("service_tier") or "standard"}
            out.append(sse(final))
        out.append(DONE)
        return b"".join(out)

    return StreamPlan(opening, emissions, closing, n_out, n_in)


def _event(obj: dict[str, Any]) -> bytes:
    return chunk(b"event: " + obj["type"].encode() + b"\ndata: " + json.dumps(obj, separators=(",", ":")).encode()
                 + b"\n\n")


def plan_responses(cfg: MockConfig, req: dict[str, Any], rid: str, created: int, n_out: int,
                   n_in: int) -> StreamPlan:
    """One streamed Responses API answer (``POST /v1/responses``): ``response.created``, reasoning and
    output text deltas on the schedule above, then ``response.completed`` with the usage (no ``[DONE]``)."""
    groups = token_groups(cfg, n_out, reasoning=True)
    seq = iter(range(1 << 30))
    resp = {"id": rid, "object": "response", "created_at": created, "model": answer_model(cfg, req),
            "status": "in_progress", "output": [], "usage": None, "error": None}
    opening = _event({"type": "response.created", "sequence_number": next(seq), "response": resp})
    emissions = []
    for t, (k, think) in zip(due_times(cfg, groups, n_in), groups, strict=True):
        kind = "response.reasoning_text.delta" if think else "response.output_text.delta"
        item = f"rs_{rid}" if think else f"msg_{rid}"
        emissions.append((t, _event({"type": kind, "item_id": item, "output_index": 0 if think else 1,
                                     "content_index": 0, "delta": " tok" * k, "sequence_number": next(seq)})))
    n_think = sum(k for k, think in groups if think)
    text = " tok" * (n_out - n_think)

    def closing(decode_ms: float, queue_ms: float = 0.0) -> bytes:
        usage = {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n_out,
                 "output_tokens_details": {"reasoning_tokens": n_think}, "total_tokens": n_in + n_out}
        message = {"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]}
        final = {**resp, "status": "completed", "output": [message], "usage": usage}
        return _event({"type": "response.completed", "sequence_number": next(seq), "response": final})

    return StreamPlan(opening, emissions, closing, n_out, n_in)
