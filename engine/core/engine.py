"""The engine: requests in, tokens out. `step()` = schedule -> run the model -> process outputs.

`add_request` and `abort` (engine/core/intake.py) are safe to call from any thread (the server's event loop); they
only queue work for the thread that calls `step()`. A fault in one sequence's part of a step (its forward pass,
sampling, detokenizing, stop checks) fails its request alone: finish reason "error" with the reason in its own
output, its KV freed at once; every other sequence of the batch goes on untouched (engine/core/step_faults.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

import torch

from engine.core.admission import AdmissionEstimator
from engine.core.engine_stats import collect_stats
from engine.core.fanout import FanOut
from engine.core.intake import RequestIntake
from engine.core.output_processor import OutputProcessor, build_output
from engine.core.step_faults import failure_message, log_failure, run_apart, sample_apart, valid_token
from engine.model.cpu_linear import pack_linears
from engine.model.decode_graphs import decode_graph_plan
from engine.model.loader import load_model
from engine.model.model_runner import ModelRunner
from engine.model.sampler import Sampler
from engine.request.config import TIERS, EngineConfig
from engine.request.outputs import EngineStats, RequestOutput
from engine.request.sampling import SamplingParams
from engine.request.sequence import Request, SeqStatus, Sequence
from engine.request.timing import StepClock, StepTimes, record_scheduled, record_token_step
from engine.scheduler.block_manager import BlockManager
from engine.scheduler.scheduler import ScheduledSeq, Scheduler

QUEUE_BOUND_MARGIN_S = 1.0  # a tier's longest wait: shed this much before it (at most a tenth of it)


class Engine(RequestIntake):
    def __init__(self, config: EngineConfig | None = None):
        self.config = config = config or EngineConfig()
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        default_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.dtype = getattr(torch, config.dtype) if config.dtype else default_dtype
        if self.device.type == "cpu" and config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        self.model, self.model_config, self.tokenizer = load_model(
            config.model, self.device, self.dtype, config.seed, use_triton=config.use_triton
        )
        # Prepacked oneDNN linears on the CPU (engine/model/cpu_linear.py); 0 where torch lacks them.
        self.packed_linears = pack_linears(self.model) if self.device.type == "cpu" and config.pack_cpu_weights else 0
        self.model_name = config.model
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        num_blocks = config.num_kv_blocks or math.ceil(config.kv_cache_tokens / config.block_size)
        num_host_blocks = num_blocks if config.num_host_blocks is None else config.num_host_blocks
        self.block_manager = BlockManager(
            num_blocks, config.block_size, num_host_blocks,
            enable_prefix_caching=config.enable_prefix_caching and config.kv_allocation == "paged",
        )
        self.scheduler = Scheduler(config, self.block_manager, self.max_model_len)
        sizes, capture = decode_graph_plan(config.decode_graphs, self.device.type, self.model, config.max_num_seqs)
        self.runner = ModelRunner(self.model, self.model_config, self.device, self.dtype, num_blocks, num_host_blocks,
                                  config.block_size, max_model_len=self.max_model_len, graph_sizes=sizes,
                                  capture_graphs=capture)
        self.eos_token_ids = list(self.tokenizer.eos_token_ids)
        self.sampler = Sampler(self.device, self.eos_token_ids)
        self.output_processor = OutputProcessor(self.tokenizer, self.eos_token_ids, self.max_model_len)
        self.requests: dict[str, Request] = {}
        self._inbox: deque[tuple[str, object]] = deque()
        self._inbox_lock = threading.Lock()
        self._pending_by_tier = dict.fromkeys(TIERS, 0)
        self._pending_work = {t: [0, 0] for t in TIERS}  # inbox: batch slots and prompt tokens per tier
        self._running_slots = dict.fromkeys(TIERS, 0)  # after the last step, for admission estimates
        self._running_prefill = dict.fromkeys(TIERS, 0)
        self.admission = AdmissionEstimator(config, {t: self.scheduler.slot_limit(t) for t in TIERS})
        self._work = threading.Event()
        self._step_lock = threading.RLock()
        self.admission_rejections = dict.fromkeys(TIERS, 0)
        self.num_shed = dict.fromkeys(TIERS, 0)  # queued requests shed: they could no longer keep their promise
        self.step_times = StepTimes()
        self.fanout = FanOut()  # requests split into children that queue for slots one by one
        self.num_failed = 0  # requests the engine failed alone (a fault in their part of a step)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._inbox)

    def wait_for_work(self, timeout: float) -> bool:
        """Block the engine thread until a request or abort arrives (or timeout); True if there is work."""
        if self.has_unfinished_requests():
            return True
        self._work.wait(timeout)
        return self.has_unfinished_requests()

    # ---- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Take in new requests and aborts, schedule, run the model, then process what it produced."""
        with self._step_lock:
            clock = StepClock()
            outputs: dict[str, RequestOutput] = {}
            self._drain_inbox(outputs, clock.start)
            self._shed_late(outputs, clock.start)
            plan = self.scheduler.schedule()
            clock.mark_scheduled()
            self.runner.execute_ops(plan.ops)
            if plan.scheduled:
                batch, logits, sample_rows = self._run(plan.scheduled, clock.start, outputs)
                clock.mark_ran()
                if batch:
                    self._process(batch, sample_rows, logits, outputs)
                clock.mark_processed()
            self.step_times.add(clock)
            self._measure(plan.scheduled, clock.processed - clock.start)
            if not self.fanout.parent_of:
                return list(outputs.values())
            merged, siblings = self.fanout.merge(outputs)
            for child_id in siblings:  # a child failed: its parent has answered, its siblings end next step
                self.abort(child_id)
            return list(merged.values())

    def _measure(self, batch: list[ScheduledSeq], step_s: float) -> None:
        """Feed the admission estimate: a step that ran the model (its time and prefill tokens); slots held."""
        if batch:
            decodes = sum(1 for item in batch if item.num_new_tokens == 1 and item.seq.num_output_tokens > 1)
            self.admission.on_step(step_s, sum(item.num_new_tokens for item in batch) - decodes)
        slots = dict.fromkeys(TIERS, 0)
        prefill = dict.fromkeys(TIERS, 0)  # admitted, not yet prefilled: a new request queues behind it too
        for request in self.scheduler.running:
            slots[request.tier] += request.params.n
            if request.first_token_time is None and request.seqs:
                prefill[request.tier] += max(0, len(request.prompt_ids) - request.seqs[0].num_computed)
        self._running_slots, self._running_prefill = slots, prefill

    def _drain_inbox(self, outputs: dict[str, RequestOutput], now: float) -> None:
        self._work.clear()  # before draining, so an add racing with us sets it again
        while self._inbox:
            with self._inbox_lock:
                kind, item = self._inbox.popleft()
            if kind == "add":
                self._start(item)
                with self._inbox_lock:  # queued now: counted by the scheduler instead
                    self._pending_by_tier[item.tier] -= 1
                    self._pending_work[item.tier][0] -= item.params.n
                    self._pending_work[item.tier][1] -= len(item.prompt_ids)
            elif item in self.requests:
                request = self.requests[item]
                for seq in request.seqs:
                    if not seq.is_finished:
                        seq.status, seq.finish_reason = SeqStatus.FINISHED, "abort"
                self._finish_request(request, outputs, now)

    def _shed_deadline(self, tier: str, request: Request) -> float | None:
        """How long it may wait unstarted: its promise (SLO admission) or its tier's longest wait, the sooner."""
        prompt = len(request.prompt_ids)
        slo = self.admission.shed_deadline_s(tier, prompt) if self.config.admission == "slo" else None
        bound = self.config.tier_max_queue_s.get(tier)
        if bound is not None:  # its first text, not only its start, within the bound as its client sees it: less
            # its own steps, and a margin for the step that notices it and the HTTP path (the overload bench's
            # basic requests overshot a 60 s bound by up to 0.2 s without it)
            bound -= self.admission.own_steps_s(prompt) + min(QUEUE_BOUND_MARGIN_S, 0.1 * bound)
        return min((d for d in (slo, bound) if d is not None), default=None)

    def _shed_late(self, outputs: dict[str, RequestOutput], now: float) -> None:
        """Finish (reason "shed") every queued request that never started and can no longer keep its promise
        (engine/core/admission.py) or has waited its tier's longest (`tier_max_queue_s`); the server answers it 429
        with Retry-After from the tier's estimated queue wait."""
        queues = self.scheduler.queues
        for tier in TIERS:
            late: list[Request] = []
            # waiting and swapped, each in arrival order within the tier: stop at the first that still has time
            for queue in (queues.waiting[tier], queues.swapped[tier]):
                for request in queue:
                    deadline = self._shed_deadline(tier, request)
                    if deadline is None or now - request.arrival_time <= deadline:
                        break
                    # One the client has seen output of keeps its place: its answer is under way. One preempted
                    # before its first text (a byte-level model holds back an incomplete character) has shown
                    # nothing yet, and would otherwise wait out the tiers above it with its first token unsent.
                    group = self.fanout.group_of(request)
                    if request.first_text_time is None and request.sheddable and not (group and group.started):
                        late.append(request)
            if not late:
                continue
            retry = self.admission.retry_after_s(tier, self._queue_snapshot())
            for request in late:
                if request.request_id not in self.requests:
                    continue  # a sibling of one shed before it
                group = self.fanout.group_of(request)
                siblings = [c for c in group.children if c.request_id in self.requests] if group else [request]
                for member in siblings:  # a split request is shed whole: none of it has shown anything yet
                    for seq in member.seqs:
                        if not seq.is_finished:
                            seq.status, seq.finish_reason = SeqStatus.FINISHED, "shed"
                    member.retry_after_s = retry
                    self._finish_request(member, outputs, now)
                self.num_shed[tier] += 1
                self.admission_rejections[tier] += 1  # a 429 like the others, only later
                self.admission.on_outcome(tier, None)  # admitted and then past hope: admission was too lenient

    def _start(self, request: Request) -> None:
        request.seqs.append(self._new_seq(request, request.child_index, list(request.prompt_ids)))
        self.requests[request.request_id] = request
        self.scheduler.add(request)

    def _new_seq(self, request: Request, index: int, token_ids: list[int]) -> Sequence:
        return Sequence(request.request_id, index, token_ids, len(request.prompt_ids), request.params,
                        request.tier, request.arrival_time, status=SeqStatus.RUNNING,
                        generator=self.sampler.generator_for(request.params, index))

    def _run(self, batch: list[ScheduledSeq], step_start: float, outputs: dict[str, RequestOutput]
             ) -> tuple[list[ScheduledSeq], torch.Tensor | None, list[int]]:
        """Forward the batch: logits for the rows that sample, those whose prompt is now all in the cache.

        When the batch's forward pass raises, each sequence runs alone and the requests of those that fail
        alone fail (engine/core/step_faults.py); returns the batch that ran, its logits and its sampling rows.
        """
        for item in batch:
            record_scheduled(self.requests[item.seq.request_id], step_start)
        tables = [self.block_manager.block_table(item.seq.seq_id) for item in batch]
        rows = [i for i, item in enumerate(batch)
                if item.seq.num_computed + item.num_new_tokens == item.seq.num_tokens]
        try:
            return batch, self.runner.run(batch, tables, rows), rows
        except Exception:  # noqa: BLE001 (found below, sequence by sequence)
            by_row, failed = run_apart(self.runner, batch, tables, rows)
        now = time.monotonic()
        for i, error in failed.items():
            if (request := self.requests.get(batch[i].seq.request_id)) is not None:
                self._fail(request, "computing", error, outputs, now)
        ran = [i for i in range(len(batch)) if batch[i].seq.request_id in self.requests]  # a request fails whole
        kept_rows = [i for i in ran if i in by_row]
        position = {i: k for k, i in enumerate(ran)}
        logits = torch.cat([by_row[i] for i in kept_rows]) if kept_rows else None
        return [batch[i] for i in ran], logits, [position[i] for i in kept_rows]

    def _fail(self, request: Request, stage: str, error: BaseException, outputs: dict[str, RequestOutput],
              now: float) -> None:
        """A fault in the request's own part of the step: it alone finishes ("error"), its KV freed now."""
        log_failure(request.request_id, stage, error)
        request.error = failure_message(stage, error)
        for seq in request.seqs:
            if not seq.is_finished:
                seq.status, seq.finish_reason = SeqStatus.FINISHED, "error"
        self.num_failed += 1
        self._finish_request(request, outputs, now)

    # ---- processing a step's outputs ------------------------------------------------------------
    def _process(self, batch: list[ScheduledSeq], sample_rows: list[int], logits: torch.Tensor,
                 outputs: dict[str, RequestOutput]) -> None:
        """Commit the computed KV, sample, append tokens and check stops, then emit the requests' outputs.

        The step's tokens (and their text) exist once sampled and detokenized: that instant, not the end of
        the forward pass, is their time, so sampling and detokenizing count as the engine's (prefill or decode)
        and not as the front end's share of the TTFT.
        """
        self._commit_computed(batch)
        draws = self._draws(batch, sample_rows)
        if not draws:
            return
        rows = [row for row, _ in draws]
        if rows != list(range(logits.shape[0])):  # a copy of the logits only when rows differ (n > 1, forks)
            logits = logits[torch.tensor(rows, device=logits.device)]
        seqs = [seq for _, seq in draws]
        try:
            tokens: list = self.sampler.sample(logits, seqs)
        except Exception:  # noqa: BLE001 (found row by row: only the faulty rows' requests fail)
            tokens = sample_apart(self.sampler, logits, seqs)
        touched = self._append_tokens(seqs, tokens, outputs)
        self._emit(touched, outputs, time.monotonic())

    def _commit_computed(self, batch: list[ScheduledSeq]) -> None:
        """The batch's new tokens are in the KV cache now (full blocks become shareable prefixes)."""
        for item in batch:
            seq = item.seq
            seq.num_computed += item.num_new_tokens
            self.block_manager.commit(seq.seq_id, seq.token_ids, seq.num_computed)

    def _draws(self, batch: list[ScheduledSeq], sample_rows: list[int]) -> list[tuple[int, Sequence]]:
        """(logits row, sequence) for every sequence that samples a token this step.

        A request with n > 1 forks its n sequences off the first one once the prompt is in the cache,
        sharing its blocks (copy-on-write); the children draw from the parent's logits row.
        """
        draws: list[tuple[int, Sequence]] = []
        for logit_row, i in enumerate(sample_rows):
            seq = batch[i].seq
            draws.append((logit_row, seq))
            request = self.requests[seq.request_id]
            if seq.num_output_tokens == 0 and len(request.seqs) < request.params.n:
                draws += [(logit_row, child) for child in self._fork(request, seq)]
        return draws

    def _fork(self, request: Request, parent: Sequence) -> list[Sequence]:
        children = []
        for index in range(1, request.params.n):
            child = self._new_seq(request, index, list(parent.token_ids))
            child.num_computed = parent.num_computed
            child.num_cached_prefix = parent.num_cached_prefix
            child.last_scheduled_step = parent.last_scheduled_step
            self.block_manager.fork(parent.seq_id, child.seq_id)
            request.seqs.append(child)
            children.append(child)
        return children

    def _append_tokens(self, seqs: list[Sequence], tokens: list, outputs: dict[str, RequestOutput]) -> list[Request]:
        """Each sequence takes its token; one that finishes frees its KV at once. Returns the requests touched.

        A token that is an exception (its row failed to sample) or outside the vocabulary, or a fault while it is
        appended, detokenized or checked for stops, fails its request alone."""
        touched: dict[str, Request] = {}
        vocab = self.model_config.vocab_size
        for seq, token in zip(seqs, tokens, strict=True):
            request = self.requests.get(seq.request_id)
            if request is None:
                continue  # failed already (another of its sequences)
            try:
                stage = "sampling"
                if isinstance(token, BaseException):
                    raise token
                if not valid_token(token, vocab):
                    raise ValueError(f"sampled token {token!r} is outside the vocabulary [0, {vocab})")
                stage = "detokenizing or checking stops for"
                reason = self.output_processor.append_token(seq, token)
            except Exception as e:  # noqa: BLE001 (this sequence's fault: its request alone fails)
                touched.pop(seq.request_id, None)
                self._fail(request, stage, e, outputs, time.monotonic())
                continue
            if reason is not None:
                seq.status, seq.finish_reason = SeqStatus.FINISHED, reason
                self.block_manager.free(seq.seq_id)
            touched[seq.request_id] = request
        return list(touched.values())

    def _emit(self, touched: list[Request], outputs: dict[str, RequestOutput], now: float) -> None:
        for request in touched:
            record_token_step(request, now)
            if request.is_finished:
                self._finish_request(request, outputs, now)
            else:
                out = outputs[request.request_id] = build_output(request, finished=False)
                if request.first_text_time is None and any(c.new_text for c in out.outputs):
                    self._first_text(request, now)

    def _first_text(self, request: Request, now: float) -> None:
        request.first_text_time = now
        if request.sheddable:  # under SLO admission: the tail factor learns what it got
            self.admission.on_outcome(request.tier, now - request.arrival_time)

    def _finish_request(self, request: Request, outputs: dict[str, RequestOutput], now: float) -> None:
        request.finished_time = now
        if request.first_text_time is None and all(s.finish_reason not in ("shed", "abort", "error")
                                                   for s in request.seqs):
            self._first_text(request, now)
        if request.first_scheduled_time is not None and all(s.finish_reason not in ("abort", "error")
                                                            for s in request.seqs):
            self.admission.on_finished(now - request.first_scheduled_time)
        self.scheduler.remove(request)
        del self.requests[request.request_id]
        outputs[request.request_id] = build_output(request, finished=True)

    # ---- convenience ----------------------------------------------------------------------------
    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 params: SamplingParams | None = None, tier: str = "standard") -> list[RequestOutput]:
        """Run prompts to completion in one batch; one finished RequestOutput per prompt, in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        ids = [self.add_request(p, params, tier, slo_admission=False) for p in prompts]
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[i] for i in ids]

    def stats(self) -> EngineStats:
        with self._step_lock:
            with self._inbox_lock:
                snapshot = self._queue_snapshot()
            return collect_stats(self, snapshot)

    def check_integrity(self) -> None:
        """Block accounting holds, only live sequences own blocks, the scheduler's queues and the premium
        reservation hold."""
        with self._step_lock:
            self.block_manager.check_integrity()
            self.scheduler.check_integrity()
            live = {s.seq_id for r in self.requests.values() for s in r.seqs if not s.is_finished}
            owners = set(self.block_manager.tables) | set(self.block_manager.host_tables)
            assert owners <= live, f"finished or unknown sequences still own KV blocks: {owners - live}"
