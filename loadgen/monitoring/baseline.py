"""A capacity run's rated step as the baseline of the five signals: which step, each signal's figure, and
the file and field it comes from.

The rated step is the one ``rated_capacity.step`` names (``capacity/run.py``), else the highest passing step
counted by the search (``gate.lookup.rated_step``). From its entry in ``summary.json["steps"]``
(``capacity/step_stats.py``):

- TTFT p99: ``steps[i].summary.p99_ttft_ms`` — the client's p99 TTFT of the step's window, every tier
  pooled (server-side histograms leave the network out, so the live p99 reads a little below it);
- output tokens/s: ``steps[i].output_tok_s`` — output tokens of the window's successful requests per second;
- KV usage: ``steps[i].kv_usage`` — the window mean of the server's KV gauge;
- batch fill ratio: ``steps[i].batch_fill_ratio`` — the window mean (its source in ``batch_fill_source``);
- admission rejections/s: ``steps[i].admission_rejections`` (the server's counter over the step) /
  ``steps[i].duration_s``, else the client's 429s in the window (``admission_rejections_client``) / the
  window's length.

Also the step's mean running requests (``server_running``: "as busy as at the rated step" counts as under
load) and the batch capacity (``engine.max_num_seqs``) a vLLM page does not expose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.gate.lookup import kind, load_summary, rated_step
from loadgen.gate.values import GateInputError, is_number
from loadgen.monitoring.signals import BATCH_FILL, KV, REJECTIONS, TOKEN_RATE, TTFT


class BaselineError(ValueError):
    """The folder is not a capacity run with a rated step: one line, for the command's usage error."""


@dataclass(frozen=True)
class Figure:
    value: float | None
    source: str  # "summary.json steps[5].summary.p99_ttft_ms"


@dataclass
class Baseline:
    path: str
    step: int
    load: float
    verdict: str | None
    figures: dict[str, Figure]  # signal key -> figure
    ttft_p50_ms: float | None = None
    running: float | None = None  # the rated step's mean running requests (server_running)
    max_num_seqs: int | None = None  # the engine's batch slots, where the run knew them
    notes: list[str] = field(default_factory=list)

    def value(self, key: str) -> float | None:
        f = self.figures.get(key)
        return None if f is None else f.value


def number(x: Any) -> float | None:
    return float(x) if is_number(x) else None


def find_step(summary: dict[str, Any]) -> dict[str, Any] | None:
    steps = [s for s in summary.get("steps") or [] if isinstance(s, dict)]
    want = (summary.get("rated_capacity") or {}).get("step")
    named = [s for s in steps if want is not None and s.get("index") == want and s.get("passed") is True]
    if named:
        return named[0]
    step = rated_step(summary)
    return step if step is not None and step.get("passed") is True else None


def load_baseline(path: str | Path) -> Baseline:
    """The baseline of the run folder (or its ``summary.json``) at ``path``."""
    try:
        summary = load_summary(path)
    except GateInputError as e:
        raise BaselineError(str(e)) from None
    if kind(summary) != "capacity":
        raise BaselineError(f"{path}: not a capacity run (no steps): the baseline is a capacity run's rated step")
    step = find_step(summary)
    if step is None:
        raise BaselineError(f"{path}: no rated step (verdict {summary.get('verdict')}: no step passed)")
    i = step.get("index")
    at = f"summary.json steps[{i}]"
    summ = step.get("summary") if isinstance(step.get("summary"), dict) else {}
    figures = {
        TTFT.key: Figure(number(summ.get("p99_ttft_ms")), f"{at}.summary.p99_ttft_ms"),
        TOKEN_RATE.key: Figure(number(step.get("output_tok_s")), f"{at}.output_tok_s"),
        KV.key: Figure(number(step.get("kv_usage")), f"{at}.kv_usage"),
        BATCH_FILL.key: Figure(number(step.get("batch_fill_ratio")),
                               f"{at}.batch_fill_ratio" + (f" ({step['batch_fill_source']})"
                                                           if step.get("batch_fill_source") else "")),
        REJECTIONS.key: rejections(step, at),
    }
    engine = summary.get("engine") if isinstance(summary.get("engine"), dict) else {}
    seqs = engine.get("max_num_seqs")
    b = Baseline(str(path), int(i) if is_number(i) else -1, float(step.get("load") or 0.0), summary.get("verdict"),
                 figures, ttft_p50_ms=number(summ.get("median_ttft_ms")), running=number(step.get("server_running")),
                 max_num_seqs=int(seqs) if is_number(seqs) else None)
    b.notes = [f"no {k} at the rated step ({f.source})" for k, f in figures.items() if f.value is None]
    return b


def rejections(step: dict[str, Any], at: str) -> Figure:
    n, dur = number(step.get("admission_rejections")), number(step.get("duration_s"))
    if n is not None and dur:
        return Figure(n / dur, f"{at}.admission_rejections / {at}.duration_s")
    w = step.get("window_s")
    n = number(step.get("admission_rejections_client"))
    if n is not None and isinstance(w, list) and len(w) == 2 and all(map(is_number, w)) and w[1] > w[0]:
        return Figure(n / (w[1] - w[0]), f"{at}.admission_rejections_client / window")
    return Figure(None, f"{at}.admission_rejections")
