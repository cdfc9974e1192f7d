"""The ``slobench`` command line: the argument parser and the dispatch to ``loadgen.commands``.

    slobench run SCENARIO.yaml [--target URL]            a fixed load from a scenario file
    slobench replay TRACE [--format F] [--time-scale X]  replay a real trace
    slobench capacity SCENARIO.yaml [--target URL]       rated capacity: ramp until the TTFT SLO breaks
    slobench summarize RUN_DIR [--goodput ttft:MS ...]   rebuild summary.json from a run folder
    slobench report RUN_DIR [RUN_B] [-o FILE]            report.html from a run folder (or A vs B)
    slobench gate RUN_DIR... --baseline B... [--rules R] CI gate: exit 0 pass, 1 regression, 2 bad input
    slobench mock-server [--strict] [--ttft-ms ...]      a mock target with exact timing
    slobench calibrate SCENARIO.yaml [--slots C ...]     the capacity search against a mock of known capacity
    slobench plan SCENARIO.yaml --model M --hardware H   capacity planning: theory, a fitted step time, prediction
    slobench watch TARGET --baseline RUN_DIR             the five health signals against a capacity run
    slobench export-monitoring RUN_DIR                   Grafana dashboard + Prometheus alerts from a run
    slobench scenarios [NAME]                            the built-in scenarios, or one's YAML to copy
    slobench experiments [NAME ...] [--reduced]          the engine's design claims measured on the reference engine
    slobench serve ...                                    the reference engine's server
    slobench generate PROMPT                              one offline generation with the engine

``run``, ``replay`` and ``capacity`` write a run folder: ``--out DIR`` names it, or ``--reports DIR``
(default ``reports``) and ``--run-id ID`` (default timestamp-name) build ``DIR/ID``; ``--out`` with
either of the others is a usage error. Bad input ends with a one-line error and exit code 2; a target
that fails ends with exit code 1 after saving and summarising what was measured; Ctrl-C or SIGTERM (a
cancelled CI job, ``timeout``) does the same with exit code 130, and stops an embedded engine.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from loadgen.commands.common import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UsageError, engine_opt
from loadgen.commands.flags import (
    CAPACITY_EXAMPLES,
    REPLAY_EXAMPLES,
    RUN_EXAMPLES,
    SCENARIO_HELP,
    SET_HELP,
    add_slo_args,
    add_target_args,
    add_workload_args,
)
from loadgen.results.latency import LATENESS_BOUND_MS
from loadgen.results.runmeta import slobench_version
from loadgen.target.embedded import EngineNotInstalled

RAW = argparse.RawDescriptionHelpFormatter  # epilogs keep their lines: the examples

__all__ = ["EXIT_FAIL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "UsageError", "build_parser", "main"]


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


def _output_args(p: argparse.ArgumentParser) -> None:
    """The run folder flags, the same on every command that writes one."""
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="run folder to write (default: REPORTS/RUN_ID); not with --reports or --run-id")
    p.add_argument("--reports", metavar="DIR", help="folder for run folders (default: reports)")
    p.add_argument("--run-id", metavar="ID", help="run folder name under --reports (default: timestamp-name)")


def _common_run_args(p: argparse.ArgumentParser) -> None:
    add_target_args(p)
    add_slo_args(p)
    _output_args(p)
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS",
                   help="SLOs for goodput, e.g. ttft:300 tpot:50 (default: the --slo thresholds)")
    p.add_argument("--workers", type=int, help="replayer processes the schedule is sharded over")
    p.add_argument("--driver", choices=("aiohttp", "locust"), default="aiohttp",
                   help="load generator: the aiohttp replayer (default) or Locust (--workers: its processes)")
    p.add_argument("--max-connections", type=int, help="cap on open connections (default: unlimited)")
    p.add_argument("--lateness-bound-ms", type=float,
                   help="p99 client lateness above which the run is invalid")
    p.add_argument("--engine-opt", action="append", type=engine_opt, default=[], metavar="KEY=VALUE",
                   help="option for the embedded engine server (repeatable), e.g. max_num_seqs=8")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.add_argument("--no-scrape", action="store_true", help="do not poll the target's /metrics")
    p.add_argument("--no-report", action="store_true", help="do not write report.html and requests.parquet")
    p.add_argument("--json", action="store_true", help="print summary.json instead of a table")


def _mock_queue_args(p: argparse.ArgumentParser, slots: int = 0, prefill: float = 0.0) -> None:
    """The mock's queueing mode, on ``mock-server`` and ``calibrate``."""
    p.add_argument("--slots", type=int, default=slots, metavar="C",
                   help="queueing mode: serve at most C requests at once, the rest wait FIFO in arrival order; a "
                        "request holds its slot until its last token (a FIFO C-server queue of known capacity; "
                        f"default {slots}{': no queue' if not slots else ''})")
    p.add_argument("--prefill-ms-per-token", type=float, default=prefill, metavar="MS",
                   help="prefill time per prompt token: the first token comes --ttft-ms + MS x prompt tokens after "
                        f"the request has its slot (default {prefill:g})")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="slobench", description="Load tests and trace replay for LLM inference services.")
    ap.add_argument("--version", action="version", version=f"slobench {slobench_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="one fixed load: a scenario, or flags alone", epilog=RUN_EXAMPLES,
                       formatter_class=RAW)
    p.add_argument("scenario", nargs="?", help=SCENARIO_HELP)
    p.add_argument("--seed", type=int, help="the workload's seed (arrivals, lengths, prompts)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    add_workload_args(p, load=True)
    _common_run_args(p)

    p = sub.add_parser("replay", help="replay a trace file", epilog=REPLAY_EXAMPLES,
                       formatter_class=RAW)
    p.add_argument("trace", type=Path, help="the trace file: Mooncake or prompts JSONL, Azure or BurstGPT CSV, "
                                            "ShareGPT JSON")
    p.add_argument("--format", choices=("mooncake", "azure", "burstgpt", "sharegpt", "prompts"),
                   help="the trace's format (default: from its name and first line)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply inter-arrival gaps (0.5: twice as fast)")
    p.add_argument("--rate", type=float, help="override the mean rate (req/s), keeping the burst shape")
    p.add_argument("--start-offset", type=float, default=0.0, help="skip the first S trace seconds")
    p.add_argument("--max-requests", type=int, help="send at most the trace's first N requests")
    p.add_argument("--max-duration", type=float, help="stop scheduling after S replay seconds")
    p.add_argument("--block-size", type=int, default=512, help="tokens per Mooncake hash id (default 512)")
    p.add_argument("--include-failed", action="store_true", help="keep BurstGPT rows with 0 response tokens")
    p.add_argument("--output-len", type=int, default=128,
                   help="max_tokens where the trace has none (ShareGPT)")
    p.add_argument("--max-output-len", type=int, help="clamp the trace's output lengths")
    p.add_argument("--arrival", choices=("poisson", "gamma", "constant"), default="poisson",
                   help="arrival process for traces without timestamps (ShareGPT; rate from --rate)")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="with --arrival gamma: the shape (below 1: burstier than Poisson; default 1)")
    p.add_argument("--tier-mix", type=_tier_mix, help="e.g. premium=1,standard=3,basic=1")
    p.add_argument("--token-range", type=int, nargs=2, default=(10, 250), metavar=("LO", "HI"),
                   help="synthetic token ids are drawn from [LO, HI)")
    p.add_argument("--concurrency", type=int, default=0,
                   help="closed loop with N users instead of timestamps")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrivals, tiers and synthetic prompts (default 0)")
    _common_run_args(p)

    p = sub.add_parser("capacity", help="rated capacity: ramp the load until an SLO breaks, then bisect",
                       epilog=CAPACITY_EXAMPLES, formatter_class=RAW)
    p.add_argument("scenario", nargs="?", help=SCENARIO_HELP)
    add_target_args(p)
    add_slo_args(p)
    add_workload_args(p, load=False)
    _output_args(p)
    p.add_argument("--seed", type=int, help="the workload's seed (arrivals, lengths, prompts)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=SET_HELP + "; search.max_duration_s=240 bounds the run's time (no step starts that would "
                                   "end past it)")
    p.add_argument("--engine-opt", action="append", type=engine_opt, default=[], metavar="KEY=VALUE",
                   help="option for the embedded engine server (repeatable), e.g. max_num_seqs=8")
    p.add_argument("--no-progress", action="store_true", help="no live display")
    p.add_argument("--no-report", action="store_true", help="do not write report.html")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the verdict")
    p.add_argument("--driver", choices=("aiohttp", "locust"), default="aiohttp",
                   help="load generator: the aiohttp replayer (default) or Locust, one Locust run per step "
                        "(no early stop within a step, no measured in-flight count)")
    p.add_argument("--workers", type=int, help="load generator processes per step: Locust processes (--driver locust) "
                   "or sharded replayer processes (aiohttp; no early stop within a step)")

    p = sub.add_parser("summarize", help="rebuild a fixed-load run's summary.json from its records (its kind and "
                       "metadata kept); a capacity run's is refused (exit 2) and left as it is",
                       epilog="examples:\n  slobench summarize reports/my-run --goodput ttft:500 tpot:50\n"
                              "  slobench summarize reports/my-run --json | jq .p99_ttft_ms",
                       formatter_class=RAW)
    p.add_argument("run_dir", type=Path, help="the run folder (requests.jsonl, summary.json)")
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLOs for goodput, e.g. ttft:300 tpot:50")
    p.add_argument("--lateness-bound-ms", type=float, default=LATENESS_BOUND_MS,
                   help=f"p99 client lateness above which the run is invalid (default {LATENESS_BOUND_MS:g})")
    p.add_argument("--json", action="store_true", help="print summary.json instead of a table")

    p = sub.add_parser("report", help="write report.html for a run folder, or compare two runs",
                       epilog="examples:\n  slobench report reports/my-run\n"
                              "  slobench report reports/before reports/after -o compare.html",
                       formatter_class=RAW)
    p.add_argument("run_dir", type=Path, help="the run folder (A when comparing)")
    p.add_argument("run_b", type=Path, nargs="?", help="a second run: compare RUN_DIR (A) with it (B)")
    p.add_argument("-o", "--output", type=Path,
                   help="output file (default: RUN_DIR/report.html; RUN_B/compare-A.html when comparing)")
    p.add_argument("--no-export", action="store_true", help="do not write requests.parquet / requests.csv")

    p = sub.add_parser("gate", help="compare a run with a baseline: exit 0 pass, 1 regression, 2 bad input",
                       epilog="examples:\n  slobench gate reports/pr-run --baseline reports/main-run --junit gate.xml\n"
                              "  slobench gate reports/pr-1 reports/pr-2 --baseline reports/main-1 reports/main-2 "
                              "--rules examples/gate.yaml",
                       formatter_class=RAW)
    p.add_argument("run_dir", nargs="+", help="run folder (or its summary.json); several: repeats of one "
                   "measurement, pooled (a capacity rating: their mean, with the interval of a mean)")
    p.add_argument("--baseline", required=True, nargs="+", help="baseline summary .json or run folder; several: "
                   "pooled as the runs are")
    p.add_argument("--rules", help="rules YAML (default: noise-aware defaults, see loadgen/gate/)")
    p.add_argument("--junit", help="write JUnit XML here, one testcase per rule")

    p = sub.add_parser("mock-server", help="a mock OpenAI-compatible target with exact timing",
                       epilog="examples:\n  slobench mock-server --port 8000 --ttft-ms 50 --itl-ms 20\n"
                              "  slobench mock-server --slots 16 --prefill-ms-per-token 0.1   # a queue of known "
                              "capacity\n  slobench mock-server --strict --api-key sekret",
                       formatter_class=RAW)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--ttft-ms", type=float, default=50.0,
                   help="time to the first token (with --slots: after the request has its slot; plus "
                        "--prefill-ms-per-token x its prompt tokens), default 50")
    p.add_argument("--itl-ms", type=float, default=20.0, help="time between tokens, default 20")
    p.add_argument("--tokens", type=int, help="tokens per stream (default: the request's max_tokens)")
    p.add_argument("--model", help="the model name it serves (default mock); any name asked for is answered "
                                   "unless --check-model")
    p.add_argument("--models", metavar="NAME,...",
                   help="several model names it serves (instead of --model): /v1/models lists them all and an "
                        "answer carries the name asked for")
    p.add_argument("--refuse", action="append", default=[], metavar="STATUS:EVERY[:RETRY_AFTER_S]",
                   help="answer every EVERY-th completion request STATUS instead (e.g. 429:3:2: every third "
                        "refused 429 with Retry-After: 2); repeatable, the first rule that matches wins")
    p.add_argument("--fcfs", action="store_true",
                   help="refuse a request with a non-zero priority field 400, as a first-come-first-served server "
                        "that knows no priorities does (the default accepts and ignores it)")
    p.add_argument("--check-model", action="store_true",
                   help="answer a request naming a model it does not serve 404, in vLLM's words: {\"error\": "
                        "{\"message\": \"The model `x` does not exist.\", \"type\": \"NotFoundError\", \"code\": 404}}")
    p.add_argument("--api-key", metavar="KEY",
                   help="as vLLM's --api-key: every request under /v1 must carry 'Authorization: Bearer KEY', else "
                        "401 {\"error\": \"Unauthorized\"}; /health and /metrics stay open")
    p.add_argument("--log-requests", metavar="FILE",
                   help="a test aid: append one JSON line per HTTP request received (method, path, headers with "
                        "lower-cased names, the JSON body or null), refused ones too; one write per line")
    p.add_argument("--strict", action="store_true",
                   help="a strict OpenAI server: 422 on unknown fields (ignore_eos, min_tokens ...), 400 on a "
                        "non-string prompt, usage only with stream_options.include_usage, no timing, no /metrics")
    p.add_argument("--reject-field", action="append", default=[], metavar="FIELD",
                   help="with --strict, refuse this OpenAI field too (e.g. service_tier, as transformers serve's "
                        "/v1/completions does); repeatable")
    p.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=None,
                   help="serve /metrics (default: yes, unless --strict)")
    p.add_argument("--metrics-bytes", type=int, default=0, metavar="N",
                   help="pad /metrics with at least N bytes of extra series (a large page to scrape)")
    p.add_argument("--metrics-flavor", choices=("vllm", "sglang", "tgi", "trtllm"), default="vllm",
                   help="whose /metrics names (and behaviour) to mimic: vllm (the reference engine's, with "
                        "per-request timing; default), sglang, tgi or trtllm (its page at /prometheus/metrics); "
                        "the last three send no per-request timing, as those servers do not")

    p.add_argument("--reasoning-tokens", type=int, default=0, metavar="N",
                   help="a reasoning model: the first N tokens of each answer are reasoning deltas (chat and "
                        "/v1/responses; TTFT counts them, TTFOT waits for the answer)")
    p.add_argument("--reasoning-field", choices=("reasoning_content", "reasoning"), default="reasoning_content",
                   help="the chat delta's reasoning key (reasoning_content: DeepSeek, older vLLM; reasoning: vLLM)")
    p.add_argument("--tokens-per-chunk", type=int, default=1, metavar="K",
                   help="each chunk carries K tokens' text, K x --itl-ms apart; with stream_options."
                        "continuous_usage_stats every chunk has the cumulative usage (vLLM's)")
    p.add_argument("--per-request-metrics", action="store_true",
                   help="vLLM's per-request metrics object (--enable-per-request-metrics) in the final usage chunk, "
                        "exact from the schedule, instead of the reference engine's timing object")
    p.add_argument("--no-responses", action="store_true",
                   help="no POST /v1/responses (a target without the Responses API)")
    _mock_queue_args(p)

    p = sub.add_parser("calibrate", help="check the capacity search: rate a queueing mock whose true capacity is "
                                         "known by simulation, print rated vs true",
                       epilog="examples:\n  slobench calibrate calibrate --slots 16\n"
                              "  slobench calibrate calibrate-steady --set search.refine_steps=4",
                       formatter_class=RAW)
    p.add_argument("scenario", help="a synthetic, single-turn, open-loop scenario: a built-in's name (calibrate, "
                                    "calibrate-steady) or a file")
    p.add_argument("--ttft-ms", type=float, default=20.0, help="the mock's fixed prefill time (default 20)")
    p.add_argument("--itl-ms", type=float, default=20.0, help="the mock's time between tokens (default 20)")
    p.add_argument("--tokens", type=int, help="tokens per answer (default: the request's max_tokens)")
    _mock_queue_args(p, slots=16, prefill=0.1)
    p.add_argument("--seed", type=int, help="the scenario's seed (its arrival pattern)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value by its dotted path (repeatable), e.g. search.step_duration_s=10")
    p.add_argument("--truth-requests", type=int, default=50000, metavar="N",
                   help="simulated requests per seed for the true capacity (default 50000)")
    p.add_argument("--truth-seeds", type=int, default=4, metavar="K", help="simulated seeds (default 4)")
    p.add_argument("--ideal-seeds", type=int, default=20, metavar="K",
                   help="seeds over which to simulate a search that trusts one window per step, judged "
                        "perfectly: the noise of one window's verdict (default 20; 0: skip)")
    _output_args(p)
    p.add_argument("--no-progress", action="store_true", help="no live display")
    p.add_argument("--no-report", action="store_true", help="do not write report.html")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the comparison")

    sub.add_parser("serve", help="run the reference engine's OpenAI-compatible server (see serve --help)",
                   add_help=False)

    p = sub.add_parser("generate", help="generate from one prompt with the reference engine (demo)",
                       epilog="example:\n  slobench generate 'The quick brown fox' --max-tokens 32",
                       formatter_class=RAW)
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--model", default="tiny", help="a preset (tiny) or a Hugging Face checkpoint folder")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")

    from loadgen.commands import experiments, export_monitoring, scenarios, watch
    from loadgen.commands.plan import register as register_plan

    register_plan(sub)
    watch.register(sub)
    export_monitoring.register(sub)
    experiments.register(sub)
    scenarios.register(sub)
    return ap


