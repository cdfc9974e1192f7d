"""Poll the target's Prometheus ``/metrics`` every second into ``metrics.jsonl``.

A measurement must never disturb itself: the scraper runs in its own process (parsing a large page
never holds the client's event loop), at a lower CPU priority (``nice``), so on a machine where the
client shares a core with it — the load generator pinned to one core, the server to the other — the
client still runs first; and it parses only the families it keeps (lines are filtered by prefix before
the Prometheus parser sees them). Each line: ``{"t": seconds since the run start, "metrics":
{"name{label=\"v\",...}": value}, "scrape": {"bytes", "fetch_ms", "parse_ms", "cpu_s"}}`` (or ``"error"``):
the scrape's own cost, CPU seconds of the scraper process so far, and the ``path`` the page was found at
(with a ``note`` when the first place tried was not it). Only families with the given prefixes are kept
(by default every server of ``results.server_metrics`` — ``vllm:``, ``sglang:``, ``tgi_``, ``trtllm_`` —
and the reference engine's ``slobench:``), so the same breakdown code works against each of them.

Where the page is: ``/metrics``, else ``/prometheus/metrics`` (trtllm-serve, whose ``/metrics`` is JSON
iteration statistics: a JSON answer is not Prometheus text and is passed over, with a note). The scraper
looks once, before the run, and keeps the path that answered.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from loadgen.results.server_metrics import PREFIXES

# each server's names (vLLM, SGLang, TGI, TRT-LLM) and the reference engine's service-health signals
DEFAULT_PREFIXES = (*PREFIXES, "slobench:")
METRICS_PATHS = ("/metrics", "/prometheus/metrics")  # tried in this order; trtllm-serve's is the second


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


def is_prometheus(body: bytes, content_type: str = "") -> bool:
    """Whether an answer is Prometheus text, not JSON (trtllm-serve's ``/metrics``)."""
    return "json" not in content_type.lower() and body.lstrip()[:1] not in (b"{", b"[")


def find_metrics_page(target: str, timeout: float = 2.0) -> tuple[str, str | None]:
    """(URL of the target's Prometheus page, a note on the places passed over or None): the first of
    ``METRICS_PATHS`` that answers Prometheus text; ``/metrics`` when none does (its errors are then
    recorded with each scrape)."""
    base, notes = target.rstrip("/"), []
    for path in METRICS_PATHS:
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as r:  # noqa: S310 (the target's URL)
                body, ctype = r.read(), r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            notes.append(f"GET {path}: HTTP {e.code}")
            continue
        except Exception as e:  # noqa: BLE001 (unreachable: try the next place, then give up)
            notes.append(f"GET {path}: {type(e).__name__}")
            continue
        if is_prometheus(body, ctype):
            return base + path, "; ".join(notes) or None
        notes.append(f"GET {path} answered JSON, not Prometheus text: ignored")
    return base + METRICS_PATHS[0], "; ".join(notes) or None


def scrape_loop(target: str, out_path: str, t0, stop, interval_s: float = 1.0,
                prefixes: Sequence[str] = DEFAULT_PREFIXES, ready=None, go=None) -> None:
    """Scrape the target's Prometheus page (found first: ``find_metrics_page``) until ``stop`` (a
    multiprocessing Event) is set; one final scrape after it. With ``ready`` and ``go`` events, signal
    ready once imported and the page found, and wait for ``go``; ``t0`` is then read from a shared value
    (the run start, known only then). Ends by itself once the process that started it is gone (killed
    outright, it could not set ``stop``)."""
    parent = os.getppid()

    def orphaned() -> bool:  # the parent's pid, not whether it lives: a pid can be reused
        return os.getppid() != parent

    with contextlib.suppress(OSError):  # not permitted: scrape at the normal priority
        os.nice(SCRAPER_NICE)
    url, note = find_metrics_page(target)
    where = {"path": url[len(target.rstrip("/")):], **({"note": note} if note else {})}
    if ready is not None:
        ready.set()
        while not go.wait(1.0):
            if orphaned():
                return
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
                                   "parse_ms": round(1000 * (c - b), 3), "cpu_s": round(time.process_time(), 4),
                                   **where}}
            except Exception as e:  # noqa: BLE001 (any failure is recorded, scraping goes on)
                line = {"t": round(t, 6), "error": f"{type(e).__name__}: {e}"}
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
            f.flush()
            if stopping or orphaned():
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
            target=scrape_loop, args=(target.rstrip("/"), str(out_path), self._t0, self._stop,
                                      interval_s, tuple(prefixes), self._ready, self._go),
            daemon=True, name="slobench-scraper",
        )

    def start(self, timeout: float = 30.0) -> Scraper:
        """Start the process and wait until it is ready (imported, the page found), so its start-up never
        overlaps the run."""
        self._proc.start()
        self._ready.wait(timeout)
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid

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
