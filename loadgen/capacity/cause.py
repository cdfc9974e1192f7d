"""Why the SLO broke: the dominant cause between the rated step and the first step that failed above it.

``break_cause`` compares the two steps' own figures (each step's entry in ``summary.json``) and names one of
``CAUSES``, with the evidence it read and how each figure changed:

- ``client``: the load generator fell behind in the failing step (its step is ``disturbed``, or its client p99
  lateness is over the bound): the target's figures there say nothing about the target.
- ``kv``: the KV cache ran out: the server preempted (swapped or recomputed) at least one request in
  ``1 / KV_PREEMPT_SHARE`` in the failing step, or more per request than at the rated step, or its peak KV use
  reached ``KV_FULL`` (the reference engine stops admitting there, so requests queue behind a full cache).
- ``queue``: requests waited for a batch slot: the server refused more requests than it answered late (its
  queue was full: vLLM's queue caps, SLO admission), or the mean time queued grew by more than the mean prefill
  time (per-request server timing, else the server's histograms), or, without a breakdown, the server's
  waiting gauge rose.
- ``prefill_interference``: the time to first token grew in prefill, not in the queue (long prompts' prefills
  delaying the others), or, for a per-token SLO (TPOT, ITL), the streams' p99 gap is far above their median
  (``STALL_RATIO``) or grew much more than it (``STALL_GROWTH``): decodes stalled behind prefills.
- ``decode``: a per-token SLO broke with no stalls: every gap grew, as decode steps slow with the batch. Time
  queued never enters a per-token figure, so a per-token SLO is never put down to ``queue``.
- ``undetermined``: the target exposes none of these figures (no server timing, no metrics page).

The rules run in that order: a late client invalidates the rest, and preemptions explain queueing and slow
prefills that follow from them. ``tests/loadgen/capacity/test_break_cause.py`` checks each rule on made-up step
figures; ``tests/e2e/test_break_cause_engine.py`` rates three scenarios on the reference engine whose cause is known
by construction (few batch slots, a small KV pool, long prompts without chunked prefill) and checks the cause named.
"""

from __future__ import annotations

from typing import Any

CAUSES = ("queue", "kv", "prefill_interference", "decode", "client", "undetermined")
# KV use at which the cache counts as exhausted: the reference engine stops admitting at its 0.9 watermark
# (kv_watermark) and queues instead of preempting, so a full cache shows there first
KV_FULL = 0.9
KV_PREEMPT_SHARE = 0.1  # preemptions per request at which the KV pool binds, whether or not they grew
STALL_GROWTH = 2.0  # a per-token SLO: worst gap / typical gap growing by this factor means stalls ...
STALL_RATIO = 3.0  # ... as does a p99 gap this many times the median: a decode waiting out whole prefills
PER_TOKEN = ("tpot_ms", "itl_ms")


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _figures(step: dict[str, Any]) -> dict[str, float | None]:
    """The figures of one step the rules read."""
    bd = step.get("breakdown") or {}
    summ = step.get("summary") or {}
    requests = _num(step.get("requests")) or 0.0
    pre = _num(step.get("preemptions"))
    gaps_p50, gaps_p99 = _num(summ.get("median_chunk_gap_ms")), _num(summ.get("p99_chunk_gap_ms"))
    return {
        "mean_queue_ms": _num(bd.get("mean_queue_ms")), "mean_prefill_ms": _num(bd.get("mean_prefill_ms")),
        "mean_decode_ms": _num(bd.get("mean_decode_ms")),
        "server_waiting": _num(step.get("server_waiting")), "kv_usage_max": _num(step.get("kv_usage_max")),
        "preemptions": pre, "preemptions_per_request": pre / requests if pre is not None and requests else None,
        "client_p99_lateness_ms": _num((summ.get("client_lateness") or {}).get("p99_ms")),
        "gap_ratio": gaps_p99 / gaps_p50 if gaps_p50 and gaps_p99 is not None else None,
        "shed_judged": _judged_sheds(step), "late": _outcome(step, "late"),
    }


