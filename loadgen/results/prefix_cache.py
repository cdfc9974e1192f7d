"""The warm-cache check: did the target's prefix cache serve more of the prompts than the run itself shares?

A run's prompts can hit a cold prefix cache only where they repeat each other (``workload.sharing``
counts that: the expected, upper-bound hit rate). A target that reports more hits served prompts from
before the run — the same seed run twice against one server, a benchmark following another — and its
TTFT is then better than this workload would get: the run is flagged, with both rates.

The observed rate comes from the records' ``cached_tokens`` (``usage.prompt_tokens_details``) when the
server sends them, else from vLLM's prefix-cache counters over the run (tokens hit / tokens queried).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.results.scraped import family_total

WARM_MARGIN = 0.05  # observed hit rate above expected + this is a warm cache, not noise or block rounding
COUNTERS = (  # (hits, queries): vLLM's names (the reference engine's too), newer first
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
    ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
)


def observed_hit_rate(records: Sequence[Mapping[str, Any]],
                      metrics: Sequence[Mapping[str, Any]] | None) -> tuple[float | None, str | None, int]:
    """(hit rate, where it came from, prompt tokens it covers) of the run; (None, None, 0) when unknown."""
    told = [r for r in records if r.get("status") == "ok" and r.get("cached_tokens") is not None
            and r.get("prompt_tokens")]
    if told:
        prompt = sum(int(r["prompt_tokens"]) for r in told)
        return sum(int(r["cached_tokens"]) for r in told) / prompt, "usage.prompt_tokens_details.cached_tokens", prompt
    samples = [m.get("metrics") for m in metrics or () if isinstance(m.get("metrics"), Mapping)]
    if len(samples) >= 2:
        first, last = samples[0], samples[-1]
        for hits, queries in COUNTERS:
            if any(k == queries or k.startswith(queries + "{") for k in last):
                dq = family_total(last, queries) - family_total(first, queries)
                if dq > 0:
                    return (family_total(last, hits) - family_total(first, hits)) / dq, f"{hits} / {queries}", int(dq)
    return None, None, 0


def prefix_cache_check(records: Sequence[Mapping[str, Any]], metrics: Sequence[Mapping[str, Any]] | None,
                       expected_share: float | None) -> dict[str, Any]:
    """The summary's ``prefix_cache`` section: ``expected_hit_rate`` (what the workload shares),
    ``observed_hit_rate`` and its ``source``, ``warm_cache`` (observed beyond expected + 5 points) and a
    ``note`` saying what that means."""
    observed, source, tokens = observed_hit_rate(records, metrics)
    out: dict[str, Any] = {"expected_hit_rate": expected_share, "observed_hit_rate": observed, "source": source,
                           "tokens": tokens, "warm_cache": False, "note": None}
    if observed is None:
        out["note"] = "the target reports no prefix-cache hits (no cached_tokens in usage, no vLLM counters)"
        return out
    if expected_share is not None and observed > expected_share + WARM_MARGIN:
        out["warm_cache"] = True
        out["note"] = (f"warm cache: the target served {100 * observed:.1f}% of prompt tokens from its prefix cache, "
                       f"but this workload shares at most {100 * expected_share:.1f}% — prompts it had seen before "
                       "the run (a repeated seed against a running server?); TTFT is better than this workload gets "
                       "on a cold cache: change the seed or restart the server")
    return out
