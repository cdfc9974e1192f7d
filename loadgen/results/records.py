"""The per-request record (docs/ARCHITECTURE.md, "Contracts"), appended to ``requests.jsonl`` as each request ends."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("ok", "http_error", "rejected", "timeout", "conn_error", "stream_error", "cancelled")


@dataclass(slots=True)
class RequestRecord:
    id: str
    stage: int
    tier: str | None
    scheduled_s: float  # intended send time; every latency is measured from here
    sent_s: float | None = None
    first_token_s: float | None = None  # the first token of any kind (reasoning or answer)
    token_s: list[float] = field(default_factory=list)  # arrival time of each chunk that carried tokens
    done_s: float | None = None
    prompt_tokens: int | None = None  # as the server counted them (usage); None when it sent no usage
    output_tokens: int | None = None
    status: str = "ok"
    http_status: int | None = None
    error: str | None = None
    server: dict[str, float] | None = None  # {queue_ms, prefill_ms, decode_ms} from the target's timing
    prompt_tokens_intended: int | None = None  # the length the workload meant (token ids, or text built to it)
    first_output_s: float | None = None  # the first answer (content) token; a reasoning model thinks before it
    reasoning_tokens: int | None = None  # of output_tokens, how many were reasoning (None: no reasoning seen)
    chunk_tokens: list[int] | None = None  # tokens each chunk of token_s carried; None: one each
    cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache (usage), when it says
    conversation: str | None = None  # multi-turn: the conversation and the turn this request is
    turn: int | None = None
    cancel_reason: str | None = None  # "client: after k tokens" | "client: after t s" | "run stopped"
    retry_after_s: float | None = None  # a shed answer's Retry-After, in seconds (the last one, when retried)
    retries: int = 0  # times the client resent it after a shed answer (client.retries)

    def to_json(self) -> str:
        r6 = _r6
        return json.dumps(
            {
                "id": self.id,
                "stage": self.stage,
                "tier": self.tier,
                "scheduled_s": r6(self.scheduled_s),
                "sent_s": r6(self.sent_s),
                "first_token_s": r6(self.first_token_s),
                "token_s": [round(t, 6) for t in self.token_s],
                "done_s": r6(self.done_s),
                "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens,
                "status": self.status,
                "http_status": self.http_status,
                "error": self.error,
                "server": self.server,
                "prompt_tokens_intended": self.prompt_tokens_intended,
                "first_output_s": r6(self.first_output_s),
                "reasoning_tokens": self.reasoning_tokens,
                "chunk_tokens": self.chunk_tokens,
                "cached_tokens": self.cached_tokens,
                "conversation": self.conversation,
                "turn": self.turn,
                "cancel_reason": self.cancel_reason,
                "retry_after_s": self.retry_after_s,
                "retries": self.retries,
            },
            separators=(",", ":"),
        )


def _r6(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


class RecordWriter:
    """Appends one JSON line per record with a single ``write(2)`` on an ``O_APPEND`` descriptor, so
    several worker processes can share the file and a crash loses nothing already written."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.count = 0

    def write(self, rec: RequestRecord) -> None:
        os.write(self._fd, (rec.to_json() + "\n").encode())
        self.count += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All complete records in a ``requests.jsonl`` (a torn last line from a crash is ignored)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
