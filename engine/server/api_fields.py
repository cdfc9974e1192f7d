"""Typed readers for the fields of a JSON request body; each raises an APIError that names the field."""

from __future__ import annotations

import math
from typing import Any

from engine.server.api_errors import APIError, invalid


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def wrong_type(param: str, expected: str, value: Any) -> APIError:
    return APIError(
        400, f"'{param}' must be {expected}, got {type_name(value)}", param=param, code="invalid_type"
    )


def int_field(body: dict, key: str, default: int | None, lo: int | None = None, hi: int | None = None):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(key, "an integer", value)
    if lo is not None and value < lo:
        raise invalid(key, f"'{key}' must be at least {lo}, got {value}")
    if hi is not None and value > hi:
        raise invalid(key, f"'{key}' must be at most {hi}, got {value}")
    return value


def float_field(body: dict, key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise wrong_type(key, "a number", value)
    try:
        value = float(value)
    except OverflowError:  # an integer beyond any float
        raise invalid(key, f"'{key}' must be a finite number") from None
    if not math.isfinite(value):
        raise invalid(key, f"'{key}' must be a finite number")
    return value


def token_id_list(value: list, param: str, vocab_size: int | None) -> list[int]:
    """`value` if every item is an integer token id of the vocabulary."""
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            raise wrong_type(f"{param}[{i}]", "an integer token id", t)
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            raise invalid(
                param,
                f"'{param}' holds token id {t} at position {i}, outside the vocabulary [0, {vocab_size})",
            )
    return value


def bool_field(body: dict, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise wrong_type(key, "a boolean", value)
    return value


def unsupported(key: str, what: str = "is not supported by this server") -> APIError:
    """A known OpenAI field this engine does not implement, given a non-neutral value."""
    return APIError(400, f"'{key}' {what}", param=key, code="unsupported")
