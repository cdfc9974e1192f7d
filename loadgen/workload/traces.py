"""Readers for the real traces in ../shared/traces, turned into request specs.

Formats: Mooncake JSONL (``timestamp`` ms, ``hash_ids`` of ``block_size``-token blocks), Azure LLM
2023 CSV (wall-clock timestamps with 7 fractional digits), BurstGPT (``_1`` and ``_3`` column
layouts; rows with 0 response tokens are failed requests, skipped by default and counted), ShareGPT
JSON (text prompts, no timestamps: pair with an arrival process), and a prompts dataset (JSONL of
``prompt`` or ``messages``, optionally ``max_tokens``; no timestamps either: ``--dataset FILE``).

Time handling, in this order: timestamps are rebased to the first row; rows before ``start_offset_s``
(trace seconds) are dropped and the rest rebased again; ``max_requests`` keeps the first N; gaps are
multiplied by ``time_scale`` (or by the factor that makes the mean rate equal ``rate``, which keeps
the burst shape); ``max_duration_s`` (replay seconds) drops what arrives later.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.workload.arrivals import Arrivals
from loadgen.workload.specs import DEFAULT_TOKEN_RANGE, BlockPrompt, RequestSpec

FORMATS = ("mooncake", "azure", "burstgpt", "sharegpt", "prompts")
_EPOCH = datetime(2020, 1, 1)
_UNIQUE_BASE = 1 << 40  # hash ids for traces without prefix info: never shared with Mooncake ids


class TraceError(ValueError):
    pass


@dataclass(slots=True)
class TraceRow:
    t: float | None  # seconds, relative to the trace's own origin
    input_len: int | None
    output_len: int | None
    hash_ids: tuple[int, ...] | None = None
    text: str | None = None
    session: str | None = None
    messages: list[dict[str, Any]] | None = None  # a chat prompt (the ``prompts`` format)


@dataclass(slots=True)
class TraceInfo:
    path: str
    format: str
    rows: int = 0  # rows in the file
    skipped_failed: int = 0  # BurstGPT rows with 0 response tokens that were skipped
    requests: int = 0  # requests in the resulting schedule
    time_factor: float = 1.0  # gap multiplier applied
    duration_s: float = 0.0  # last arrival in the schedule

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class TraceOptions:
    time_scale: float = 1.0
    rate: float | None = None  # override the mean rate, keep the burst shape
    start_offset_s: float = 0.0
    max_requests: int | None = None
    max_duration_s: float | None = None
    block_size: int = 512
    seed: int = 0
    skip_failed: bool = True
    token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE
    output_len: int = 128  # for traces without output lengths (ShareGPT)
    max_output_len: int | None = None  # clamp output lengths
    arrivals: Arrivals | None = None  # for traces without timestamps (ShareGPT)
    tiers: dict[str, float] = field(default_factory=dict)


def detect_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".jsonl"):
        with path.open(encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        try:
            keys = set(json.loads(first)) if first else set()
        except (ValueError, TypeError):
            keys = set()
        return "prompts" if keys & {"prompt", "messages", "text"} else "mooncake"
    if name.endswith(".json"):
        return "sharegpt"
    if name.endswith(".csv"):
        with path.open(newline="", encoding="utf-8") as f:
            header = f.readline()
        if header.startswith("TIMESTAMP,ContextTokens"):
            return "azure"
        if header.startswith("Timestamp,") and "Request tokens" in header:
            return "burstgpt"
    raise TraceError(f"{path}: cannot tell the trace format; pass --format ({'|'.join(FORMATS)})")


def _jsonl(path: Path) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a JSONL file, with their line numbers (for errors that name the line)."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield lineno, line


def read_mooncake(path: Path, block_size: int = 512) -> list[TraceRow]:
    rows = []
    for lineno, line in _jsonl(path):
        try:
            o = json.loads(line)
            ids = tuple(int(h) for h in o["hash_ids"])
            row = TraceRow(o["timestamp"] / 1000.0, int(o["input_length"]), int(o["output_length"]), ids)
        except (ValueError, KeyError, TypeError) as e:
            raise TraceError(f"{path}:{lineno}: not a Mooncake row ({e})") from e
        if len(ids) * block_size < row.input_len:
            raise TraceError(
                f"{path}:{lineno}: {len(ids)} hash ids x block_size {block_size} < input_length "
                f"{row.input_len}; wrong block_size?"
            )
        rows.append(row)
    return rows


def _azure_time(s: str) -> float:
    base, _, frac = s.strip().partition(".")
    d = datetime.fromisoformat(base) - _EPOCH  # naive, no timezone: any offset cancels after rebasing
    # whole seconds as an exact integer, then the 100 ns fraction: no float rounding at 1e9 seconds
    return (d.days * 86400 + d.seconds) + (int(frac) / 10 ** len(frac) if frac else 0.0)


def read_azure(path: Path) -> list[TraceRow]:
    rows = []
    with path.open(newline="", encoding="utf-8") as f:
        r = csv.reader(f)
        header = next(r, None)
        if not header or header[:3] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise TraceError(f"{path}: expected header TIMESTAMP,ContextTokens,GeneratedTokens, got {header}")
        for lineno, rec in enumerate(r, 2):
            try:
                rows.append(TraceRow(_azure_time(rec[0]), int(rec[1]), int(rec[2])))
            except (ValueError, IndexError) as e:
                raise TraceError(f"{path}:{lineno}: bad Azure row {rec} ({e})") from e
    return rows


def read_burstgpt(path: Path, skip_failed: bool = True) -> tuple[list[TraceRow], int]:
    rows, skipped = [], 0
    with path.open(newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        need = {"Timestamp", "Request tokens", "Response tokens"}
        if not r.fieldnames or not need <= set(r.fieldnames):
            raise TraceError(f"{path}: BurstGPT header needs {sorted(need)}, got {r.fieldnames}")
        for lineno, rec in enumerate(r, 2):
            try:
                t = float(rec["Timestamp"])
                n_in, n_out = int(rec["Request tokens"]), int(rec["Response tokens"])
            except (ValueError, TypeError) as e:
                raise TraceError(f"{path}:{lineno}: bad BurstGPT row ({e})") from e
            if n_out == 0 and skip_failed:
                skipped += 1
                continue
            rows.append(TraceRow(t, max(n_in, 1), max(n_out, 1), session=rec.get("Session ID") or None))
    return rows, skipped


def read_sharegpt(path: Path) -> list[TraceRow]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise TraceError(f"{path}: not JSON ({e})") from e
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a JSON array of conversations")
    rows = []
    for i, conv in enumerate(data):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not turns or not isinstance(turns[0], dict) or "value" not in turns[0]:
            raise TraceError(f"{path}: entry {i} has no conversations[0].value")
        rows.append(TraceRow(None, None, None, text=turns[0]["value"]))
    return rows


def read_prompts(path: Path) -> list[TraceRow]:
    """A JSONL dataset of prompts, one object per line: ``prompt`` (or ``text``) as a string, or ``messages``
    (a chat), and optionally the answer's length (``max_tokens`` or ``output_len``)."""
    rows = []
    for lineno, line in _jsonl(path):
        try:
            o = json.loads(line)
        except ValueError as e:
            raise TraceError(f"{path}:{lineno}: not JSON ({e})") from None
        if not isinstance(o, dict):
            raise TraceError(f"{path}:{lineno}: expected an object with prompt or messages")
        text, messages = o.get("prompt", o.get("text")), o.get("messages")
        out = o.get("max_tokens", o.get("output_len"))
        if not (isinstance(text, str) and text) and not (isinstance(messages, list) and messages
                                                        and all(isinstance(m, dict) for m in messages)):
            raise TraceError(f"{path}:{lineno}: expected a non-empty prompt (a string) or messages (a list of "
                             "{role, content})")
        if out is not None and not (isinstance(out, int) and out >= 1):
            raise TraceError(f"{path}:{lineno}: max_tokens must be a whole number >= 1, found {out!r}")
        rows.append(TraceRow(None, None, out, text=text if messages is None else None, messages=messages))
    return rows


