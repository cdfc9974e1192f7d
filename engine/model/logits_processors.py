"""What a request changes in its logits row before a token is picked: stops banned before `min_tokens`,
`logit_bias`, and vLLM's three penalties (repetition over the prompt and output, frequency and presence over
the output). Rows that ask for none of these cost nothing; the caller's logits are never written to.
"""

from __future__ import annotations

import torch

from engine.request.sequence import Sequence


def banned_tokens(seq: Sequence, eos_token_ids: list[int]) -> list[int]:
    """Too early to stop: end-of-sequence and stop tokens are not allowed yet (empty once min_tokens are out)."""
    p = seq.params
    if seq.num_output_tokens >= p.min_tokens:
        return []
    return list(p.stop_token_ids) + ([] if p.ignore_eos else eos_token_ids)


def _penalize(row: torch.Tensor, seq: Sequence) -> None:
    """vLLM's penalties on one logits row, in place."""
    p, vocab = seq.params, row.shape[0]
    if p.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=row.device)
        seen[torch.tensor([t for t in seq.token_ids if t < vocab], dtype=torch.long, device=row.device)] = True
        scaled = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
        row.copy_(torch.where(seen, scaled, row))
    if (p.frequency_penalty or p.presence_penalty) and seq.num_output_tokens:
        out = torch.tensor(seq.output_ids, dtype=torch.long, device=row.device)
        counts = torch.bincount(out, minlength=vocab)[:vocab].to(row.dtype)
        row.sub_(counts * p.frequency_penalty + (counts > 0).to(row.dtype) * p.presence_penalty)


def apply_logits_processors(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: list[int]) -> torch.Tensor:
    """`logits` (one row per sequence) with each sequence's bans, biases and penalties; a copy when any apply."""
    work = [(row, seq, banned_tokens(seq, eos_token_ids)) for row, seq in enumerate(seqs)]
    work = [(row, seq, banned) for row, seq, banned in work if banned or seq.params.logit_bias or seq.params.penalized]
    if not work:
        return logits
    logits = logits.clone()
    vocab = logits.shape[1]
    for row, seq, banned in work:
        p = seq.params
        if p.penalized:
            _penalize(logits[row], seq)
        if p.logit_bias:
            ids = [t for t in p.logit_bias if t < vocab]
            if ids:
                bias = torch.tensor([p.logit_bias[t] for t in ids], dtype=logits.dtype, device=logits.device)
                logits[row, ids] += bias
        banned = [t for t in banned if t < vocab]
        if banned:
            logits[row, banned] = float("-inf")
    return logits
