"""``steps.csv``: a capacity run's steps, one row each, beside its ``summary.json`` (rewritten with it after
every step), for spreadsheets and pandas. Every figure is the summary's own (``summary.json["steps"]``);
the columns are listed in docs/outputs.md:

    pd.read_csv("reports/<run-id>/steps.csv")

The fixed columns come first; then, for every tier and SLO the run judges (``summary.json["slos"]``), six
columns named ``<tier>.<metric>.<figure>``: the quantile judged (``mean`` for a mean SLO, whose value is
then the window's mean), its measured value, its interval's low and high ends, the threshold and the verdict.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from loadgen.results.rundir import STEPS_CSV, write_text

# column -> the step entry's key (None: computed in ``step_row``)
FIXED = {
    "step": "index", "phase": "phase", "load": "load", "requested_rps": None, "offered_rps": "offered_rps",
    "planned_rps": "planned_rps", "window_start_s": None, "window_end_s": None, "requests": "requests",
    "throughput_rps": "throughput_rps", "output_tok_s": "output_tok_s", "goodput_rps": "goodput_rps",
    "passed": "passed", "margin": "margin", "counted": "counted", "deciding": None, "valid": "valid",
    "disturbance": "disturbance", "stopped_early": "stopped_early", "decided_by": "decided_by", "draw": "draw",
    "attempt": "attempt", "remeasured_of": "remeasured_of", "concurrency_measured": "concurrency_measured",
}
SLO_FIGURES = {"quantile": None, "value_ms": "value_ms_q", "ci_low_ms": "ci_low_ms", "ci_high_ms": "ci_high_ms",
               "threshold_ms": "threshold_ms", "passed": "passed"}


def slo_columns(summary: dict[str, Any]) -> list[tuple[str, str, float | str | None, str]]:
    """(tier, metric, quantile, column prefix) of every SLO the run judges, in the summary's order (the
    quantile ``"mean"`` for a mean SLO)."""
    out = []
    for tier, slos in (summary.get("slos") or {}).items():
        for slo in slos or []:
            q = "mean" if slo.get("statistic") == "mean" else slo.get("quantile")
            out.append((tier, slo["metric"], q, f"{tier}.{slo['metric']}"))
    return out


def columns(summary: dict[str, Any]) -> list[str]:
    return [*FIXED, *(f"{prefix}.{fig}" for *_, prefix in slo_columns(summary) for fig in SLO_FIGURES)]


def step_row(st: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """One step's row: the entry's own figures, its requested rate (the search's load on the rate axis),
    its judged window, whether the verdict rests on it, each SLO's judgement."""
    row = {col: st.get(key) for col, key in FIXED.items() if key is not None}
    window = st.get("window_s")
    w0, w1 = window if isinstance(window, (list, tuple)) and len(window) == 2 else (None, None)
    deciding = (summary.get("lateness") or {}).get("deciding_steps") or []
    row.update(requested_rps=st.get("load") if summary.get("axis", "rate") == "rate" else None,
               window_start_s=w0, window_end_s=w1, deciding=st.get("index") in deciding)
    for tier, metric, q, prefix in slo_columns(summary):
        judged = (((st.get("tiers") or {}).get(tier) or {}).get("judged") or {}).get(metric) or {}
        row[f"{prefix}.quantile"] = q
        for fig, key in SLO_FIGURES.items():
            if key is not None:
                row[f"{prefix}.{fig}"] = judged.get(key)
    return row


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(round(v, 6))
    return str(v)


def steps_csv_text(summary: dict[str, Any]) -> str:
    cols = columns(summary)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for st in summary.get("steps") or []:
        row = step_row(st, summary)
        w.writerow([_cell(row.get(c)) for c in cols])
    return buf.getvalue()


def write_steps_csv(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    """``steps.csv`` of the summary, atomically (a reader never sees half a file)."""
    path = Path(run_dir) / STEPS_CSV
    write_text(path, steps_csv_text(summary))
    return path
