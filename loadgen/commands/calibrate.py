"""``slobench calibrate SCENARIO``: check the capacity search against a target whose capacity is known.

It starts ``slobench mock-server`` in queueing mode (``--slots C``: a FIFO C-server queue with known prefill
and inter-token times, ``target.mock.slots``), computes that queue's true capacity for the scenario by
exact simulation (``capacity.truth``: the highest rate whose steady-state SLO quantiles hold), runs the
ordinary capacity search against the mock (``capacity.run.run_capacity``, nothing special-cased), and
prints the rated capacity against the truth. The run folder is a capacity run's, and its ``summary.json``
gains a ``calibration`` section: ``true_capacity_rps``, ``rated_rps``, ``error`` (rated / true - 1), the
mock's parameters, and ``ideal``: what a search that trusts *one* window per step, judged perfectly, would
rate (this seed's first arrival draw; the spread over ``--ideal-seeds`` seeds): the noise of a single
window's verdict, which the rating's pooled fit over the steps' windows is there to reduce.

A separate command rather than ``capacity --truth``: the truth exists only for a target slobench starts
and knows the queue of, so the mock's flags and the simulation's belong to one command of their own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadgen.commands.common import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    UsageError,
    interval_basis,
    run_dir_from,
    target_options,
)


def mock_flags(q) -> list[str]:
    """``mock-server`` flags for the queue ``q`` (a ``capacity.truth.QueueParams``)."""
    out = ["--slots", str(q.slots), "--ttft-ms", repr(q.ttft_ms), "--prefill-ms-per-token",
           repr(q.prefill_ms_per_token), "--itl-ms", repr(q.itl_ms)]
    return out + (["--tokens", str(q.tokens)] if q.tokens is not None else [])


class MockProcess:
    """``slobench mock-server`` in queueing mode on a free loopback port, its output in the run folder."""

    def __init__(self, q, log_path: Path):
        from loadgen.target.embedded import free_port

        self.q, self.log_path = q, log_path
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        from loadgen.target.embedded import wait_healthy

        port = self.url.rsplit(":", 1)[1]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "mock-server", "--port", port,
                                      *mock_flags(self.q)], stdout=self._log, stderr=subprocess.STDOUT)
        wait_healthy(self.url, self.proc, 30, self.log_path)
        return self.url

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.proc is not None:
            self._log.close()


def queue_params(args: argparse.Namespace):
    from loadgen.capacity.truth import QueueParams

    try:
        return QueueParams(slots=args.slots, ttft_ms=args.ttft_ms, prefill_ms_per_token=args.prefill_ms_per_token,
                           itl_ms=args.itl_ms, tokens=args.tokens)
    except ValueError as e:
        raise UsageError(f"mock queue: {e} (--slots, --ttft-ms, --prefill-ms-per-token, --itl-ms, --tokens)") from None


def calibration_section(truth: dict[str, Any], summary: dict[str, Any], q, ideal: dict[str, Any] | None,
                        truth_s: float) -> dict[str, Any]:
    """The summary's ``calibration``: rated against true, and what they were found with. ``rated_rps`` is
    the summary's headline ``rated_capacity.rate_rps``; ``errors`` also holds, where the summary has them,
    the requested load of the rated step and the rating's interval estimate, and ``truth_in_interval``."""
    true_rps = truth["true_capacity_rps"]
    rated = (summary.get("rated_capacity") or {}) if summary.get("verdict") == "rated" else {}

    def err(x):
        return x / true_rps - 1.0 if isinstance(x, (int, float)) and true_rps else None

    rated_rps = rated.get("rate_rps")
    errors = {k: err(rated.get(k)) for k in ("rate_rps", "requested_rps", "estimate") if rated.get(k) is not None}
    lo, hi = rated.get("ci_low"), rated.get("ci_high")
    open_ends = rated.get("ci_unbounded") or []  # an unbounded end holds whatever lies beyond it
    inside = (bool(("low" in open_ends or lo <= true_rps) and ("high" in open_ends or true_rps <= hi))
              if None not in (lo, hi, true_rps) else None)
    return {"true_capacity_rps": true_rps, "rated_rps": rated_rps, "error": err(rated_rps),
            "abs_error": abs(err(rated_rps)) if err(rated_rps) is not None else None, "errors": errors,
            "interval": [lo, hi] if lo is not None and hi is not None else None, "interval_unbounded": open_ends,
            "truth_in_interval": inside,
            "verdict": summary.get("verdict"), **{k: v for k, v in truth.items() if k != "true_capacity_rps"},
            "ideal": ideal, "mock": {"mode": "queueing", **q.as_dict()}, "truth_s": round(truth_s, 3)}


