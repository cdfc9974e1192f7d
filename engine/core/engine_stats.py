"""`Engine.stats()`: the engine's state in one `EngineStats` (gauges for /metrics, checks for tests)."""

from __future__ import annotations

from typing import Any

from engine.core.admission import QueueSnapshot
from engine.request.outputs import EngineStats
from engine.request.tiers import TIERS


def collect_stats(engine: Any, snapshot: QueueSnapshot) -> EngineStats:
    """`engine` is the Engine, read under its step lock (no step half done); `snapshot`: what is queued."""
    kv = engine.block_manager.stats()
    sched = engine.scheduler
    tables = engine.block_manager.tables
    running_by_tier = dict.fromkeys(TIERS, 0)
    blocks_by_tier: dict[str, set[int]] = {t: set() for t in TIERS}
    seqs_by_tier = dict.fromkeys(TIERS, 0)
    for request in sched.running:
        running_by_tier[request.tier] += 1
        seqs_by_tier[request.tier] += sum(not s.is_finished for s in request.seqs)
        for seq in request.seqs:
            blocks_by_tier[request.tier].update(tables.get(seq.seq_id, ()))
    num_running_seqs = sum(seqs_by_tier.values())
    admission = engine.admission
    inbox = admission.inbox_requests
    return EngineStats(
        kv_usage=kv.usage,
        fragmentation=kv.fragmentation,
        num_kv_blocks=kv.num_blocks,
        used_kv_blocks=kv.used_blocks,
        blocks_saved_by_sharing=kv.blocks_saved_by_sharing,
        prefix_query_tokens=kv.prefix_query_tokens,
        prefix_hit_tokens=kv.prefix_hit_tokens,
        num_running=sum(running_by_tier.values()),
        num_running_seqs=num_running_seqs,
        num_waiting=sched.num_waiting() + sum(inbox.values()),
        num_swapped=sched.num_swapped(),
        batch_fill_ratio=num_running_seqs / engine.config.max_num_seqs,
        num_preemptions=sched.num_preemptions,
        num_swap_outs=sched.num_swap_outs,
        admission_rejections=dict(admission.rejections),
        waiting_by_tier={t: len(sched.waiting[t]) + inbox[t] for t in TIERS},
        running_by_tier=running_by_tier,
        running_seqs_by_tier=seqs_by_tier,
        kv_usage_by_tier={t: len(b) / kv.num_blocks for t, b in blocks_by_tier.items()},
        estimated_queue_wait_s={t: admission.estimator.queue_wait_s(t, snapshot) for t in TIERS},
        steps=sched.step_count,
        schedule_time_s=engine.step_times.schedule_s,
        process_time_s=engine.step_times.process_s,
        step_time_s=engine.step_times.step_s,
        shed_by_tier=dict(admission.num_shed),
        admission_tail_factor=dict(admission.estimator.tail_factor),
    )
