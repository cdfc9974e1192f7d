"""A streamed response, chunk by chunk, into its request record: token times, usage, server timing.

Shared by the aiohttp replayer and the Locust user, so both drivers record a stream exactly alike.
"""

from __future__ import annotations

from loadgen.results.records import RequestRecord
from loadgen.target.sse import SSEParser, StreamError, chunk_content, decode_chunk

SERVER_KEYS = ("queue_ms", "prefill_ms", "decode_ms")


class StreamRecorder:
    def __init__(self, rec: RequestRecord, keep_text: bool = False):
        self.rec = rec
        self.parser = SSEParser()
        self.finished = False
        self.n_chunks = 0
        self.keep_text = keep_text  # keep the answer's text (a conversation's next turn sends it back)
        self._parts: list[str] = []

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
        if content := chunk_content(obj):  # TTFT and ITL count content chunks only, as vLLM's benchmark does
            if self.keep_text:
                self._parts.append(content)
            rec.token_s.append(t)
            self.n_chunks += 1
            if rec.first_token_s is None:
                rec.first_token_s = t
        choices = obj.get("choices")
        if choices and choices[0].get("finish_reason"):
            self.finished = True
        usage = obj.get("usage")
        if usage:
            rec.output_tokens = usage.get("completion_tokens", rec.output_tokens)
            rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
        timing = obj.get("timing")
        if timing:
            rec.server = {k: timing[k] for k in SERVER_KEYS if k in timing}

    def close(self) -> None:
        """The stream ended: raise StreamError unless it ended properly."""
        for ev in self.parser.close():
            if decode_chunk(ev.data) is None:
                self.finished = True
        if not self.finished:
            raise StreamError("stream ended without [DONE] or a finish_reason")
        if self.rec.output_tokens is None:
            self.rec.output_tokens = self.n_chunks  # no usage from the target: one token per content chunk
