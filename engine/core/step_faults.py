"""A fault in one sequence's part of an engine step, found and kept to its own request.

The engine runs a step's forward pass and its sampling for the whole batch at once. When either raises, it does
that part again one sequence at a time (`run_apart`, `sample_apart`): the sequences that fail alone are the
faulty ones, and only their requests fail; the others' results are exactly those of the batch (a sequence's
sampling never depends on its neighbours; its forward pass writes the same KV again). A sampled token outside the
vocabulary, and an error while a token is appended, detokenized or checked for stops, fail only its request too.
A fault that cannot be pinned on a sequence (scheduling, KV block moves) still fails the step, and the engine
thread fails every request in flight (engine/server/engine_loop.py).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger("engine.server")


def failure_message(stage: str, error: BaseException) -> str:
    """What the failed request's client reads (its own error event or 500): where, and the exception's type."""
    return (f"the engine failed while {stage} this request ({type(error).__name__}); the other requests in its "
            f"batch were not affected")


def log_failure(request_id: str, stage: str, error: BaseException) -> None:
    logger.error("request %s failed alone while %s: %r", request_id, stage, error, exc_info=error)


def valid_token(token: Any, vocab_size: int) -> bool:
    return isinstance(token, int) and 0 <= token < vocab_size


def sample_apart(sampler: Any, logits: torch.Tensor, seqs: list) -> list[int | BaseException]:
    """Each row sampled on its own: its token, or the exception sampling it raised."""
    tokens: list[int | BaseException] = []
    for row, seq in enumerate(seqs):
        try:
            tokens.append(sampler.sample(logits[row : row + 1], [seq])[0])
        except Exception as e:  # noqa: BLE001 (any fault of this row fails its request alone)
            tokens.append(e)
    return tokens


def run_apart(runner: Any, batch: list, tables: list[list[int]], rows: list[int]
              ) -> tuple[dict[int, torch.Tensor], dict[int, BaseException]]:
    """The batch's forward pass one sequence at a time, after the whole batch's raised: the logits row of each
    batch position that ran and samples, and the exception of each position that failed alone."""
    sampling = set(rows)
    logits: dict[int, torch.Tensor] = {}
    failed: dict[int, BaseException] = {}
    for i, (item, table) in enumerate(zip(batch, tables, strict=True)):
        try:
            out = runner.run([item], [table], [0] if i in sampling else [])
        except Exception as e:  # noqa: BLE001 (any fault of this sequence fails its request alone)
            failed[i] = e
            continue
        if i in sampling:
            logits[i] = out
    return logits, failed
