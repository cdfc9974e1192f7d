"""``slobench summarize``: a fixed-load run's ``summary.json`` rebuilt from its records, of the same kind.

The records hold every latency, so a fixed-load summary (``kind`` ``run`` or ``replay``, or a Locust run's)
is theirs to rebuild; what the run knew beyond them (its metadata, the probe's findings, the tier SLOs, the
goodput SLOs asked for) is kept from the summary it replaces. A capacity run's summary is not: its step
windows, each step's early-stop decision and the search's verdict exist only in that summary, so it is
never rebuilt, and never replaced by a summary of another kind (docs/outputs.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loadgen.results.latency import LATENESS_BOUND_MS
from loadgen.results.rundir import (
    FIXED_LOAD_KINDS,
    METRICS,
    REQUESTS,
    SCHEMA_VERSION,
    SUMMARY,
    read_json_object,
    read_metrics,
    run_kind,
)

# What a fixed-load summary says beyond its records: kept from the summary being replaced.
KEPT_KEYS = ("kind", "scenario", "target", "driver", "started_at", "versions", "git_commit", "machine", "argv",
             "model", "requests_planned", "stopped_early", "target_probe", "request_fit", "prefix_cache", "locust")


class NotRebuildable(ValueError):
    """The folder's summary cannot be rebuilt from its records (its message is one line)."""


def rebuild_fixed_summary(run_dir: str | Path, *, goodput: Mapping[str, float] | None = None,
                          lateness_bound_ms: float = LATENESS_BOUND_MS) -> dict[str, Any]:
    """The folder's summary rebuilt from ``requests.jsonl`` and ``metrics.jsonl``. ``goodput``: the SLOs of
    ``request_goodput`` (default: the old summary's ``goodput_slo``). Raises NotRebuildable for a folder
    without records or of a kind other than a fixed load."""
    from loadgen.results.records import read_records
    from loadgen.results.summary import summarize  # lazy: pandas

    run_dir = Path(run_dir)
    req = run_dir / REQUESTS
    if not req.is_file():
        raise NotRebuildable(f"{req} not found")
    kind = run_kind(run_dir)
    if kind == "capacity":
        raise NotRebuildable(
            f"{run_dir} is a capacity run: its summary.json holds the search (each step's window and decision, the "
            "verdict, the rated capacity) that its records alone cannot rebuild; summary.json left as it is")
    if kind is not None and kind not in FIXED_LOAD_KINDS:
        raise NotRebuildable(f"{run_dir} is a {kind} run; summarize rebuilds fixed-load runs "
                             f"({', '.join(FIXED_LOAD_KINDS)}) only; summary.json left as it is")
    old = read_json_object(run_dir / SUMMARY) or {}
    # The tier SLOs live in the old summary only (the records carry the tier, not its SLO): keep them.
    tiers = old.get("tiers") if isinstance(old.get("tiers"), dict) else {}
    tier_slos = {t: e["slo"] for t, e in tiers.items() if isinstance(e, dict) and e.get("slo")}
    goodput = goodput or (old.get("goodput_slo") if isinstance(old.get("goodput_slo"), dict) else None)
    new = summarize(read_records(req), goodput=goodput or None, tier_slos=tier_slos,
                    lateness_bound_ms=lateness_bound_ms, metrics=read_metrics(run_dir / METRICS))
    kept = {k: old[k] for k in KEPT_KEYS if k in old}
    return {"schema_version": SCHEMA_VERSION, **kept, "run_id": run_dir.name, **new}
