"""Command-line flags of the server: every EngineConfig field becomes a flag."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from typing import Any

from engine.request.config import EngineConfig
from engine.request.tiers import TIERS

SWITCH_INTERVAL_MS = 0.5  # the server process's GIL switch interval (Python's default: 5 ms)


def _tier_pairs(text: str) -> list[tuple[str, Any]]:
    """`tier=value,...` or a JSON object: (tier, value) pairs, tiers checked."""
    text = text.strip()
    if text.startswith("{"):
        try:
            pairs = list(json.loads(text).items())
        except (json.JSONDecodeError, AttributeError) as e:
            raise argparse.ArgumentTypeError(f"not a JSON object of tier limits: {e}") from None
    else:
        pairs = []
        for part in text.split(","):
            tier, sep, value = part.partition("=")
            if not sep:
                raise argparse.ArgumentTypeError(f"expected tier=N pairs, got {part!r}")
            pairs.append((tier.strip(), value.strip()))
    for tier, _ in pairs:
        if tier not in TIERS:
            raise argparse.ArgumentTypeError(f"unknown tier {tier!r}; tiers are {', '.join(TIERS)}")
    return pairs


def _tier_limits(text: str) -> dict[str, int]:
    """`premium=8,standard=16,basic=32` or a JSON object (what scenario files pass): a number per tier."""
    limits = {}
    for tier, value in _tier_pairs(text):
        try:
            limits[tier] = int(value)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{tier}: {value!r} is not an integer") from None
        if limits[tier] < 0:
            raise argparse.ArgumentTypeError(f"{tier}: the limit must be non-negative")
    return limits


def _tier_bounds(text: str) -> dict[str, float | None]:
    """`basic=60,premium=null` or a JSON object: positive seconds per tier, or null / none (unbounded)."""
    bounds: dict[str, float | None] = {}
    for tier, value in _tier_pairs(text):
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
            bounds[tier] = None
            continue
        try:
            bounds[tier] = float(value)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{tier}: {value!r} is not a number of seconds or null") from None
        if not bounds[tier] > 0:
            raise argparse.ArgumentTypeError(f"{tier}: the bound must be positive seconds (or null: unbounded)")
    return bounds


_ENGINE_HELP = {
    "device": "cuda | cpu (default: cuda when available)",
    "dtype": "float32 | bfloat16 | float16 (default: float32 on cpu, bfloat16 on cuda)",
    "seed": "random seed for preset weights",
    "max_model_len": "context length (default: the model's)",
    "block_size": "KV block size in tokens",
    "num_kv_blocks": "KV blocks (default: from --kv-cache-tokens)",
    "kv_cache_tokens": "KV capacity in tokens",
    "num_host_blocks": "host (swap) KV blocks",
    "enable_prefix_caching": "prefix caching (--no-prefix-caching turns it off)",
    "kv_allocation": "paged | contiguous",
    "batching": "continuous | static",
    "max_num_seqs": "batch slots",
    "max_num_batched_tokens": "per-step token budget",
    "enable_chunked_prefill": "chunked prefill (--no-chunked-prefill turns it off)",
    "prefill_chunk_size": "largest prefill chunk one request gets per step",
    "rebatch_interval": "queued requests join the batch every N steps (and whenever a request finishes)",
    "first_text_priority": "while a request's first token is out but its text is held back (an incomplete "
                           "character), the prefill chunks of requests ranked below it wait "
                           "(--no-first-text-priority turns it off)",
    "premium_reserved_kv_frac": "share of KV blocks only premium may use",
    "premium_reserved_slots": "batch slots only premium may use",
    "max_waiting_per_tier": "waiting-queue bounds: premium=N,standard=N,basic=N (or JSON)",
    "kv_watermark": "KV usage at which queued requests stop joining the batch and swapping starts",
    "admission": "slo (default): answer 429 + Retry-After to a request whose estimated queue wait would break its "
                 "tier's TTFT promise (--tier-ttft-slo-ms); queue-length: only the per-tier queue bounds "
                 "(--max-waiting-per-tier)",
    "tier_ttft_slo_ms": "TTFT promises that --admission slo keeps, in ms: premium=N,standard=N,basic=N (or JSON; "
                        "0: none). Default premium=300,standard=800; basic has none",
    "pack_cpu_weights": "on the CPU, linear layers on weights oneDNN reordered once at load instead of torch's "
                        "F.linear (--no-pack-cpu-weights: F.linear)",
    "decode_graphs": "decode steps on static, padded buffers replayed from CUDA graphs, batch sizes 1, 2, 4, 8, 16, "
                     "... up to --max-num-seqs: auto (default) captures them on CUDA with the Triton kernel; eager "
                     "runs the padded path uncaptured (any device); off",
    "tier_max_queue_s": "the longest a request of each tier waits unstarted before it is answered 429 with "
                        "Retry-After, in seconds: premium=S,standard=S,basic=S (or JSON; null: unbounded). "
                        "Default 60 each (a common client timeout)",
    "admission_target_frac": "--admission slo admits while the estimated TTFT stays within this share of the "
                             "promise (the rest is for HTTP, network and client; default 0.8)",
}


def _engine_fields() -> list[tuple[str, Any]]:
    """(EngineConfig field, its type without None) for every engine option but `model`."""
    hints = typing.get_type_hints(EngineConfig)
    out = []
    for f in dataclasses.fields(EngineConfig):
        if f.name == "model":
            continue
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
            tp = args[0]
        out.append((f.name, typing.get_origin(tp) or tp))
    return out


def add_server_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of `slobench serve` / `python -m engine.server`.

    Every EngineConfig field is a flag (`max_num_seqs` -> `--max-num-seqs`; booleans also take
    `--no-...`), defaulting to EngineConfig's own default.
    """
    parser.add_argument("--model", default="tiny", help="a preset name (tiny) or a Hugging Face checkpoint folder")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free port; default: 8000)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=5.0,
        help="seconds in-flight requests get to finish at shutdown",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--switch-interval-ms", type=float, default=SWITCH_INTERVAL_MS, help="the GIL switch interval (ms)"
    )
    parser.add_argument(
        "--parent-pid", type=int, default=None,
        help="shut down (after the drain) once the process that started the server, PID, is gone: slobench "
             "starts its embedded engine with it, in a session of its own, so that a load generator killed "
             "outright (SIGKILL) does not leave the engine running",
    )
    parser.add_argument(
        "--engine-core", choices=["process", "thread"], default="process",
        help="process (default): the scheduler and model loop in an engine-core process of their own, apart "
             "from the HTTP front end; thread: both in one process (the engine on a thread)",
    )
    group = parser.add_argument_group("engine")
    for name, tp in _engine_fields():
        flag = "--" + name.replace("_", "-")
        help_ = _ENGINE_HELP.get(name)
        if tp is bool:
            group.add_argument(flag, dest=name, default=None, action=argparse.BooleanOptionalAction, help=help_)
        elif tp is dict:
            parse = _tier_bounds if name == "tier_max_queue_s" else _tier_limits
            group.add_argument(flag, dest=name, default=None, type=parse, help=help_)
        elif name == "admission":
            group.add_argument(flag, dest=name, default=None, choices=["slo", "queue-length"], help=help_)
        elif name == "decode_graphs":
            group.add_argument(flag, dest=name, default=None, choices=["auto", "off", "eager"], help=help_)
        elif tp in (int, float, str):
            group.add_argument(flag, dest=name, default=None, type=tp, help=help_)
    # Short spellings for the switches that turn things off.
    group.add_argument(
        "--no-prefix-caching", dest="enable_prefix_caching", action="store_false", help=argparse.SUPPRESS
    )
    group.add_argument(
        "--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false", help=argparse.SUPPRESS
    )
    group.add_argument("--no-triton", dest="use_triton", action="store_false", help=argparse.SUPPRESS)
    return parser


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed flags; options not given keep EngineConfig's defaults."""
    kwargs: dict[str, Any] = {"model": getattr(args, "model", "tiny")}
    for name, _ in _engine_fields():
        value = getattr(args, name, None)
        if value is not None:
            kwargs[name] = value
    # a flag naming some tiers keeps the others' defaults
    for name in ("max_waiting_per_tier", "tier_ttft_slo_ms", "tier_max_queue_s"):
        if name in kwargs:
            kwargs[name] = {**getattr(EngineConfig(), name), **kwargs[name]}
    return EngineConfig(**kwargs)
