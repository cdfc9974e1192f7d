"""The experiments by name, each with its full form (about a minute on a 2-core CPU, all together within
15 minutes) and its reduced form (seconds: the test suite's)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.experiments.batching import BatchingParams, RebatchParams, continuous_batching, rebatch_interval
from engine.experiments.chunked_prefill import ChunkedParams, chunked_prefill
from engine.experiments.kv_memory import PagedParams, PrefixParams, paged_kv, prefix_sharing
from engine.experiments.overload import FillParams, OverloadParams, batch_fill, overload
from engine.experiments.result import ExperimentResult
from engine.experiments.tiers import MixParams, TierParams, Traffic, mixed_vs_separated, priority_tiers


@dataclass(frozen=True)
class Experiment:
    name: str
    claim: str  # one line, for listings and progress
    fn: Callable[[Any], ExperimentResult]
    full: Any  # its parameters dataclass
    reduced: Any

    def run(self, reduced: bool = False) -> ExperimentResult:
        start = time.perf_counter()
        result = self.fn(self.reduced if reduced else self.full)
        result.wall_s = time.perf_counter() - start
        result.params = {**result.params, "form": "reduced" if reduced else "full"}
        return result


_SMALL_TRAFFIC = Traffic(interactive_rps=8.0, duration_s=2.0, batch_requests=24, batch_prompt=(64, 192),
                         batch_output=(48, 96))

EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("continuous-batching", "continuous vs static batching throughput (2-3x)", continuous_batching,
               BatchingParams(), BatchingParams(requests=32, max_num_seqs=8)),
    Experiment("paged-kv", "paged vs contiguous KV: fragmentation (< 4% vs > 30%), sequences in the same memory (> 2x)",
               paged_kv, PagedParams(), PagedParams(requests=32, kv_cache_tokens=2048, max_num_seqs=32)),
    Experiment("prefix-sharing", "prefix sharing on customer-service traffic: KV memory saved (up to 40%)",
               prefix_sharing, PrefixParams(), PrefixParams(requests=24, max_num_seqs=8)),
    Experiment("chunked-prefill", "chunked prefill: decode stall during a long prefill, the long prompt's extra time "
               "(about 10%)", chunked_prefill, ChunkedParams(), ChunkedParams(decodes=4, long_prompt_len=1024)),
    Experiment("rebatch-interval", "re-batching every 1, 4, 8 steps: scheduling overhead (< 2% at 4-8), TTFT cost",
               rebatch_interval, RebatchParams(), RebatchParams(intervals=(1, 8), duration_s=1.5)),
    Experiment("priority-tiers", "priority tiers: interactive queue time (tens of ms), batch completion, throughput",
               priority_tiers, TierParams(), TierParams(traffic=_SMALL_TRAFFIC, max_num_seqs=8)),
    Experiment("overload", "swapping at 90% KV with admission control under overload: no failures, premium SLO",
               overload, OverloadParams(),
               OverloadParams(kv_cache_tokens=2048, max_num_seqs=16, duration_s=2.0, calibration_requests=16)),
    Experiment("batch-fill", "batch fill ratio falls with sparse arrivals or too conservative tiering", batch_fill,
               FillParams(), FillParams(rates_rps=(2.0, 32.0), duration_s=1.5, reserved_slots=(0, 16),
                                        backlog_requests=32, max_num_seqs=24)),
    Experiment("mixed-vs-separated",
               "interactive and batch traffic mixed in one instance (tuned by slots and tiers) vs separated",
               mixed_vs_separated, MixParams(),
               MixParams(traffic=_SMALL_TRAFFIC, mixed_slots=(4, 16), mixed_tiers=(("standard", "standard"),
                                                                                 ("premium", "basic")),
                         interactive_slots=8, batch_slots=16)),
)}


def unknown(names: list[str]) -> list[str]:
    return [n for n in names if n not in EXPERIMENTS]
