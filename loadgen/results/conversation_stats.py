"""The ``conversations`` and ``cancellations`` sections of a fixed run's summary, from its records (and,
for what was never sent, the plan: each conversation's planned turns, the planned client cancellations).

- ``conversations``: conversations, turns planned / sent / completed / not sent, why not sent (a
  conversation ends at its first turn that is not ``ok``: ``previous turn failed``, or ``previous turn
  cancelled`` by the client mix or the run; ``run ended``: the run stopped, or a capacity window closed,
  before the turn was due), and ``prefix_cache`` where the server reports ``cached_tokens``: the hit rate
  cached / prompt tokens over the turns from the second on, and its per-conversation median and min;
  ``null`` when it reports none.
- ``cancellations``: the client's planned cancellations that happened, by reason, how many had their
  first token before the cancel, and the requests cut off because the run stopped.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from loadgen.results import latency

CACHED_SOURCE = "usage.prompt_tokens_details.cached_tokens"


def planned_of(specs: Iterable[Any]) -> dict[str, Any]:
    """What a run's request specs plan (``summary.summarize(planned=)``): each conversation's turns and the
    number of client cancellations."""
    specs = list(specs)
    turns = Counter(str(s.conversation) for s in specs if getattr(s, "conversation", None) is not None)
    return {"turns": dict(turns), "cancels": sum(getattr(s, "cancel_reason", None) is not None for s in specs)}


def conversations_section(records: list[Mapping[str, Any]],
                          planned_turns: Mapping[str, int] | None = None) -> dict[str, Any] | None:
    """``None`` for a run without conversations."""
    by_conv: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("conversation") is not None:
            by_conv[str(r["conversation"])].append(r)
    planned = dict(planned_turns or {})
    if not by_conv and not planned:
        return None
    names = sorted(set(by_conv) | set(planned))
    not_sent: Counter[str] = Counter()
    sent = completed = 0
    for c in names:
        recs = sorted(by_conv.get(c, []), key=lambda r: r.get("turn") or 0)
        sent += len(recs)
        completed += sum(r.get("status") == "ok" for r in recs)
        missing = max(0, planned.get(c, len(recs)) - len(recs))
        if missing:
            last = recs[-1] if recs else None
            if last is None or last.get("status") == "ok":
                not_sent["run ended"] += missing
            elif last.get("status") == "cancelled":
                not_sent["previous turn cancelled"] += missing
            else:
                not_sent["previous turn failed"] += missing
    return {"conversations": len(names), "turns_planned": sum(planned.values()) if planned else sent,
            "turns_sent": sent, "turns_completed": completed, "turns_not_sent": sum(not_sent.values()),
            "not_sent_by_reason": dict(sorted(not_sent.items())), "prefix_cache": _prefix_cache(by_conv)}


def _prefix_cache(by_conv: Mapping[str, list[Mapping[str, Any]]]) -> dict[str, Any] | None:
    cached = prompt = turns = 0
    rates = []
    for recs in by_conv.values():
        c_cached = c_prompt = 0
        for r in recs:
            if (r.get("turn") or 0) < 1 or r.get("status") != "ok":
                continue
            if r.get("cached_tokens") is None or not r.get("prompt_tokens"):
                continue
            c_cached += int(r["cached_tokens"])
            c_prompt += int(r["prompt_tokens"])
            turns += 1
        if c_prompt:
            rates.append(c_cached / c_prompt)
            cached, prompt = cached + c_cached, prompt + c_prompt
    if not prompt:
        return None
    return {"hit_rate": cached / prompt, "cached_tokens": cached, "prompt_tokens": prompt, "turns": turns,
            "per_conversation": {"conversations": len(rates), "median": latency.percentile(rates, 50),
                                 "min": float(min(rates))},
            "source": CACHED_SOURCE}


def cancellations_section(records: list[Mapping[str, Any]], planned: int | None = None) -> dict[str, Any]:
    by_reason: Counter[str] = Counter()
    first = run_stopped = 0
    for r in records:
        if r.get("status") != "cancelled":
            continue
        reason = r.get("cancel_reason")
        if reason and str(reason).startswith("client"):
            by_reason[str(reason)] += 1
            first += r.get("first_token_s") is not None
        else:
            run_stopped += 1
    return {"planned": planned, "client": sum(by_reason.values()), "by_reason": dict(sorted(by_reason.items())),
            "first_token_before_cancel": first, "run_stopped": run_stopped}
