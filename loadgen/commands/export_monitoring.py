"""``slobench export-monitoring RUN_DIR``: a Grafana dashboard and Prometheus alerting rules for the five
service-health signals, thresholds from the capacity run's rated step (``loadgen/monitoring/export.py``)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from loadgen.commands.common import EXIT_OK, UsageError

PROM_RANGE = re.compile(r"^[0-9]+(ms|s|m|h)$")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "export-monitoring", help="write a Grafana dashboard and Prometheus alerting rules for the five health "
                                  "signals, thresholds from a capacity run's rated step",
        epilog="Writes OUT/grafana-dashboard.json and OUT/prometheus-rules.yml. A threshold is the rated step's "
               "figure x (1 + tolerance) + a floor for TTFT p99, KV usage and rejections/s, x (1 - tolerance) - "
               "floor for output tokens/s and batch fill (alerted only under load). exit codes: 0 written; 2 bad "
               "input (not a capacity run, no rated step, bad flags).")
    p.add_argument("run_dir", type=Path, help="a capacity run folder (or its summary.json)")
    p.add_argument("--out", type=Path, metavar="DIR", help="where to write the two files (default: RUN_DIR/monitoring)")
    p.add_argument("--flavor", choices=("vllm", "slobench", "both"), default="both",
                   help="metric names: vLLM's (vllm:), the reference engine's own (slobench:), or both (default: "
                        "both; a panel then plots both, the rules file has a group for each)")
    p.add_argument("--tolerance", type=float, default=0.25,
                   help="relative deviation allowed in a signal's bad direction (default 0.25)")
    p.add_argument("--sustain-s", type=float, default=30.0, metavar="S",
                   help="the alerts' for: duration in seconds (default 30)")
    p.add_argument("--rule-range", default="1m", metavar="RANGE",
                   help="the range of the rules' rates and averages, a PromQL duration (default 1m; at least 4 "
                        "scrape intervals)")
    p.add_argument("--max-num-seqs", type=int, metavar="N",
                   help="vLLM's batch slots for its batch fill ratio (default: the run's engine.max_num_seqs)")
    return p


def cmd_export_monitoring(args: argparse.Namespace) -> int:
    from loadgen.monitoring.baseline import BaselineError, load_baseline
    from loadgen.monitoring.export import ExportOptions, write
    from loadgen.monitoring.promql import EXPORT_FLAVORS

    if not args.tolerance >= 0 or not args.sustain_s >= 0:
        raise UsageError("export-monitoring: --tolerance and --sustain-s must be 0 or more")
    if not PROM_RANGE.match(args.rule_range):
        raise UsageError(f"export-monitoring: --rule-range {args.rule_range!r} is not a PromQL duration (e.g. 1m)")
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise UsageError(f"export-monitoring: --max-num-seqs must be 1 or more, got {args.max_num_seqs}")
    try:
        baseline = load_baseline(args.run_dir)
    except BaselineError as e:
        raise UsageError(f"export-monitoring: {e}") from None
    flavors = EXPORT_FLAVORS if args.flavor == "both" else (args.flavor,)
    opts = ExportOptions(flavors=flavors, tolerance=args.tolerance, sustain_s=args.sustain_s,
                         rule_range=args.rule_range, max_num_seqs=args.max_num_seqs)
    run_dir = args.run_dir if args.run_dir.is_dir() else args.run_dir.parent
    dash, rules = write(baseline, opts, args.out or run_dir / "monitoring")
    print(f"baseline: rated step {baseline.step} (load {baseline.load:.4g}) of {baseline.path}")
    for note in [*baseline.notes, *opts.notes]:
        print(f"note: {note}")
    print(f"dashboard: {dash}\nrules: {rules}")
    return EXIT_OK
