"""Randomized differential test: the engine on small KV pools against the same requests on a big pool.

Random pools of 4-24 blocks of 8 or 16 tokens (with and without a host swap pool, sometimes with a premium
reservation), 2-5 concurrent greedy requests with n = 1-4 in three tiers, some sharing a prompt prefix, some
arriving a few steps after the others, under random scheduler settings (chunking, watermark, re-batching
interval, token budget, static batching, contiguous allocation). Every request must finish, or be refused at
`add_request` exactly when it could never fit alone (engine/scheduler/scheduler.py's progress guarantee); greedy tokens
must equal the big pool's; `check_integrity()` holds after every step; no block is left at the end.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from engine import Engine, EngineConfig, SamplingParams
from engine.request.errors import CapacityExceededError
from engine.scheduler.block_manager import kv_blocks_alone
from tests.helpers import run_engine

pytestmark = pytest.mark.timeout(600)

MAX_STEPS = 3000  # far more than any of these needs when it progresses (a few hundred at most)

configs = st.fixed_dictionaries({
    "num_kv_blocks": st.integers(4, 24),
    "block_size": st.sampled_from([8, 16]),
    "num_host_blocks": st.sampled_from([None, 0, 2, 8]),
    "rebatch_interval": st.sampled_from([1, 4]),
    "kv_watermark": st.sampled_from([0.7, 0.9, 1.0]),
    "prefill_chunk_size": st.sampled_from([8, 16, 256]),
    "max_num_batched_tokens": st.sampled_from([32, 512]),
    "enable_prefix_caching": st.booleans(),
    "enable_chunked_prefill": st.sampled_from([True, True, True, False]),
    "kv_allocation": st.sampled_from(["paged", "paged", "paged", "contiguous"]),
    "batching": st.sampled_from(["continuous", "continuous", "continuous", "static"]),
    "premium_reserved_kv_frac": st.sampled_from([0.0, 0.0, 0.25]),
    "max_num_seqs": st.sampled_from([4, 8, 64]),
})  # fmt: skip
tokens = st.integers(0, 255)


@st.composite
def workloads(draw):
    """Requests (prompt, n, max_tokens, tier, arrival step), some sharing a prefix, some arriving later."""
    shared = draw(st.lists(tokens, max_size=48))
    requests = []
    for _ in range(draw(st.integers(2, 5))):
        own = draw(st.lists(tokens, min_size=1, max_size=48))
        prompt = shared + own if draw(st.booleans()) else own
        requests.append((prompt, draw(st.integers(1, 4)), draw(st.integers(1, 24)),
                         draw(st.sampled_from(["premium", "standard", "basic"])),
                         draw(st.sampled_from([0, 0, 0, 2, 6, 12]))))
    return requests


def run(config: dict, requests: list) -> tuple[list, Engine]:
    """Each request's n token lists, or 'refused'; integrity checked after every step."""
    engine = Engine(EngineConfig(model="tiny", admission="queue-length", **config))
    ids: list[str | None] = [None] * len(requests)

    def arrive(step: int) -> None:
        for i, (prompt, n, max_tokens, tier, arrival) in enumerate(requests):
            if arrival == step:
                params = SamplingParams(n=n, max_tokens=max_tokens, temperature=0, ignore_eos=True)
                try:
                    ids[i] = engine.add_request(prompt, params, tier=tier)
                except CapacityExceededError as e:
                    assert "KV-cache blocks" in str(e) or "batch slots" in str(e)

    done = run_engine(engine, MAX_STEPS, arrive, last_arrival=max(r[4] for r in requests))
    return [done[i] if i else "refused" for i in ids], engine


def fixed(shapes: list[tuple[int, int, int, str]], shared: int = 0, seed: int = 0) -> list:
    """Requests of the given (prompt length, n, max_tokens, tier), the first `shared` tokens common to all."""
    rng = random.Random(seed)
    common = [rng.randrange(256) for _ in range(shared)]
    return [(common + [rng.randrange(256) for _ in range(p - shared)], n, m, t, 0) for p, n, m, t in shapes]


DEFAULTS = {"num_host_blocks": None, "rebatch_interval": 4, "kv_watermark": 0.9, "prefill_chunk_size": 256,
            "max_num_batched_tokens": 512, "enable_prefix_caching": True, "enable_chunked_prefill": True,
            "kv_allocation": "paged", "batching": "continuous", "premium_reserved_kv_frac": 0.0, "max_num_seqs": 64}
ISSUE = fixed([(33, 4, 12, "standard"), (48, 2, 14, "standard"), (71, 1, 4, "standard"), (68, 3, 24, "standard"),
               (77, 3, 21, "standard")], shared=32)


@example(config={**DEFAULTS, "num_kv_blocks": 22, "block_size": 16}, requests=ISSUE)  # n > 1, swaps, prefix hits
@example(config={**DEFAULTS, "num_kv_blocks": 22, "block_size": 16, "num_host_blocks": 0}, requests=ISSUE)
@example(config={**DEFAULTS, "num_kv_blocks": 8, "block_size": 16},  # copy-on-write queued, then swapped
         requests=fixed([(64, 1, 16, "standard"), (20, 3, 8, "standard")], seed=1))
@example(config={**DEFAULTS, "num_kv_blocks": 12, "block_size": 8, "num_host_blocks": 2, "kv_watermark": 0.7,
                 "premium_reserved_kv_frac": 0.25, "prefill_chunk_size": 8, "rebatch_interval": 1},
         requests=fixed([(30, 2, 20, "basic"), (25, 3, 10, "standard"), (20, 1, 24, "premium")], shared=16, seed=2))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(config=configs, requests=workloads())
def test_small_pools_give_the_big_pools_tokens(config, requests):
    got, engine = run(config, requests)
    stats = engine.stats()
    event(f"preempted: {stats.num_preemptions > 0}, swapped: {stats.num_swap_outs > 0}, "
          f"prefix hits: {stats.prefix_hit_tokens > 0}, n > 1: {any(r[1] > 1 for r in requests)}")
    expected, _ = run({**config, "num_kv_blocks": 2048, "num_host_blocks": None}, requests)
    sched, bs = engine.scheduler, config["block_size"]
    for (prompt, _n, max_tokens, tier, _), mine, theirs in zip(requests, got, expected, strict=True):
        # wider than the pool or the slots together, its n completions run as children one sequence each
        one = kv_blocks_alone(len(prompt), 1, max_tokens, bs)
        never_fits = one > sched.kv_limit(tier) or sched.slot_limit(tier) < 1
        assert (mine == "refused") == never_fits, "refused exactly what could never fit alone"
        assert mine == ("refused" if never_fits else theirs), "greedy tokens differ from the big pool's"
