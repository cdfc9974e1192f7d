"""What every driver sends: the client settings and the OpenAI request body for one spec. Shared by the
aiohttp replayer and the Locust users, so both send byte-identical requests."""

from __future__ import annotations

import email.utils
import json
import time
from dataclasses import dataclass, field
from typing import Any

from loadgen.target.request_shape import RequestShape
from loadgen.workload.specs import RequestSpec


@dataclass(slots=True)
class ClientConfig:
    target: str  # base URL, e.g. http://127.0.0.1:8000
    model: str | None = None  # None: the first id of GET /v1/models
    max_connections: int = 0  # 0: unlimited
    read_timeout_s: float | None = 300.0  # longest silence inside a stream; no total timeout
    connect_timeout_s: float = 10.0
    headers: dict[str, str] = field(default_factory=dict)  # on every request: Authorization, --header (a secret)
    shape: RequestShape = field(default_factory=RequestShape)  # the optional fields the target accepts
    extra_body: dict[str, Any] = field(default_factory=dict)  # --extra-body: merged into every request's body
    abort_after_conn_errors: int = 10  # consecutive connection failures that end the run (0: never)
    retries: int = 0  # client.retries: resend a shed request (429 / 503 / 529) up to this many times
    retry_max_wait_s: float = 30.0  # the longest Retry-After honoured before a resend


def retry_after(value: str | list[str] | None) -> float | None:
    """A ``Retry-After`` header in seconds: delta-seconds, or an HTTP date (seconds from now); None when
    absent or unreadable (a repeated header: its first)."""
    if isinstance(value, list):
        value = value[0] if value else None
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def tier_headers(spec: RequestSpec, cfg: ClientConfig) -> dict[str, str] | None:
    """The headers a request of this spec's tier carries beside the run's own (``tiers.<t>.headers``)."""
    return cfg.shape.tier_headers.get(spec.tier) if spec.tier else None


def build_body(spec: RequestSpec, cfg: ClientConfig, model: str) -> tuple[str, bytes]:
    """The endpoint path and JSON body for one request: ``/v1/completions`` or ``/v1/chat/completions``
    by the prompt's kind (every prompt to chat with ``shape.chat``), or the Responses API
    (``shape.endpoint == "responses"``: ``input`` is the text or the messages, ``max_output_tokens``)."""
    shape = cfg.shape
    if shape.endpoint == "responses":
        path = "/v1/responses"
        prompt = spec.prompt if spec.kind == "chat" else spec.prompt_value()
        body: dict[str, Any] = {"model": model, "input": prompt, "max_output_tokens": spec.max_tokens, "stream": True}
    else:
        body = {"model": model, "max_tokens": spec.max_tokens, "stream": True}
        if shape.continuous_usage:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        elif shape.include_usage:
            body["stream_options"] = {"include_usage": True}
        if spec.kind == "chat" or shape.endpoint == "chat":
            path = "/v1/chat/completions"
            chat = spec.kind == "chat"
            body["messages"] = spec.prompt if chat else [{"role": "user", "content": spec.prompt_value()}]
        else:
            path = "/v1/completions"
            body["prompt"] = spec.prompt_value()
    if spec.ignore_eos and shape.ignore_eos:
        body["ignore_eos"] = True
    if shape.service_tier and spec.tier:
        body["service_tier"] = spec.tier
    if spec.tier in shape.priorities:
        body["priority"] = shape.priorities[spec.tier]
    if cfg.extra_body:
        body.update(cfg.extra_body)
    return path, json.dumps(body, separators=(",", ":")).encode()