def ideal_section(scn, q, true_rps: float, seeds: int) -> dict[str, Any] | None:
    """One window per load step, judged perfectly: this seed's rating and the spread over ``seeds`` seeds."""
    import numpy as np

    from loadgen.capacity.settings import CapacitySettings
    from loadgen.capacity.truth import ideal_step_ratings

    if seeds <= 0 or not true_rps:
        return None
    load_step = CapacitySettings.from_scenario(scn).step  # the options of each load step
    own = float(ideal_step_ratings(scn, q, true_rps, load_step.step_duration_s, load_step.warmup_s, seeds=1,
                                   seed0=scn.seed)[0])
    errs = ideal_step_ratings(scn, q, true_rps, load_step.step_duration_s, load_step.warmup_s,
                              seeds=seeds) / true_rps - 1.0
    return {"rated_rps": own, "error": own / true_rps - 1.0, "seeds": seeds, "mean_error": float(np.mean(errs)),
            "sd_error": float(np.std(errs)), "abs_error_p90": float(np.sort(np.abs(errs))[int(0.9 * (seeds - 1))]),
            "step_duration_s": load_step.step_duration_s, "warmup_s": load_step.warmup_s}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def cmd_calibrate(args: argparse.Namespace) -> int:
    from loadgen.capacity.run import run_capacity
    from loadgen.capacity.settings import CapacitySettings
    from loadgen.capacity.truth import QueueTruth, TruthError, check_scenario
    from loadgen.results.rundir import json_default, write_summary
    from loadgen.scenario.builtin import resolve_scenario
    from loadgen.scenario.model import ScenarioError
    from loadgen.scenario.parse import load_scenario
    from loadgen.target.capabilities import ProbeError
    from loadgen.target.discovery import TargetError
    from loadgen.target.embedded import EngineStartError

    q = queue_params(args)
    if args.truth_requests < 1000 or args.truth_seeds < 1 or args.ideal_seeds < 0:
        raise UsageError("need --truth-requests >= 1000, --truth-seeds >= 1 and --ideal-seeds >= 0")
    try:
        args.scenario = resolve_scenario(args.scenario)  # a built-in's name or a file
        scn = load_scenario(args.scenario, overrides=list(args.set or []))
        if args.seed is not None:
            scn.seed = args.seed
        CapacitySettings.from_scenario(scn)
        check_scenario(scn)  # before anything runs: a scenario the simulation cannot stand for
        t0 = time.monotonic()
        say = (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
        say(f"simulating the mock's queue ({q.slots} slots) for {scn.name}: {args.truth_seeds} x "
            f"{args.truth_requests} requests ...")
        sim = QueueTruth(scn, q, requests=args.truth_requests, seeds=args.truth_seeds)
    except (ScenarioError, TruthError, ValueError) as e:
        raise UsageError(str(e)) from None
    true_rps = sim.capacity()
    truth = sim.describe(true_rps)
    say(f"true capacity {_num(true_rps)} req/s (saturation {sim.saturation_rps:.3g} req/s)")
    ideal = ideal_section(scn, q, true_rps, args.ideal_seeds)
    if ideal:
        say(f"one window per step, judged perfectly: {ideal['rated_rps']:.3g} req/s on this seed's first draw "
            f"({_pct(ideal['error'])}); over {ideal['seeds']} seeds {_pct(ideal['mean_error'])} "
            f"± {100 * ideal['sd_error']:.1f}%")
    truth_s = time.monotonic() - t0
    run_dir = run_dir_from(args, scn.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    mock = MockProcess(q, run_dir / "mock.log")
    try:
        url = mock.start()
        say(f"mock target on {url} ({' '.join(mock_flags(q))})")
        res = run_capacity(scn, run_dir, target=url, progress=not args.no_progress, scenario_path=str(args.scenario),
                           log=say, target_options=target_options(args, scn))
    except (EngineStartError, TargetError, ProbeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL
    finally:
        mock.stop()
    s = res.summary
    s["calibration"] = cal = calibration_section(truth, s, q, ideal, truth_s)
    write_summary(res.run_dir, s)
    if args.json:
        print(json.dumps(s, indent=2, default=json_default))
    else:
        print(f"rated {_num(cal['rated_rps'])} req/s, true {_num(true_rps)} req/s: error {_pct(cal['error'])}"
              + (f" (one window per step, judged perfectly: {_pct(ideal['error'])} on this seed)" if ideal else "")
              + f"  [{s['verdict']}]")
        others = {k: v for k, v in cal["errors"].items() if k != "rate_rps"}
        if others or cal["interval"]:
            print("  " + ", ".join(f"{k} {_pct(v)}" for k, v in others.items())
                  + (f"; truth {'inside' if cal['truth_in_interval'] else 'OUTSIDE'} the interval "
                     f"{_num(cal['interval'][0])}-{_num(cal['interval'][1])} req/s ({interval_basis(s).strip()})"
                     if cal["interval"] else ""))
        print(s["verdict_text"])
        print(f"results: {res.run_dir}/ (summary.json: calibration)")
    if not args.no_report and s["steps"]:
        from loadgen.report import auto_report

        auto_report(res.run_dir)
    if res.stopped:
        print(f"calibration run ended early: {res.stopped}", file=sys.stderr)
        return EXIT_INTERRUPTED if res.stopped.startswith("interrupted") else EXIT_FAIL
    return EXIT_OK


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"
