"""Validating the YAML of a scenario file: a mapping that knows its key path, so every mistake is reported
as ``key.path: expected ..., found ...``, and unknown keys are caught (a typo is never silently ignored)."""

from __future__ import annotations

from typing import Any

from loadgen.scenario.model import ScenarioError

MISSING = object()  # no default: the key is required
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false", dict: "a mapping",
               list: "a list"}


def type_name(types: type | tuple[type, ...]) -> str:
    """``(int, type(None))`` -> "an integer or null", for "expected ..." messages."""
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types if t is not type(None)) + (
        " or null" if type(None) in types else "")


def found(v: Any) -> str:
    """A value as "found ..." messages show it: its type, and the value itself unless it is a container."""
    return f"{type(v).__name__} {v!r}" if not isinstance(v, (dict, list)) else type(v).__name__


class MappingNode:
    """A mapping of the scenario with its key path, for error messages. It records the keys it was asked
    for, so that :meth:`check_unknown` can reject the rest."""

    def __init__(self, data: Any, path: str):
        if not isinstance(data, dict):
            raise ScenarioError(f"{path or 'scenario'}: expected a mapping, found {found(data)}")
        self.data, self.path = data, path
        self.used: set[str] = set()

    def key(self, k: str) -> str:
        return f"{self.path}.{k}" if self.path else k

    def get(self, k: str, types, default=MISSING, *, choices=None, min_value=None, positive=False):
        """The value at ``k``, checked against ``types`` (an int is accepted as a float) and the limits; a
        missing key, or null where the default is not null, gives ``default``."""
        self.used.add(k)
        if k not in self.data or self.data[k] is None and default is not MISSING and default is not None:
            if default is MISSING:
                raise ScenarioError(f"{self.key(k)}: required, expected {type_name(types)}")
            return default
        v = self.data[k]
        t = types if isinstance(types, tuple) else (types,)
        if float in t and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if isinstance(v, bool) and bool not in t or not isinstance(v, t):
            raise ScenarioError(f"{self.key(k)}: expected {type_name(types)}, found {found(v)}")
        if choices is not None and v not in choices:
            raise ScenarioError(f"{self.key(k)}: expected one of {', '.join(map(str, choices))}, found {v!r}")
        if positive and v is not None and not v > 0:
            raise ScenarioError(f"{self.key(k)}: expected a value > 0, found {v!r}")
        if min_value is not None and v is not None and v < min_value:
            raise ScenarioError(f"{self.key(k)}: expected a value >= {min_value}, found {v!r}")
        return v

    def get_quantile(self, k: str) -> float:
        q = self.get(k, float)
        if not 0 < q < 1:
            raise ScenarioError(f"{self.key(k)}: expected a quantile between 0 and 1 (0.99 for p99), found {q!r}")
        return q

    def child(self, k: str, default=MISSING) -> MappingNode | None:
        self.used.add(k)
        if k not in self.data or self.data[k] is None:
            if default is MISSING:
                raise ScenarioError(f"{self.key(k)}: required, expected a mapping")
            return default
        return MappingNode(self.data[k], self.key(k))

    def check_unknown(self) -> None:
        extra = sorted(set(self.data) - self.used)
        if extra:
            raise ScenarioError(f"{self.key(extra[0])}: unknown key (known: {', '.join(sorted(self.used))})")
