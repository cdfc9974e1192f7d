"""``slobench scenarios [NAME]``: the built-in scenarios (``loadgen/scenario/builtin.py``): a list with what each
is for, or one built-in's YAML to copy (``slobench scenarios your-server > my.yaml``)."""

from __future__ import annotations

import argparse
import os
import sys

from loadgen.commands.common import EXIT_OK, UsageError

EPILOG = ("A built-in is named on the command line in place of a file: `slobench capacity chat`. Those marked "
          "'embedded engine' are tuned for the reference engine that starts when no --target is given (its tiny "
          "model, short prompts, a lateness bound for a shared 2-core machine); for your own server start from "
          "`slobench scenarios your-server > my.yaml`, every field of which is explained in its comments.")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("scenarios", help="list the built-in scenarios, or print one's YAML to copy",
                              epilog=EPILOG)
    p.add_argument("name", nargs="?", help="a built-in's name: print its YAML (e.g. your-server > my.yaml)")
    p.set_defaults(cmd="scenarios")
    return p


def cmd_scenarios(args: argparse.Namespace) -> int:
    from loadgen.scenario.builtin import builtin_names, builtin_path, builtin_scenarios

    if args.name:
        path = builtin_path(args.name)
        if path is None:
            raise UsageError(f"scenarios: no built-in scenario {args.name!r} (built in: {', '.join(builtin_names())})")
        return write(path.read_text(encoding="utf-8"))
    rows = builtin_scenarios()
    width = max(len(r.name) for r in rows)
    return write("".join(f"{r.name:<{width}}  {'embedded engine' if r.embedded_engine else 'any server':<15}  "
                         f"{r.description}\n" for r in rows))


def write(text: str) -> int:
    """``text`` to stdout; a reader that stops early (``| head``) is no error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit does not fail
    return EXIT_OK
