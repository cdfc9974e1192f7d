"""Live display of a capacity search: a table of finished steps and a progress bar for the one under way.

On a terminal it is a rich ``Live`` view on stderr; elsewhere (CI logs, pipes) one plain line per step.
"""

from __future__ import annotations

import sys
from typing import Any


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def step_line(step: dict[str, Any], unit: str) -> str:
    tiers = "  ".join(
        f"{t} q={_ms(e.get('ttft_ms_q'))}ms" + ("" if e.get("passed") is None else (" ok" if e["passed"] else " FAIL"))
        for t, e in step["tiers"].items())
    bd = step.get("breakdown") or {}
    verdict = "PASS" if step["passed"] else "FAIL"
    early = " (stopped early)" if step.get("stopped_early") else ""
    return (f"step {step['index']} {step['phase']:<6} load {step['load']:.3g} {unit}{_offered(step, unit)}: "
            f"{verdict}{early}{_marks(step)}  {tiers}  "
            f"queue {_ms(bd.get('mean_queue_ms'))} prefill {_ms(bd.get('mean_prefill_ms'))} "
            f"net {_ms(bd.get('mean_network_ms'))} ms")


def _offered(step: dict[str, Any], unit: str) -> str:
    off = step.get("offered_rps")
    return f" (offered {off:.3g})" if unit == "req/s" and isinstance(off, (int, float)) else ""


def _marks(step: dict[str, Any]) -> str:
    """What the search made of the step: its fresh arrival draw, a re-measure, a disturbance."""
    out = ""
    if step.get("draw"):
        out += f" [draw {step['draw']}]"
    if step.get("remeasured_of") is not None:
        out += f" [re-measure of {step['remeasured_of']}]"
    if step.get("disturbance"):
        out += f" DISTURBED ({step['disturbance']})" + ("" if step.get("counted", True) else ", measured again")
    return out


class CapacityDisplay:
    def __init__(self, title: str, unit: str, tiers: list[str], enabled: bool = True, console=None):
        self.unit, self.tiers = unit, tiers
        self.rich = enabled and (console is not None or sys.stderr.isatty())
        self.enabled = enabled
        self.rows: list[dict[str, Any]] = []
        self._status = ""
        if not self.rich:
            return
        from rich.console import Console
        from rich.live import Live
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console or Console(stderr=True)
        self.title = title
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[info]}"), console=self.console)
        self.task = None
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def _table(self):
        from rich import box
        from rich.table import Table

        t = Table(title=self.title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        for c in ("#", "phase", self.unit):
            t.add_column(c, justify="right", no_wrap=True)
        for tier in self.tiers:
            t.add_column(tier[:4], justify="right", no_wrap=True)
        for c in ("queue", "pref", "net", "KV", "fill", ""):
            t.add_column(c, justify="right", no_wrap=True)
        for s in self.rows:
            bd = s.get("breakdown") or {}
            cells = [str(s["index"]), s["phase"], f"{s['load']:.3g}"]
            for tier in self.tiers:
                e = s["tiers"].get(tier) or {}
                mark = "" if e.get("passed") is None else (" ✓" if e["passed"] else " ✗")
                cells.append(f"{_ms(e.get('ttft_ms_q'))}{mark}")
            early = ("*" if s.get("stopped_early") else "") + ("!" if s.get("disturbance") else "")
            cells += [_ms(bd.get("mean_queue_ms")), _ms(bd.get("mean_prefill_ms")), _ms(bd.get("mean_network_ms")),
                      _pct(s.get("kv_usage")), _pct(s.get("batch_fill_ratio")),
                      ("[green]pass[/]" if s["passed"] else "[red]FAIL[/]") + early]
            t.add_row(*cells)
        return t

    def _render(self):
        from rich.console import Group
        from rich.text import Text

        legend = Text("tiers: TTFT at the judged quantile, ms; queue / pref(ill) / net: mean ms; * stopped early; "
                      "! disturbed (the load generator fell behind)",
                      style="dim")
        return Group(self._table(), legend, self.progress, Text(self._status))

    def start_step(self, index: int, load: float, phase: str, total_s: float) -> None:
        if not self.rich:
            return
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"step {index} ({phase}) {load:.3g} {self.unit}", total=total_s,
                                           info="")
        self.live.update(self._render())

    def update(self, elapsed_s: float, info: str) -> None:
        if self.rich and self.task is not None:
            self.progress.update(self.task, completed=elapsed_s, info=info)

    def end_step(self, step: dict[str, Any]) -> None:
        self.rows.append(step)
        if self.rich:
            if self.task is not None:
                self.progress.remove_task(self.task)
                self.task = None
            self.live.update(self._render())
        elif self.enabled:
            print(step_line(step, self.unit), file=sys.stderr, flush=True)

    def status(self, text: str) -> None:
        self._status = text
        if self.rich:
            self.live.update(self._render())
        elif self.enabled:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.rich:
            if self.task is not None:
                self.progress.remove_task(self.task)
            self.live.update(self._render())
            self.live.stop()


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"
