"""The mock server's ``/metrics`` page: the ``vllm:`` series the scraper reads, and padding to bench a large page."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class MockMetrics:
    def __init__(self, model: str) -> None:
        r = self.registry = CollectorRegistry()
        lab = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests running", lab, registry=r).labels(model)
        Gauge("vllm:num_requests_waiting", "Requests waiting", lab, registry=r).labels(model)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens", lab, registry=r).labels(model)
        self.gen = Counter("vllm:generation_tokens", "Generated tokens", lab, registry=r).labels(model)
        self.queue, self.prefill, self.decode = (
            Histogram(f"vllm:request_{n}_time_seconds", f"{n} time", lab, buckets=BUCKETS, registry=r).labels(model)
            for n in ("queue", "prefill", "decode")
        )


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
