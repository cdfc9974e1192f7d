"""Run a benchmark suite and write its one current results file.

    python -m bench --list                      # the suites, their parts and what each needs
    python -m bench SUITE                       # every part, measured: bench/results/SUITE.json
    python -m bench SUITE --part NAME ...       # only these parts (the others stay in the file)
    python -m bench SUITE --quick               # each part small, to check it runs (bench/results untouched)

Measure on an otherwise idle machine: the timings are the machine's as much as the code's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.suites import SUITES, Part, Suite
from loadgen.results.runmeta import git_commit, machine, now_iso, versions

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


class SuiteError(Exception):
    """A part failed: its command and exit status, in one line."""


def command(part: Part, quick: bool, out: Path) -> list[str]:
    args = part.quick if quick else part.args
    cmd = [sys.executable, str(Path("bench") / part.script), *args]
    if "--" in args:  # the script passes what follows ``--`` on: its own output option goes before it
        i = cmd.index("--")
        cmd[i:i] = [part.out_flag, str(out)]
    else:
        cmd += [part.out_flag, str(out)]
    if part.pin and not quick:
        cmd = ["taskset", "-c", part.pin, *cmd]
    return cmd


def shown(part: Part, quick: bool) -> str:
    """The command as a reader reruns it (``python -m bench`` writes the output option itself)."""
    args = part.quick if quick else part.args
    pin = f"taskset -c {part.pin} " if part.pin and not quick else ""
    return f"{pin}python bench/{part.script} {shlex.join(args)}".rstrip()


def run_part(part: Part, quick: bool, work: Path) -> dict[str, Any]:
    out = work / (part.name if part.out_file else f"{part.name}.json")
    cmd = command(part, quick, out)
    print(f"bench: {part.name}: {shown(part, quick)}", file=sys.stderr, flush=True)
    started, t0 = now_iso(), time.monotonic()
    rc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}).returncode
    if rc != 0:
        raise SuiteError(f"part {part.name} failed (exit {rc}): {shlex.join(cmd)}")
    path = out / part.out_file if part.out_file else out
    if not path.is_file():
        raise SuiteError(f"part {part.name} wrote no results file ({path})")
    return {"about": part.about, "command": shown(part, quick), "quick": quick, "needs": list(part.needs),
            "measured": {"commit": git_commit(), "started_at": started, "wall_s": round(time.monotonic() - t0, 1),
                         "machine": machine(), "versions": versions()},
            "result": json.loads(path.read_text())}


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def run_suite(suite: Suite, parts: list[Part], quick: bool, out: Path) -> Path:
    """Run ``parts`` and write them into ``out``, keeping the parts already there that were not run; each
    part is written as soon as it is done, so a failure later loses nothing measured."""
    data = json.loads(out.read_text()) if out.is_file() and not quick else {}
    data.update({"suite": suite.name, "about": suite.about})
    data.setdefault("parts", {})
    with tempfile.TemporaryDirectory(prefix=f"bench-{suite.name}-") as tmp:
        for part in parts:
            data["parts"][part.name] = run_part(part, quick, Path(tmp))
            data["parts"] = {p.name: data["parts"][p.name] for p in suite.parts if p.name in data["parts"]}
            write_atomic(out, data)
    return out


def listing() -> str:
    lines = []
    for s in SUITES.values():
        lines.append(f"{s.name}: {s.about}")
        for p in s.parts:
            needs = f"  [needs {', '.join(p.needs)}]" if p.needs else ""
            lines.append(f"  {p.name}: {p.about}{needs}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", nargs="?", help="the suite to run (see --list)")
    ap.add_argument("--list", action="store_true", help="list the suites and their parts")
    ap.add_argument("--part", action="append", default=[], metavar="NAME", help="run only this part (repeatable)")
    ap.add_argument("--quick", action="store_true", help="each part small, to check it runs; its figures mean "
                    "nothing and bench/results is left alone")
    ap.add_argument("--out", type=Path, help="the results file (default: bench/results/SUITE.json; with --quick "
                    "a file in the temporary folder)")
    args = ap.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    if args.suite not in SUITES:
        print(f"error: {'no suite given' if not args.suite else f'no suite {args.suite!r}'}; the suites: "
              f"{', '.join(SUITES)} (python -m bench --list)", file=sys.stderr)
        return 2
    suite = SUITES[args.suite]
    try:
        parts = [suite.part(n) for n in args.part] if args.part else list(suite.parts)
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    out = args.out or (Path(tempfile.gettempdir()) / f"slobench-bench-quick-{suite.name}.json" if args.quick
                       else RESULTS / f"{suite.name}.json")
    try:
        path = run_suite(suite, parts, args.quick, out)
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"bench: {suite.name}: written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
