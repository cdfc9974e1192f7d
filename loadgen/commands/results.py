"""Commands over a finished run folder: ``summarize`` (rebuild summary.json from the records),
``report`` (report.html, or two runs compared) and ``gate`` (a run against its baseline, for CI)."""

from __future__ import annotations

import argparse
import json
import sys

from loadgen.commands.common import EXIT_OK, UsageError, goodput_slos
from loadgen.commands.summary_table import print_summary


def cmd_summarize(args: argparse.Namespace) -> int:
    from loadgen.results.records import read_records
    from loadgen.results.rundir import read_metrics
    from loadgen.results.summary import summarize

    req = args.run_dir / "requests.jsonl"
    if not req.is_file():
        raise UsageError(f"{req} not found")
    # The tier SLOs live in the old summary only (the records carry the tier, not its SLO): keep them.
    tier_slos = {}
    cfg_path = args.run_dir / "summary.json"
    if cfg_path.is_file():
        try:
            old = json.loads(cfg_path.read_text())
            tier_slos = {t: e["slo"] for t, e in (old.get("tiers") or {}).items() if "slo" in e}
        except (ValueError, AttributeError):
            pass
    s = summarize(read_records(req), goodput=goodput_slos(args.goodput) or None, tier_slos=tier_slos,
                  lateness_bound_ms=args.lateness_bound_ms,
                  metrics=read_metrics(args.run_dir / "metrics.jsonl"))
    s["run_id"] = args.run_dir.name
    (args.run_dir / "summary.json").write_text(json.dumps(s, indent=2, default=float) + "\n")
    print_summary(s, args.run_dir, args.json)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from loadgen.report import write_compare, write_report
    from loadgen.report.data import RunDataError

    try:
        if args.run_b is not None:
            path = write_compare(args.run_dir, args.run_b, args.output)
        else:
            path = write_report(args.run_dir, args.output, export=not args.no_export)
    except RunDataError as e:
        raise UsageError(str(e)) from None
    print(f"report: {path}")
    return EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    from loadgen.gate.command import main as gate_main

    return gate_main(args.run_dir, args.baseline, args.rules, args.junit, sys.stdout, sys.stderr)