def read_rows(path: Path, fmt: str, opts: TraceOptions) -> tuple[list[TraceRow], int]:
    if fmt == "mooncake":
        return read_mooncake(path, opts.block_size), 0
    if fmt == "azure":
        return read_azure(path), 0
    if fmt == "burstgpt":
        return read_burstgpt(path, opts.skip_failed)
    if fmt == "sharegpt":
        return read_sharegpt(path), 0
    if fmt == "prompts":
        return read_prompts(path), 0
    raise TraceError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")


def load_trace(path: str | Path, fmt: str | None = None, opts: TraceOptions | None = None):
    """Read a trace file and return ``(specs, info)``: request specs sorted by arrival, and counts."""
    opts = opts or TraceOptions()
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    fmt = fmt or detect_format(path)
    if not opts.time_scale > 0:
        raise TraceError(f"time scale must be > 0, got {opts.time_scale}")
    rows, skipped = read_rows(path, fmt, opts)
    info = TraceInfo(str(path), fmt, rows=len(rows) + skipped, skipped_failed=skipped)
    if not rows:
        raise TraceError(f"{path}: no requests")

    if rows[0].t is None:  # no timestamps: an arrival process supplies them
        arr = opts.arrivals or Arrivals("poisson", rate=opts.rate or 1.0)
        n = len(rows) if opts.max_requests is None else min(opts.max_requests, len(rows))
        times = arr.times(n=n, duration_s=opts.max_duration_s, seed=opts.seed)
        rows = rows[: len(times)]
    else:
        order = sorted(range(len(rows)), key=lambda i: rows[i].t)  # stable: keeps equal-time order
        rows = [rows[i] for i in order]
        t = np.asarray([r.t for r in rows], dtype=float)
        t -= t[0]
        keep = t >= opts.start_offset_s
        rows = [r for r, k in zip(rows, keep, strict=True) if k]
        t = t[keep]
        if opts.max_requests is not None:
            rows, t = rows[: opts.max_requests], t[: opts.max_requests]
        if not rows:
            raise TraceError(f"{path}: no requests after start offset {opts.start_offset_s}s")
        t -= t[0]
        factor = opts.time_scale
        if opts.rate is not None:
            if not opts.rate > 0:
                raise TraceError(f"rate must be > 0, got {opts.rate}")
            span = t[-1]
            factor = (len(t) - 1) / span / opts.rate if span > 0 and len(t) > 1 else 1.0
        times = t * factor
        info.time_factor = float(factor)
        if opts.max_duration_s is not None:
            n_keep = int(np.searchsorted(times, opts.max_duration_s, side="left"))
            rows, times = rows[:n_keep], times[:n_keep]

    rng = np.random.default_rng([opts.seed, 0x7E5])
    tiers = [None] * len(rows)
    if opts.tiers:
        names = list(opts.tiers)
        w = np.asarray([opts.tiers[k] for k in names], dtype=float)
        tiers = [names[j] for j in rng.choice(len(names), size=len(rows), p=w / w.sum())]
    specs = []
    for i, (row, ts) in enumerate(zip(rows, times, strict=True)):
        out = row.output_len if row.output_len is not None else opts.output_len
        if opts.max_output_len is not None:
            out = min(out, opts.max_output_len)
        if row.messages is not None:
            prompt, n_in = [dict(m) for m in row.messages], None
        elif row.text is not None:
            prompt, n_in = row.text, None
        else:
            ids = row.hash_ids
            if ids is None:  # no prefix info: blocks unique to this row
                nb = -(-row.input_len // opts.block_size)
                base = _UNIQUE_BASE + (i << 20)
                ids = tuple(range(base, base + nb))
            prompt = BlockPrompt(ids, row.input_len, opts.block_size, opts.seed, tuple(opts.token_range))
            n_in = row.input_len
        specs.append(
            RequestSpec(
                id=f"{fmt}{i}", arrival_s=float(ts), prompt=prompt, max_tokens=int(max(out, 1)),
                tier=tiers[i], prompt_tokens=n_in, conversation=row.session,
            )
        )
    info.requests = len(specs)
    info.duration_s = float(times[-1]) if len(specs) else 0.0
    return specs, info


def load_length_stats(path: str | Path) -> tuple[list[int], list[int]]:
    """Input and output lengths from a length-statistics CSV (etalon's ``num_prefill_tokens``,
    ``num_decode_tokens``) or any trace above, for empirical length distributions."""
    path = Path(path)
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            header = f.readline()
        if header.startswith("num_prefill_tokens"):
            with path.open(newline="", encoding="utf-8") as f:
                recs = list(csv.DictReader(f))
            return [int(r["num_prefill_tokens"]) for r in recs], [int(r["num_decode_tokens"]) for r in recs]
    rows, _ = read_rows(path, detect_format(path), TraceOptions())
    return [r.input_len for r in rows if r.input_len], [r.output_len for r in rows if r.output_len]
