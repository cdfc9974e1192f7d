"""The ``slobench gate`` command: evaluate, write the CI outputs, print the verdict.

    slobench gate RUN_DIR [RUN_DIR ...] --baseline BASELINE(.json | run folder) [BASELINE ...]
                  [--rules gate.yaml] [--junit junit.xml]

Several runs on a side are repeats of one measurement, pooled into one summary (``gate.pool``).

Exit 0 when every rule passes, 1 on a regression, 2 when the input is unusable (missing files, bad
YAML, an unknown rule, a metric missing from either side) with a one-line message. JUnit XML gets one
testcase per rule; with ``$GITHUB_STEP_SUMMARY`` set a markdown table is appended to it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

from loadgen.gate.evaluate import EXIT_UNUSABLE, GateReport, gate
from loadgen.gate.output import junit_xml, markdown, text_lines
from loadgen.gate.values import GateInputError


def main(run: list[str], baseline: list[str], rules: str | None, junit: str | None, stdout: TextIO,
         stderr: TextIO) -> int:
    """Never a traceback: exit 0 / 1 / 2. The JUnit file and step summary are written for unusable input
    too, so CI shows why the gate could not answer."""
    rep: GateReport | None = None
    error: str | None = None
    try:
        rep = gate(run, baseline, rules)
    except GateInputError as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 (a CI gate must answer with an exit code, not a traceback)
        error = f"unexpected {type(e).__name__}: {e}"
    try:
        if junit:
            Path(junit).parent.mkdir(parents=True, exist_ok=True)
            Path(junit).write_bytes(junit_xml(rep, error, ", ".join(run), ", ".join(baseline)))
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as f:
                f.write(markdown(rep, error))
    except OSError as e:
        error = error or f"cannot write the gate's output: {e}"
        rep = None
    if rep is None:
        print(f"error: gate: {error}", file=stderr)
        return EXIT_UNUSABLE
    for line in text_lines(rep):
        print(line, file=stdout)
    return rep.exit_code
