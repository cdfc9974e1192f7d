"""Poll the target's Prometheus ``/metrics`` every second into ``metrics.jsonl``.

Runs in its own process so parsing a large exposition never steals time from the replayer's event
loop. Each line: ``{"t": seconds since the run start, "metrics": {"name{label=\"v\",...}": value}}``
(or ``"error"``). Only families with the given prefixes are kept (``vllm:`` and ``slobench:`` by default), so the same
breakdown code works against the reference engine and a real vLLM.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# vLLM's names (so breakdowns work against a real vLLM) and the reference engine's service-health signals.
DEFAULT_PREFIXES = ("vllm:", "slobench:")


def parse_metrics(text: str, prefixes: Sequence[str] = DEFAULT_PREFIXES) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if prefixes and not fam.name.startswith(tuple(prefixes)):
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):  # creation timestamps, not measurements
                continue
            if s.labels:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
            else:
                out[s.name] = s.value
    return out


def scrape_once(url: str, prefixes: Sequence[str] = DEFAULT_PREFIXES, timeout: float = 2.0) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback target URL)
        return parse_metrics(r.read().decode("utf-8", "replace"), prefixes)


def scrape_loop(url: str, out_path: str, t0, stop, interval_s: float = 1.0,
                prefixes: Sequence[str] = DEFAULT_PREFIXES, ready=None, go=None) -> None:
    """Scrape until ``stop`` (a multiprocessing Event) is set; one final scrape after it. With ``ready``
    and ``go`` events, signal ready once imported and wait for ``go``; ``t0`` is then read from a shared
    value (the run start, known only then)."""
    if ready is not None:
        ready.set()
        go.wait()
    t0 = t0.value if hasattr(t0, "value") else t0
    stop.wait(max(0.0, t0 - time.monotonic()))  # first scrape at the run start
    k = 0
    with open(out_path, "a", encoding="utf-8") as f:
        while True:
            stopping = stop.is_set()
            t = time.monotonic() - t0
            try:
                line = {"t": round(t, 6), "metrics": scrape_once(url, prefixes)}
            except Exception as e:  # noqa: BLE001 (any failure is recorded, scraping goes on)
                line = {"t": round(t, 6), "error": f"{type(e).__name__}: {e}"}
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
            f.flush()
            if stopping:
                return
            k += 1
            stop.wait(max(0.0, t0 + k * interval_s - time.monotonic()))


class Scraper:
    """A scraper process: ``start()`` at the run start, ``stop()`` at its end."""

    def __init__(self, target: str, out_path: str | Path, interval_s: float = 1.0,
                 prefixes: Sequence[str] = DEFAULT_PREFIXES):
        ctx = mp.get_context("spawn")
        self._stop, self._ready, self._go = ctx.Event(), ctx.Event(), ctx.Event()
        self._t0 = ctx.Value("d", 0.0)
        self._proc = ctx.Process(
            target=scrape_loop, args=(target.rstrip("/") + "/metrics", str(out_path), self._t0, self._stop,
                                      interval_s, tuple(prefixes), self._ready, self._go),
            daemon=True, name="slobench-scraper",
        )

    def start(self, timeout: float = 30.0) -> Scraper:
        """Start the process and wait until it is ready, so its start-up never overlaps the run."""
        self._proc.start()
        self._ready.wait(timeout)
        return self

    def go(self, t0: float) -> None:
        self._t0.value = t0
        self._go.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._go.set()
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(1.0)
