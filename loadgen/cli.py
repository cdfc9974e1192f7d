"""The ``slobench`` command line.

    slobench run SCENARIO.yaml [--target URL]            a fixed load from a scenario file
    slobench replay TRACE [--format F] [--time-scale X]  replay a real trace
    slobench capacity SCENARIO.yaml [--target URL]       rated capacity: ramp until the TTFT SLO breaks
    slobench summarize RUN_DIR [--goodput ttft:MS ...]   rebuild summary.json from a run folder
    slobench report RUN_DIR [RUN_B] [-o FILE]            report.html from a run folder (or A vs B)
    slobench gate RUN_DIR --baseline B [--rules R]       CI gate: exit 0 pass, 1 regression, 2 bad input
    slobench mock-server [--ttft-ms --itl-ms --tokens]   a mock target with exact timing
    slobench serve ...                                    the reference engine's server
    slobench generate PROMPT                              one offline generation with the engine

Bad input ends with a one-line error and exit code 2; a target that fails ends with exit code 1 after
saving and summarising what was measured; Ctrl-C does the same with exit code 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")


def _tier_mix(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, text.split(",")):
        name, sep, w = part.partition("=")
        try:
            out[name.strip()] = float(w) if sep else 1.0
        except ValueError:
            raise argparse.ArgumentTypeError(f"tier mix {text!r}: weight {w!r} is not a number") from None
    if not out:
        raise argparse.ArgumentTypeError("empty tier mix")
    return out


def _engine_opt(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"engine option {text!r}: expected KEY=VALUE")
    import yaml

    return key.replace("-", "_"), yaml.safe_load(value)


def _common_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target",
                   help="base URL of an OpenAI-compatible server (default: start the reference engine)")
    p.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--run-id", help="run folder name (default: timestamp-name)")
    p.add_argument("--reports", default="reports", help="folder for run folders (default: reports)")
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLOs for goodput, e.g. ttft:300 tpot:50")
    p.add_argument("--workers", type=int, help="replayer processes the schedule is sharded over")
    p.add_argument("--driver", choices=("aiohttp", "locust"), default="aiohttp",
                   help="load generator: the aiohttp replayer (default) or Locust (--workers: its processes)")
    p.add_argument("--max-connections", type=int, help="cap on open connections (default: unlimited)")
    p.add_argument("--lateness-bound-ms", type=float,
                   help="p99 client lateness above which the run is invalid")
    p.add_argument("--engine-opt", action="append", type=_engine_opt, default=[], metavar="KEY=VALUE",
                   help="option for the embedded engine server (repeatable), e.g. max_num_seqs=8")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.add_argument("--no-scrape", action="store_true", help="do not poll the target's /metrics")
    p.add_argument("--no-report", action="store_true", help="do not write report.html and requests.parquet")
    p.add_argument("--json", action="store_true", help="print summary.json instead of a table")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="slobench", description="Load tests and trace replay for LLM inference services.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="run a scenario file")
    p.add_argument("scenario", type=Path)
    p.add_argument("--seed", type=int)
    _common_run_args(p)

    p = sub.add_parser("replay", help="replay a trace file")
    p.add_argument("trace", type=Path)
    p.add_argument("--format", choices=("mooncake", "azure", "burstgpt", "sharegpt"))
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply inter-arrival gaps (0.5: twice as fast)")
    p.add_argument("--rate", type=float, help="override the mean rate (req/s), keeping the burst shape")
    p.add_argument("--start-offset", type=float, default=0.0, help="skip the first S trace seconds")
    p.add_argument("--max-requests", type=int)
    p.add_argument("--max-duration", type=float, help="stop scheduling after S replay seconds")
    p.add_argument("--block-size", type=int, default=512, help="tokens per Mooncake hash id (default 512)")
    p.add_argument("--include-failed", action="store_true", help="keep BurstGPT rows with 0 response tokens")
    p.add_argument("--output-len", type=int, default=128,
                   help="max_tokens where the trace has none (ShareGPT)")
    p.add_argument("--max-output-len", type=int, help="clamp the trace's output lengths")
    p.add_argument("--arrival", choices=("poisson", "gamma", "constant"), default="poisson",
                   help="arrival process for traces without timestamps (ShareGPT; rate from --rate)")
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--tier-mix", type=_tier_mix, help="e.g. premium=1,standard=3,basic=1")
    p.add_argument("--token-range", type=int, nargs=2, default=(10, 250), metavar=("LO", "HI"),
                   help="synthetic token ids are drawn from [LO, HI)")
    p.add_argument("--concurrency", type=int, default=0,
                   help="closed loop with N users instead of timestamps")
    p.add_argument("--seed", type=int, default=0)
    _common_run_args(p)

    p = sub.add_parser("capacity", help="rated capacity: ramp the load until an SLO breaks, then bisect")
    p.add_argument("scenario", type=Path)
    p.add_argument("--target",
                   help="base URL of an OpenAI-compatible server (default: start the reference engine)")
    p.add_argument("--out", type=Path, help="run folder (default: REPORTS/RUN_ID)")
    p.add_argument("--run-id", help="run folder name (default: timestamp-name)")
    p.add_argument("--reports", default="reports", help="folder for run folders (default: reports)")
    p.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--seed", type=int)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value by its dotted path (repeatable), e.g. search.start=4")
    p.add_argument("--engine-opt", action="append", type=_engine_opt, default=[], metavar="KEY=VALUE",
                   help="option for the embedded engine server (repeatable), e.g. max_num_seqs=8")
    p.add_argument("--no-progress", action="store_true", help="no live display")
    p.add_argument("--no-report", action="store_true", help="do not write report.html")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the verdict")
    p.add_argument("--driver", choices=("aiohttp", "locust"), default="aiohttp",
                   help="load generator: the aiohttp replayer (default) or Locust, one Locust run per step "
                        "(no early stop within a step, no measured in-flight count)")
    p.add_argument("--workers", type=int, help="Locust processes per step (with --driver locust)")

    p = sub.add_parser("summarize", help="rebuild summary.json from a run folder")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS")
    p.add_argument("--lateness-bound-ms", type=float, default=10.0)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("report", help="write report.html for a run folder, or compare two runs")
    p.add_argument("run_dir", type=Path)
    p.add_argument("run_b", type=Path, nargs="?", help="a second run: compare RUN_DIR (A) with it (B)")
    p.add_argument("-o", "--output", type=Path,
                   help="output file (default: RUN_DIR/report.html; RUN_B/compare-A.html when comparing)")
    p.add_argument("--no-export", action="store_true", help="do not write requests.parquet / requests.csv")

    p = sub.add_parser("gate", help="compare a run with a baseline: exit 0 pass, 1 regression, 2 bad input")
    p.add_argument("run_dir", help="run folder (or its summary.json)")
    p.add_argument("--baseline", required=True, help="baseline summary .json or run folder")
    p.add_argument("--rules", help="rules YAML (default: noise-aware defaults, see loadgen/gate/)")
    p.add_argument("--junit", help="write JUnit XML here, one testcase per rule")

    p = sub.add_parser("mock-server", help="a mock OpenAI-compatible target with exact timing")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--tokens", type=int, help="tokens per stream (default: the request's max_tokens)")
    p.add_argument("--model", default="mock")

    sub.add_parser("serve", help="run the reference engine's OpenAI-compatible server (see serve --help)",
                   add_help=False)

    p = sub.add_parser("generate", help="generate from one prompt with the reference engine (demo)")
    p.add_argument("prompt")
    p.add_argument("--model", default="tiny")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "serve":
            return _serve(argv[1:])
        args = build_parser().parse_args(argv)
        return {"run": cmd_run, "replay": cmd_replay, "summarize": cmd_summarize, "capacity": cmd_capacity,
                "mock-server": cmd_mock_server, "generate": cmd_generate,
                "report": cmd_report, "gate": cmd_gate}[args.cmd](args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


# ------------------------------------------------------------------ engine-owned commands


def _serve(argv: list[str]) -> int:
    from engine.server import add_server_arguments, run_server  # lazy: only `serve` imports torch

    p = _Parser(prog="slobench serve", description="The reference engine's OpenAI-compatible server.")
    add_server_arguments(p)
    args = p.parse_args(argv)
    result = run_server(args)
    return int(result) if isinstance(result, int) else EXIT_OK


def cmd_generate(args) -> int:
    from engine import Engine, EngineConfig, SamplingParams  # lazy: torch

    if args.max_tokens < 1:
        raise UsageError("--max-tokens must be >= 1")
    try:
        engine = Engine(EngineConfig(model=args.model))
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    results = engine.generate([args.prompt], SamplingParams(max_tokens=args.max_tokens,
                                                            temperature=args.temperature))
    for r in results:
        print(r.text)
        keys = ("queue_ms", "prefill_ms", "decode_ms")
        t = r.timing
        t = t if isinstance(t, dict) else {k: getattr(t, k, None) for k in keys}
        print("  ".join(f"{k[:-3]} {t[k]:.1f} ms" for k in keys if isinstance(t.get(k), (int, float))),
              file=sys.stderr)
    return EXIT_OK


def cmd_mock_server(args) -> int:
    from loadgen.target.mock_server import MockConfig, serve

    if args.ttft_ms < 0 or args.itl_ms < 0 or (args.tokens is not None and args.tokens < 1):
        raise UsageError("--ttft-ms and --itl-ms must be >= 0 and --tokens >= 1")
    serve(MockConfig(args.ttft_ms, args.itl_ms, args.tokens, args.model), args.host, args.port)
    return EXIT_OK


# ------------------------------------------------------------------ load runs


def cmd_run(args) -> int:
    from loadgen.scenario.model import ScenarioError
    from loadgen.scenario.parse import load_scenario

    _goodput(args.goodput)  # bad SLOs fail before anything is loaded
    try:
        scn = load_scenario(args.scenario)
        if args.seed is not None:
            scn.seed = args.seed
            if scn.trace_options:
                scn.trace_options.seed = args.seed
        specs, info = scn.build()
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    engine_opts = {**scn.engine, **dict(args.engine_opt)}
    return _execute(args, specs, name=scn.name, target=args.target or scn.target,
                    model=args.model or scn.model, engine_opts=engine_opts, goodput_cfg=scn.goodput,
                    tier_slos=scn.tier_slos, workers=args.workers or scn.workers,
                    max_conn=_pick(args.max_connections, scn.max_connections),
                    lateness=_pick(args.lateness_bound_ms, scn.lateness_bound_ms),
                    concurrency=scn.arrivals.concurrency if scn.arrivals and scn.arrivals.closed else 0,
                    read_timeout=scn.read_timeout_s,
                    meta={"scenario": str(args.scenario), "scenario_name": scn.name, "workload": info})


def cmd_replay(args) -> int:
    from loadgen.workload.arrivals import Arrivals
    from loadgen.workload.traces import TraceError, TraceOptions, load_trace

    goodput = _goodput(args.goodput)
    for name in ("time_scale", "rate", "max_duration"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {v}")
    if args.max_requests is not None and args.max_requests < 1:
        raise UsageError("--max-requests must be >= 1")
    try:
        arrivals = Arrivals(args.arrival, rate=args.rate or 1.0, burstiness=args.burstiness)
        opts = TraceOptions(
            time_scale=args.time_scale, rate=args.rate, start_offset_s=args.start_offset,
            max_requests=args.max_requests, max_duration_s=args.max_duration, block_size=args.block_size,
            seed=args.seed, skip_failed=not args.include_failed, token_range=tuple(args.token_range),
            output_len=args.output_len, max_output_len=args.max_output_len, arrivals=arrivals,
            tiers=args.tier_mix or {},
        )
        specs, info = load_trace(args.trace, args.format, opts)
    except (TraceError, ValueError) as e:
        raise UsageError(str(e)) from None
    if info.skipped_failed:
        print(f"skipped {info.skipped_failed} failed rows (0 response tokens); --include-failed keeps them",
              file=sys.stderr)
    return _execute(args, specs, name=args.trace.stem.split(".")[0], target=args.target, model=args.model,
                    engine_opts=dict(args.engine_opt), goodput_cfg=goodput, tier_slos={},
                    workers=args.workers or 1, max_conn=args.max_connections or 0,
                    lateness=_pick(args.lateness_bound_ms, 10.0), concurrency=args.concurrency,
                    read_timeout=300.0, meta={"trace": info.as_dict()})


def _pick(cli_value, default):
    return default if cli_value is None else cli_value


def _goodput(items) -> dict[str, float]:
    from loadgen.results.summary import parse_goodput

    try:
        return parse_goodput(items or [])
    except ValueError as e:
        raise UsageError(str(e)) from None


def _execute(args, specs, *, name, target, model, engine_opts, goodput_cfg, tier_slos, workers, max_conn,
             lateness, concurrency, read_timeout, meta) -> int:
    from loadgen.drivers.replayer import ClientConfig, TargetError
    from loadgen.fixed_load import RunOptions, execute
    from loadgen.results.rundir import new_run_id
    from loadgen.target.embedded import EmbeddedEngine, EngineStartError

    if not specs:
        raise UsageError("the workload has no requests")
    if workers < 1 or max_conn < 0 or concurrency < 0:
        raise UsageError("--workers must be >= 1, --max-connections and --concurrency >= 0")
    if target and not target.startswith(("http://", "https://")):
        raise UsageError(f"--target must be an http(s) URL, got {target!r}")
    goodput = {**goodput_cfg, **_goodput(args.goodput)}
    run_dir = Path(args.reports) / (args.run_id or new_run_id(name))
    engine = None
    try:
        if not target:
            engine = EmbeddedEngine(engine_opts, log_path=run_dir / "engine.log")
            print(f"starting the reference engine on {engine.url} ...", file=sys.stderr)
            target = engine.start()
        opts = RunOptions(
            run_dir=run_dir,
            client=ClientConfig(target.rstrip("/"), model=model, max_connections=max_conn,
                                read_timeout_s=read_timeout),
            workers=workers, driver=args.driver, concurrency=concurrency, scrape=not args.no_scrape,
            progress=not args.no_progress and sys.stderr.isatty(), goodput=goodput, tier_slos=tier_slos,
            lateness_bound_ms=lateness, watch=engine.died if engine else None,
            meta={**meta, "engine": engine_opts if engine else None},
        )
        result = execute(specs, opts)
    except EngineStartError as e:
        print(f"error: could not start the reference engine: {e}", file=sys.stderr)
        return EXIT_FAIL
    except TargetError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL
    finally:
        if engine:
            engine.stop()
    _print_summary(result.summary, result.run_dir, args.json)
    if not args.no_report:
        from loadgen.report import auto_report

        auto_report(result.run_dir)
    if not result.stopped and result.summary.get("requests") and not result.summary.get("completed"):
        examples = "; ".join(result.summary.get("error_examples") or [])
        print(f"error: no request succeeded ({examples})", file=sys.stderr)
        return EXIT_FAIL
    if result.stopped:
        saved = result.summary.get("requests", 0)
        print(f"run ended early: {result.stopped}\n{saved} request records saved in {result.run_dir}",
              file=sys.stderr)
        return EXIT_INTERRUPTED if result.stopped.startswith("interrupted") else EXIT_FAIL
    return EXIT_OK


def cmd_capacity(args) -> int:
    from loadgen.capacity.run import command
    from loadgen.scenario.model import ScenarioError

    try:
        return command(args)
    except ScenarioError as e:
        raise UsageError(str(e)) from None


def cmd_summarize(args) -> int:
    from loadgen.results.records import read_records
    from loadgen.results.rundir import read_metrics
    from loadgen.results.summary import summarize

    req = args.run_dir / "requests.jsonl"
    if not req.is_file():
        raise UsageError(f"{req} not found")
    tier_slos = {}
    cfg_path = args.run_dir / "summary.json"
    if cfg_path.is_file():
        try:
            old = json.loads(cfg_path.read_text())
            tier_slos = {t: e["slo"] for t, e in (old.get("tiers") or {}).items() if "slo" in e}
        except (ValueError, AttributeError):
            pass
    s = summarize(read_records(req), goodput=_goodput(args.goodput) or None, tier_slos=tier_slos,
                  lateness_bound_ms=args.lateness_bound_ms,
                  metrics=read_metrics(args.run_dir / "metrics.jsonl"))
    s["run_id"] = args.run_dir.name
    (args.run_dir / "summary.json").write_text(json.dumps(s, indent=2, default=float) + "\n")
    _print_summary(s, args.run_dir, args.json)
    return EXIT_OK


def cmd_report(args) -> int:
    from loadgen.report import write_compare, write_report
    from loadgen.report.data import RunDataError

    try:
        if args.run_b is not None:
            path = write_compare(args.run_dir, args.run_b, args.output)
        else:
            path = write_report(args.run_dir, args.output, export=not args.no_export)
    except RunDataError as e:
        raise UsageError(str(e)) from None
    print(f"report: {path}")
    return EXIT_OK


def cmd_gate(args) -> int:
    from loadgen.gate.rules import main as gate_main

    return gate_main(args.run_dir, args.baseline, args.rules, args.junit, sys.stdout, sys.stderr)


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def _print_summary(s: dict, run_dir: Path, as_json: bool) -> None:
    if as_json:
        print(json.dumps(s, indent=2, default=float))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"slobench {s.get('run_id', '')}", show_header=True)
    t.add_column("metric")
    for c in ("mean", "median", "p90", "p99"):
        t.add_column(c, justify="right")
    for m in ("ttft", "tpot", "itl", "e2el"):
        t.add_row(
            f"{m.upper()} (ms)", *(_fmt(s.get(f"{c}_{m}_ms")) for c in ("mean", "median", "p90", "p99")))
    con.print(t)
    lat = s.get("client_lateness", {})
    con.print(
        f"requests {s.get('requests')}  completed {s.get('completed')}  failed {s.get('failed')}  "
        f"cancelled {s.get('cancelled', 0)}  duration {_fmt(s.get('duration'))} s\n"
        f"request throughput {_fmt(s.get('request_throughput'))} req/s  "
        f"goodput {_fmt(s.get('request_goodput'))} req/s  output {_fmt(s.get('output_throughput'))} tok/s\n"
        f"errors {s.get('errors') or '{}'}  client lateness p50 {_fmt(lat.get('p50_ms'))} ms "
        f"p99 {_fmt(lat.get('p99_ms'))} ms  valid {s.get('valid')}"
    )
    bd = s.get("breakdown") or {}
    if bd.get("source"):
        con.print(f"breakdown ({bd['source']}): queue {_fmt(bd.get('mean_queue_ms'))} ms  prefill "
                  f"{_fmt(bd.get('mean_prefill_ms'))} ms  decode {_fmt(bd.get('mean_decode_ms'))} ms (means)")
    for tier, e in (s.get("tiers") or {}).items():
        if "slo_attainment" in e:
            con.print(f"tier {tier}: {e['slo_met']}/{e['requests']} met {e['slo']} "
                      f"({100 * e['slo_attainment']:.1f}%)")
    if not s.get("valid", True) and s.get("invalid_reason"):
        con.print(f"[bold red]INVALID RUN:[/] {s['invalid_reason']}")
    con.print(f"results: {run_dir}/ (requests.jsonl, metrics.jsonl, summary.json)")


if __name__ == "__main__":
    sys.exit(main())
