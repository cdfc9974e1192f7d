"""Which model a target serves, how to read its refusals, and the error for a target that cannot be used
at all."""

from __future__ import annotations

import json
import urllib.request


class TargetError(RuntimeError):
    """The target cannot be used (unreachable, no models, died mid-run)."""


def discover_model(target: str, timeout_s: float = 10.0) -> str:
    """The first model id of ``GET {target}/v1/models`` (blocking: call it before a run starts, or in an
    executor)."""
    url = target.rstrip("/") + "/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 (the user's target URL)
            data = json.loads(r.read()).get("data") or []
    except urllib.error.HTTPError as e:
        raise TargetError(f"GET {url} returned HTTP {e.code}; pass --model") from e
    except (OSError, ValueError) as e:
        raise TargetError(f"cannot reach {target}: {type(e).__name__}: {e}") from e
    if not data:
        raise TargetError(f"{url} lists no model; pass --model")
    return data[0]["id"]


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
