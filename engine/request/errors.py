"""Errors the engine raises for a request it cannot take; the server maps them onto HTTP statuses."""

from __future__ import annotations


class EngineError(Exception):
    """Base class for request-level engine errors."""


class InvalidRequestError(EngineError, ValueError):
    """The request itself is malformed (empty prompt, token id out of range, ...). HTTP 400."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class PromptTooLongError(InvalidRequestError):
    """Prompt (plus max_tokens) does not fit the model's context. HTTP 400."""


class CapacityExceededError(InvalidRequestError):
    """The request could never run on this engine, even alone: its KV (every one of its n sequences at
    prompt + max_tokens) exceeds the cache, or n exceeds the batch slots its tier may use. HTTP 400."""


class QueueFullError(EngineError):
    """The tier's bounded waiting queue is full: admission control rejects. HTTP 429."""

    def __init__(self, tier: str, limit: int, retry_after_s: int = 1):
        super().__init__(f"the {tier} queue is full ({limit} requests waiting); retry in {retry_after_s} s")
        self.tier = tier
        self.limit = limit
        self.retry_after_s = retry_after_s  # the engine's estimate of when its queue has room again


class SLOUnattainableError(EngineError):
    """SLO-aware admission: the tier's queue is long enough that this request would miss its
    time-to-first-token promise. HTTP 429 with Retry-After."""

    def __init__(self, tier: str, estimate_s: float, slo_s: float, retry_after_s: int):
        super().__init__(
            f"the {tier} tier's queue would delay this request's first token to about {estimate_s:.2f} s, "
            f"too close to or beyond its {slo_s * 1e3:.0f} ms promise; retry in {retry_after_s} s"
        )
        self.tier = tier
        self.estimate_s = estimate_s
        self.slo_s = slo_s
        self.retry_after_s = retry_after_s
