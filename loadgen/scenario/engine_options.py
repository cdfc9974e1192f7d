"""The ``engine`` section of a scenario: the embedded reference engine's options, and their parser."""

from __future__ import annotations

from typing import Any

from engine.request.tiers import TIERS
from loadgen.scenario.model import ScenarioError
from loadgen.scenario.schema import MappingNode, found

# Options for the embedded reference engine: EngineConfig fields and server flags (``python -m
# engine.server --help``), with their types and choices. loadgen imports no more of the engine than its plain
# request data (the tiers), so this is a table; tests/loadgen/scenario/test_scenario_schema.py checks it against
# EngineConfig and the server's parser.
_opt = type(None)
ENGINE_OPTIONS: dict[str, tuple[tuple, tuple | None]] = {
    "model": ((str,), None),
    "device": ((str, _opt), None),
    "dtype": ((str, _opt), None),
    "seed": ((int,), None),
    "num_threads": ((int, _opt), None),
    "max_model_len": ((int, _opt), None),
    "block_size": ((int,), None),
    "num_kv_blocks": ((int, _opt), None),
    "kv_cache_tokens": ((int,), None),
    "num_host_blocks": ((int, _opt), None),
    "enable_prefix_caching": ((bool,), None),
    "kv_allocation": ((str,), ("paged", "contiguous")),
    "batching": ((str,), ("continuous", "static")),
    "max_num_seqs": ((int,), None),
    "max_num_batched_tokens": ((int,), None),
    "enable_chunked_prefill": ((bool,), None),
    "prefill_chunk_size": ((int,), None),
    "rebatch_interval": ((int,), None),
    "first_text_priority": ((bool,), None),
    "premium_reserved_kv_frac": ((float,), None),
    "premium_reserved_slots": ((int,), None),
    "max_waiting_per_tier": ((dict,), None),
    "kv_watermark": ((float,), None),
    "admission": ((str,), ("slo", "queue-length")),
    "tier_ttft_slo_ms": ((dict,), None),
    "tier_max_queue_s": ((dict,), None),
    "admission_target_frac": ((float,), None),
    "pack_cpu_weights": ((bool,), None),
    "use_triton": ((bool, _opt), None),
    "decode_graphs": ((str,), ("auto", "off", "eager")),
    # server flags
    "api_key": ((str, _opt), None),
    "drain_timeout": ((float,), None),
    "log_level": ((str,), ("debug", "info", "warning", "error")),
    "switch_interval_ms": ((float,), None),
    "engine_core": ((str,), ("process", "thread")),
}
_TIER_CHOICES = "|".join(TIERS)  # the keys of a per-tier option, as its errors name them


def parse_engine_options(eng: MappingNode) -> dict[str, Any]:
    """The ``engine`` section: known options only, with their types and choices, none negative."""
    out: dict[str, Any] = {}
    for k in eng.data:
        if k in ("host", "port"):
            raise ScenarioError(f"{eng.key(k)}: the embedded engine always listens on a free loopback port; "
                                "to use a server of your own, set target: http://HOST:PORT")
        if k not in ENGINE_OPTIONS:
            raise ScenarioError(f"{eng.key(str(k))}: unknown engine option (known: {', '.join(ENGINE_OPTIONS)})")
        types, choices = ENGINE_OPTIONS[k]
        v = eng.get(k, types, choices=choices)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
            raise ScenarioError(f"{eng.key(k)}: expected a value >= 0, found {v!r}")
        if k == "max_waiting_per_tier":
            for tier, n in v.items():
                if tier not in TIERS or isinstance(n, bool) or not isinstance(n, int):
                    raise ScenarioError(f"{eng.key(k)}.{tier}: expected {_TIER_CHOICES}: an integer, "
                                        f"found {found(n)}")
        if k == "tier_ttft_slo_ms":
            for tier, ms in v.items():
                if tier not in TIERS or isinstance(ms, bool) or \
                        not isinstance(ms, (int, float)) or ms < 0:
                    raise ScenarioError(f"{eng.key(k)}.{tier}: expected {_TIER_CHOICES}: a number of ms "
                                        f">= 0, found {found(ms)}")
        if k == "tier_max_queue_s":
            for tier, s in v.items():
                if tier not in TIERS or isinstance(s, bool) or \
                        not (s is None or (isinstance(s, (int, float)) and s > 0)):
                    raise ScenarioError(f"{eng.key(k)}.{tier}: expected {_TIER_CHOICES}: seconds > 0 or "
                                        f"null (unbounded), found {found(s)}")
        out[k] = v
    return out
