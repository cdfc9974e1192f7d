"""The engine's design claims, every experiment in its full form: `slobench experiments --out bench/results`.

    .venv/bin/python bench/experiments_bench.py [NAME ...] [--reduced] [--out bench/results]

Writes bench/results/experiments.json and experiments.html (about a minute per experiment on the 2-core
machine, under 15 minutes in all). docs/validation.md's "Experiments" table is read from the JSON.
"""

from __future__ import annotations

import argparse
import sys

from loadgen.commands.common import EXIT_USAGE, UsageError
from loadgen.commands.experiments import cmd_experiments, register


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    register(ap.add_subparsers(dest="cmd"))
    argv = sys.argv[1:]
    if "--out" not in argv:
        argv += ["--out", "bench/results"]
    try:
        return cmd_experiments(ap.parse_args(["experiments", *argv]))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
