"""What one streamed answer of the mock looks like: its chunks, when each is due, and the final chunk.

The server (``mock.server``) writes ``opening`` at once, each of ``emissions`` at its time after the
request arrived (on an absolute schedule, so timer overshoot never accumulates), then ``closing``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadgen.target.mock.config import MockConfig
from loadgen.target.mock.wire import chunk, sse

DONE = chunk(b"data: [DONE]\n\n")


@dataclass(slots=True)
class StreamPlan:
    opening: bytes  # written with the response head (a strict chat server's role chunk)
    emissions: list[tuple[float, bytes]]  # (seconds after arrival, the chunks due then), in time order
    closing: Callable[[float], bytes]  # decode ms → the last bytes: usage, timing, [DONE]
    n_out: int
    n_in: int


def plan_stream(cfg: MockConfig, req: dict[str, Any], chat: bool, head: dict[str, Any], n_out: int,
                n_in: int) -> StreamPlan:
    """The chunks of one answer of ``n_out`` tokens: the first at ``ttft_ms``, the next ``itl_ms`` apart."""
    usage = bool((req.get("stream_options") or {}).get("include_usage"))

    def content(text: str, finish: str | None = None) -> bytes:
        choice = ({"index": 0, "delta": {"content": text}, "finish_reason": finish} if chat
                  else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        return sse({**head, "choices": [choice]})

    opening = b""
    if cfg.strict and chat:  # as OpenAI does: the role first, in a chunk with no content (not a token)
        opening = sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "finish_reason": None}]})
    token, last = content(" tok"), content(" tok", "length")
    ttft, itl = cfg.ttft_ms / 1000.0, cfg.itl_ms / 1000.0
    emissions = [(ttft + k * itl, token) for k in range(n_out - 1)] + [(ttft + (n_out - 1) * itl, last)]

    def closing(decode_ms: float) -> bytes:
        out = []
        if usage:
            final = {**head, "choices": [],
                     "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}}
            if not cfg.strict and cfg.metrics_flavor == "vllm":  # the reference engine's extension only
                final["timing"] = {"queue_ms": 0.0, "prefill_ms": cfg.ttft_ms, "decode_ms": decode_ms,
                                   "tier": req.get("service_tier") or "standard"}
            out.append(sse(final))
        out.append(DONE)
        return b"".join(out)

    return StreamPlan(opening, emissions, closing, n_out, n_in)
