"""What one engine step costs: the theory's roofline, or a linear model fitted to a target's measured steps.

A step runs some sequences (``n_seq``) through the model: ``n_tok`` new tokens (one per decoding sequence,
a chunk per prefilling one), reading ``kv_tokens`` cached tokens' K and V, with ``attn_pairs`` query-key
pairs of attention. Every argument may be a numpy array (the simulator prices runs of decode steps at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from loadgen.planning.hardware import Accelerator
from loadgen.planning.model_shape import ModelShape


class StepModel(Protocol):
    def step_s(self, n_seq, n_tok, kv_tokens, attn_pairs): ...

    def as_dict(self) -> dict: ...


@dataclass(frozen=True)
class Roofline:
    """Step time = fixed overhead + max(memory traffic / bandwidth, FLOPs / compute), at the peak figures
    (an optimistic bound: real kernels reach a share of them). Tensor parallelism splits weights, KV and
    FLOPs over ``tp`` devices; its all-reduces are not priced."""

    shape: ModelShape
    hw: Accelerator
    tp: int = 1
    overhead_s: float = 0.0  # launch and scheduling time no roofline sees

    def step_s(self, n_seq, n_tok, kv_tokens, attn_pairs):
        s = self.shape
        traffic = (s.weights_bytes + s.kv_bytes_per_token * (np.asarray(kv_tokens) + n_tok)) / self.tp
        flops = (s.matmul_flops_per_token * np.asarray(n_tok) + s.attention_flops_per_pair * np.asarray(attn_pairs))
        return self.overhead_s + np.maximum(traffic / self.hw.bandwidth_bytes_s, flops / self.tp / self.hw.flops)

    def as_dict(self) -> dict:
        return {"kind": "roofline", "hardware": self.hw.as_dict(), "tp": self.tp, "overhead_s": self.overhead_s}


@dataclass(frozen=True)
class LinearStep:
    """Step time = const + per_seq x sequences + per_token x new tokens + per_pair x attention pairs, fitted
    to measured steps (``step_timing.fit``)."""

    const_s: float
    per_seq_s: float
    per_token_s: float
    per_pair_s: float

    def step_s(self, n_seq, n_tok, kv_tokens, attn_pairs):
        return (self.const_s + self.per_seq_s * np.asarray(n_seq) + self.per_token_s * np.asarray(n_tok)
                + self.per_pair_s * np.asarray(attn_pairs))

    def as_dict(self) -> dict:
        return {"kind": "linear", "const_s": self.const_s, "per_seq_s": self.per_seq_s,
                "per_token_s": self.per_token_s, "per_pair_s": self.per_pair_s}


@dataclass(frozen=True)
class ConstantStep:
    """Every step takes the same time: the queueing-theory case (M/D/c) the simulator is checked against."""

    step: float

    def step_s(self, n_seq, n_tok, kv_tokens, attn_pairs):
        return np.full(np.shape(kv_tokens), self.step) if np.ndim(kv_tokens) else self.step

    def as_dict(self) -> dict:
        return {"kind": "constant", "step_s": self.step}


def decode_step_s(model: StepModel, batch: float, context: float) -> float:
    """A pure decode step of ``batch`` sequences of ``context`` tokens each."""
    return float(model.step_s(batch, batch, batch * context, batch * context))


def prefill_steps(tokens: int, chunk: int | None) -> list[tuple[int, int, int, float]]:
    """One request's prefill alone as its steps' (sequences, new tokens, KV tokens, attention pairs): chunks
    of at most ``chunk`` tokens (None: the whole prompt in one step), each after the ``done`` computed before
    it attending to n x (done + (n + 1) / 2) pairs."""
    step = chunk if chunk else max(tokens, 1)
    out, done = [], 0
    while done < tokens:
        n = min(step, tokens - done)
        out.append((1, n, done + n, n * (done + (n + 1) / 2)))
        done += n
    return out


def prefill_s(model: StepModel, tokens: int, chunk: int) -> float:
    """One request's prefill alone, in chunks of at most ``chunk`` tokens (one step each)."""
    return sum(float(model.step_s(*s)) for s in prefill_steps(tokens, chunk))
