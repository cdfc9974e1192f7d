"""The engine: requests in, tokens out. `step()` = schedule -> run the model -> process outputs.

`add_request` and `abort` are safe to call from any thread (the server's event loop); they only queue work
for the thread that calls `step()`.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from engine.block_manager import BlockManager
from engine.config import TIERS, EngineConfig, normalize_tier
from engine.errors import InvalidRequestError, PromptTooLongError, QueueFullError
from engine.loader import load_model
from engine.model_runner import ModelRunner, sample
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Request, SeqStatus, Sequence


@dataclass
class Timing:
    """Where a request's time went, from the engine's own clock (time.monotonic())."""

    queue_ms: float
    prefill_ms: float
    decode_ms: float
    tier: str
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float
    token_times: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"queue_ms": round(self.queue_ms, 3), "prefill_ms": round(self.prefill_ms, 3),
                "decode_ms": round(self.decode_ms, 3), "tier": self.tier}


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]  # everything generated so far
    text: str  # detokenized so far, stop strings trimmed, incomplete UTF-8 held back
    new_token_ids: list[int]  # generated in this step
    new_text: str
    finish_reason: str | None  # None while running, else "stop" | "length" | "abort"


@dataclass
class RequestOutput:
    request_id: str
    tier: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    timing: Timing | None  # set once finished
    num_cached_tokens: int

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text


@dataclass
class EngineStats:
    kv_usage: float
    fragmentation: float
    num_kv_blocks: int
    used_kv_blocks: int
    blocks_saved_by_sharing: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_running: int  # sequences in the batch
    num_waiting: int
    num_swapped: int
    batch_fill_ratio: float  # running sequences / batch slots
    num_preemptions: int  # cumulative
    num_swap_outs: int  # cumulative; preemptions that were not swaps dropped KV to recompute
    admission_rejections: dict[str, int]
    waiting_by_tier: dict[str, int]
    running_by_tier: dict[str, int]
    kv_usage_by_tier: dict[str, float]  # blocks referenced by the tier's running sequences / all blocks
    steps: int
    schedule_time_s: float  # in the scheduler, cumulative
    process_time_s: float  # sampling bookkeeping, stop checks, detokenizing, outputs, cumulative
    step_time_s: float  # whole steps, cumulative


_request_ids = itertools.count()


def stop_prefix_overlap(text: str, stops: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


class Engine:
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
        self.model_name = config.model
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        num_blocks = config.num_kv_blocks or math.ceil(config.kv_cache_tokens / config.block_size)
        num_host_blocks = num_blocks if config.num_host_blocks is None else config.num_host_blocks
        self.block_manager = BlockManager(
            num_blocks, config.block_size, num_host_blocks,
            enable_prefix_caching=config.enable_prefix_caching and config.kv_allocation == "paged",
        )
        self.scheduler = Scheduler(config, self.block_manager, self.max_model_len)
        self.runner = ModelRunner(self.model, self.model_config, self.device, self.dtype,
                                  num_blocks, num_host_blocks, config.block_size)
        self.eos_token_ids = list(self.tokenizer.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self._inbox: deque[tuple[str, object]] = deque()
        self._inbox_lock = threading.Lock()
        self._pending_by_tier = dict.fromkeys(TIERS, 0)
        self._work = threading.Event()
        self._step_lock = threading.RLock()
        self.admission_rejections = dict.fromkeys(TIERS, 0)
        self._schedule_time = 0.0
        self._process_time = 0.0
        self._step_time = 0.0

    # ---- requests in ----------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    tier: str | None = "standard", request_id: str | None = None) -> str:
        params = params or SamplingParams()
        try:
            tier = normalize_tier(tier)
        except ValueError as e:
            raise InvalidRequestError(str(e), "service_tier") from None
        prompt_ids = self._prompt_ids(prompt)
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise PromptTooLongError(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(prompt_ids)} tokens and max_tokens asks for {params.max_tokens} more",
                "prompt" if len(prompt_ids) >= self.max_model_len else "max_tokens",
            )
        request_id = request_id or f"req-{next(_request_ids)}"
        request = Request(request_id, prompt_ids, params, tier)
        limit = self.config.max_waiting_per_tier.get(tier, 0)
        with self._inbox_lock:
            if self.scheduler.num_waiting(tier) + self._pending_by_tier[tier] >= limit:
                self.admission_rejections[tier] += 1
                raise QueueFullError(tier, limit)
            self._pending_by_tier[tier] += 1
            self._inbox.append(("add", request))
        self._work.set()
        return request_id

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is empty", "prompt")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list | tuple) and all(isinstance(t, int) and not isinstance(t, bool)
                                                      for t in prompt):
            ids = list(prompt)
            vocab = self.model_config.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidRequestError(f"token id {bad[0]} is out of range [0, {vocab})", "prompt")
        else:
            raise InvalidRequestError("prompt must be a string or a list of token ids", "prompt")
        if not ids:
            raise InvalidRequestError("prompt is empty", "prompt")
        return ids

    def abort(self, request_id: str) -> None:
        with self._inbox_lock:
            self._inbox.append(("abort", request_id))
        self._work.set()

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
        with self._step_lock:
            t0 = time.monotonic()
            outputs: dict[str, RequestOutput] = {}
            self._drain_inbox(outputs, t0)
            sched = self.scheduler.schedule()
            t1 = time.monotonic()
            self.runner.execute_ops(sched.ops)
            batch = sched.scheduled
            t2 = t3 = t1
            if batch:
                for item in batch:
                    request = self.requests[item.seq.request_id]
                    if request.first_scheduled_time is None:
                        request.first_scheduled_time = t0
                tables = [self.block_manager.block_table(item.seq.seq_id) for item in batch]
                rows = [i for i, item in enumerate(batch)
                        if item.seq.num_computed + item.num_new_tokens == item.seq.num_tokens]
                logits = self.runner.run(batch, tables, rows)
                t2 = time.monotonic()
                self._process(batch, rows, logits, outputs, t2)
                t3 = time.monotonic()
            self._schedule_time += t1 - t0
            self._process_time += t3 - t2
            self._step_time += t3 - t0
            return list(outputs.values())

    def _drain_inbox(self, outputs: dict[str, RequestOutput], now: float) -> None:
        self._work.clear()  # before draining, so an add racing with us sets it again
        while self._inbox:
            with self._inbox_lock:
                kind, item = self._inbox.popleft()
                if kind == "add":
                    self._pending_by_tier[item.tier] -= 1
            if kind == "add":
                self._start(item)
            elif item in self.requests:
                request = self.requests[item]
                for seq in request.seqs:
                    if not seq.is_finished:
                        seq.status, seq.finish_reason = SeqStatus.FINISHED, "abort"
                self._finish_request(request, outputs, now)

    def _start(self, request: Request) -> None:
        request.seqs.append(self._new_seq(request, 0, list(request.prompt_ids)))
        self.requests[request.request_id] = request
        self.scheduler.add(request)

    def _new_seq(self, request: Request, index: int, token_ids: list[int]) -> Sequence:
        generator = None
        if request.params.seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(request.params.seed + index)
        return Sequence(request.request_id, index, token_ids, len(request.prompt_ids), request.params,
                        request.tier, request.arrival_time, status=SeqStatus.RUNNING, generator=generator)

    def _process(self, batch, rows: list[int], logits: torch.Tensor, outputs: dict[str, RequestOutput],
                 now: float) -> None:
        for item in batch:
            seq = item.seq
            seq.num_computed += item.num_new_tokens
            self.block_manager.commit(seq.seq_id, seq.token_ids, seq.num_computed)
        # Which logits row each sampled sequence draws from: a request with n > 1 forks its n sequences
        # off the first one once the prompt is in the cache, sharing its blocks (copy-on-write).
        draws: list[tuple[int, Sequence]] = []
        for logit_row, i in enumerate(rows):
            seq = batch[i].seq
            draws.append((logit_row, seq))
            request = self.requests[seq.request_id]
            if seq.num_output_tokens == 0 and len(request.seqs) < request.params.n:
                for index in range(1, request.params.n):
                    child = self._new_seq(request, index, list(seq.token_ids))
                    child.num_computed = seq.num_computed
                    child.num_cached_prefix = seq.num_cached_prefix
                    child.last_scheduled_step = seq.last_scheduled_step
                    self.block_manager.fork(seq.seq_id, child.seq_id)
                    request.seqs.append(child)
                    draws.append((logit_row, child))
        if not draws:
            return
        picked = logits[torch.tensor([r for r, _ in draws], device=logits.device)]
        tokens = sample(picked, [s for _, s in draws], self.eos_token_ids)
        touched: dict[str, Request] = {}
        for (_, seq), token in zip(draws, tokens, strict=True):
            request = self.requests[seq.request_id]
            seq.token_ids.append(token)
            if request.first_token_time is None:
                request.first_token_time = now
            self._check_stop(seq, token)
            touched[request.request_id] = request
        for request in touched.values():
            request.token_times.append(now)
            if request.is_finished:
                self._finish_request(request, outputs, now)
            else:
                outputs[request.request_id] = self._output(request, finished=False)

    def _check_stop(self, seq: Sequence, token: int) -> None:
        p = seq.params
        n_out = seq.num_output_tokens
        reason = None
        if n_out >= p.min_tokens and (token in p.stop_token_ids
                                      or (not p.ignore_eos and token in self.eos_token_ids)):
            reason = "stop"
        elif n_out >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = "length"
        checked = len(seq.text)
        seq.text += self._detokenize_step(seq, final=reason is not None)
        if reason is None and p.stop and n_out >= p.min_tokens:
            # Only the tail can hold a new match: the text before it was already checked.
            start = max(0, checked - max(len(s) for s in p.stop) + 1)
            hits = [i for i in (seq.text.find(s, start) for s in p.stop) if i >= 0]
            if hits:
                seq.text, reason = seq.text[: min(hits)], "stop"
        if reason is not None:
            seq.status, seq.finish_reason = SeqStatus.FINISHED, reason
            self.block_manager.free(seq.seq_id)

    def _detokenize_step(self, seq: Sequence, final: bool) -> str:
        """Text the newest token adds, decoding only a short window (constant work per token).

        The window starts a few tokens back so tokenizers that merge across token boundaries (leading
        spaces, multi-byte characters split over byte tokens) still render right; text that ends in an
        incomplete UTF-8 sequence is held back until the bytes that complete it arrive.
        """
        ids = seq.output_ids
        before = self.tokenizer.decode(ids[seq.prefix_offset : seq.read_offset])
        after = self.tokenizer.decode(ids[seq.prefix_offset :])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(ids)
        return after[len(before) :]

    def _output(self, request: Request, finished: bool) -> RequestOutput:
        completions = []
        for seq in request.seqs:
            new_ids = seq.output_ids[seq.num_emitted_tokens :]
            visible = len(seq.text)
            if not seq.is_finished:
                # Hold back a tail that may still grow into a stop string: it must never be streamed.
                visible -= stop_prefix_overlap(seq.text, seq.params.stop)
            new_text = seq.text[seq.emitted_text_len : visible]
            seq.num_emitted_tokens = seq.num_output_tokens
            seq.emitted_text_len = max(seq.emitted_text_len, visible)
            completions.append(CompletionOutput(seq.index, list(seq.output_ids), seq.text[:visible], new_ids,
                                                new_text, seq.finish_reason))
        return RequestOutput(request.request_id, request.tier, request.prompt_ids, completions, finished,
                             self._timing(request) if finished else None,
                             request.seqs[0].num_cached_prefix if request.seqs else 0)

    def _timing(self, request: Request) -> Timing:
        end = request.finished_time or time.monotonic()
        scheduled = request.first_scheduled_time or end
        first = request.first_token_time or end
        return Timing(
            queue_ms=(scheduled - request.arrival_time) * 1e3,
            prefill_ms=(first - scheduled) * 1e3,
            decode_ms=(end - first) * 1e3,
            tier=request.tier,
            arrival_time=request.arrival_time,
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time,
            finished_time=end,
            token_times=list(request.token_times),
        )

    def _finish_request(self, request: Request, outputs: dict[str, RequestOutput], now: float) -> None:
        request.finished_time = now
        self.scheduler.remove(request)
        del self.requests[request.request_id]
        outputs[request.request_id] = self._output(request, finished=True)

    # ---- convenience ----------------------------------------------------------------------------
    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 params: SamplingParams | None = None, tier: str = "standard") -> list[RequestOutput]:
        """Run prompts to completion in one batch; one finished RequestOutput per prompt, in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        ids = [self.add_request(p, params, tier) for p in prompts]
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[i] for i in ids]

    def stats(self) -> EngineStats:
        with self._step_lock:
            kv = self.block_manager.stats()
            sched = self.scheduler
            running_by_tier = dict.fromkeys(TIERS, 0)
            blocks_by_tier: dict[str, set[int]] = {t: set() for t in TIERS}
            for request in sched.running:
                running_by_tier[request.tier] += sum(not s.is_finished for s in request.seqs)
                for seq in request.seqs:
                    blocks_by_tier[request.tier].update(self.block_manager.tables.get(seq.seq_id, ()))
            num_running = sum(running_by_tier.values())
            return EngineStats(
                kv_usage=kv.usage,
                fragmentation=kv.fragmentation,
                num_kv_blocks=kv.num_blocks,
                used_kv_blocks=kv.used_blocks,
                blocks_saved_by_sharing=kv.blocks_saved_by_sharing,
                prefix_query_tokens=kv.prefix_query_tokens,
                prefix_hit_tokens=kv.prefix_hit_tokens,
                num_running=num_running,
                num_waiting=sched.num_waiting() + sum(self._pending_by_tier.values()),
                num_swapped=sched.num_swapped(),
                batch_fill_ratio=num_running / self.config.max_num_seqs,
                num_preemptions=sched.num_preemptions,
                num_swap_outs=sched.num_swap_outs,
                admission_rejections=dict(self.admission_rejections),
                waiting_by_tier={t: len(sched.waiting[t]) + self._pending_by_tier[t] for t in TIERS},
                running_by_tier=running_by_tier,
                kv_usage_by_tier={t: len(b) / kv.num_blocks for t, b in blocks_by_tier.items()},
                steps=sched.step_count,
                schedule_time_s=self._schedule_time,
                process_time_s=self._process_time,
                step_time_s=self._step_time,
            )

    def check_integrity(self) -> None:
        """Block accounting holds, and only live sequences own blocks."""
        with self._step_lock:
            self.block_manager.check_integrity()
            live = {s.seq_id for r in self.requests.values() for s in r.seqs if not s.is_finished}
            owners = set(self.block_manager.tables) | set(self.block_manager.host_tables)
            assert owners <= live, f"finished or unknown sequences still own KV blocks: {owners - live}"
