"""Commands over a finished run folder: ``summarize`` (rebuild a fixed-load run's summary.json from its records),
``report`` (report.html, or two runs compared) and ``gate`` (a run against its baseline, for CI)."""

from __future__ import annotations

import argparse
import sys

from loadgen.commands.common import EXIT_OK, UsageError, goodput_slos
from loadgen.commands.summary_table import print_summary


def cmd_summarize(args: argparse.Namespace) -> int:
    """Rebuild a fixed-load run's summary.json from its records, keeping its kind and metadata; a capacity
    run's (or any other kind's) is refused, exit 2, and left as it is (``results.rebuild``)."""
    from loadgen.results.rebuild import NotRebuildable, rebuild_fixed_summary
    from loadgen.results.rundir import write_summary

    try:
        s = rebuild_fixed_summary(args.run_dir, goodput=goodput_slos(args.goodput) or None,
                                  lateness_bound_ms=args.lateness_bound_ms)
    except NotRebuildable as e:
        raise UsageError(str(e)) from None
    write_summary(args.run_dir, s)
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
