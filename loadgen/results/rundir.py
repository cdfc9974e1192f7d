"""The run folder (``reports/<run-id>/``): its files, how they are read back, and how the summary is
written. A report can always be rebuilt from the folder alone (docs/ARCHITECTURE.md, "Contracts")."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.results.records import read_records

REQUESTS, METRICS, SUMMARY, CONFIG = "requests.jsonl", "metrics.jsonl", "summary.json", "config.json"
PREDICTION = "prediction.json"  # a capacity run's: ``slobench plan --capacity-run`` writes it, the report shows it


def new_run_id(name: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{name}"


def run_folder(out: str | Path | None, reports: str | Path, run_id: str | None, name: str) -> Path:
    """``--out DIR`` when given, else ``REPORTS/RUN_ID`` (default RUN_ID: timestamp-name)."""
    return Path(out) if out else Path(reports) / (run_id or new_run_id(name))


def read_metrics(path: str | Path) -> list[dict]:
    """The scraped samples of a ``metrics.jsonl`` (unreadable lines, e.g. a torn last one, are skipped)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if "metrics" in o:
            out.append(o)
    return out


def read_run_records(run_dir: str | Path) -> list[dict[str, Any]]:
    p = Path(run_dir) / REQUESTS
    return read_records(p) if p.is_file() else []


def json_default(o: Any) -> Any:
    """numpy scalars as plain numbers; anything else as its string."""
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    return str(o)


def write_json(path: str | Path, obj: Any) -> None:
    """Write through a temporary file and rename, so a reader (or a crash) never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=json_default) + "\n")
    tmp.replace(path)


def write_summary(run_dir: str | Path, summary: dict[str, Any]) -> None:
    write_json(Path(run_dir) / SUMMARY, summary)
