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


class QueueFullError(EngineError):
    """The tier's bounded waiting queue is full: admission control rejects. HTTP 429."""

    def __init__(self, tier: str, limit: int):
        super().__init__(f"the {tier} queue is full ({limit} requests waiting); retry later")
        self.tier = tier
        self.limit = limit
