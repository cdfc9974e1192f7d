"""A streamed response, chunk by chunk, into its request record: token times, usage, server timing.

Shared by the aiohttp replayer and the Locust user, so both drivers record a stream exactly alike. It
reads completions and chat chunks and Responses API events alike (docs/ARCHITECTURE.md, "The per-request
record"): every chunk that carries tokens, reasoning or answer, is a time in ``token_s``; the first of
any kind is ``first_token_s``, the first answer token ``first_output_s``. When the server sends usage in
every chunk (vLLM's ``continuous_usage_stats``) each chunk's token count is the growth of
``completion_tokens`` (``chunk_tokens``); without it ``chunk_tokens`` stays None: one token per chunk.
"""

from __future__ import annotations

from typing import Any

from loadgen.results.records import RequestRecord
from loadgen.target.sse import RESPONSES_END, SSEParser, StreamError, chunk_parts, chunk_usage, decode_chunk

# front_end_ms and held_ms: the reference engine's (its front end's share; first token -> first text)
SERVER_KEYS = ("queue_ms", "prefill_ms", "decode_ms", "front_end_ms", "held_ms")
# vLLM's per-request `metrics` object (--enable-per-request-metrics), field by field, as its
# build_per_request_timing_metrics computes them from the engine's RequestStateStats:
#   queue_time_ms          = scheduled_ts − queued_ts          (waiting in the scheduler's queue)
#   time_to_first_token_ms = first_token_ts − scheduled_ts     (from scheduling: prefill, after the queue)
#   generation_time_ms     = last_token_ts − first_token_ts    (decode)
# the same intervals as its vllm:request_{queue,prefill,decode}_time_seconds histograms.
VLLM_METRICS = {"queue_ms": "queue_time_ms", "prefill_ms": "time_to_first_token_ms", "decode_ms": "generation_time_ms"}
SOURCE_VLLM = "vllm metrics"  # server["source"]: which per-request timing the record's server came from
SOURCE_SLOBENCH = "slobench timing"


def server_timing(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The record's ``server`` from a chunk (or a whole response): slobench's ``timing`` object, or vLLM's
    per-request ``metrics`` object mapped onto queue / prefill / decode; None when it has neither."""
    timing = obj.get("timing")
    if isinstance(timing, dict) and any(k in timing for k in SERVER_KEYS):
        return {**{k: timing[k] for k in SERVER_KEYS if k in timing}, "source": SOURCE_SLOBENCH}
    m = obj.get("metrics")
    if isinstance(m, dict) and any(isinstance(m.get(v), (int, float)) for v in VLLM_METRICS.values()):
        out: dict[str, Any] = {k: float(m[v]) for k, v in VLLM_METRICS.items() if isinstance(m.get(v), (int, float))}
        out["source"] = SOURCE_VLLM
        return out
    return None


class StreamRecorder:
    def __init__(self, rec: RequestRecord, keep_text: bool = False):
        self.rec = rec
        self.parser = SSEParser()
        self.finished = False
        self.n_chunks = 0  # chunks that carried tokens (reasoning or answer)
        self.n_reasoning_chunks = 0
        self.keep_text = keep_text  # keep the answer's text (a conversation's next turn sends it back)
        self._parts: list[str] = []
        self._counted = 0  # completion_tokens at the last token chunk (continuous usage)
        self._per_chunk: list[int] | None = []  # tokens per chunk while every token chunk carried usage
        self._reasoning_counted = 0  # tokens of the reasoning chunks (per chunk counts, or one each)
        self._usage_reasoning: int | None = None  # usage's completion_tokens_details.reasoning_tokens

    @property
    def text(self) -> str:
        """The answer's text so far (content only, no reasoning); empty unless ``keep_text``."""
        return "".join(self._parts)

    def feed(self, data: bytes, t: float) -> None:
        """Bytes as they arrived, at `t` seconds on the run's clock (split anywhere)."""
        for ev in self.parser.feed(data):
            self._event(ev.data, t)

    def _event(self, data: str, t: float) -> None:
        rec = self.rec
        obj = decode_chunk(data)
        if obj is None:  # [DONE]
            self.finished = True
            return
        content, reasoning = chunk_parts(obj)
        usage = chunk_usage(obj)
        if content or reasoning:  # TTFT and ITL count token chunks only, as vLLM's benchmark does
            if content and self.keep_text:
                self._parts.append(content)
            rec.token_s.append(t)
            self.n_chunks += 1
            if rec.first_token_s is None:
                rec.first_token_s = t
            if content and rec.first_output_s is None:
                rec.first_output_s = t
            k = 1
            if self._per_chunk is not None:
                if usage is not None and "completion_tokens" in usage:
                    k = max(1, usage["completion_tokens"] - self._counted)
                    self._counted = usage["completion_tokens"]
                    self._per_chunk.append(k)
                else:
                    self._per_chunk = None  # no usage delta on this chunk: one token per chunk, as before
            if reasoning and not content:
                self.n_reasoning_chunks += 1
                self._reasoning_counted += k
        choices = obj.get("choices")
        if (choices and choices[0].get("finish_reason")) or obj.get("type") in RESPONSES_END:
            self.finished = True
        if usage:
            rec.output_tokens = usage.get("completion_tokens", rec.output_tokens)
            rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
            rec.cached_tokens = usage.get("cached_tokens", rec.cached_tokens)
            self._usage_reasoning = usage.get("reasoning_tokens", self._usage_reasoning)
        if (server := server_timing(obj)) is not None:
            rec.server = server

    def close(self) -> None:
        """The stream ended: raise StreamError unless it ended properly."""
        for ev in self.parser.close():
            if decode_chunk(ev.data) is None:
                self.finished = True
        if not self.finished:
            raise StreamError("stream ended without [DONE], a finish_reason or response.completed")
        rec = self.rec
        per_chunk = self._per_chunk if self._per_chunk and len(self._per_chunk) == self.n_chunks else None
        rec.chunk_tokens = per_chunk  # None: no usage deltas, one token per chunk assumed
        if rec.output_tokens is None:  # no usage from the target: the chunks' tokens
            rec.output_tokens = sum(per_chunk) if per_chunk is not None else self.n_chunks
        if self._usage_reasoning is not None:
            rec.reasoning_tokens = self._usage_reasoning
        elif self.n_reasoning_chunks:
            rec.reasoning_tokens = self._reasoning_counted
