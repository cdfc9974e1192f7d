"""slobench's Locust driver: streaming LLM users, an SLO ramp shape, records gathered at the master.

    locust -f loadgen/drivers/locust/locustfile.py --headless --host http://127.0.0.1:8000 \\
        --slobench-scenario loadgen/scenarios/smoke.yaml --slobench-out reports/my-run
    # a ramp that stops (exit code 3) when a tier's p99 TTFT SLO breaks:
    locust -f loadgen/drivers/locust/locustfile.py --headless --host URL --slobench-scenario S.yaml \\
        --slobench-steps 2,4,8,16 --slobench-step-s 20 --slobench-warmup-s 5
    # more load generators: --processes N here, or --master here and --worker --master-host H elsewhere

Every ``--slobench-*`` option can also be set by its ``SLOBENCH_*`` environment variable. The run writes
``requests.jsonl`` (the record of docs/ARCHITECTURE.md, the same as the aiohttp replayer's), ``summary.json``,
``locust_stages.json`` (per-stage SLO verdicts) and ``start.json`` into ``--slobench-out``. Without a web
UI open the load shape drives everything; with one, press Start and watch ``/slobench`` for the counters.

Response times go into Locust's histogram at 3 significant digits (Locust's own
``locust.stats.bucket_response_time`` rounds to 2, i.e. up to ±5%: it is replaced here through that
documented module-level hook), so the percentiles Locust prints are within 0.5% of the exact ones in
``summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import locust.runners
import locust.stats
from locust import events
from locust.runners import MasterRunner, WorkerRunner

from loadgen.drivers.locust.collect import bucket_3_significant
from loadgen.drivers.locust.shape import CONTROL, MSG_START, MSG_STOP, SLORampShape, start_sending, stop_local
from loadgen.drivers.locust.stages import parse_steps, staged_load_from_scenario, staged_load_from_specs_file
from loadgen.drivers.locust.users import STATE, ClosedLoopUser, OpenLoopDriver

__all__ = ["ClosedLoopUser", "OpenLoopDriver", "SLORampShape"]

log = logging.getLogger("slobench.locust")


locust.stats.bucket_response_time = bucket_3_significant
# Workers report every second (Locust's default is 3 s): records reach the master, and the SLO is judged,
# that much sooner. (A module constant of locust.runners, read at each report.)
locust.runners.WORKER_REPORT_INTERVAL = 1.0

OPTIONS = [  # name, type, default, help
    ("scenario", str, None, "scenario YAML (its workload, load and tier SLOs)"),
    ("specs", str, None, "request specs file written by `slobench run --driver locust` (instead of a scenario)"),
    ("out", str, None, "run folder for requests.jsonl, summary.json, locust_stages.json (default reports/locust-TIME)"),
    ("model", str, None, "model name to send (default: the scenario's, else the first of GET /v1/models)"),
    ("steps", str, None, "ramp: comma-separated loads on the scenario's axis (req/s, or users for closed loop)"),
    ("step-s", float, 20.0, "ramp: seconds per step"),
    ("warmup-s", float, 0.0, "seconds at the start of each step left out of the SLO judgement"),
    ("seed", int, None, "override the scenario's seed"),
    ("slo-quantile", float, 0.99, "the TTFT quantile each tier's ttft_ms SLO applies to"),
    ("slo-exit-code", int, 3, "exit code when a TTFT SLO breaks"),
    ("no-slo-stop", bool, False, "keep going when a TTFT SLO breaks"),
    ("drain-s", float, 60.0, "after the last send, how long in-flight requests may take before they are cancelled"),
    ("max-connections", int, 0, "connections per sending process (0: unlimited)"),
    ("read-timeout", float, 300.0, "longest silence inside a stream, seconds"),
    ("no-summary", bool, False, "do not write summary.json at the end"),
    ("t0", float, None, "the run's time 0 as a time.monotonic() value of this machine (default: now + a lead)"),
    ("shape", str, None, "JSON of the optional request fields to send, e.g. '{\"ignore_eos\": false}' for a strict "
                         "server (slobench passes what its probe found)"),
]


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    group = parser.add_argument_group("slobench", "LLM streaming load (slobench); also as SLOBENCH_* env vars")
    for name, typ, default, help_ in OPTIONS:
        env = "SLOBENCH_" + name.upper().replace("-", "_")
        if typ is bool:
            group.add_argument(f"--slobench-{name}", action="store_true", default=False, env_var=env, help=help_)
        else:
            group.add_argument(f"--slobench-{name}", type=typ, default=default, env_var=env, help=help_)


def run_options(parsed) -> dict:
    """The slobench options of a run, as sent to the workers with the start message."""
    g = lambda k: getattr(parsed, "slobench_" + k.replace("-", "_"), None)  # noqa: E731
    out = g("out") or str(Path("reports") / time.strftime("locust-%Y%m%d-%H%M%S"))
    return {
        "scenario": g("scenario"), "specs": g("specs"), "out": out, "model": g("model"), "steps": g("steps"),
        "step_s": g("step-s"), "warmup_s": g("warmup-s") or 0.0, "seed": g("seed"),
        "slo_quantile": g("slo-quantile") or 0.99, "slo_exit_code": g("slo-exit-code") or 3,
        "stop_on_slo": not g("no-slo-stop"), "drain_s": g("drain-s") or 60.0,
        "max_connections": g("max-connections") or 0, "read_timeout": g("read-timeout") or 300.0,
        "summary": not g("no-summary"), "t0": g("t0"), "api_key": os.environ.get("SLOBENCH_API_KEY"),
        "headers": json.loads(os.environ.get("SLOBENCH_HEADERS") or "{}"),
        "extra_body": json.loads(os.environ.get("SLOBENCH_EXTRA_BODY") or "{}"),
        "shape": json.loads(g("shape")) if g("shape") else None,
    }


_staged_loads: dict[tuple, object] = {}


def build_staged_load(opts: dict):
    key = tuple(opts.get(k) for k in ("scenario", "specs", "steps", "step_s", "seed", "model"))
    if key not in _staged_loads:
        if opts.get("specs"):
            _staged_loads[key] = staged_load_from_specs_file(opts["specs"])
        elif opts.get("scenario"):
            _staged_loads[key] = staged_load_from_scenario(opts["scenario"], steps=parse_steps(opts.get("steps")),
                                                    step_s=opts.get("step_s"), seed=opts.get("seed"),
                                                    model=opts.get("model"))
        else:
            raise ValueError("give --slobench-scenario FILE (or SLOBENCH_SCENARIO)")
    return _staged_loads[key]


@events.init.add_listener
def _on_init(environment, runner, web_ui=None, **_kw) -> None:
    if isinstance(runner, WorkerRunner):
        _init_worker(environment, runner)
        return
    opts = run_options(environment.parsed_options)
    t = time.perf_counter()
    try:
        staged = build_staged_load(opts)
    except (ValueError, OSError) as e:
        log.error("slobench: %s", e)
        sys.exit(2)
    CONTROL.env, CONTROL.opts, CONTROL.staged = environment, opts, staged
    CONTROL.build_s = time.perf_counter() - t
    if isinstance(runner, MasterRunner):
        environment.events.worker_report.add_listener(
            lambda client_id, data: CONTROL.collector and "slobench" in data
            and CONTROL.collector.feed(client_id, data["slobench"]))
    environment.events.quitting.add_listener(_on_quitting)
    if web_ui is not None:
        @web_ui.app.route("/slobench")
        def _slobench_status():
            return CONTROL.status()


def _on_quitting(environment, **_kw) -> None:
    if CONTROL.collector is not None and not CONTROL.finished:  # Ctrl-C or --run-time: save what was measured
        CONTROL.stop_reason = CONTROL.stop_reason or "stopped before the plan ended"
        CONTROL.finish()


def _init_worker(environment, runner) -> None:
    opts = run_options(environment.parsed_options)
    if opts.get("scenario") or opts.get("specs"):
        try:
            build_staged_load(opts)  # ready before the master's start message (--processes)
        except (ValueError, OSError) as e:
            log.warning("slobench: %s (waiting for the master's options)", e)

    def on_start(environment, msg, **_kw) -> None:
        d = msg.data
        index = d["shards"].get(runner.client_id)
        if index is None:
            log.warning("slobench: this worker joined after the start; it sends nothing")
            return
        start_sending(build_staged_load(d["opts"]), index, d["count"], d["t0_wall"], d["opts"], environment)

    def on_stop(environment, msg, **_kw) -> None:
        stop_local(bool(msg.data.get("cancel")))

    runner.register_message(MSG_START, on_start)
    runner.register_message(MSG_STOP, on_stop)

    @environment.events.report_to_master.add_listener
    def _report(client_id, data) -> None:
        if STATE.staged is not None:
            data["slobench"] = STATE.tally.report()
