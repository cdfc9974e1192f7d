"""HTML reports from run folders: ``write_report(run_dir)`` and ``write_compare(run_a, run_b)``.

Kept import-light (plotly loads only when a page is rendered) so ``slobench gate`` and the run
commands do not pay for it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def write_report(run_dir: str | Path, out: str | Path | None = None, export: bool = True) -> Path:
    from loadgen.report.html import write_report as _w

    return _w(run_dir, out, export)


def write_compare(run_a: str | Path, run_b: str | Path, out: str | Path | None = None) -> Path:
    from loadgen.report.html import write_compare as _w

    return _w(run_a, run_b, out)


def auto_report(run_dir: str | Path, stream=None) -> Path | None:
    """The report written at the end of ``run`` / ``replay`` / ``capacity``: never raises (a report must
    not fail a measured run), prints where it went; ``SLOBENCH_NO_REPORT=1`` turns it off."""
    stream = stream or sys.stderr
    if os.environ.get("SLOBENCH_NO_REPORT", "") not in ("", "0"):
        return None
    try:
        path = write_report(run_dir)
    except Exception as e:  # noqa: BLE001 (reported, the run's result stands)
        print(f"warning: could not write the HTML report for {run_dir}: {type(e).__name__}: {e}", file=stream)
        return None
    print(f"report: {path}", file=stream)
    return path


__all__ = ["auto_report", "write_compare", "write_report"]
