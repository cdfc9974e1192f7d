"""The errors the HTTP server returns, as OpenAI's error JSON, and how engine errors map onto them."""

from __future__ import annotations

from typing import Any

from engine.errors import (
    CapacityExceededError,
    EngineError,
    InvalidRequestError,
    PromptTooLongError,
    QueueFullError,
    SLOUnattainableError,
)

RETRY_AFTER_S = 1  # what a 429 for a full queue tells the client to wait


class APIError(Exception):
    """An error the server returns as OpenAI's error JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type or _default_type(status)
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def map_engine_error(e: EngineError) -> APIError:
    if isinstance(e, PromptTooLongError):
        return APIError(400, str(e), param=e.param or "prompt", code="context_length_exceeded")
    if isinstance(e, CapacityExceededError):
        return APIError(400, str(e), param=e.param or "max_tokens", code="exceeds_engine_capacity")
    if isinstance(e, InvalidRequestError):
        return APIError(400, str(e), param=e.param or "prompt", code="invalid_value")
    if isinstance(e, QueueFullError):
        return APIError(
            429,
            str(e),
            param="service_tier",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if isinstance(e, SLOUnattainableError):
        return APIError(
            429,
            str(e),
            param="service_tier",
            code="slo_unattainable",
            headers={"Retry-After": str(e.retry_after_s)},
        )
    return APIError(400, str(e), code="invalid_request")


def shed_error(out: Any, tier: str, config: Any) -> APIError | None:
    """The 429 for an output that says its request was shed from the queue (None for any other output)."""
    if not (out.finished and any(c.finish_reason == "shed" for c in out.outputs)):
        return None
    t = out.timing
    waited = f" {(t.finished_time - t.arrival_time) * 1e3:.0f} ms" if t is not None else ""
    promise = (getattr(config, "tier_ttft_slo_ms", None) or {}).get(tier)
    kept = f"its {promise:.0f} ms promise" if promise else "its promise"
    return APIError(
        429,
        f"the {tier} tier's queue held this request{waited} before it could answer, too long to keep {kept}; "
        f"retry in {RETRY_AFTER_S} s",
        param="service_tier",
        code="slo_unattainable",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )
