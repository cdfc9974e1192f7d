"""HTTP/1.1 and Server-Sent Events framing, written by hand: the mock writes bytes straight to the transport."""

from __future__ import annotations

import json

SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")
STREAM_END = b"0\r\n\r\n"  # the chunked body's last chunk


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def sse(obj) -> bytes:
    return chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable",
            529: "Site is overloaded"}


def response(status: int, body: bytes, ctype: str = "application/json", extra_headers: str = "") -> bytes:
    reason = _REASONS.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"{extra_headers}Connection: keep-alive\r\n\r\n").encode() + body


def error(status: int, message: str, retry_after_s: float | None = None) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    extra = f"Retry-After: {retry_after_s:g}\r\n" if retry_after_s is not None else ""
    return response(status, json.dumps(body).encode(), extra_headers=extra)


# vLLM's words for its two refusals here, byte for byte in shape, since users point slobench at vLLM.
UNAUTHORIZED = response(401, b'{"error": "Unauthorized"}')  # vLLM's --api-key middleware


def model_not_found(name: str) -> bytes:
    """vLLM's 404 for a model it does not serve."""
    body = {"error": {"message": f"The model `{name}` does not exist.", "type": "NotFoundError", "code": 404}}
    return response(404, json.dumps(body).encode())
