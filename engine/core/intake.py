"""The engine's intake (`RequestIntake`, a part of `Engine`): a request checked, then refused at once or queued
for the engine thread; aborts.

`add_request` and `abort` are safe to call from any thread (the server's event loop); they only queue work for
the thread that calls `step()`. A request refused here never reaches the scheduler: a malformed prompt, one
longer than the context, one that could never fit the KV pool even alone (HTTP 400 with the reason), and,
refused by admission (engine/core/admission_control.py), a full tier queue or a TTFT promise the queue would
break (HTTP 429 with the engine's own estimate of when there is room). A request whose n sequences could never
run together is split into n children (engine/core/fanout.py).
"""

from __future__ import annotations

import itertools

from engine.request.errors import CapacityExceededError, InvalidRequestError, PromptTooLongError
from engine.request.sampling import SamplingParams
from engine.request.sequence import Request
from engine.request.tiers import DEFAULT_TIER, normalize_tier
from engine.scheduler.block_manager import kv_blocks_alone

_request_ids = itertools.count()


class RequestIntake:
    """`Engine`'s intake methods (the attributes they use are set up in `Engine.__init__`)."""

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    tier: str | None = DEFAULT_TIER, request_id: str | None = None,
                    slo_admission: bool = True) -> str:
        """Queue a request (any thread); returns its id.

        `slo_admission=False` (offline work, `generate`) skips SLO-aware admission for it: neither refused at
        arrival nor shed while it waits; the queue bound still holds.
        """
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
        split = self._needs_children(len(prompt_ids), params, tier)
        self._check_fits_alone(len(prompt_ids), params.n if not split else 1, params, tier)
        request_id = request_id or f"req-{next(_request_ids)}"
        with self._inbox_lock:
            self.admission.admit(tier, len(prompt_ids), slo_admission)  # raises the 429s
            if split:
                requests = self.fanout.split(request_id, prompt_ids, params, tier, slo_admission)
            else:
                requests = [Request(request_id, prompt_ids, params, tier, sheddable=slo_admission)]
            for request in requests:
                self.admission.entered_inbox(request)
                self._inbox.append(("add", request))
        self._work.set()
        return request_id

    def _needs_children(self, prompt_len: int, params: SamplingParams, tier: str) -> bool:
        """Its n sequences could never run together (batch slots, or n copies of its KV), one alone could."""
        if params.n == 1:
            return False
        sched, bs = self.scheduler, self.config.block_size
        return params.n > sched.slot_limit(tier) or (
            kv_blocks_alone(prompt_len, params.n, params.max_tokens, bs) > sched.kv_limit(tier))

    def _check_fits_alone(self, prompt_len: int, n: int, params: SamplingParams, tier: str) -> None:
        """Refuse up front what could never run even alone (the scheduler's progress guarantee needs it).

        `n` sequences together (1 for a request split into children).
        """
        sched, bs = self.scheduler, self.config.block_size
        slots = sched.slot_limit(tier)
        if n > slots:  # only when the tier has no slot at all: wider requests are split
            raise CapacityExceededError(
                f"n = {n} completions need {n} batch slots, but the {tier} tier may use only "
                f"{slots} (max_num_seqs {self.config.max_num_seqs}); lower n", "n")
        blocks, limit = kv_blocks_alone(prompt_len, n, params.max_tokens, bs), sched.kv_limit(tier)
        if blocks > limit:
            share = "" if limit == self.block_manager.num_blocks else f" the {tier} tier may use"
            raise CapacityExceededError(
                f"this request needs up to {blocks} KV-cache blocks of {bs} tokens ({n} completion(s) of "
                f"{prompt_len} prompt + {params.max_tokens} max_tokens tokens) but the KV cache has only "
                f"{limit}{share}; lower max_tokens or the prompt", "max_tokens")

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
        """End a request (any thread): a split request's children all end."""
        ids = self.fanout.children_ids(request_id) or [request_id]
        with self._inbox_lock:
            self._inbox.extend(("abort", rid) for rid in ids)
        self._work.set()
