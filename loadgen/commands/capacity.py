"""``slobench capacity``: check the scenario, run the capacity search, print the verdict.

Exit codes (also in ``--help``, ``cli.py``): 0 with a verdict the steps support (rated,
never_broke, never_met), 1 when the target failed, 2 for bad input (a UsageError, before an engine
starts), 3 when the verdict is ``invalid`` (it rests on a step whose load generator fell behind even
after its re-measures: the numbers are saved, but do not trust them), 130 on Ctrl-C or SIGTERM;
everything measured is saved either way."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from loadgen.commands.common import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    interval_basis,
    run_dir_from,
    target_options,
)
from loadgen.commands.flags import check_driver_support, scenario_from_args, target_url
from loadgen.commands.summary_table import print_target_fit

EXIT_INVALID = 3


def cmd_capacity(args: argparse.Namespace) -> int:
    from loadgen.capacity.run import run_capacity
    from loadgen.capacity.settings import CapacitySettings
    from loadgen.results.rundir import json_default
    from loadgen.scenario.model import ScenarioError
    from loadgen.scenario.options import StepOptions
    from loadgen.scenario.steps import step_specs
    from loadgen.target.access import AccessError
    from loadgen.target.capabilities import ProbeError
    from loadgen.target.discovery import TargetError
    from loadgen.target.embedded import EngineStartError, require_engine
    from loadgen.target.request_shape import TargetFitError
    from loadgen.workload.exact_text import ExactLengthError
    from loadgen.workload.tokenizer import TokenizerError

    scn, path = scenario_from_args(args, needs_slo=True)
    check_driver_support(scn, args.driver)
    target = target_url(args.target or scn.target)
    try:
        CapacitySettings.from_scenario(scn)  # bad input fails before an engine starts
        # the workload itself must build (a bad trace path, an empty trace)
        step_specs(scn, scn.search.axis if scn.search else "rate", (scn.search.start if scn.search else 1.0),
                   0, 0.0, (scn.step or StepOptions()).step_duration_s)
    except (ScenarioError, ValueError) as e:
        raise UsageError(str(e)) from None
    if not target:
        require_engine()  # before the run folder exists: nothing is left behind
    run_dir = run_dir_from(args, scn.name)
    engine_opts = scn.engine_options(args.engine_opt)
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        res = run_capacity(scn, run_dir, target=target, engine_opts=engine_opts, model=args.model or scn.model,
                           progress=not args.no_progress, scenario_path=str(path), log=say,
                           driver=args.driver, workers=args.workers or 1, target_options=target_options(args, scn))
    except EngineStartError as e:
        say(f"error: could not start the reference engine: {e}")
        return EXIT_FAIL
    except (TargetError, ProbeError) as e:
        say(f"error: {e}")
        return EXIT_USAGE if isinstance(e, AccessError) else EXIT_FAIL
    except (TargetFitError, TokenizerError, ExactLengthError) as e:
        raise UsageError(str(e)) from None
    s = res.summary
    if args.json:
        print(json.dumps(s, indent=2, default=json_default))
    else:
        print_verdict(s)
        print(f"results: {res.run_dir}/ (summary.json, steps.csv, requests.jsonl, metrics.jsonl)")
    if not args.no_report and s["steps"]:
        from loadgen.report import auto_report  # never raises: a report must not fail a measured run

        auto_report(res.run_dir)
    if res.stopped:
        say(f"capacity run ended early: {res.stopped}\n{len(s['steps'])} finished steps saved in {res.run_dir}")
        return EXIT_INTERRUPTED if res.stopped.startswith("interrupted") else EXIT_FAIL
    if s.get("verdict") == "invalid":
        say(f"invalid capacity run (exit {EXIT_INVALID}): {s.get('invalid_reason', '')}")
        return EXIT_INVALID
    return EXIT_OK


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_verdict(s: dict[str, Any]) -> None:
    """The rated capacity once (the summary's ``headline``: the offered rate, the requested beside it), its
    interval, the concurrency there, then the search's account of its steps (``search_text``)."""
    from rich.console import Console
    from rich.markup import escape

    from loadgen.capacity.headline import headline, interval_span

    con = Console()
    r = s.get("rated_capacity")
    unit = "req/s"
    verdict = s.get("search_verdict") or s["verdict"]
    head = s.get("headline") or headline(r, verdict, s.get("axis", "rate"))  # an older summary has none
    if r and head:
        bad = "[bold red]INVALID[/] " if s["verdict"] == "invalid" else ""
        con.print(f"{bad}[bold]{escape(head)}[/]"
                  + (f"  (spec capacity {r['spec_rate_rps']:.3g} {unit} with {100 * s['headroom']:g}% headroom)"
                     if r.get("spec_rate_rps") is not None else "")
                  + (f"; judged over {r['window_s']:.0f} s windows" if r.get("window_s") else ""))
        if r.get("ci_low") is not None:
            of = "users" if r.get("ci_of") == "concurrency" else "req/s"
            b = r.get("binding") or {}
            con.print(f"{100 * r['confidence']:g}% interval: {interval_span(r)} {of} "
                      f"(estimate {r['estimate']:.3g}{interval_basis(s)}); {r.get('boundary') or '-'} boundary; "
                      f"binding SLO: {b.get('tier')} {b.get('metric')}"
                      + ("" if r.get("confirmed") is None else
                         ("; both ends confirmed on fresh arrivals" if r["confirmed"] else "; UNCONFIRMED")))
        if r.get("cause"):
            c = r["cause"]
            con.print(f"cause of the break (step {c['failing_step']}): {c['cause']}: {escape(c['why'])}")
        if len(r.get("tier_capacity") or {}) > 1:  # each tier's own crossing at the mix: which binds, by how much
            per_tier = [f"{t} {'≥ ' if c.get('open') == 'above' else ''}{c['load']:.3g}"
                        for t, c in r["tier_capacity"].items()]
            con.print("per tier at this mix: " + ", ".join(per_tier))
        if r.get("concurrency") is not None:
            con.print(f"concurrency there: {_num(r['concurrency_measured'])} in flight measured, "
                      f"{_num(r['concurrency_littles_law'])} by Little's law"
                      + ("" if r.get("concurrency_agree") is None else
                         (" (they agree)" if r["concurrency_agree"] else " (they DISAGREE)"))
                      + (f"; output {r['output_tok_s']:.0f} tok/s" if r.get("output_tok_s") else ""))
    else:
        con.print("[bold red]no rated capacity[/]")
    # the search's own account (its loads are the requested ones); an older summary has only verdict_text
    con.print(escape(f"search: {s['search_text']}" if s.get("search_text") else s["verdict_text"]))
    print_target_fit(con, s)
    if not s.get("valid"):
        con.print(f"[bold red]INVALID RUN:[/] {s.get('invalid_reason', '')}")
