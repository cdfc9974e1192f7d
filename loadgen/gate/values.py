"""What every gate module shares: the input error, the missing-value marker, the number test and how a
value is printed."""

from __future__ import annotations

import math
from typing import Any


class GateInputError(Exception):
    """Unusable input: exit 2 with this one-line message."""


class _Missing:
    """The type of ``MISSING``: distinct from ``None``, which a summary uses for a measured "no value"."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def is_number(x: Any) -> bool:
    """A finite int or float; ``True`` / ``False`` are not numbers here (``valid`` is a flag)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def format_value(v: Any) -> str:
    """A value as the gate prints it: JSON-like null / true / false, floats to 4 significant digits."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if is_number(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    return str(v)
