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


def response(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: keep-alive\r\n\r\n").encode() + body


def error(status: int, message: str) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return response(status, json.dumps(body).encode())
