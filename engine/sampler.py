"""Picks each sequence's next token from its logits row: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import torch

from engine.sampling import SamplingParams
from engine.sequence import Sequence

SEED_MAX = 2**64 - 1  # torch's seeds: -(2**63) .. 2**64 - 1


def completion_seed(seed: int, index: int) -> int:
    """seed + index, wrapped past 2**64 - 1 (a seed near the top of the range with n > 1 overflowed)."""
    s = seed + index
    return s - 2**64 if s > SEED_MAX else s


class Sampler:
    def __init__(self, device: torch.device, eos_token_ids: list[int]):
        self.device = device
        self.eos_token_ids = eos_token_ids

    def generator_for(self, params: SamplingParams, index: int) -> torch.Generator | None:
        """The random stream of completion `index` of a seeded request (None: the global one).

        Completion i draws from seed + i, so a request's n completions differ and each is reproducible.
        """
        if params.seed is None:
            return None
        generator = torch.Generator(device=self.device)
        generator.manual_seed(completion_seed(params.seed, index))
        return generator

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """One token per row. Greedy rows are argmax; others use temperature, top-k, top-p and their own seed."""
        logits = logits.clone()
        for row, seq in enumerate(seqs):
            p = seq.params
            if seq.num_output_tokens < p.min_tokens:
                # Too early to stop: end-of-sequence and stop tokens are not allowed yet.
                banned = list(p.stop_token_ids) + ([] if p.ignore_eos else self.eos_token_ids)
                if banned:
                    logits[row, banned] = float("-inf")
        greedy = logits.argmax(dim=-1).tolist()
        out: list[int] = []
        for row, seq in enumerate(seqs):
            p = seq.params
            if p.greedy:
                out.append(greedy[row])
                continue
            scores = logits[row] / p.temperature
            if p.top_k > 0:
                kth = torch.topk(scores, min(p.top_k, scores.numel())).values[-1]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            if p.top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
                drop = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
                sorted_probs[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            out.append(int(torch.multinomial(probs, 1, generator=seq.generator).item()))
        return out
