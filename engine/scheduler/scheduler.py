"""Continuous-batching scheduler: which queued requests join the batch and when, with chunked prefill, priority
tiers, preemption and swapping.

Each step packs a token budget in rank order: running requests get one token per decode and a chunk per prefill, and
on a step where queued requests join, those ranked below the best queued request come after the joining ones. New
work joins only every `rebatch_interval` steps, or at once when a request has finished (its slot and KV are free).
While a running request's first token is out but its first text is not (a character held back over byte tokens),
the prefill chunks of requests ranked below it wait and their decodes go on (`first_text_priority`): a step's time is
mostly its prefill tokens, so the steps it still needs run short. Tiers are strict: premium before standard before
basic; a waiting request may preempt running requests ranked below it for batch slots and KV, and premium may hold
back a share of the KV blocks (`premium_reserved_kv_frac`: the other tiers together never hold more than the rest,
on joining, in later prefill chunks, in decode growth and at swap-in) and of the batch slots
(engine/scheduler/reservation.py). At the KV usage watermark no request joins and the lowest-ranked running requests
move to host memory (or, when the host pool is full, drop their KV to be recomputed later).

Progress guarantee. Requests are ranked by (tier, arrival): premium before standard before basic, older before younger
(engine/scheduler/queues.py). A request is preempted only in favour of one ranked above it: a victim is always the
lowest-ranked running request below the one that needs room, a request steps aside itself only when every other running
request ranks above it, and the watermark never pushes out the best-ranked running request. So the best-ranked
unfinished request is never preempted. Running, it is scheduled first with the whole token budget and takes KV and slots
from the others; queued, it is the first candidate to join at every join step (due within `rebatch_interval` steps),
gets the step's token budget before every running request ranked below it, may preempt every other running request, and
nothing ranked below it joins before it; and every request `Engine.add_request` accepts fits the pool alone (its tier's
share of KV blocks and batch slots, each of its n sequences counted in full beyond the shared prompt blocks:
`kv_blocks_alone`), a request that could never fit being rejected up front. So it finishes, then the next best-ranked
one, and so on: every request finishes (requests of a higher tier that keep arriving do overtake; tiers are strict; a
static batch drains before the next starts). A request that restarts after losing its KV re-prefills one sequence's
prompt and its other sequences share those blocks again, so its KV stays within the same bound.

Two baselines are switches. Static batching: a batch fills every slot it can (up to max_num_seqs, or until the queue is
empty), prefills under the token budget over as many steps as that takes, takes no new member once a member has started
decoding, and refills only when every member has finished (engine/scheduler/static_batch.py). Contiguous allocation:
each request reserves KV for prompt + max_tokens up front, as pre-paged engines did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request.config import EngineConfig
from engine.request.sequence import Request, SeqStatus, Sequence
from engine.scheduler.block_manager import BlockManager, kv_slots
from engine.scheduler.block_ops import BlockOps
from engine.scheduler.queues import RequestQueues, rank
from engine.scheduler.reservation import PremiumReservation
from engine.scheduler.static_batch import StaticBatch

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
        self.queues = RequestQueues()
        self.waiting = self.queues.waiting  # tier -> requests in rank order
        self.swapped = self.queues.swapped
        self.running: list[Request] = []
        self.step_count = 0
        self.rebatch_due = True  # a request finished: queued requests join at the next step, whatever the interval
        self.num_preemptions = 0
        self.num_swap_outs = 0  # of those, moved to host memory (the rest drop their KV and recompute)
        self.reservation = PremiumReservation(config, block_manager)
        self.static_batch = StaticBatch()  # batching: static only
        self.kv_blocked_tier: str | None = None  # the last join step stopped at a request of it for lack of KV
        self._first_text_rank: tuple | None = None  # this step: the best-ranked request whose first text is held

    # ---- queues ---------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.queues.new_arrival(request)

    def num_waiting(self, tier: str | None = None) -> int:
        return self.queues.num_waiting(tier)

    def num_swapped(self) -> int:
        return self.queues.num_swapped()

    def running_slots(self) -> int:
        # A request holds n slots from joining the batch on: its n sequences fork after the prefill.
        return sum(r.params.n for r in self.running)

    def slot_limit(self, tier: str) -> int:
        return self.reservation.slot_limit(tier)

    def kv_limit(self, tier: str) -> int:
        return self.reservation.kv_limit(tier)

    def remove(self, request: Request) -> None:
        """Take a request out of whichever queue holds it and free its KV (finish or abort)."""
        if request in self.running:
            self.running.remove(request)
            self.rebatch_due = True
        self.queues.take(request)
        self.static_batch.discard(request)
        for seq in request.seqs:
            self.bm.free(seq.seq_id)

    # ---- the step -------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        out = SchedulerOutput()
        self.reservation.recount(self.running)
        join = self._join_due()
        self._relieve_watermark(out)
        budget = self.config.max_num_batched_tokens
        # The token budget goes in rank order across running and queued requests: joining serves the
        # running requests ranked above each candidate before it, the rest come after. Scheduling every
        # running request first would let lower tiers' prefill chunks spend a step's budget before a
        # premium request arriving under overload could start. (Static batching keeps its own order.)
        running = sorted(self.running, key=rank)
        self._first_text_rank = self._pending_first_text(running)
        if join and self.config.batching == "continuous":
            budget = self._join_queued(budget, out, running)
        budget = self._serve_running(running, None, budget, out)
        if join and self.config.batching == "static":
            self._join_queued(budget, out)
        return out

    def _pending_first_text(self, running: list[Request]) -> tuple | None:
        """The best rank among `running` (in rank order) with its first token out but its text held back (None:
        none). Not during a prefill: holding others then idles the budget and refuses lower tiers too early."""
        if not self.config.first_text_priority or self.config.batching != "continuous":
            return None
        return next((rank(r) for r in running if r.first_token_time and r.first_text_time is None), None)

    def _prefill_held(self, request: Request) -> bool:
        """Its prefill waits: one ranked above (its tier's too: overload steps are mostly its) holds back its text."""
        return self._first_text_rank is not None and rank(request) > self._first_text_rank

    def _serve_running(self, behind: list[Request], above: Request | None, budget: int,
                       out: SchedulerOutput) -> int:
        """Schedule the running requests of `behind` (in rank order) ranked above `above` (all when None), taking
        them off the list."""
        while behind and (above is None or rank(behind[0]) < rank(above)):
            request = behind.pop(0)
            if request.request_id not in out.preempted:  # a joining request may have pushed it out for room
                budget = self._schedule_request(request, budget, out)
        return budget

    def _join_due(self) -> bool:
        if self.config.batching == "static":
            self.static_batch.update(self.running)
            return True  # closed, only the batch's own preempted members come back
        due = self.rebatch_due or not self.running or self.step_count % self.config.rebatch_interval == 0
        if due:
            self.rebatch_due = False
        return due

    def _victim_below(self, request: Request) -> Request | None:
        """The lowest-ranked running request ranked below `request` (None: everyone else ranks above)."""
        below = [r for r in self.running if r is not request and rank(r) > rank(request)]
        return max(below, key=rank) if below else None

    def _live_seqs(self, request: Request) -> list[Sequence]:
        return [s for s in request.seqs if not s.is_finished]

    def _tokens_for(self, seq: Sequence, budget: int) -> int:
        """How many of the sequence's uncomputed tokens fit this step's budget (0: none this step)."""
        n = seq.num_uncomputed
        if budget <= 0:  # spent (a whole prefill longer than the budget may have overdrawn it)
            return 0
        if n <= 1:
            return n
        if self.config.enable_chunked_prefill:
            return min(n, self.config.prefill_chunk_size, budget)
        # Without chunking a prefill runs whole; one longer than the budget runs alone.
        if n <= budget or budget == self.config.max_num_batched_tokens:
            return n
        return 0

    def _fits(self, request: Request, blocks: int, uncounted: int = 0) -> bool:
        """`blocks` fresh blocks are free, and they (with `uncounted` blocks the request holds already) keep its tier
        within its share."""
        return blocks <= self.bm.num_free_blocks and self.reservation.within_share(request, blocks + uncounted)

    # ---- running requests -----------------------------------------------------------------------
    def _share_prompt_blocks(self, request: Request, seq: Sequence) -> bool:
        """A sequence restarting without KV shares its prompt's full blocks with the request's leader (the
        sequence re-prefilling them) once they are written, or leads itself when no live sequence holds KV
        (the leader finished); whether it has a table now."""
        leader = next((s for s in self._live_seqs(request) if s.seq_id in self.bm.tables), None)
        shared = min(len(request.prompt_ids), seq.num_tokens - 1) // self.bm.block_size
        if leader is not None and leader.num_computed < shared * self.bm.block_size:
            return False
        if leader is None:
            shared = 0
        seq.num_computed = self.bm.allocate_prefix(seq.seq_id, seq.token_ids, leader and leader.seq_id, shared)
        seq.num_cached_prefix = seq.num_computed
        self.reservation.note_blocks(request, seq)
        return True

    def _schedule_request(self, request: Request, budget: int, out: SchedulerOutput) -> int:
        for seq in self._live_seqs(request):
            if seq.seq_id not in self.bm.tables and not self._share_prompt_blocks(request, seq):
                continue
            n = self._tokens_for(seq, budget)
            if n == 0 or (n > 1 and self._prefill_held(request)):
                continue
            slots = seq.num_computed + n
            while not self._fits(request, self.bm.blocks_needed(seq.seq_id, slots)):
                victim = self._victim_below(request)
                if victim is not None:
                    budget += self._preempt(victim, out)
                    continue
                self.reservation.recount(self.running)  # a copy-on-write may have left a block counted
                if self._fits(request, self.bm.blocks_needed(seq.seq_id, slots)):
                    break
                # Everyone else running ranks above: the request itself steps aside, with any of its
                # sequences already placed in this step's batch.
                return budget + self._preempt(request, out)
            out.ops.extend(self.bm.ensure_slots(seq.seq_id, slots))
            self.reservation.note_blocks(request, seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            seq.last_scheduled_step = self.step_count
            budget -= n
        return budget

    def _preempt(self, request: Request, out: SchedulerOutput) -> int:
        """Swap a running request to host memory, or drop its KV to recompute when the host pool is full.

        Returns the tokens of its sequences already placed in this step's batch, now taken out again.
        """
        mine = {s.seq_id for s in request.seqs}
        refund = sum(x.num_new_tokens for x in out.scheduled if x.seq.seq_id in mine)
        out.scheduled = [x for x in out.scheduled if x.seq.seq_id not in mine]
        self.running.remove(request)
        self.num_preemptions += 1
        out.preempted.add(request.request_id)
        live = self._live_seqs(request)
        held = [s.seq_id for s in live if s.seq_id in self.bm.tables]
        if held and self.bm.can_swap_out(held):
            out.ops.extend(self.bm.swap_out(held))
            for seq in live:
                seq.status = SeqStatus.SWAPPED
            self.queues.put_swapped(request)
            self.num_swap_outs += 1
        else:
            for seq in live:
                self._drop_kv(seq)
            self.queues.put_waiting(request)
        self.reservation.recount(self.running)
        return refund

    def _drop_kv(self, seq: Sequence) -> None:
        self.bm.free(seq.seq_id)
        seq.num_computed = 0
        seq.num_cached_prefix = 0
        seq.status = SeqStatus.WAITING

    def _relieve_watermark(self, out: SchedulerOutput) -> None:
        """Above the KV watermark, move the lowest-ranked requests out (never the best-ranked one)."""
        while self.bm.usage >= self.config.kv_watermark and len(self.running) > 1:
            self._preempt(max(self.running, key=rank), out)

    # ---- joining the batch ----------------------------------------------------------------------
    def _join_queued(self, budget: int, out: SchedulerOutput, behind: list[Request] | None = None) -> int:
        """Queued requests join the batch in rank order, swapped and waiting alike (the swapped ones ran before).

        Strict priority: a request that cannot join stops the joining for every request ranked below it.
        Under static batching requests join regardless of the token budget (the batch's prefill spreads over
        steps), and once its batch is closed only the batch's own members.
        """
        static = self.config.batching == "static"
        members = self.static_batch.joinable() if static else None
        self.kv_blocked_tier = None
        if members is not None and members <= {r.request_id for r in self.running}:
            return budget  # a closed batch with every member running: nobody to join
        for tier in self.waiting:
            while (request := self.queues.first(tier, members)) is not None:
                if behind:  # running requests ranked above this one take their share of the budget first
                    budget = self._serve_running(behind, request, budget, out)
                if request.request_id in out.preempted or (budget <= 0 and not static):
                    return budget  # pushed out in this step: its turn is over until the next
                blocked, budget = self._try_join(request, budget, out, static)
                if blocked:
                    self.kv_blocked_tier = request.tier if blocked == "kv" else None
                    return budget
                if static:
                    self.static_batch.add(request)
        return budget

    def _try_join(self, request: Request, budget: int, out: SchedulerOutput, static: bool) -> tuple[str, int]:
        """Join the request to the batch and schedule it, pushing out lower-ranked ones as needed; ('' or what it
        lacks: 'slots', 'budget' or 'kv', the budget left)."""
        while self.running_slots() + request.params.n > self.slot_limit(request.tier):
            victim = self._victim_below(request)
            if victim is None:
                return "slots", budget
            budget += self._preempt(victim, out)
        swapped = self.queues.is_swapped(request)
        live = self._live_seqs(request)
        leader, slots = live[0], 0
        if not swapped:
            seq_budget = self.config.max_num_batched_tokens if static else budget
            if leader.seq_id not in self.bm.tables:
                leader.num_cached_prefix = leader.num_computed = self.bm.allocate_prefix(
                    leader.seq_id, leader.token_ids)
            first_chunk = self._tokens_for(leader, seq_budget)
            if first_chunk == 0 or (first_chunk > 1 and self._prefill_held(request)):
                self._drop_kv(leader)
                return "budget", budget
            slots = self._slots_on_joining(request, leader, first_chunk)
        while not self._join_fits(request, swapped, leader, slots, budget):
            victim = self._victim_below(request)
            if victim is None:
                if not swapped:
                    self._drop_kv(leader)
                return "kv", budget
            budget += self._preempt(victim, out)
        self.queues.take(request)
        if swapped:
            out.ops.extend(self.bm.swap_in([s.seq_id for s in live if s.seq_id in self.bm.host_tables]))
        else:
            out.ops.extend(self.bm.ensure_slots(leader.seq_id, slots))
        for seq in live:
            seq.status = SeqStatus.RUNNING
            self.reservation.note_blocks(request, seq)
        self.running.append(request)
        if (held := self._pending_first_text([request])) is not None:  # swapped in with its text held: those
            self._first_text_rank = min(held, self._first_text_rank or held)  # served after it hold back too
        return "", self._schedule_request(request, budget, out)

    def _slots_on_joining(self, request: Request, leader: Sequence, first_chunk: int) -> int:
        """KV slots a new request takes as it joins: its first chunk, or everything up front when contiguous."""
        if self.config.kv_allocation == "contiguous":
            return min(kv_slots(len(request.prompt_ids), request.params.max_tokens), self.max_model_len)
        return leader.num_computed + first_chunk

    def _join_fits(self, request: Request, swapped: bool, leader: Sequence, slots: int, budget: int) -> bool:
        """Room for the request's first step: slots are checked already; KV, its tier's share, the watermark."""
        if swapped:
            growth = []
            for seq in self._live_seqs(request):
                if seq.seq_id in self.bm.host_tables:
                    n = self._tokens_for(seq, budget)
                    budget -= n
                    growth.append((seq.seq_id, seq.num_computed + n))
            blocks, uncounted = self.bm.blocks_to_resume(growth), 0
            margin = SWAP_IN_HYSTERESIS
        else:
            blocks = self.bm.blocks_needed(leader.seq_id, slots)
            uncounted = self.reservation.uncounted_blocks(request, leader)
            margin = 0.0
        usage_after = 1.0 - (self.bm.num_free_blocks - blocks) / self.bm.num_blocks
        if self.running and usage_after > self.config.kv_watermark - margin:
            return False
        return self._fits(request, blocks, uncounted)

    # ---- checks ---------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Every request is in one place, slots and the premium reservation hold."""
        queued = list(self.queues)
        assert len({id(r) for r in queued + self.running}) == len(queued) + len(self.running), "a request is twice"
        assert self.running_slots() <= self.config.max_num_seqs, "more sequences running than batch slots"
        for request in queued:
            tables = [s.seq_id for s in request.seqs if s.seq_id in self.bm.tables]
            assert not tables, f"queued request {request.request_id} holds device KV blocks"
        self.reservation.check_integrity(self.running)
