"""The five service-health signals: what each measures, which way is bad, the deviation rule, and each
server's Prometheus names for them.

The rule (one for ``watch`` and the exported alerts): a signal deviates when it is beyond its baseline by
more than the tolerance, in its bad direction —

- higher is bad (TTFT p99, KV usage, admission rejections/s): ``value > baseline x (1 + tolerance) + floor``;
- lower is bad (output tokens/s, batch fill ratio): ``value < baseline x (1 - tolerance) - floor``, judged only
  *under load* (a queue of at least one request on average over the window, or as many requests running as
  at the rated step): with an empty queue a low token rate or a half-empty batch means light traffic, not a
  sick service.

``floor`` is an absolute slack per signal, so a baseline of 0 (no rejections at the rated step) or a few
milliseconds does not make noise a deviation. A deviation is *sustained* once it has lasted ``sustain_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from loadgen.results.server_metrics import BY_NAME, ServerMetrics, detect


@dataclass(frozen=True)
class Signal:
    key: str
    title: str
    unit: str
    bad: str  # "high" | "low": the direction that says capacity or parameters need adjusting
    floor: float  # absolute slack added to the tolerance (in the signal's unit)
    fmt: str  # how to print a value


TTFT = Signal("ttft_p99_ms", "TTFT p99", "ms", "high", 5.0, "{:.0f}")
TOKEN_RATE = Signal("output_tok_s", "output tokens/s", "tok/s", "low", 1.0, "{:.0f}")
KV = Signal("kv_usage", "KV usage", "ratio", "high", 0.02, "{:.3f}")
BATCH_FILL = Signal("batch_fill", "batch fill ratio", "ratio", "low", 0.02, "{:.3f}")
REJECTIONS = Signal("rejections_per_s", "admission rejections/s", "1/s", "high", 0.1, "{:.2f}")
SIGNALS: tuple[Signal, ...] = (TTFT, TOKEN_RATE, KV, BATCH_FILL, REJECTIONS)
BY_KEY = {s.key: s for s in SIGNALS}
TTFT_QUANTILE = 0.99  # the quantile judged: the capacity search's SLOs are p99 TTFT
UNDER_LOAD_WAITING = 1.0  # mean requests waiting over the window at or above which a server is under load


def limit(signal: Signal, baseline: float, tolerance: float) -> float:
    """The value past which the signal deviates (above it for higher-is-bad, below it for lower-is-bad)."""
    if signal.bad == "high":
        return baseline * (1.0 + tolerance) + signal.floor
    return max(0.0, baseline * (1.0 - tolerance) - signal.floor)


def beyond(signal: Signal, value: float, baseline: float, tolerance: float) -> bool:
    lim = limit(signal, baseline, tolerance)
    return value > lim if signal.bad == "high" else value < lim


@dataclass(frozen=True)
class Names:
    """One server's names for the five signals (``None`` / empty: the server exposes none)."""

    flavor: str  # vllm | slobench | sglang | tgi | trtllm
    ttft: str | None  # histogram in seconds (its _bucket series)
    generation: str | None  # counter of generated tokens (the sample name, _total included)
    kv: tuple[str, ...]  # KV usage gauges 0..1, the first on the page wins (mean over its series)
    fill: str | None  # a batch fill ratio gauge (summed over its series: the engine's is per tier)
    running: str | None  # gauge: requests running, for the fill ratio without ``fill`` and for "under load"
    max_running: tuple[str, ...]  # gauges of the batch's capacity, first found wins
    waiting: str | None  # gauge: requests queued ("under load")
    rejections: str | None  # counter of requests refused at admission (HTTP 429)


def from_server(srv: ServerMetrics, generation: str | None) -> Names:
    return Names(srv.server, srv.ttft, generation, srv.kv_usage, None, srv.running, srv.max_running, srv.waiting,
                 None)


# Generated-token counters (vLLM, SGLang, TRT-LLM; TGI has none). No rejection counters: vLLM, SGLang and
# TRT-LLM queue rather than refuse, and TGI's refusals are not told apart from other failures on its page.
FLAVORS: dict[str, Names] = {
    "vllm": from_server(BY_NAME["vllm"], "vllm:generation_tokens_total"),
    "sglang": from_server(BY_NAME["sglang"], "sglang:generation_tokens_total"),
    "tgi": from_server(BY_NAME["tgi"], None),
    "trtllm": from_server(BY_NAME["trtllm"], "trtllm_generation_tokens_total"),
    # the reference engine: its own per-tier signals (engine/server/metrics.py) beside its vLLM-compatible names
    "slobench": Names("slobench", "slobench:time_to_first_token_seconds", "slobench:generation_tokens_total",
                      ("vllm:kv_cache_usage_perc",), "slobench:batch_fill_ratio", "vllm:num_requests_running", (),
                      "vllm:num_requests_waiting", "slobench:admission_rejections_total"),
}


def detect_flavor(sample: Mapping[str, float]) -> Names | None:
    """The names a scraped page carries: the reference engine's when it has ``slobench:`` signals, else the
    server ``results.server_metrics.detect`` tells from its prefix."""
    if any(k.startswith("slobench:time_to_first_token_seconds") for k in sample):
        return FLAVORS["slobench"]
    srv = detect(sample)
    return FLAVORS[srv.server] if srv is not None else None
