"""Incremental Server-Sent Events parser for OpenAI-style streams.

Feed it bytes exactly as they come off the socket, split anywhere (even inside a UTF-8 character or a
``\\r\\n`` pair); it returns the complete events seen so far. Follows the WHATWG event-stream rules that
matter for LLM servers: ``\\n``, ``\\r`` and ``\\r\\n`` line ends, multi-line ``data:`` joined by ``\\n``,
comment lines (``:``), an optional single space after the colon, an event dispatched at a blank line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

try:  # orjson parses a chunk ~3x faster; json is the fallback and gives the same objects
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads

DONE = "[DONE]"


@dataclass(slots=True)
class Event:
    data: str
    event: str | None = None
    id: str | None = None


class SSEParser:
    __slots__ = ("_buf", "_data", "_event", "_id", "_pending_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._pending_cr = False  # the last chunk ended in \r: a following \n belongs to it

    def feed(self, chunk: bytes) -> list[Event]:
        if self._pending_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._pending_cr = False
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            if buf.endswith(b"\r"):
                self._pending_cr = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, self._buf = buf.split(b"\n")
        if not lines:
            return []
        events: list[Event] = []
        for raw in lines:
            if not raw:  # blank line: dispatch
                if self._data:
                    events.append(Event("\n".join(self._data), self._event, self._id))
                self._data = []
                self._event = None
                continue
            if raw[0] == 58:  # b":" comment
                continue
            field, sep, value = raw.partition(b":")
            if sep and value[:1] == b" ":
                value = value[1:]
            name = field.decode("utf-8", "replace")
            if name == "data":
                self._data.append(value.decode("utf-8", "replace"))
            elif name == "event":
                self._event = value.decode("utf-8", "replace")
            elif name == "id":
                self._id = value.decode("utf-8", "replace")
            # "retry" and unknown fields are ignored
        return events

    def close(self) -> list[Event]:
        """End of stream: a final event without its blank line is still delivered (lenient)."""
        events = self.feed(b"\n\n") if (self._buf or self._data) else []
        return events


class StreamError(Exception):
    """An error object inside a 200 stream, or a malformed chunk."""


def decode_chunk(data: str) -> dict[str, Any] | None:
    """Decode one event's data: None for ``[DONE]``; raises StreamError for an error object (a chunk's
    ``error``, a Responses API ``error`` or ``response.failed`` event) or bad JSON."""
    if data == DONE:
        return None
    try:
        obj = _loads(data)
    except ValueError as e:
        raise StreamError(f"malformed chunk: {data[:200]!r}") from e
    if not isinstance(obj, dict):
        raise StreamError(f"chunk is not a JSON object: {data[:200]!r}")
    err = obj.get("error")
    kind = obj.get("type")
    if kind == "error":  # the Responses API's error event: code and message at the top
        err = {"message": obj.get("message") or "error event", "code": obj.get("code")}
    elif kind == "response.failed":
        err = (obj.get("response") or {}).get("error") or {"message": "response.failed"}
    if err:
        if isinstance(err, dict):
            msg = err.get("message") or json.dumps(err)
            code = err.get("code") or err.get("type")
            raise StreamError(f"{code}: {msg}" if code else str(msg))
        raise StreamError(str(err))
    return obj


# Responses API events (POST /v1/responses, stream: true) that carry generated text
RESPONSES_TEXT = "response.output_text.delta"
RESPONSES_REASONING = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
RESPONSES_END = ("response.completed", "response.incomplete")  # no [DONE]: the stream ends with one of these


def chunk_parts(obj: dict[str, Any]) -> tuple[str, str]:
    """(answer text, reasoning text) of a completions or chat chunk or a Responses API event ("" when
    none). Reasoning is a chat delta's ``reasoning_content`` (DeepSeek, older vLLM) or ``reasoning``
    (vLLM), or a Responses reasoning (summary) delta."""
    kind = obj.get("type")
    if kind is not None and "choices" not in obj:
        if kind == RESPONSES_TEXT:
            return obj.get("delta") or "", ""
        if kind in RESPONSES_REASONING:
            return "", obj.get("delta") or ""
        return "", ""
    choices = obj.get("choices")
    if not choices:
        return "", ""
    c = choices[0]
    text = c.get("text")
    if text is not None:
        return text or "", ""
    delta = c.get("delta")
    if not delta:
        return "", ""
    return delta.get("content") or "", delta.get("reasoning_content") or delta.get("reasoning") or ""


def chunk_content(obj: dict[str, Any]) -> str:
    """The answer text of a chunk or event ("" when none; reasoning is not content)."""
    return chunk_parts(obj)[0]


def chunk_usage(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The usage of a chunk, or of a Responses ``response.completed`` / ``response.incomplete`` event,
    in chat-completions names: ``prompt_tokens``, ``completion_tokens``, ``reasoning_tokens`` and
    ``cached_tokens`` where the server says them."""
    usage = obj.get("usage")
    if usage is None and obj.get("type") in RESPONSES_END:
        usage = (obj.get("response") or {}).get("usage")
        if isinstance(usage, dict):
            return _usage(usage.get("input_tokens"), usage.get("output_tokens"),
                          usage.get("output_tokens_details"), usage.get("input_tokens_details"))
    if not isinstance(usage, dict):
        return None
    return _usage(usage.get("prompt_tokens"), usage.get("completion_tokens"),
                  usage.get("completion_tokens_details"), usage.get("prompt_tokens_details"))


def _usage(n_in: Any, n_out: Any, out_details: Any, in_details: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(n_in, int):
        out["prompt_tokens"] = n_in
    if isinstance(n_out, int):
        out["completion_tokens"] = n_out
    if isinstance(out_details, dict) and isinstance(out_details.get("reasoning_tokens"), int):
        out["reasoning_tokens"] = out_details["reasoning_tokens"]
    if isinstance(in_details, dict) and isinstance(in_details.get("cached_tokens"), int):
        out["cached_tokens"] = in_details["cached_tokens"]
    return out
