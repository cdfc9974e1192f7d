"""Poll the target's Prometheus ``/metrics`` every second into ``metrics.jsonl``.

A measurement must never disturb itself: the scraper runs in its own process (parsing a large page
never holds the client's event loop), at a lower CPU priority (``nice``), so on a machine where the
client shares a core with it — the load generator pinned to one core, the server to the other — the
client still runs first; and it parses only the families it keeps (lines are filtered by prefix before
the Prometheus parser sees them). Each line: ``{"t": seconds since the run start, "metrics":
{"name{label=\"v\",...}": value}, "scrape": {"bytes", "fetch_ms", "parse_ms", "cpu_s"}}`` (or ``"error"``):
the scrape's own cost, CPU seconds of the scraper process so far. Only families with the given prefixes
are kept (``vllm:`` and ``slobench:`` by default), so the same breakdown code works against the reference
engine and a real vLLM.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# vLLM's names (so breakdowns work against a real vLLM) and the reference engine's service-health signals.
DEFAULT_PREFIXES = ("vllm:", "slobench:")


SCRAPER_NICE = 10  # the client's processes run first when they share a core with the scraper


def kept_lines(text: str, prefixes: Sequence[str]) -> str:
    """The exposition lines of the kept families (their samples and their ``# HELP`` / ``# TYPE`` lines):
    a 1 MB page of other series costs a string scan, not a parse."""
    if not prefixes:
        return text
    p = tuple(prefixes)
    def kept(line: str) -> bool:
        if line.startswith(p):
            return True
        parts = line.split(" ", 3)
        return line.startswith("# ") and len(parts) > 2 and parts[2].startswith(p)

    return "\n".join(line for line in text.splitlines() if kept(line)) + "\n"


def parse_metrics(text: str, prefixes: Sequence[str] = DEFAULT_PREFIXES) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(kept_lines(text, prefixes)):
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
    with contextlib.suppress(OSError):  # not permitted: scrape at the normal priority
        os.nice(SCRAPER_NICE)
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
                a = time.perf_counter()
                with urllib.request.urlopen(url, timeout=2.0) as r:  # noqa: S310 (loopback target URL)
                    raw = r.read()
                b = time.perf_counter()
                metrics = parse_metrics(raw.decode("utf-8", "replace"), prefixes)
                c = time.perf_counter()
                line = {"t": round(t, 6), "metrics": metrics,
                        "scrape": {"bytes": len(raw), "fetch_ms": round(1000 * (b - a), 3),
                                   "parse_ms": round(1000 * (c - b), 3), "cpu_s": round(time.process_time(), 4)}}
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