def _outcome(step: dict[str, Any], name: str) -> float | None:
    tiers = [e.get("outcomes") for e in (step.get("tiers") or {}).values() if isinstance(e, dict)]
    counts = [o.get(name) for o in tiers if isinstance(o, dict) and isinstance(o.get(name), int)]
    return float(sum(counts)) if counts else None


def _judged_sheds(step: dict[str, Any]) -> float | None:
    """Refusals the step judged: its shed requests beyond each tier's budget."""
    shed = _outcome(step, "shed")
    if shed is None:
        return None
    return shed - sum(e.get("shed_unjudged") or 0 for e in (step.get("tiers") or {}).values() if isinstance(e, dict))


def _change(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def break_cause(rated: dict[str, Any] | None, failing: dict[str, Any] | None, metric: str | None,
                lateness_bound_ms: float) -> dict[str, Any] | None:
    """``{cause, why, metric, rated_step, failing_step, evidence}`` (evidence: figure -> {rated, failing,
    change}); None without a failing step."""
    if failing is None:
        return None
    at = _figures(rated) if rated else {}
    fail = _figures(failing)
    evidence = {k: {"rated": at.get(k), "failing": fail[k], "change": _change(at.get(k), fail[k])} for k in fail}

    def verdict(cause: str, why: str) -> dict[str, Any]:
        return {"cause": cause, "why": why, "metric": metric, "rated_step": rated.get("index") if rated else None,
                "failing_step": failing.get("index"), "evidence": evidence}

    late = fail["client_p99_lateness_ms"]
    if failing.get("disturbed") or (late is not None and late > lateness_bound_ms):
        return verdict("client", f"the load generator fell behind (client p99 lateness {late or 0:.1f} ms)")
    per_req, before = fail["preemptions_per_request"], at.get("preemptions_per_request") or 0.0
    if (fail["preemptions"] or 0) > 0 and ((per_req or 0) > before or (per_req or 0) >= KV_PREEMPT_SHARE):
        return verdict("kv", f"{fail['preemptions']:.0f} preemptions in the failing step (rated step: "
                             f"{at.get('preemptions') or 0:.0f})")
    if (fail["kv_usage_max"] or 0) >= KV_FULL:
        return verdict("kv", f"KV cache use reached {100 * fail['kv_usage_max']:.0f} %")
    if (fail["shed_judged"] or 0) > (fail["late"] or 0):
        return verdict("queue", f"the server refused {fail['shed_judged']:.0f} requests (429 / 503 / 529) beyond "
                                f"the shed budget, against {fail['late'] or 0:.0f} answered late: its queue was full")
    d_queue = _change(at.get("mean_queue_ms"), fail["mean_queue_ms"])
    d_prefill = _change(at.get("mean_prefill_ms"), fail["mean_prefill_ms"])
    if metric in PER_TOKEN:
        r0, r1 = at.get("gap_ratio"), fail["gap_ratio"]
        if r1 and (r1 >= STALL_RATIO or (r0 and r1 >= STALL_GROWTH * r0)):
            return verdict("prefill_interference", f"the streams' p99 gap is {r1:.1f} times their median (rated "
                                                   f"step: {r0 or 0:.1f}): decodes stalled behind prefills")
        if r1:
            return verdict("decode", f"the streams' p99 gap is {r1:.1f} times their median (rated step: "
                                     f"{r0 or 0:.1f}): every gap grew, decode steps slowed with the batch")
    if d_queue is not None and d_prefill is not None:
        if d_queue >= d_prefill:
            return verdict("queue", f"mean time queued grew by {d_queue:.0f} ms, prefill by {d_prefill:.0f} ms")
        return verdict("prefill_interference", f"mean prefill grew by {d_prefill:.0f} ms, time queued by "
                                               f"{d_queue:.0f} ms")
    d_wait = _change(at.get("server_waiting"), fail["server_waiting"])
    if d_wait is not None and d_wait > 1.0:
        return verdict("queue", f"the server's waiting requests rose by {d_wait:.1f} on average")
    return verdict("undetermined", "the target reports no queue, prefill, KV or waiting figures to tell")
