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
        """One token per row. Greedy rows are argmax; the others are drawn together (see _draw)."""
        banned_rows = [(row, self._banned(seq)) for row, seq in enumerate(seqs)
                       if seq.num_output_tokens < seq.params.min_tokens]
        if any(banned for _, banned in banned_rows):
            logits = logits.clone()
            for row, banned in banned_rows:
                if banned:
                    logits[row, banned] = float("-inf")
        out = [0] * len(seqs)
        greedy = [row for row, seq in enumerate(seqs) if seq.params.greedy]
        drawn = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
        if greedy:
            part = logits if len(greedy) == len(seqs) else logits[greedy]
            for row, token in zip(greedy, part.argmax(dim=-1).tolist(), strict=True):
                out[row] = token
        if drawn:
            part = logits if len(drawn) == len(seqs) else logits[drawn]
            for row, token in zip(drawn, self._draw(part, [seqs[r] for r in drawn]), strict=True):
                out[row] = token
        return out

    def _banned(self, seq: Sequence) -> list[int]:
        """Too early to stop: end-of-sequence and stop tokens are not allowed yet."""
        p = seq.params
        return list(p.stop_token_ids) + ([] if p.ignore_eos else self.eos_token_ids)

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Temperature, top-k and top-p per row, then one uniform number per row through the row's CDF.

        Inverse-CDF sampling takes one random number per token, drawn from the request's own generator when it
        is seeded, so a seeded completion is reproducible whatever else shares its batch. torch.multinomial
        row by row took 13.0 ms for 25 rows over a 32,000-word vocabulary on one CPU core; this takes 1.04 ms
        (bench/step_time_bench.py, bench/results/step-time.json).
        """
        temps = torch.tensor([s.params.temperature for s in seqs], dtype=logits.dtype, device=logits.device)
        scores = logits / temps.unsqueeze(1)
        for k in {s.params.top_k for s in seqs if s.params.top_k > 0}:
            rows = [i for i, s in enumerate(seqs) if s.params.top_k == k]
            part = scores[rows]
            kth = torch.topk(part, min(k, part.shape[1]), dim=-1).values[:, -1:]
            scores[rows] = part.masked_fill(part < kth, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        for i, s in enumerate(seqs):
            if s.params.top_p < 1.0:  # a full sort: only the rows that ask for it
                sorted_probs, order = probs[i].sort(descending=True)
                # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
                drop = sorted_probs.cumsum(-1) - sorted_probs >= s.params.top_p
                sorted_probs[drop] = 0.0
                probs[i] = torch.zeros_like(probs[i]).scatter_(0, order, sorted_probs)
        cdf = probs.cumsum(dim=-1)
        total = cdf[:, -1:]
        uniform = torch.rand(len(seqs), 1, dtype=cdf.dtype, device=cdf.device)
        for i, s in enumerate(seqs):
            if s.generator is not None:
                uniform[i] = torch.rand(1, generator=s.generator, dtype=cdf.dtype, device=cdf.device)
        # Strictly below the total, so the first CDF entry above it has positive probability.
        point = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
        return torch.searchsorted(cdf, point, right=True).squeeze(1).tolist()
