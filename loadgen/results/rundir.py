"""The run folder (``reports/<run-id>/``): its files, how they are read back, and how the summary is
written. A report can always be rebuilt from the folder alone (docs/ARCHITECTURE.md, "Contracts").

``SCHEMA_VERSION`` versions the run folder's outputs (docs/outputs.md): every ``summary.json`` carries it,
and so do a run's ``config.json`` and the ``requests.parquet`` metadata. It changes when a field changes
its meaning or leaves; fields that are only added keep it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.results.records import read_records

REQUESTS, METRICS, SUMMARY, CONFIG = "requests.jsonl", "metrics.jsonl", "summary.json", "config.json"
STEPS_CSV = "steps.csv"  # a capacity run's steps, one row each (``capacity/steps_csv.py``)
# 1: before it was written (``rated_capacity.rate_rps`` was the requested rate); 2: ``rate_rps`` is the
# offered rate, the requested one ``requested_rps``. Raise it when a field changes meaning or leaves.
SCHEMA_VERSION = 2
FIXED_LOAD_KINDS = ("run", "replay")  # the kinds whose summary is the records' summary (``summarize`` rebuilds it)
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


def write_text(path: str | Path, text: str) -> None:
    """Write through a temporary file and rename, so a reader (or a crash) never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(path: str | Path, obj: Any) -> None:
    """``obj`` as indented JSON, atomically (``write_text``)."""
    write_text(path, json.dumps(obj, indent=2, default=json_default) + "\n")


def write_summary(run_dir: str | Path, summary: dict[str, Any]) -> None:
    """``summary.json``, atomically, with ``schema_version`` first (unless the summary names its own)."""
    write_json(Path(run_dir) / SUMMARY, {"schema_version": SCHEMA_VERSION, **summary})


def read_json_object(path: str | Path) -> dict[str, Any] | None:
    """The JSON object in a file; None when it is missing, unreadable or not an object."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def run_kind(run_dir: str | Path) -> str | None:
    """What the folder's run was: its summary's ``kind`` (``run``, ``replay``, ``capacity``; a summary with
    ``steps`` and no kind is a capacity run's), else its ``config.json``'s (a capacity run's names its
    ``search``); None when neither says (a Locust run's summary has no kind: a fixed load)."""
    summary = read_json_object(Path(run_dir) / SUMMARY)
    if summary is not None and summary.get("kind"):
        return str(summary["kind"])
    if summary is not None and isinstance(summary.get("steps"), list):
        return "capacity"
    config = read_json_object(Path(run_dir) / CONFIG) or {}
    if config.get("kind"):
        return str(config["kind"])
    return "capacity" if "search" in config else None
