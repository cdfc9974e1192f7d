"""What every command shares: the usage error, the exit codes, the output flags' run folder, and how a
capacity summary's interval is described."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loadgen.results.rundir import run_folder

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_REPORTS = "reports"


class UsageError(Exception):
    """Bad input on the command line or in a file it names: one-line message, exit 2."""


def engine_opt(text: str) -> tuple[str, Any]:
    """An ``--engine-opt KEY=VALUE`` flag: the key as an EngineConfig field name, the value read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"engine option {text!r}: expected KEY=VALUE")
    import yaml

    return key.replace("-", "_"), yaml.safe_load(value)


def run_dir_from(args: argparse.Namespace, name: str) -> Path:
    """The run folder of ``--out DIR`` or ``--reports DIR --run-id ID``.

    ``--out`` names the folder itself, so it cannot be combined with either of the others: a run-id that
    silently lost to ``--out`` would put the run where nobody looks for it."""
    if args.out is not None and (args.run_id is not None or args.reports is not None):
        given = " and ".join(f for f, v in (("--run-id", args.run_id), ("--reports", args.reports)) if v is not None)
        raise UsageError(f"--out names the run folder itself; do not combine it with {given}")
    return run_folder(args.out, args.reports or DEFAULT_REPORTS, args.run_id, name)


def goodput_slos(items: Iterable[str] | None) -> dict[str, float]:
    """``--goodput ttft:300 tpot:50`` as ``{"ttft": 300.0, ...}``; a bad item is a UsageError."""
    from loadgen.results.summary import parse_goodput  # lazy: pandas

    try:
        return parse_goodput(items or [])
    except ValueError as e:
        raise UsageError(str(e)) from None


def pick(cli_value, default):
    """The command-line value when one was given (0 included), else the scenario's."""
    return default if cli_value is None else cli_value


def access_from(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The credentials and headers (``--api-key`` or ``$OPENAI_API_KEY``, ``--header``) and ``--extra-body``."""
    from loadgen.target.access import Access, parse_extra_body, parse_header

    key = getattr(args, "api_key", None)
    key = key if key is not None else os.environ.get("OPENAI_API_KEY") or None
    try:
        headers = dict(parse_header(h) for h in getattr(args, "header", None) or [])
        extra = parse_extra_body(args.extra_body) if getattr(args, "extra_body", None) else {}
    except ValueError as e:
        raise UsageError(str(e)) from None
    return Access(api_key=key, headers=headers), extra


def target_options(args: argparse.Namespace, scenario=None):
    """How to reach the target and fit the requests to it: the credentials, headers and extra body
    (``access_from``), ``--no-probe``, ``--tokenizer``, the fields the scenario asked for explicitly
    (``workload.ignore_eos: true``, ``client.send_tier``), and the endpoint (``--endpoint``, else the
    scenario's ``client.endpoint``)."""
    from loadgen.target.prepare import TargetOptions

    access, extra_body = access_from(args)
    return TargetOptions(probe=not getattr(args, "no_probe", False), tokenizer_dir=getattr(args, "tokenizer", None),
                         access=access, extra_body=extra_body,
                         explicit=set(scenario.explicit_fields) if scenario is not None else set(),
                         send_tier=scenario.send_tier if scenario is not None else None,
                         send_priority=getattr(scenario, "send_priority", None),
                         tier_priority=dict(getattr(scenario, "tier_priority", None) or {}),
                         tier_headers=dict(getattr(scenario, "tier_headers", None) or {}),
                         continuous_usage=getattr(scenario, "continuous_usage", None),
                         endpoint=pick(getattr(args, "endpoint", None), getattr(scenario, "endpoint", None)))


def interval_basis(summary: dict[str, Any]) -> str:
    """What a capacity summary's interval rests on: " from 23 windows, 8 of them refine" (or "")."""
    r = summary.get("rated_capacity") or {}
    windows = (r.get("interval") or {}).get("windows")
    refine = sum(1 for st in summary.get("steps") or [] if st.get("phase") == "refine" and st.get("counted"))
    return (f" from {windows} windows" if windows else "") + (f", {refine} of them refine" if refine else "")
