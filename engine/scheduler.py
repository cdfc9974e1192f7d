"""Continuous-batching scheduler with chunked prefill, priority tiers, admission control and swapping.

Each step packs a token budget: every running decode gets one token, prefills get chunks of what is left.
New work joins only every `rebatch_interval` steps, or at once when a request has finished (its slot and
KV are free). Tiers are strict: premium before standard before basic; a waiting request may preempt
running requests of a lower tier, and premium may hold back a share of the KV blocks and batch slots.
At the KV usage watermark admissions stop and the lowest-tier, longest-idle running requests move to host
memory (or, when the host pool is full, drop their KV to be recomputed later).

Two baselines are switches: static batching (a batch starts together and ends together) and contiguous
allocation (each request reserves KV for prompt + max_tokens up front, as pre-paged engines did).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager, BlockOps
from engine.config import TIERS, EngineConfig
from engine.sequence import Request, SeqStatus, Sequence

TIER_RANK = {tier: rank for rank, tier in enumerate(TIERS)}  # lower rank = higher priority
# Swapped requests come back only when usage stays this far below the watermark (avoids ping-pong).
SWAP_IN_HYSTERESIS = 0.05


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    ops: BlockOps = field(default_factory=BlockOps)
    preempted: set[str] = field(default_factory=set)  # request ids


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, max_model_len: int):
        self.config = config
        self.bm = block_manager
        self.max_model_len = max_model_len
        self.waiting: dict[str, deque[Request]] = {tier: deque() for tier in TIERS}
        self.swapped: dict[str, deque[Request]] = {tier: deque() for tier in TIERS}
        self.running: list[Request] = []
        self.step_count = 0
        self.rebatch_due = True  # a request finished: admit at the next step, whatever the interval
        self.num_preemptions = 0
        self.num_swap_outs = 0  # of those, moved to host memory (the rest drop their KV and recompute)
        self.reserved_blocks = int(config.premium_reserved_kv_frac * block_manager.num_blocks)

    # ---- queues ---------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.waiting[request.tier].append(request)

    def num_waiting(self, tier: str | None = None) -> int:
        tiers = [tier] if tier else TIERS
        return sum(len(self.waiting[t]) for t in tiers)

    def num_swapped(self) -> int:
        return sum(len(q) for q in self.swapped.values())

    def running_slots(self) -> int:
        # A request holds n slots from admission on: its n sequences fork after the prefill.
        return sum(r.params.n for r in self.running)

    def remove(self, request: Request) -> None:
        """Take a request out of whichever queue holds it and free its KV (finish or abort)."""
        if request in self.running:
            self.running.remove(request)
            self.rebatch_due = True
        for queues in (self.waiting, self.swapped):
            if request in queues[request.tier]:
                queues[request.tier].remove(request)
        for seq in request.seqs:
            self.bm.free(seq.seq_id)

    # ---- the step -------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        out = SchedulerOutput()
        admit = self._admission_due()
        if admit:
            self._preempt_for_higher_tiers(out)
        self._relieve_watermark(out)
        budget = self.config.max_num_batched_tokens
        scheduled_ids: set[str] = set()
        for request in sorted(self.running, key=self._priority):
            if request.request_id in scheduled_ids or request.request_id in out.preempted:
                continue  # preempted earlier in this loop
            budget = self._schedule_request(request, budget, out, scheduled_ids)
        if admit:
            # Swap-ins wait for a step without swap-outs (see BlockOps), fresh admissions need not.
            self._admit(budget, out, scheduled_ids, allow_swap_in=not out.ops.swap_out)
        return out

    def _admission_due(self) -> bool:
        if self.config.batching == "static":
            return not self.running
        due = self.rebatch_due or not self.running or self.step_count % self.config.rebatch_interval == 0
        if due:
            self.rebatch_due = False
        return due

    @staticmethod
    def _priority(request: Request) -> tuple[int, float]:
        return TIER_RANK[request.tier], request.arrival_time

    def _victim_order(self, requests: list[Request]) -> list[Request]:
        """Who to preempt first: lowest tier, then longest idle (least recently scheduled), newest last."""
        return sorted(
            requests,
            key=lambda r: (-TIER_RANK[r.tier], min(s.last_scheduled_step for s in r.seqs), -r.arrival_time),
        )

    def _live_seqs(self, request: Request) -> list[Sequence]:
        return [s for s in request.seqs if not s.is_finished]

    def _tokens_for(self, seq: Sequence, budget: int) -> int:
        """How many of the sequence's uncomputed tokens fit this step's budget (0: none this step)."""
        n = seq.num_uncomputed
        if n <= 1:
            return min(n, budget)
        if self.config.enable_chunked_prefill:
            return min(n, self.config.prefill_chunk_size, budget)
        # Without chunking a prefill runs whole; one longer than the budget runs alone.
        if n <= budget or budget == self.config.max_num_batched_tokens:
            return n
        return 0

    def _schedule_request(
        self, request: Request, budget: int, out: SchedulerOutput, scheduled_ids: set[str]
    ) -> int:
        for seq in self._live_seqs(request):
            n = self._tokens_for(seq, budget)
            if n == 0:
                continue
            slots = seq.num_computed + n
            while self.bm.blocks_needed(seq.seq_id, slots) > self.bm.num_free_blocks:
                candidates = [
                    r for r in self.running if r.request_id not in scheduled_ids and r is not request
                ]
                if not candidates:
                    # Nobody else to take KV from: the request itself steps aside, with any of its
                    # sequences already placed in this step's batch.
                    mine = {s.seq_id for s in request.seqs}
                    kept = [x for x in out.scheduled if x.seq.seq_id not in mine]
                    budget += sum(x.num_new_tokens for x in out.scheduled if x not in kept)
                    out.scheduled = kept
                    self._preempt(request, out)
                    return budget
                self._preempt(self._victim_order(candidates)[0], out)
            ops = self.bm.ensure_slots(seq.seq_id, slots)
            if ops:
                out.ops.extend(ops)
            out.scheduled.append(ScheduledSeq(seq, n))
            seq.last_scheduled_step = self.step_count
            budget -= n
        scheduled_ids.add(request.request_id)
        return budget

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Swap a running request to host memory, or drop its KV to recompute when the host pool is full."""
        self.running.remove(request)
        self.num_preemptions += 1
        out.preempted.add(request.request_id)
        seq_ids = [s.seq_id for s in self._live_seqs(request)]
        if not out.ops.swap_in and self.bm.can_swap_out(seq_ids):
            out.ops.extend(self.bm.swap_out(seq_ids))
            for seq in self._live_seqs(request):
                seq.status = SeqStatus.SWAPPED
            self.swapped[request.tier].append(request)
            self.num_swap_outs += 1
            return
        for seq in self._live_seqs(request):
            self.bm.free(seq.seq_id)
            seq.num_computed = 0
            seq.num_cached_prefix = 0
            seq.status = SeqStatus.WAITING
        self.waiting[request.tier].appendleft(request)

    def _relieve_watermark(self, out: SchedulerOutput) -> None:
        """Above the KV watermark, move the lowest-tier, longest-idle requests out (keep at least one)."""
        while self.bm.usage >= self.config.kv_watermark and len(self.running) > 1:
            self._preempt(self._victim_order(self.running)[0], out)

    # ---- admission ------------------------------------------------------------------------------
    def _slot_limit(self, tier: str) -> int:
        reserved = 0 if tier == "premium" else self.config.premium_reserved_slots
        return self.config.max_num_seqs - reserved

    def _slots_for_admission(self, request: Request, first_chunk: int) -> int:
        """KV slots a new request takes now: its first chunk, or everything up front when contiguous."""
        if self.config.kv_allocation == "contiguous":
            return min(len(request.prompt_ids) + request.params.max_tokens, self.max_model_len)
        return request.seqs[0].num_computed + first_chunk

    def _kv_fits(self, tier: str, blocks: int) -> bool:
        reserved = 0 if tier == "premium" else self.reserved_blocks
        free_after = self.bm.num_free_blocks - blocks
        usage_after = 1.0 - free_after / self.bm.num_blocks
        return free_after >= reserved and (usage_after <= self.config.kv_watermark or not self.running)

    def _preempt_for_higher_tiers(self, out: SchedulerOutput) -> None:
        """A waiting request may push out running requests of a strictly lower tier to get a batch slot."""
        for tier in TIERS:
            for request in self.waiting[tier]:
                while self.running_slots() + request.params.n > self._slot_limit(tier):
                    lower = [r for r in self.running if TIER_RANK[r.tier] > TIER_RANK[tier]]
                    if not lower:
                        return
                    self._preempt(self._victim_order(lower)[0], out)

    def _admit(self, budget: int, out: SchedulerOutput, scheduled_ids: set[str], allow_swap_in: bool) -> int:
        """Tier by tier: swapped requests first (they were admitted once already), then waiting ones.

        Strict priority: a request that cannot get in stops admission for its tier and every lower one,
        never for a higher one.
        """
        for tier in TIERS:
            if allow_swap_in:
                budget, blocked = self._swap_in_tier(tier, budget, out, scheduled_ids)
                if blocked:
                    return budget
            queue = self.waiting[tier]
            while queue and budget > 0:
                request = queue[0]
                if self.running_slots() + request.params.n > self._slot_limit(tier):
                    return budget
                live = self._live_seqs(request)
                for seq in live:  # a request preempted for recompute may hold n sequences
                    if seq.seq_id not in self.bm.tables:
                        seq.num_cached_prefix = seq.num_computed = self.bm.allocate_prefix(seq.seq_id, seq.token_ids)
                first_chunk = self._tokens_for(live[0], budget)
                slots = self._slots_for_admission(request, first_chunk)
                if first_chunk == 0 or not self._kv_fits(tier, self.bm.blocks_needed(live[0].seq_id, slots)):
                    return budget
                queue.popleft()
                out.ops.extend(self.bm.ensure_slots(live[0].seq_id, slots))
                for seq in live:
                    seq.status = SeqStatus.RUNNING
                self.running.append(request)
                budget = self._schedule_request(request, budget, out, scheduled_ids)
        return budget

    def _swap_in_tier(self, tier: str, budget: int, out: SchedulerOutput, scheduled_ids: set[str]
                      ) -> tuple[int, bool]:
        """Bring back the tier's swapped requests while they fit; (budget left, whether one is left out)."""
        queue = self.swapped[tier]
        while queue and budget > 0:
            request = queue[0]
            seq_ids = [s.seq_id for s in self._live_seqs(request)]
            blocks = len(self.bm.host_blocks_of(seq_ids))
            usage_after = 1.0 - (self.bm.num_free_blocks - blocks) / self.bm.num_blocks
            if (
                self.running_slots() + request.params.n > self._slot_limit(tier)
                or (self.running and usage_after > self.config.kv_watermark - SWAP_IN_HYSTERESIS)
                or not self.bm.can_swap_in(seq_ids)
            ):
                return budget, True
            queue.popleft()
            out.ops.extend(self.bm.swap_in(seq_ids))
            for seq in self._live_seqs(request):
                seq.status = SeqStatus.RUNNING
            self.running.append(request)
            budget = self._schedule_request(request, budget, out, scheduled_ids)
        return budget, False