def _commands() -> dict[str, Callable[[argparse.Namespace], int]]:
    # Imported on use: each command module pulls in only what its command needs (torch, pandas, rich).
    from loadgen.commands.calibrate import cmd_calibrate
    from loadgen.commands.capacity import cmd_capacity
    from loadgen.commands.experiments import cmd_experiments
    from loadgen.commands.export_monitoring import cmd_export_monitoring
    from loadgen.commands.load_runs import cmd_replay, cmd_run
    from loadgen.commands.plan import cmd_plan
    from loadgen.commands.results import cmd_gate, cmd_report, cmd_summarize
    from loadgen.commands.scenarios import cmd_scenarios
    from loadgen.commands.targets import cmd_generate, cmd_mock_server
    from loadgen.commands.watch import cmd_watch

    return {"run": cmd_run, "replay": cmd_replay, "summarize": cmd_summarize, "capacity": cmd_capacity,
            "mock-server": cmd_mock_server, "generate": cmd_generate, "report": cmd_report, "gate": cmd_gate,
            "calibrate": cmd_calibrate, "plan": cmd_plan, "watch": cmd_watch,
            "export-monitoring": cmd_export_monitoring, "experiments": cmd_experiments,
            "scenarios": cmd_scenarios}


# The commands that measure, save as they go or start an engine: SIGTERM takes Ctrl-C's path there. The
# others end at once on it, as a process does by default: nothing to save, and the mock server's graceful
# close would wait on its clients' idle keep-alive connections.
SIGTERM_AS_CTRL_C = frozenset({"run", "replay", "capacity", "calibrate", "plan", "experiments"})


def _terminated(signum, frame) -> None:
    """SIGTERM outside a run's event loop (starting an engine, preparing, writing a report) ends the command as
    Ctrl-C does: clean-up runs (an embedded engine is stopped), exit 130. Inside a run's loop,
    ``drivers.event_loop.STOP_SIGNALS`` stop the run gracefully instead."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "serve":
            from loadgen.commands.targets import cmd_serve

            return cmd_serve(argv[1:], _Parser)
        args = build_parser().parse_args(argv)
        if args.cmd in SIGTERM_AS_CTRL_C:
            signal.signal(signal.SIGTERM, _terminated)
        return _commands()[args.cmd](args)
    except (UsageError, EngineNotInstalled) as e:  # bad input, or the engine extra not installed
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
