"""The errors the HTTP server returns, as OpenAI's error JSON, and how engine errors map onto them."""

from __future__ import annotations

from typing import Any

from engine.request.errors import (
    CapacityExceededError,
    EngineError,
    InvalidRequestError,
    PromptTooLongError,
    QueueFullError,
    SLOUnattainableError,
)

RETRY_AFTER_S = 1  # a 429 whose engine gave no estimate of when there is room (an older core)


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
            headers={"Retry-After": str(getattr(e, "retry_after_s", RETRY_AFTER_S))},
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
    """The 429 for an output that says its request was shed from the queue (None for any other output): past
    its tier's TTFT promise (code slo_unattainable) or its tier's longest queue wait (code queue_timeout)."""
    if not (out.finished and any(c.finish_reason == "shed" for c in out.outputs)):
        return None
    t = out.timing
    waited_s = (t.finished_time - t.arrival_time) if t is not None else None
    waited = f" {waited_s * 1e3:.0f} ms" if waited_s is not None else ""
    promise = (getattr(config, "tier_ttft_slo_ms", None) or {}).get(tier)
    bound = (getattr(config, "tier_max_queue_s", None) or {}).get(tier)
    retry = out.retry_after_s or RETRY_AFTER_S
    if bound is not None and waited_s is not None and (promise is None or waited_s * 1e3 > promise):
        what, code = f"its longest queue wait of {bound:g} s", "queue_timeout"
    else:
        what, code = (f"its {promise:.0f} ms promise" if promise else "its promise"), "slo_unattainable"
    return APIError(
        429,
        f"the {tier} tier's queue held this request{waited} before it could answer, too long to keep {what}; "
        f"retry in {retry} s",
        param="service_tier",
        code=code,
        headers={"Retry-After": str(retry)},
    )


def engine_failed_error(out: Any) -> APIError | None:
    """The 500 for an output that says the engine failed this request alone (None for any other output)."""
    if not (out.finished and getattr(out, "error", None)):
        return None
    return APIError(500, out.error, type="server_error", code="engine_error")
