"""The engine: requests in, tokens out. `step()` = schedule -> run the model -> process outputs.

`add_request` and `abort` (engine/core/intake.py) are safe to call from any thread (the server's event loop);
they only queue work for the thread that calls `step()`. Whether a request is accepted, and when a queued one
is shed, is admission's (engine/core/admission_control.py). A fault in one sequence's part of a step (its
forward pass, sampling, detokenizing, stop checks) fails its request alone: finish reason "error" with the
reason in its own output, its KV freed at once; every other sequence of the batch goes on untouched
(engine/core/step_faults.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

import torch

from engine.core.admission_control import AdmissionControl
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
from engine.request.config import EngineConfig
from engine.request.outputs import EngineStats, RequestOutput
from engine.request.sampling import SamplingParams
from engine.request.sequence import Request, SeqStatus, Sequence
from engine.request.tiers import DEFAULT_TIER, TIERS
from engine.request.timing import StepClock, StepTimes, record_scheduled, record_token_step
from engine.scheduler.block_manager import BlockManager
from engine.scheduler.scheduler import ScheduledSeq, Scheduler


class Engine(RequestIntake):
    """Requests in (`add_request`, `abort`: engine/core/intake.py), outputs out of `step()`.

    It holds the scheduler, the model runner, the sampler and the output processor, and `admission`
    (engine/core/admission_control.py), which accepts or refuses each request and sheds the queued ones that
    can no longer keep their promise.
    """

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
        self.packed_linears = 0
        if self.device.type == "cpu" and config.pack_cpu_weights:
            self.packed_linears = pack_linears(self.model)
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
        self.runner = ModelRunner(
            self.model, self.model_config, self.device, self.dtype, num_blocks, num_host_blocks, config.block_size,
            max_model_len=self.max_model_len, graph_sizes=sizes, capture_graphs=capture,
        )
        self.eos_token_ids = list(self.tokenizer.eos_token_ids)
        self.sampler = Sampler(self.device, self.eos_token_ids)
        self.output_processor = OutputProcessor(self.tokenizer, self.eos_token_ids, self.max_model_len)
        self.requests: dict[str, Request] = {}
        self._inbox: deque[tuple[str, object]] = deque()
        self._inbox_lock = threading.Lock()
        self._work = threading.Event()
        self._step_lock = threading.RLock()
        self.step_times = StepTimes()
        self.fanout = FanOut()  # requests split into children that queue for slots one by one
        # accepts or refuses requests (429), sheds the queued ones past their promise; feeds on the steps
        self.admission = AdmissionControl(config, self.scheduler, self.fanout)
        self.num_failed = 0  # requests the engine failed alone (a fault in their part of a step)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._inbox)

    def wait_for_work(self, timeout: float) -> bool:
        """Block the engine thread until a request or abort arrives (or timeout); True if there is work."""
        if self.has_unfinished_requests():
            return True
        self._work.wait(timeout)
        return self.has_unfinished_requests()

    # ---- the step --------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Take in new requests and aborts, shed the late, schedule, run the model, then process what it produced."""
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
            self.admission.on_step(plan.scheduled, clock.processed - clock.start)
            return self._merged(outputs)

    def _merged(self, outputs: dict[str, RequestOutput]) -> list[RequestOutput]:
        """The step's outputs as their clients see them: a split request's children merged into their parent."""
        if not self.fanout.parent_of:
            return list(outputs.values())
        merged, siblings = self.fanout.merge(outputs)
        for child_id in siblings:  # a child failed: its parent has answered, its siblings end next step
            self.abort(child_id)
        return list(merged.values())

    # ---- before the schedule: new requests, aborts, the late -------------------------------------
    def _drain_inbox(self, outputs: dict[str, RequestOutput], now: float) -> None:
        self._work.clear()  # before draining, so an add racing with us sets it again
        while self._inbox:
            with self._inbox_lock:
                kind, item = self._inbox.popleft()
            if kind == "add":
                self._start(item)
                with self._inbox_lock:
                    self.admission.left_inbox(item)
            elif item in self.requests:
                self._end(self.requests[item], "abort", outputs, now)

    def _shed_late(self, outputs: dict[str, RequestOutput], now: float) -> None:
        """Finish (reason "shed") the queued requests that admission gives up on (engine/core/admission_control.py).

        The server answers each 429, with Retry-After from its tier's estimated queue wait.
        """
        for tier in TIERS:
            late = self.admission.late_requests(tier, now)
            if not late:
                continue
            retry = self.admission.retry_after_s(tier)
            for request in late:
                if request.request_id not in self.requests:
                    continue  # a sibling of one shed before it
                group = self.fanout.group_of(request)
                siblings = [c for c in group.children if c.request_id in self.requests] if group else [request]
                for member in siblings:  # a split request is shed whole: none of it has shown anything yet
                    member.retry_after_s = retry
                    self._end(member, "shed", outputs, now)
                self.admission.on_shed(tier)

    def _start(self, request: Request) -> None:
        request.seqs.append(self._new_seq(request, request.child_index, list(request.prompt_ids)))
        self.requests[request.request_id] = request
        self.scheduler.add(request)

    def _new_seq(self, request: Request, index: int, token_ids: list[int]) -> Sequence:
        return Sequence(request.request_id, index, token_ids, len(request.prompt_ids), request.params,
                        request.tier, request.arrival_time, status=SeqStatus.RUNNING,
                        generator=self.sampler.generator_for(request.params, index))

    # ---- running the model -----------------------------------------------------------------------
    def _run(
        self, batch: list[ScheduledSeq], step_start: float, outputs: dict[str, RequestOutput]
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
        self.num_failed += 1
        self._end(request, "error", outputs, now)

    # ---- processing a step's outputs -------------------------------------------------------------
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
        appended, detokenized or checked for stops, fails its request alone.
        """
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
        self.admission.on_first_text(request, now)

    # ---- a request's end -------------------------------------------------------------------------
    def _end(self, request: Request, reason: str, outputs: dict[str, RequestOutput], now: float) -> None:
        """End the request with `reason` (abort, shed, error) on every sequence still going."""
        for seq in request.seqs:
            if not seq.is_finished:
                seq.status, seq.finish_reason = SeqStatus.FINISHED, reason
        self._finish_request(request, outputs, now)

    def _finish_request(self, request: Request, outputs: dict[str, RequestOutput], now: float) -> None:
        request.finished_time = now
        completed = all(s.finish_reason not in ("shed", "abort", "error") for s in request.seqs)
        if request.first_text_time is None and completed:  # its last output is its first text
            self._first_text(request, now)
        self.admission.on_finished(request, now)
        self.scheduler.remove(request)
        del self.requests[request.request_id]
        outputs[request.request_id] = build_output(request, finished=True)

    # ---- convenience -----------------------------------------------------------------------------
    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 params: SamplingParams | None = None, tier: str = DEFAULT_TIER) -> list[RequestOutput]:
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
                snapshot = self.admission.snapshot()
            return collect_stats(self, snapshot)

    def check_integrity(self) -> None:
        """Assert the engine's invariants: block accounting, only live sequences owning blocks, the scheduler's
        queues and its premium reservation.
        """
        with self._step_lock:
            self.block_manager.check_integrity()
            self.scheduler.check_integrity()
            live = {s.seq_id for r in self.requests.values() for s in r.seqs if not s.is_finished}
            owners = set(self.block_manager.tables) | set(self.block_manager.host_tables)
            assert owners <= live, f"finished or unknown sequences still own KV blocks: {owners - live}"
