"""Reading the scraped ``/metrics`` samples of ``metrics.jsonl``: a metric family's series, and the
deltas of counters and histograms over a span of the run.

A sample is ``{series key: value}``; a series key is the metric name with its labels
(``vllm:num_requests_running{model_name="m"}``). Histograms come as their ``_sum`` / ``_count`` series.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# vLLM's histograms whose sum/count deltas give the breakdown when records carry no server timing
BREAKDOWN_HISTOGRAMS = {
    "queue_ms": "vllm:request_queue_time_seconds",
    "prefill_ms": "vllm:request_prefill_time_seconds",
    "decode_ms": "vllm:request_decode_time_seconds",
}


def family(sample: Mapping[str, float], name: str) -> list[float]:
    """The values of every labelled series of one metric (``name`` or ``name{...}``)."""
    return [v for k, v in sample.items() if k == name or k.startswith(name + "{")]


def family_total(sample: Mapping[str, float], name: str) -> float:
    return float(sum(family(sample, name)))


def histogram_mean_delta(first: Mapping[str, float], last: Mapping[str, float], name: str) -> tuple[float | None, int]:
    """(mean observation in seconds, observations) of a histogram between two samples."""
    ds = family_total(last, name + "_sum") - family_total(first, name + "_sum")
    dc = family_total(last, name + "_count") - family_total(first, name + "_count")
    return (ds / dc if dc > 0 else None), int(dc)


def breakdown_histogram_means(first: Mapping[str, float], last: Mapping[str, float]) -> dict[str, float | None]:
    """Mean queue / prefill / decode time (ms) of the requests that ended between two samples, and how
    many requests that is (``requests``, from the queue histogram)."""
    out: dict[str, float | None] = {}
    for key, hist in BREAKDOWN_HISTOGRAMS.items():
        mean_s, n = histogram_mean_delta(first, last, hist)
        out[key] = None if mean_s is None else mean_s * 1000.0
        if key == "queue_ms":
            out["requests"] = n
    return out


def scrape_cost(samples: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What scraping ``/metrics`` cost (``target.scrape`` records it with each sample): scrapes, mean page
    size, mean fetch and parse time, and the scraper process's CPU seconds over the run."""
    costs = [s["scrape"] for s in samples if isinstance(s.get("scrape"), Mapping)]
    if not samples:
        return None
    out: dict[str, Any] = {"scrapes": len(costs), "mean_bytes": None, "mean_fetch_ms": None,
                           "mean_parse_ms": None, "cpu_s": None}
    if costs:
        out["mean_bytes"] = sum(c["bytes"] for c in costs) / len(costs)
        out["mean_fetch_ms"] = sum(c["fetch_ms"] for c in costs) / len(costs)
        out["mean_parse_ms"] = sum(c["parse_ms"] for c in costs) / len(costs)
        out["cpu_s"] = round(costs[-1]["cpu_s"], 4)  # the process started with the run
    return out
