"""How to read a target's refusals, and the error for a target that cannot be used at all (which model it
serves: ``target/access.py`` ``check_target``)."""

from __future__ import annotations

import json


class TargetError(RuntimeError):
    """The target cannot be used (unreachable, no models, died mid-run)."""


def error_text(raw: bytes, status: int) -> str:
    """``HTTP 422: <the server's message>`` from an error body: OpenAI's ``{"error": {"message"}}`` (vLLM's
    404 for an unknown model too), vLLM's ``--api-key`` 401 ``{"error": "Unauthorized"}``, FastAPI's
    ``{"detail": ...}`` (``transformers serve``), else the start of whatever it sent. A 401 says what to check."""
    hint = " (a missing or wrong API key: --api-key)" if status == 401 else ""
    try:
        obj = json.loads(raw)
    except ValueError:
        return f"HTTP {status}: {raw[:300].decode('utf-8', 'replace')}{hint}"
    err = obj.get("error", obj.get("detail", obj)) if isinstance(obj, dict) else obj
    msg = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
    return f"HTTP {status}: {msg or json.dumps(err)[:300]}{hint}"
