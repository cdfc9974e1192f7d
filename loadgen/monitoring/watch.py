"""``slobench watch``: scrape the target every interval, read the five signals over a sliding window, judge
them against the baseline and show it — a rich live table on a terminal, one line per look elsewhere, or
JSON lines (``--json``). Ends at ``--duration``, at the first sustained deviation with ``--fail-fast``, or on
Ctrl-C; its exit code is 1 when a deviation was sustained (or the target stayed unreachable that long), else 0.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from loadgen.monitoring.baseline import Baseline
from loadgen.monitoring.readings import Reading, read
from loadgen.monitoring.signals import BY_KEY, SIGNALS, TTFT, UNDER_LOAD_WAITING, Names
from loadgen.monitoring.tracker import DEVIATING, SUSTAINED, DeviationTracker, Judgement

Sample = Mapping[str, float]


@dataclass(frozen=True)
class WatchOptions:
    tolerance: float = 0.25
    sustain_s: float = 30.0
    window_s: float = 30.0
    interval_s: float = 1.0
    duration_s: float | None = None  # None: until Ctrl-C
    once: bool = False
    json: bool = False
    fail_fast: bool = False
    max_num_seqs: int | None = None  # the batch capacity where neither the page nor the baseline says


def under_load(r: Reading, baseline: Baseline) -> bool:
    """A queue of at least one request on average, or as many requests running as at the rated step."""
    if r.waiting is not None and r.waiting >= UNDER_LOAD_WAITING:
        return True
    return r.running is not None and baseline.running is not None and baseline.running > 0 \
        and r.running >= baseline.running


def fmt(key: str, v: float | None) -> str:
    return "-" if v is None else BY_KEY[key].fmt.format(v)


def num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def look_dict(r: Reading, loaded: bool, judged: Mapping[str, Judgement], names: Names) -> dict[str, Any]:
    return {"t": round(r.t, 3), "server": names.flavor, "window_s": round(r.span_s, 3), "under_load": loaded,
            "waiting": r.waiting, "running": r.running, "ttft_p50_ms": r.ttft_p50_ms,
            "ttft_requests": r.ttft_requests,
            "signals": {k: {**j.as_dict(), "source": r.sources.get(k)} for k, j in judged.items()}}


def plain_line(r: Reading, loaded: bool, judged: Mapping[str, Judgement]) -> str:
    parts = []
    for s in SIGNALS:
        j = judged[s.key]
        mark = "" if j.state in ("ok",) else f" {j.state}" + (f" {j.for_s:.0f}s" if j.for_s is not None else "")
        parts.append(f"{s.key} {fmt(s.key, j.value)} (base {fmt(s.key, j.baseline)}){mark}")
    return f"t={r.t:.1f}s {'load' if loaded else 'light'}  " + " | ".join(parts)


class View:
    """The rich live table (``live``) or plain lines / JSON lines on ``out``."""

    def __init__(self, target: str, names: Names, baseline: Baseline, opts: WatchOptions, out: TextIO):
        self.target, self.names, self.baseline, self.opts, self.out = target, names, baseline, opts, out
        self.live = None
        self.status = ""
        if opts.json or opts.once:
            return
        from rich.console import Console

        self.console = Console(file=out)
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self.table(None, False, {}), console=self.console, refresh_per_second=4)
            self.live.start()

    def table(self, r: Reading | None, loaded: bool, judged: Mapping[str, Judgement]):
        from rich import box
        from rich.table import Table
        from rich.text import Text

        b, o = self.baseline, self.opts
        state = ""
        if r is not None:
            state = (f"; {'under load' if loaded else 'light traffic'} (waiting {num(r.waiting)}, running "
                     f"{num(r.running)}, {r.ttft_requests} first tokens in the window)")
        lines = [f"tolerance {o.tolerance:g}, sustained after {o.sustain_s:g} s, window {o.window_s:g} s{state}"]
        lines += [f"{s.title}: baseline {b.figures[s.key].source}"
                  + (f"; live {r.sources[s.key]}" if r is not None and s.key in r.sources else "") for s in SIGNALS]
        if self.status:
            lines.append(self.status)
        t = Table(title=f"slobench watch {self.target} ({self.names.flavor} names) against rated step {b.step} "
                        f"(load {b.load:.3g}) of {b.path}", title_justify="left", box=box.SIMPLE_HEAD,
                  caption=Text("\n".join(lines)), caption_justify="left")
        for c in ("signal", "now", "baseline", "limit", "state", "for"):
            t.add_column(c, justify="left" if c in ("signal", "state") else "right", no_wrap=True)
        for s in SIGNALS:
            j = judged.get(s.key)
            style = {SUSTAINED: "bold red", DEVIATING: "yellow"}.get(j.state if j else "", "")
            now = fmt(s.key, j.value) if j else "-"
            if s is TTFT and r is not None and r.ttft_p50_ms is not None:
                now += f" (p50 {r.ttft_p50_ms:.0f})"
            t.add_row(Text(f"{s.title} ({s.unit})"), now, fmt(s.key, b.value(s.key)),
                      fmt(s.key, j.limit) if j else "-", j.state if j else "-",
                      f"{j.for_s:.0f}s" if j and j.for_s is not None else "", style=style)
        return t

    def show(self, r: Reading, loaded: bool, judged: Mapping[str, Judgement]) -> None:
        if self.opts.json:
            self.line(look_dict(r, loaded, judged, self.names))
        elif self.live is not None:
            self.live.update(self.table(r, loaded, judged))
        elif self.opts.once:
            from rich.console import Console

            Console(file=self.out).print(self.table(r, loaded, judged))
        else:
            print(plain_line(r, loaded, judged), file=self.out, flush=True)

    def error(self, t: float, message: str) -> None:
        self.status = f"scrape failed at {t:.1f} s: {message}"
        if self.opts.json:
            self.line({"t": round(t, 3), "error": message})
        elif self.live is None:
            print(f"t={t:.1f}s {self.status}", file=self.out, flush=True)

    def line(self, obj: dict[str, Any]) -> None:
        print(json.dumps(obj, separators=(",", ":")), file=self.out, flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def verdict_text(tracker: DeviationTracker, lost_s: float | None) -> str:
    if lost_s is not None:
        return f"target unreachable for {lost_s:.0f} s"
    if tracker.sustained:
        return "sustained deviation: " + ", ".join(BY_KEY[k].title for k in sorted(tracker.sustained))
    return "no sustained deviation"


def watch(target: str, scrape: Callable[[], Sample], names: Names, baseline: Baseline, opts: WatchOptions,
          first: Sample, out: TextIO = sys.stdout, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> int:
    """Watch until the end (see the module's docstring); ``first``: the sample the command checked the page
    with, the window's first. Returns the exit code (0, or 1 on a sustained deviation)."""
    baseline_values = {s.key: baseline.value(s.key) for s in SIGNALS}
    tracker = DeviationTracker(baseline_values, opts.tolerance, 0.0 if opts.once else opts.sustain_s)
    max_seqs = opts.max_num_seqs or baseline.max_num_seqs
    view = View(target, names, baseline, opts, out)
    t0 = clock()
    window: deque[tuple[float, Sample]] = deque([(0.0, first)])
    looks, last_ok, lost = 0, 0.0, None
    try:
        while True:
            looks += 1
            sleep(max(0.0, t0 + looks * opts.interval_s - clock()))
            t = clock() - t0
            try:
                window.append((t, scrape()))
                last_ok = t
            except Exception as e:  # noqa: BLE001 (a failed scrape is shown; watching goes on)
                view.error(t, f"{type(e).__name__}: {e}")
                if opts.once or t - last_ok >= max(opts.sustain_s, 3 * opts.interval_s):
                    lost = t - last_ok  # --once has no second try: its one look is lost
                    break
                if opts.duration_s is not None and t >= opts.duration_s:
                    break
                continue
            while len(window) > 2 and window[1][0] <= t - opts.window_s:  # the oldest still spans the window
                window.popleft()
            r = read(list(window), names, max_seqs)
            loaded = under_load(r, baseline)
            view.show(r, loaded, tracker.update(t, r.values, loaded))
            if opts.once or (opts.fail_fast and tracker.sustained):
                break
            if opts.duration_s is not None and t >= opts.duration_s:
                break
    except KeyboardInterrupt:
        pass  # Ctrl-C ends the watch: the verdict so far
    finally:
        view.close()
    code = 1 if tracker.sustained or lost is not None else 0
    text = verdict_text(tracker, lost)
    if opts.json:
        view.line({"end": True, "exit": code, "verdict": text, "sustained": sorted(tracker.sustained),
                   "looks": looks})
    else:
        print(f"{text} (exit {code})", file=out, flush=True)
    return code
