"""Prometheus metrics for the engine server: vLLM's names plus slobench's per-tier service-health signals.

The `vllm:` metrics carry vLLM's labels (`model_name`, `engine`) and meanings, so dashboards and the
slobench scraper work against either server; their latency buckets start at 1 ms. The `slobench:` metrics
are the five service-health signals, labelled by tier: time to first token, output token rate, KV usage,
batch fill ratio (running sequences / max batch) and admission rejections; also each tier's estimated queue
wait, which SLO-aware admission judges, and the tail factor it scales that estimate by (engine/core/admission.py).

Each server owns its own `CollectorRegistry`. Request histograms are observed once per finished request
from the engine's exact timestamps (`Timing`), so queue + prefill + decode add up to e2e latency.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engine.request.tiers import DEFAULT_TIER, TIERS

CONTENT_TYPE = CONTENT_TYPE_LATEST

# fmt: off
# Request-level latencies (TTFT, e2e, queue, prefill, decode): 1 ms up to vLLM's long tail.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2,
    0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
    2560.0,
)
# Per-token gaps.
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
# fmt: on
RATE_WINDOW_S = 5.0  # slobench:output_tokens_per_second averages over this window


def buckets_1_2_5(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's token-count buckets)."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > limit:
                return out
            out.append(v)
        exp += 1


class ServerMetrics:
    """All series of one server. Thread-safe: the engine thread records, the HTTP thread renders."""

    def __init__(self, model_name: str, max_num_seqs: int, max_model_len: int, engine_index: int = 0):
        self.registry = CollectorRegistry(auto_describe=True)
        self.max_num_seqs = max_num_seqs
        r = self.registry
        lv = (model_name, str(engine_index))
        ln = ["model_name", "engine"]

        def gauge(name: str, doc: str):
            return Gauge(name, doc, ln, registry=r).labels(*lv)

        def counter(name: str, doc: str):
            return Counter(name, doc, ln, registry=r).labels(*lv)

        def hist(name: str, doc: str, buckets):
            return Histogram(name, doc, ln, buckets=buckets, registry=r).labels(*lv)

        # Scheduler state
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.swapped = gauge("vllm:num_requests_swapped", "Number of requests swapped to host memory.")
        # KV cache
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.gpu_kv_usage = gauge(
            "vllm:gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage (vLLM's older name)."
        )
        self.kv_fragmentation = gauge(
            "slobench:kv_cache_fragmentation", "Allocated but unfilled KV slots / allocated KV slots."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.gpu_prefix_queries = counter(
            "vllm:gpu_prefix_cache_queries", "Prefix cache queries in tokens (vLLM's older name)."
        )
        self.gpu_prefix_hits = counter(
            "vllm:gpu_prefix_cache_hits", "Prefix cache hits in tokens (vLLM's older name)."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemptions from the engine."
        )
        # Tokens
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ln + ["finished_reason"],
            registry=r,
        )
        self._success_lv = lv
        for reason in ("stop", "length", "abort"):
            self._success.labels(*lv, reason)
        tok_buckets = buckets_1_2_5(max_model_len)
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok_buckets
        )
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tok_buckets
        )
        self.request_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tok_buckets
        )
        self.request_n = hist(
            "vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20)
        )
        # Latencies
        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LATENCY_BUCKETS,
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.tpot = hist(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds (vLLM's older name for inter-token latency).",
            ITL_BUCKETS,
        )
        self.request_tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        )

        # slobench service-health signals, by tier
        tl = ["model_name", "tier"]
        self._tier_ttft = Histogram(
            "slobench:time_to_first_token_seconds",
            "Time to first token by service tier.",
            tl,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._tier_gen_tokens = Counter(
            "slobench:generation_tokens", "Generated tokens by service tier.", tl, registry=r
        )
        self._tier_token_rate = Gauge(
            "slobench:output_tokens_per_second",
            f"Output tokens per second by service tier, over the last {RATE_WINDOW_S:g} s.",
            tl,
            registry=r,
        )
        self._tier_kv = Gauge(
            "slobench:kv_cache_usage_perc",
            "Share of KV blocks held by each tier's requests (sums to vllm:kv_cache_usage_perc).",
            tl,
            registry=r,
        )
        self._tier_fill = Gauge(
            "slobench:batch_fill_ratio",
            "Running requests of each tier / max batch size (max_num_seqs).",
            tl,
            registry=r,
        )
        self._tier_rejections = Counter(
            "slobench:admission_rejections",
            "Requests rejected at admission (full tier queue or SLO admission, HTTP 429), shed ones included.",
            tl,
            registry=r,
        )
        self._tier_shed = Counter(
            "slobench:requests_shed",
            "Queued requests shed before they started: they could no longer keep their tier's promise (HTTP 429).",
            tl,
            registry=r,
        )
        self._tier_running = Gauge(
            "slobench:num_requests_running", "Running requests by tier.", tl, registry=r
        )
        self._tier_waiting = Gauge(
            "slobench:num_requests_waiting", "Waiting requests by tier.", tl, registry=r
        )
        self._tier_wait = Gauge(
            "slobench:estimated_queue_wait_seconds",
            "Estimated queue wait of a request of each tier arriving now (what SLO-aware admission judges).",
            tl,
            registry=r,
        )
        self._tier_tail = Gauge(
            "slobench:admission_tail_factor",
            "The factor SLO-aware admission scales each tier's estimate by, learned from its accepted requests' TTFT.",
            tl,
            registry=r,
        )
        self._tier = {
            t: {
                "ttft": self._tier_ttft.labels(model_name, t),
                "gen": self._tier_gen_tokens.labels(model_name, t),
                "rate": self._tier_token_rate.labels(model_name, t),
                "kv": self._tier_kv.labels(model_name, t),
                "fill": self._tier_fill.labels(model_name, t),
                "rej": self._tier_rejections.labels(model_name, t),
                "shed": self._tier_shed.labels(model_name, t),
                "running": self._tier_running.labels(model_name, t),
                "waiting": self._tier_waiting.labels(model_name, t),
                "wait": self._tier_wait.labels(model_name, t),
                "tail": self._tier_tail.labels(model_name, t),
            }
            for t in TIERS
        }

        self._lock = threading.Lock()
        self._last_cumulative: dict[str, float] = collections.defaultdict(float)
        self._gen_by_tier: dict[str, int] = dict.fromkeys(TIERS, 0)
        self._rate_window: collections.deque[tuple[float, dict[str, int]]] = collections.deque()
        self.requests_observed = 0

    # ----------------------------------------------------------------------------- per step / request

    def record_outputs(self, outputs: list[Any]) -> None:
        """Token counters and, for finished requests, the request histograms. Engine thread."""
        gen_total = 0
        for out in outputs:
            new = 0
            total = 0
            for c in out.outputs:
                new += len(c.new_token_ids)
                total += len(c.token_ids)
            if new:
                gen_total += new
                tier = out.tier if out.tier in self._tier else DEFAULT_TIER
                self._tier[tier]["gen"].inc(new)
                with self._lock:
                    self._gen_by_tier[tier] += new
                if total == new:  # this step produced the request's first tokens: its prefill is done
                    self.prompt_tokens.inc(len(out.prompt_token_ids))
            if out.finished:
                self.observe_finished(out)
        if gen_total:
            self.generation_tokens.inc(gen_total)

    def observe_finished(self, out: Any) -> None:
        reasons = [c.finish_reason for c in out.outputs]
        if "shed" in reasons:  # answered 429: not a finished request
            return
        reason = "abort" if "abort" in reasons else ("length" if "length" in reasons else "stop")
        self._success.labels(*self._success_lv, reason).inc()
        t = out.timing
        if reason == "abort" or t is None:
            return
        n_gen = sum(len(c.token_ids) for c in out.outputs)
        self.request_prompt_tokens.observe(len(out.prompt_token_ids))
        self.request_generation_tokens.observe(n_gen)
        params = getattr(out, "params", None)
        if params is not None:
            self.request_max_tokens.observe(params.max_tokens)
            self.request_n.observe(params.n)
        queue_s, prefill_s, decode_s = t.queue_ms / 1e3, t.prefill_ms / 1e3, t.decode_ms / 1e3
        ttft = t.first_token_time - t.arrival_time if t.first_token_time is not None else queue_s + prefill_s
        self.ttft.observe(ttft)
        self._tier[out.tier if out.tier in self._tier else DEFAULT_TIER]["ttft"].observe(ttft)
        self.queue.observe(queue_s)
        self.prefill.observe(prefill_s)
        self.decode.observe(decode_s)
        self.inference.observe(prefill_s + decode_s)
        self.e2e.observe(queue_s + prefill_s + decode_s)
        times = list(t.token_times or ())
        for a, b in zip(times, times[1:], strict=False):
            self.itl.observe(b - a)
            self.tpot.observe(b - a)
        n_steps = max(len(times), max((len(c.token_ids) for c in out.outputs), default=0))
        if n_steps > 1:
            self.request_tpot.observe(decode_s / (n_steps - 1))
        with self._lock:
            self.requests_observed += 1

    # ---------------------------------------------------------------------------------- engine state

    def _delta(self, key: str, value: float) -> float:
        with self._lock:
            d = value - self._last_cumulative[key]
            if d > 0:
                self._last_cumulative[key] = value
            return max(d, 0.0)

    def update_stats(self, stats: Any, now: float | None = None) -> None:
        """Gauges and cumulative counters from `Engine.stats()`. Engine thread."""
        now = time.monotonic() if now is None else now
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.swapped.set(stats.num_swapped)
        self.kv_usage.set(stats.kv_usage)
        self.gpu_kv_usage.set(stats.kv_usage)
        self.kv_fragmentation.set(getattr(stats, "fragmentation", 0.0))
        d = self._delta("prefix_q", stats.prefix_query_tokens)
        if d:
            self.prefix_queries.inc(d)
            self.gpu_prefix_queries.inc(d)
        d = self._delta("prefix_h", stats.prefix_hit_tokens)
        if d:
            self.prefix_hits.inc(d)
            self.gpu_prefix_hits.inc(d)
        d = self._delta("preempt", stats.num_preemptions)
        if d:
            self.preemptions.inc(d)
        running_by_tier = getattr(stats, "running_by_tier", None) or {}
        seqs_by_tier = getattr(stats, "running_seqs_by_tier", None) or running_by_tier
        waiting_by_tier = getattr(stats, "waiting_by_tier", None) or {}
        kv_by_tier = getattr(stats, "kv_usage_by_tier", None)
        rejections = getattr(stats, "admission_rejections", None) or {}
        waits = getattr(stats, "estimated_queue_wait_s", None) or {}
        shed = getattr(stats, "shed_by_tier", None) or {}
        tails = getattr(stats, "admission_tail_factor", None) or {}
        for tier, series in self._tier.items():
            series["wait"].set(waits.get(tier, 0.0))
            series["tail"].set(tails.get(tier, 1.0))
            running = running_by_tier.get(tier, 0)
            series["running"].set(running)
            series["waiting"].set(waiting_by_tier.get(tier, 0))
            series["fill"].set(seqs_by_tier.get(tier, 0) / self.max_num_seqs)
            if kv_by_tier is not None:
                series["kv"].set(kv_by_tier.get(tier, 0.0))
            d = self._delta(f"rej:{tier}", rejections.get(tier, 0))
            if d:
                series["rej"].inc(d)
            d = self._delta(f"shed:{tier}", shed.get(tier, 0))
            if d:
                series["shed"].inc(d)
        if kv_by_tier is None:  # the engine does not split KV by tier: attribute by running share
            total = sum(running_by_tier.get(t, 0) for t in self._tier)
            for tier, series in self._tier.items():
                share = running_by_tier.get(tier, 0) / total if total else 0.0
                series["kv"].set(stats.kv_usage * share)
        self._update_rates(now)

    def _update_rates(self, now: float) -> None:
        with self._lock:
            snapshot = dict(self._gen_by_tier)
            self._rate_window.append((now, snapshot))
            while len(self._rate_window) > 2 and now - self._rate_window[1][0] >= RATE_WINDOW_S:
                self._rate_window.popleft()
            t0, first = self._rate_window[0]
        dt = now - t0
        for tier, series in self._tier.items():
            series["rate"].set((snapshot[tier] - first[tier]) / dt if dt > 0 else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
