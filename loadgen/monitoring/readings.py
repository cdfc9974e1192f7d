"""The five signals over a window of scrapes: TTFT quantiles from the histogram's bucket deltas (as
Prometheus' ``histogram_quantile`` interpolates them), token and rejection rates from counter deltas, and
gauges (KV usage, batch fill, running, waiting) as their mean over the window's samples — the rated step's
figures are window means too, so the two compare like for like.

A window is ``[(t, sample), ...]`` in time order, a sample as ``target.scrape.parse_metrics`` returns it
(``{series key: value}``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loadgen.monitoring.signals import BATCH_FILL, KV, REJECTIONS, TOKEN_RATE, TTFT, TTFT_QUANTILE, Names
from loadgen.results.scraped import family, family_total

Sample = Mapping[str, float]
LE = re.compile(r'(?:\{|,)le="([^"]*)"')


@dataclass
class Reading:
    """The signals over one window (``None``: no data, or the server has no such series)."""

    t: float  # the newest sample's time
    span_s: float  # from the oldest sample of the window to the newest
    values: dict[str, float | None]
    ttft_p50_ms: float | None = None
    ttft_requests: int = 0  # TTFT observations in the window
    waiting: float | None = None  # mean requests queued over the window
    running: float | None = None  # mean requests running over the window
    sources: dict[str, str] = field(default_factory=dict)  # signal key -> the series it was read from


def counter_delta(first: Sample, last: Sample, name: str) -> float | None:
    """A counter's increase between two samples, every series summed; after a reset (the server restarted)
    its value since the reset, as Prometheus' ``rate`` counts it."""
    if not family(last, name):
        return None
    a, b = family_total(first, name), family_total(last, name)
    return b - a if b >= a else b


def buckets(sample: Sample, hist: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound, every labelled series summed (``sum by (le)``)."""
    out: dict[float, float] = {}
    prefix = hist + "_bucket{"
    for k, v in sample.items():
        if k.startswith(prefix) and (m := LE.search(k)):
            le = float(m.group(1))  # float("+Inf") is inf
            out[le] = out.get(le, 0.0) + v
    return out


def bucket_deltas(first: Sample, last: Sample, hist: str) -> dict[float, float]:
    a, b = buckets(first, hist), buckets(last, hist)
    if any(b.get(le, 0.0) < n for le, n in a.items()):  # a reset in between: the counts since it
        return b
    return {le: n - a.get(le, 0.0) for le, n in b.items()}


def histogram_quantile(q: float, cum: Mapping[float, float]) -> float | None:
    """The q-quantile of cumulative bucket counts, interpolated linearly inside its bucket (the lowest
    bucket from 0); in the +Inf bucket, the highest finite bound — Prometheus' ``histogram_quantile``."""
    bounds = sorted(cum)
    if not bounds or not math.isinf(bounds[-1]) or cum[bounds[-1]] <= 0:
        return None
    rank = q * cum[bounds[-1]]
    lo_bound, lo_count = 0.0, 0.0
    for le in bounds:
        n = cum[le]
        if n >= rank:
            if math.isinf(le):
                return lo_bound
            if n == lo_count:
                return le
            return lo_bound + (le - lo_bound) * (rank - lo_count) / (n - lo_count)
        lo_bound, lo_count = le, n
    return lo_bound


def gauge_mean(window: Sequence[tuple[float, Sample]], names: Sequence[str], combine) -> tuple[float | None, str]:
    """The mean over the window's samples of the first gauge among ``names`` on the page (each sample's
    series combined by ``combine``), and its name."""
    for name in names:
        vals = [combine(f) for _, s in window if (f := family(s, name))]
        if vals:
            return sum(vals) / len(vals), name
    return None, ""


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def read(window: Sequence[tuple[float, Sample]], names: Names, max_num_seqs: int | None = None) -> Reading:
    """The five signals over ``window`` (at least two samples for the rates and TTFT) in ``names``;
    ``max_num_seqs``: the batch's capacity where the page does not say (vLLM, TGI)."""
    (t0, first), (t1, last) = window[0], window[-1]
    dt = t1 - t0
    values: dict[str, float | None] = dict.fromkeys((TTFT.key, TOKEN_RATE.key, KV.key, BATCH_FILL.key,
                                                      REJECTIONS.key))
    r = Reading(t=t1, span_s=dt, values=values)
    if names.ttft and dt > 0 and buckets(last, names.ttft):
        cum = bucket_deltas(first, last, names.ttft)
        total = cum.get(math.inf, 0.0)
        r.ttft_requests = int(round(total))
        if total > 0:
            values[TTFT.key] = 1000.0 * histogram_quantile(TTFT_QUANTILE, cum)
            r.ttft_p50_ms = 1000.0 * histogram_quantile(0.5, cum)
        r.sources[TTFT.key] = f"{names.ttft}_bucket (p{TTFT_QUANTILE * 100:g} of the window's deltas)"
    for sig, counter in ((TOKEN_RATE, names.generation), (REJECTIONS, names.rejections)):
        if counter and dt > 0 and (d := counter_delta(first, last, counter)) is not None:
            values[sig.key] = d / dt
            r.sources[sig.key] = f"rate of {counter}"
    kv, kv_name = gauge_mean(window, names.kv, mean)
    if kv is not None:
        values[KV.key], r.sources[KV.key] = kv, f"{kv_name} (window mean)"
    r.running = gauge_mean(window, [names.running] if names.running else [], sum)[0]
    r.waiting = gauge_mean(window, [names.waiting] if names.waiting else [], sum)[0]
    fill, fill_name = gauge_mean(window, [names.fill] if names.fill else [], sum)
    if fill is not None:
        values[BATCH_FILL.key], r.sources[BATCH_FILL.key] = fill, f"{fill_name} (tiers summed, window mean)"
    elif r.running is not None:
        cap, cap_name = gauge_mean(window, names.max_running, sum)
        if cap is None and max_num_seqs:
            cap, cap_name = float(max_num_seqs), f"max_num_seqs ({max_num_seqs})"
        if cap:
            values[BATCH_FILL.key] = r.running / cap
            r.sources[BATCH_FILL.key] = f"{names.running} / {cap_name} (window mean)"
    return r
