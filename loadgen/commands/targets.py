"""Commands that are a target or use the engine directly: ``serve`` (the reference engine's server),
``generate`` (one offline generation) and ``mock-server`` (a target with exact timing)."""

from __future__ import annotations

import argparse
import os
import sys

from loadgen.commands.common import EXIT_OK, UsageError
from loadgen.target.embedded import require_engine


def cmd_serve(argv: list[str], parser_class: type[argparse.ArgumentParser]) -> int:
    """``serve`` takes the engine server's own flags, so it parses its arguments itself."""
    require_engine()
    from engine.server.launch import run_server  # lazy: only `serve` imports torch
    from engine.server.server_args import add_server_arguments

    p = parser_class(prog="slobench serve", description="The reference engine's OpenAI-compatible server.")
    add_server_arguments(p)
    args = p.parse_args(argv)
    result = run_server(args)
    return int(result) if isinstance(result, int) else EXIT_OK


def cmd_generate(args: argparse.Namespace) -> int:
    require_engine()
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


def parse_refuse(text: str) -> tuple[int, int, float | None]:
    """``STATUS:EVERY[:RETRY_AFTER]`` (``--refuse 429:3:2``) as (status, every, retry_after_s)."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        status, every = int(parts[0]), int(parts[1])
        retry = float(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise UsageError(f"--refuse {text}: expected STATUS:EVERY[:RETRY_AFTER_S], e.g. 429:3:2") from None
    if not 400 <= status <= 599 or every < 1 or (retry is not None and retry < 0):
        raise UsageError(f"--refuse {text}: STATUS is an HTTP error (400-599), EVERY >= 1, RETRY_AFTER_S >= 0")
    return status, every, retry


def cmd_mock_server(args: argparse.Namespace) -> int:
    from loadgen.target.mock.config import STRICT_FIELDS, MockConfig
    from loadgen.target.mock.server import serve

    if args.ttft_ms < 0 or args.itl_ms < 0 or (args.tokens is not None and args.tokens < 1):
        raise UsageError("--ttft-ms and --itl-ms must be >= 0 and --tokens >= 1")
    if args.reject_field and not args.strict:
        raise UsageError("--reject-field needs --strict (the default mode accepts every field)")
    if unknown := set(args.reject_field) - set().union(*STRICT_FIELDS.values()):
        raise UsageError(f"--reject-field {', '.join(sorted(unknown))}: --strict refuses fields OpenAI does not know "
                         "already; name one it knows (e.g. service_tier)")
    if args.metrics_bytes < 0:
        raise UsageError("--metrics-bytes must be >= 0")
    if args.reasoning_tokens < 0 or args.tokens_per_chunk < 1:
        raise UsageError("--reasoning-tokens must be >= 0 and --tokens-per-chunk >= 1")
    if args.slots < 0 or args.prefill_ms_per_token < 0:
        raise UsageError("--slots and --prefill-ms-per-token must be >= 0 (--slots 0: no queue)")
    if args.models is not None and args.model is not None:
        raise UsageError("pass --model or --models, not both")
    names = [n.strip() for n in args.models.split(",")] if args.models is not None else [args.model or "mock"]
    if not all(names) or args.api_key == "":
        raise UsageError("--models names and --api-key must not be empty")
    if args.log_requests and not os.path.isdir(os.path.dirname(os.path.abspath(args.log_requests))):
        raise UsageError(f"--log-requests {args.log_requests}: no such directory")
    serve(MockConfig(args.ttft_ms, args.itl_ms, args.tokens, names[0], strict=args.strict,
                     reject_fields=tuple(args.reject_field), metrics=args.metrics, metrics_bytes=args.metrics_bytes,
                     metrics_flavor=args.metrics_flavor, reasoning_tokens=args.reasoning_tokens,
                     reasoning_field=args.reasoning_field, tokens_per_chunk=args.tokens_per_chunk,
                     per_request_metrics=args.per_request_metrics, responses=not args.no_responses,
                     slots=args.slots, prefill_ms_per_token=args.prefill_ms_per_token, models=tuple(names[1:]),
                     check_model=args.check_model, api_key=args.api_key, request_log=args.log_requests,
                     fcfs=args.fcfs, refuse=tuple(parse_refuse(r) for r in args.refuse)),
          args.host, args.port)
    return EXIT_OK
