"""``slobench watch TARGET --baseline RUN_DIR``: the five service-health signals of a live target against a
capacity run's rated step (``loadgen/monitoring/``)."""

from __future__ import annotations

import argparse
import sys

from loadgen.commands.common import UsageError

FLAVOR_CHOICES = ("auto", "vllm", "slobench", "sglang", "tgi", "trtllm")
EPILOG = ("exit codes: 0 no sustained deviation; 1 a signal stayed beyond its tolerance for --sustain-s (with "
          "--once: beyond it in the one look), or the target stopped answering for that long; 2 bad input or a "
          "target that cannot be scraped at the start. Ctrl-C ends the watch with the verdict so far. Deviation: "
          "TTFT p99, KV usage and rejections/s above baseline x (1 + tolerance) + a small floor; output tokens/s "
          "and batch fill below baseline x (1 - tolerance) - floor while the server is under load (a queue, or "
          "as many running as at the rated step).")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("watch", help="watch a live target's five health signals against a capacity run's "
                                            "rated step; exit 1 on a sustained deviation", epilog=EPILOG)
    p.add_argument("target", help="base URL of the server (its Prometheus page: /metrics, else /prometheus/metrics)")
    p.add_argument("--baseline", required=True, metavar="RUN_DIR",
                   help="a capacity run folder (or its summary.json): its rated step's figures are the baseline")
    p.add_argument("--tolerance", type=float, default=0.25,
                   help="relative deviation allowed in a signal's bad direction (default 0.25)")
    p.add_argument("--sustain-s", type=float, default=30.0, metavar="S",
                   help="a deviation counts once it has lasted S seconds without a look back inside (default 30)")
    p.add_argument("--window-s", type=float, default=30.0, metavar="S",
                   help="sliding window the signals are read over: histogram and counter deltas, gauge means "
                        "(default 30)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between scrapes (default 1; with --once: the one interval)")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("--once", action="store_true",
                   help="scrape twice, --interval apart, print the signals and exit (1 when one is beyond its limit)")
    p.add_argument("--json", action="store_true", help="one JSON object per look, then an end line, on stdout")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first sustained deviation")
    p.add_argument("--max-num-seqs", type=int, metavar="N",
                   help="the server's batch slots, for the batch fill ratio where its page does not say (vLLM, "
                        "TGI; default: the baseline run's engine.max_num_seqs)")
    p.add_argument("--flavor", choices=FLAVOR_CHOICES, default="auto",
                   help="whose metric names to read (default: told by the page; the reference engine's slobench: "
                        "names when it has them)")
    return p


def check(args: argparse.Namespace) -> None:
    if not args.target.startswith(("http://", "https://")):
        raise UsageError(f"watch: target {args.target!r} is not an http(s) URL")
    for flag, v in (("--interval", args.interval), ("--window-s", args.window_s)):
        if not v > 0:
            raise UsageError(f"watch: {flag} must be above 0, got {v:g}")
    for flag, v in (("--tolerance", args.tolerance), ("--sustain-s", args.sustain_s)):
        if not v >= 0:
            raise UsageError(f"watch: {flag} must be 0 or more, got {v:g}")
    if args.duration is not None and not args.duration > 0:
        raise UsageError(f"watch: --duration must be above 0, got {args.duration:g}")
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise UsageError(f"watch: --max-num-seqs must be 1 or more, got {args.max_num_seqs}")


def cmd_watch(args: argparse.Namespace, out=None) -> int:
    from loadgen.monitoring.baseline import BaselineError, load_baseline
    from loadgen.monitoring.signals import FLAVORS, detect_flavor
    from loadgen.monitoring.watch import WatchOptions, watch
    from loadgen.target.scrape import find_metrics_page, scrape_once

    check(args)
    try:
        baseline = load_baseline(args.baseline)
    except BaselineError as e:
        raise UsageError(f"watch: baseline {e}") from None
    url, note = find_metrics_page(args.target)
    try:
        first = scrape_once(url)
    except Exception as e:  # noqa: BLE001 (unreachable, refused, not Prometheus text: one line)
        raise UsageError(f"watch: cannot scrape {url}: {getattr(e, 'reason', None) or e}"
                         + (f" ({note})" if note else "")) from None
    names = detect_flavor(first) if args.flavor == "auto" else FLAVORS[args.flavor]
    if names is None:
        raise UsageError(f"watch: {url} has none of the servers' metric names (vllm:, slobench:, sglang:, tgi_, "
                         "trtllm_): nothing to watch")
    opts = WatchOptions(tolerance=args.tolerance, sustain_s=args.sustain_s, window_s=args.window_s,
                        interval_s=args.interval, duration_s=args.duration, once=args.once, json=args.json,
                        fail_fast=args.fail_fast, max_num_seqs=args.max_num_seqs)
    return watch(args.target, lambda: scrape_once(url), names, baseline, opts, first,
                 out=out if out is not None else sys.stdout)
