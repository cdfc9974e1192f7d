"""``slobench experiments [NAME ...]``: the engine's design claims measured on the reference engine, in-process.

Each experiment (engine/experiments/registry.py) states its parameters, the design claim and its figure, the
measured figure and whether the claim holds here, and where it does not, by how much and the likely reason.
The run folder gets ``experiments.json`` after every experiment (Ctrl-C keeps what finished) and
``experiments.html`` at the end. ``--reduced`` is the seconds-long form the tests run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadgen.commands.common import EXIT_INTERRUPTED, EXIT_OK, UsageError, run_dir_from

JSON_NAME, HTML_NAME = "experiments.json", "experiments.html"


def register(sub) -> argparse.ArgumentParser:
    """Add ``experiments`` to the subcommands."""
    p = sub.add_parser("experiments", help="the engine's design claims measured on the reference engine (CPU)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME", help="experiments to run (default: all; --list names them)")
    p.add_argument("--reduced", action="store_true", help="the seconds-long form (the tests'), not the full one")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="run folder to write (default: REPORTS/RUN_ID); not with --reports or --run-id")
    p.add_argument("--reports", metavar="DIR", help="folder for run folders (default: reports)")
    p.add_argument("--run-id", metavar="ID", help="run folder name under --reports (default: timestamp-experiments)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.set_defaults(cmd="experiments")
    return p


def cmd_experiments(args: argparse.Namespace) -> int:
    from loadgen.target.embedded import require_engine

    require_engine()
    from engine.experiments.registry import EXPERIMENTS, unknown
    from loadgen.report.experiments import write_experiments_html
    from loadgen.results.rundir import write_json
    from loadgen.results.runmeta import now_iso

    if args.list:
        for e in EXPERIMENTS.values():
            print(f"{e.name:22} {e.claim}")
        return EXIT_OK
    names = list(dict.fromkeys(args.names)) or list(EXPERIMENTS)
    if bad := unknown(names):
        raise UsageError(f"unknown experiment {', '.join(map(repr, bad))}; known: {', '.join(EXPERIMENTS)}")
    run_dir = run_dir_from(args, "experiments")
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = {"form": "reduced" if args.reduced else "full", "requested": names, "started": now_iso(),
           "interrupted": False, "experiments": []}
    say = (lambda _msg: None) if args.no_progress else (lambda msg: print(msg, file=sys.stderr, flush=True))
    code = EXIT_OK
    try:
        for i, name in enumerate(names, 1):
            say(f"[{i}/{len(names)}] {name}: {EXPERIMENTS[name].claim} ...")
            result = EXPERIMENTS[name].run(reduced=args.reduced)
            doc["experiments"].append(result.as_dict())
            write_json(run_dir / JSON_NAME, doc)
            verdicts = ", ".join(f"{f.measured} -> {'holds' if f.holds else 'does not hold'}" for f in result.findings)
            say(f"[{i}/{len(names)}] {name} ({result.wall_s:.1f} s): {verdicts}")
    except KeyboardInterrupt:
        doc["interrupted"] = True
        say(f"interrupted: saving the {len(doc['experiments'])} experiment(s) that finished")
        code = EXIT_INTERRUPTED
    write_json(run_dir / JSON_NAME, doc)
    write_experiments_html(doc, run_dir / HTML_NAME)
    held = sum(e["holds"] for e in doc["experiments"])
    print(f"{held} of {len(doc['experiments'])} experiments hold here; {run_dir / JSON_NAME}, {run_dir / HTML_NAME}")
    return code
