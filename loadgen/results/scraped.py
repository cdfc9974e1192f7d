"""Reading the scraped ``/metrics`` samples of ``metrics.jsonl``: a metric family's series, and the
deltas of counters and histograms over a span of the run.

A sample is ``{series key: value}``; a series key is the metric name with its labels
(``vllm:num_requests_running{model_name="m"}``). Histograms come as their ``_sum`` / ``_count`` series.
Which server's names to read comes from ``results.server_metrics`` (vLLM, SGLang, TGI, TRT-LLM).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadgen.results.server_metrics import ServerMetrics, detect


def family(sample: Mapping[str, float], name: str, where: str | None = None) -> list[float]:
    """The values of every labelled series of one metric (``name`` or ``name{...}``); with ``where``
    (``'method="prefill"'``), only the series whose labels include it."""
    return [v for k, v in sample.items()
            if (k == name and where is None) or (k.startswith(name + "{") and (where is None or where in k))]


def family_total(sample: Mapping[str, float], name: str, where: str | None = None) -> float:
    return float(sum(family(sample, name, where)))


def histogram_mean_delta(first: Mapping[str, float], last: Mapping[str, float], name: str,
                         where: str | None = None) -> tuple[float | None, int]:
    """(mean observation in seconds, observations) of a histogram (or summary) between two samples."""
    ds = family_total(last, name + "_sum", where) - family_total(first, name + "_sum", where)
    dc = family_total(last, name + "_count", where) - family_total(first, name + "_count", where)
    return (ds / dc if dc > 0 else None), int(dc)


def breakdown_histogram_means(first: Mapping[str, float], last: Mapping[str, float],
                              server: ServerMetrics | None = None) -> dict[str, Any]:
    """Mean queue / prefill / decode time (ms) of the requests that ended between two samples, from the
    server's own histograms (``server``, else told by the page's metric prefix), and how many requests
    that is (``requests``: the queue histogram's count, else the end-to-end one's). ``source`` names the
    server's histograms (``"sglang histograms"``); ``source_detail`` (one line) says how each part was
    derived: a histogram's mean where the server has one, else a difference of two means (SGLang's
    prefill = mean TTFT − mean queue, its decode = mean end to end − mean TTFT; TGI's prefill = mean
    prefill batch, its decode = mean inference − that). A derived part is never below 0. TGI adds
    ``validation_ms`` (front-end work before its queue, part of the breakdown's network share)."""
    srv = server or detect(last) or detect(first)
    out: dict[str, Any] = {"source": None, "queue_ms": None, "prefill_ms": None, "decode_ms": None, "requests": 0}
    if srv is None:
        return out
    detail: dict[str, str] = {}

    def mean(name: str | None, where: str | None = None) -> tuple[float | None, int]:
        if name is None:
            return None, 0
        m, n = histogram_mean_delta(first, last, name, where)
        return (None if m is None else m * 1000.0), n

    q, nq = mean(srv.queue)
    ttft, nt = mean(srv.ttft)
    e2e, ne = mean(srv.e2e)
    if q is not None:
        out["queue_ms"], detail["queue_ms"] = q, f"mean {srv.queue}"
    p, _ = mean(srv.prefill)
    if p is not None:
        detail["prefill_ms"] = f"mean {srv.prefill}"
    elif srv.prefill_batch and (p := mean(*srv.prefill_batch)[0]) is not None:
        name, where = srv.prefill_batch
        detail["prefill_ms"] = (f"mean {name}{{{where}}} (one prefill batch's time: the batch that gave the "
                                "request its first token)")
    elif ttft is not None and q is not None:
        p = max(0.0, ttft - q)
        detail["prefill_ms"] = (f"mean {srv.ttft} - mean {srv.queue} (the server has no prefill histogram: "
                                "its TTFT's other work, e.g. tokenizing, counts as prefill)")
    out["prefill_ms"] = p
    d, _ = mean(srv.decode)
    inference, ni = mean(srv.inference)
    if d is not None:
        detail["decode_ms"] = f"mean {srv.decode}"
    elif e2e is not None and ttft is not None:
        d = max(0.0, e2e - ttft)
        detail["decode_ms"] = f"mean {srv.e2e} - mean {srv.ttft} (the server has no decode histogram)"
    elif inference is not None and p is not None:
        d = max(0.0, inference - p)
        detail["decode_ms"] = f"mean {srv.inference} - the prefill above (the server has no decode histogram)"
    out["decode_ms"] = d
    if srv.validation and (v := mean(srv.validation)[0]) is not None:
        out["validation_ms"] = v
        detail["validation_ms"] = f"mean {srv.validation} (before the queue: counted in network)"
    out["requests"] = nq or ne or nt or ni
    if detail:  # one line, as the breakdown's source_detail: "queue = mean …; prefill = …; decode = …"
        out["source"] = srv.source
        out["source_detail"] = "; ".join(f"{part[:-3]} = {how}" for part, how in detail.items())
    return out


def scrape_cost(samples: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What scraping ``/metrics`` cost (``target.scrape`` records it with each sample): scrapes, mean page
    size, mean fetch and parse time, the scraper process's CPU seconds over the run, the page's ``path``
    (``/metrics``, or trtllm-serve's ``/prometheus/metrics``) and any ``notes`` on how it was found."""
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
        paths = [c["path"] for c in costs if c.get("path")]
        out["path"] = paths[-1] if paths else None  # where the Prometheus page was found
        notes = sorted({c["note"] for c in costs if c.get("note")})
        if notes:
            out["notes"] = notes
    return out
