"""How slobench reaches a target: its base URL, the credentials and headers every request carries, and the
check before any load that the target is there, lets us in and serves the model.

A base URL is taken with or without ``/v1`` (``http://host:8000`` and ``http://host:8000/v1`` are the same
target). ``--api-key`` (default ``$OPENAI_API_KEY``) is sent as ``Authorization: Bearer KEY``; ``--header``
adds any other (a gateway's tenant or routing header) and may override that one. The Prometheus page is
scraped without them: servers keep ``/metrics`` open (vLLM's ``--api-key`` guards only ``/v1``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loadgen.target.discovery import TargetError, error_text


class AccessError(TargetError):
    """The target cannot be used as given: nothing listens, it refuses the credentials, or it does not serve
    the model. Found before any load is sent; a usage error (exit 2), not a failure of the target."""


@dataclass
class Access:
    """The credentials and headers every request to the target carries."""

    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def http_headers(self) -> dict[str, str]:
        """The request headers: ``Authorization: Bearer KEY`` when there is a key, then ``--header``'s."""
        out = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {**out, **self.headers}


def base_url(url: str) -> str:
    """The target's base URL: no trailing slash, no trailing ``/v1`` (the paths slobench calls carry it)."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def parse_header(text: str) -> tuple[str, str]:
    """``'X-Tenant: batch'`` -> ``("X-Tenant", "batch")``; ValueError on anything else."""
    name, sep, value = text.partition(":")
    name = name.strip()
    if not sep or not name or any(c.isspace() for c in name):
        raise ValueError(f"--header {text!r}: expected 'Name: value'")
    return name, value.strip()


def parse_extra_body(text: str) -> dict[str, Any]:
    """``--extra-body '{"temperature": 0}'``: a JSON object merged into every request's body."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--extra-body: not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"--extra-body: expected a JSON object, found {type(obj).__name__}")
    return obj


def check_target(target: str, model: str | None, headers: Mapping[str, str], timeout_s: float = 10.0) -> str:
    """The model to send, after ``GET {target}/v1/models`` with the run's headers: the first model it lists
    when ``model`` is None. Raises AccessError (one line) when nothing listens at ``target``, it refuses the
    credentials (401 / 403), or it lists models and ``model`` is not among them; TargetError when it cannot
    say which model and none was given. A server without ``/v1/models`` is fine when ``model`` is given."""
    url = target.rstrip("/") + "/v1/models"
    req = urllib.request.Request(url, headers=dict(headers))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 (the user's target URL)
            raw = r.read()
    except urllib.error.HTTPError as e:
        body = e.read()
        if e.code in (401, 403):
            has_key = any(k.lower() == "authorization" for k in headers)
            hint = ("the API key was refused (check --api-key or OPENAI_API_KEY)" if has_key else
                    "it needs an API key: pass --api-key KEY or set OPENAI_API_KEY")
            raise AccessError(f"{target} refused GET /v1/models ({error_text(body, e.code)}): {hint}") from None
        if model:
            return model  # no model list (a gateway, a minimal server): the probe finds out the rest
        raise TargetError(f"GET {url} returned HTTP {e.code}; pass --model") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, ConnectionRefusedError):
            raise AccessError(f"nothing is listening at {target} (connection refused); is the server running, "
                              "and is the URL's port right?") from None
        raise AccessError(f"cannot reach {target}: {type(reason).__name__}: {reason}") from None
    except (OSError, ValueError) as e:
        raise AccessError(f"cannot reach {target}: {type(e).__name__}: {e}") from None
    try:
        listed = [m["id"] for m in json.loads(raw).get("data") or [] if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError):
        listed = []
    if model is None:
        if not listed:
            raise TargetError(f"{url} lists no model; pass --model")
        return listed[0]
    if listed and model not in listed:
        raise AccessError(f"{target} does not serve model {model!r} (it serves: {', '.join(listed[:10])}); "
                          "fix --model")
    return model
