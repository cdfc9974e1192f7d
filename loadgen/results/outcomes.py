"""What became of each request, in six classes, and the shed budget that decides which refusals are judged.

- ``good``: answered, and met every per-request SLO of its tier (a tier without one: answered);
- ``late``: answered, and missed at least one of them;
- ``shed``: refused by the server on purpose: HTTP 429, 503 or 529 (``SHED_HTTP``), its ``Retry-After``
  kept in the record (``retry_after_s``); the record's status is ``rejected``;
- ``timeout``: the client gave up: the tier's deadline (``tiers.<t>.timeout_s``) or a silent stream
  (``client.read_timeout_s``);
- ``failed``: anything else that did not answer (another HTTP error, a broken stream, no connection);
- ``cancelled``: the workload's own cancellations (a user closing the tab), and requests cut off because
  the run or its step ended: no latency sample either way.

A mean SLO is no request's to meet (``results.slo``): it plays no part in good / late.

**The shed budget** (``tiers.<t>.slo.max_shed``): a server that sheds on purpose may refuse up to that
share of a tier's requests without their counting as misses. ``within_shed_budget`` leaves the first
refusals, up to the budget, out of what is judged; the ones beyond it are judged as failed requests are
(over every threshold). Without a budget every refusal is a miss, so a server never rates higher by
refusing work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from loadgen.results import latency

OUTCOMES = ("good", "late", "shed", "timeout", "failed", "cancelled")
SHED_HTTP = (429, 503, 529)  # too many requests; overloaded (vLLM's queue caps); Dynamo's and gateways' overload


def _get(r: Any, key: str) -> Any:
    return r.get(key) if isinstance(r, Mapping) else getattr(r, key, None)


def is_shed(r: Any) -> bool:
    return _get(r, "status") == "rejected"


def outcome(r: Any, slos: Mapping[str, float]) -> str:
    """The request's class; ``slos`` its tier's per-request SLOs (``{"ttft_ms": 300, ...}``)."""
    status = _get(r, "status")
    if status == "cancelled":
        return "cancelled"
    if status == "rejected":
        return "shed"
    if status == "timeout":
        return "timeout"
    if status != "ok":
        return "failed"
    return "good" if latency.meets(r, slos) else "late"


def outcome_counts(records: Iterable[Any], slos: Mapping[str, float]) -> dict[str, int]:
    """How many of ``records`` fell in each class (every class present, zeros included)."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for r in records:
        counts[outcome(r, slos)] += 1
    return counts


def shed_allowance(n: int, max_shed: float) -> int:
    """How many of ``n`` requests may be shed unjudged: floor(max_shed x n)."""
    return math.floor(max_shed * n + 1e-9) if max_shed > 0 else 0


def within_shed_budget(records: Sequence[Any], max_shed: float, of: int | None = None) -> list[Any]:
    """``records`` without the refusals the budget allows (the first ones, in the order given): a share
    ``max_shed`` of ``of`` requests (default: of ``records``; a step that is still running: its planned
    count); with no budget, ``records`` as they are."""
    allowed = shed_allowance(len(records) if of is None else of, max_shed)
    if not allowed:
        return list(records)
    out = []
    for r in records:
        if allowed and is_shed(r):
            allowed -= 1
            continue
        out.append(r)
    return out
