"""The client cancellation mix, for every driver: a request whose spec says so closes its stream after k
content chunks (``cancel_after_tokens``) or t seconds after its scheduled time (``cancel_after_s``), as a
user closing the tab does. Its record gets ``status = "cancelled"`` and ``cancel_reason`` "client: after k
tokens" / "client: after t s" (no SLO sample, ``results.latency.client_cancelled``); a request cut off
because the run stopped gets ``cancel_reason = "run stopped"``.
"""

from __future__ import annotations

from loadgen.drivers.stream_recorder import StreamRecorder
from loadgen.results.records import RequestRecord
from loadgen.workload.specs import RequestSpec

RUN_STOPPED = "run stopped"


def feed(recorder: StreamRecorder, data: bytes, t: float, after_tokens: int | None) -> bool:
    """Feed bytes to the recorder; with ``after_tokens``, line by line, and ``True`` as soon as it holds that
    many content chunks (the rest of ``data`` is dropped: the client has stopped reading)."""
    if after_tokens is None:
        recorder.feed(data, t)
        return False
    for line in data.splitlines(keepends=True):
        recorder.feed(line, t)
        if recorder.n_chunks >= after_tokens:
            return True
    return False


def cancelled_by_client(rec: RequestRecord, spec: RequestSpec, chunks: int | None = None) -> None:
    """Mark the record as the client's planned cancellation (``chunks``: content chunks it had received)."""
    rec.status, rec.cancel_reason, rec.error = "cancelled", spec.cancel_reason, None
    if chunks is not None and rec.output_tokens is None:
        rec.output_tokens = chunks


def cancelled_by_run(rec: RequestRecord) -> None:
    rec.status, rec.error, rec.cancel_reason = "cancelled", RUN_STOPPED, RUN_STOPPED
