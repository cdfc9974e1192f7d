"""The mock server's Prometheus page in one server's names (``--metrics-flavor``: the reference engine's
``vllm:`` series by default, or SGLang's, TGI's or trtllm-serve's), and padding to bench a large page.

Every finished request is observed with exact, known values: queue = the time it waited for a slot (0
without ``--slots``), prefill = the mock's TTFT after that, decode = the rest of the stream, so a test can
assert the breakdown each server's histograms give. The running and waiting gauges count the requests
being served and those queued for a slot. trtllm-serve's
page is at ``/prometheus/metrics`` (its ``/metrics`` answers JSON iteration stats, ``[]`` here)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
FLAVORS = ("vllm", "sglang", "tgi", "trtllm")


class MockMetrics:
    """The page's series; ``queued(+1 / -1)`` as a request starts and stops waiting for a slot, ``start()``
    when it is served, ``abort()`` when its client leaves, ``finish()`` when it ends."""

    def __init__(self, model: str, flavor: str = "vllm") -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"metrics flavor {flavor!r}: expected one of {', '.join(FLAVORS)}")
        self.flavor = flavor
        self.path = "/prometheus/metrics" if flavor == "trtllm" else "/metrics"
        self.json_page = b"[]" if flavor == "trtllm" else None  # what its /metrics answers instead
        r = self.registry = CollectorRegistry()
        self._hist: dict[str, object] = {}  # part -> histogram child: queue, prefill, decode, ttft, e2e, ...
        getattr(self, f"_build_{flavor}")(r, model)

    def _h(self, part: str, name: str, labels: dict[str, str], doc: str = "") -> None:
        h = Histogram(name, doc or name, list(labels), buckets=BUCKETS, registry=self.registry)
        self._hist[part] = h.labels(**labels) if labels else h

    def _gauges(self, running: str, waiting: str, labels: dict[str, str]) -> None:
        r, lab = self.registry, list(labels)
        g_run = Gauge(running, "Requests running", lab, registry=r)
        g_wait = Gauge(waiting, "Requests waiting", lab, registry=r)
        self.running = g_run.labels(**labels) if labels else g_run
        self.waiting = g_wait.labels(**labels) if labels else g_wait  # the series exists, at 0

    def _counters(self, prompt: str, gen: str, labels: dict[str, str]) -> None:
        lab = list(labels)
        self.prompt = Counter(prompt, "Prompt tokens", lab, registry=self.registry).labels(**labels)
        self.gen = Counter(gen, "Generated tokens", lab, registry=self.registry).labels(**labels)

    def _build_vllm(self, r: CollectorRegistry, model: str) -> None:
        lab = {"model_name": model}
        self._gauges("vllm:num_requests_running", "vllm:num_requests_waiting", lab)
        self._counters("vllm:prompt_tokens", "vllm:generation_tokens", lab)
        for part in ("queue", "prefill", "decode"):
            self._h(part, f"vllm:request_{part}_time_seconds", lab, f"{part} time")

    def _build_sglang(self, r: CollectorRegistry, model: str) -> None:
        lab = {"model_name": model}
        self._gauges("sglang:num_running_reqs", "sglang:num_queue_reqs", lab)
        self._counters("sglang:prompt_tokens", "sglang:generation_tokens", lab)
        self._h("queue", "sglang:queue_time_seconds", lab)
        self._h("ttft", "sglang:time_to_first_token_seconds", lab)
        self._h("e2e", "sglang:e2e_request_latency_seconds", lab)

    def _build_tgi(self, r: CollectorRegistry, model: str) -> None:  # TGI's series carry no model label
        self._gauges("tgi_batch_current_size", "tgi_queue_size", {})
        self.prompt = self.gen = None
        for part, name in (("validation", "validation"), ("queue", "queue"), ("inference", "inference"),
                           ("e2e", ""), ("per_token", "mean_time_per_token")):
            self._h(part, f"tgi_request_{name}_duration" if name else "tgi_request_duration", {})
        batch = Histogram("tgi_batch_inference_duration", "Batch inference duration", ["method"], buckets=BUCKETS,
                          registry=r)
        self._hist["prefill_batch"] = batch.labels(method="prefill")

    def _build_trtllm(self, r: CollectorRegistry, model: str) -> None:
        lab = {"model_name": model, "engine_type": "trtllm"}
        self._gauges("trtllm_num_requests_running", "trtllm_num_requests_waiting", lab)
        self._counters("trtllm_prompt_tokens", "trtllm_generation_tokens", lab)
        for part, name in (("queue", "request_queue_time"), ("ttft", "time_to_first_token"),
                           ("e2e", "e2e_request_latency"), ("prefill", "request_prefill_time"),
                           ("decode", "request_decode_time")):
            self._h(part, f"trtllm_{name}_seconds", lab)

    def queued(self, delta: int) -> None:
        self.waiting.inc(delta)

    def start(self) -> None:
        self.running.inc()

    def abort(self) -> None:
        self.running.dec()

    def finish(self, prefill_s: float, decode_s: float, n_in: int, n_out: int, queue_s: float = 0.0) -> None:
        """A request ended: queue ``queue_s``, prefill ``prefill_s``, decode ``decode_s``, in this flavour's
        histograms (TTFT and end to end from arrival, TGI's inference from its slot)."""
        self.running.dec()
        if self.prompt is not None:
            self.prompt.inc(n_in)
            self.gen.inc(n_out)
        ttft_s = queue_s + prefill_s
        values = {"queue": queue_s, "validation": 0.0, "prefill": prefill_s, "prefill_batch": prefill_s,
                  "ttft": ttft_s, "decode": decode_s, "e2e": ttft_s + decode_s, "inference": prefill_s + decode_s,
                  "per_token": (ttft_s + decode_s) / max(1, n_out)}
        for part, h in self._hist.items():
            h.observe(values[part])


def metrics_padding(n_bytes: int) -> bytes:
    """Whole Prometheus series lines of a gauge the scraper does not read, at least n_bytes in all."""
    if n_bytes <= 0:
        return b""
    lines = [b"# HELP mock_padding A large /metrics page: series only the page size needs\n",
             b"# TYPE mock_padding gauge\n"]
    size, i = sum(map(len, lines)), 0
    while size < n_bytes:
        lines.append(b'mock_padding{series="%08d"} 0.0\n' % i)
        size += len(lines[-1])
        i += 1
    return b"".join(lines)
