"""Export a run's records as ``requests.parquet`` (pyarrow) or ``requests.csv`` (without pyarrow).

One row per request with every field of the record (``records.RequestRecord``), the server timing
flattened (``server_queue_ms`` … ``server_source``), the derived latencies in ms (``ttft_ms``,
``ttfot_ms``, ``e2el_ms``, ``tpot_ms``, the request's per-token ITL p50 / p99 / max, ``lateness_ms``; null
where undefined, e.g. failed requests) and, for a capacity run, the load of the step each request belongs
to (its ``stage`` → the summary's step: ``step_load``, ``step_requested_rps``, ``step_offered_rps``,
``step_phase``). ``token_s`` and ``chunk_tokens`` stay list columns in Parquet and become JSON strings in
CSV. The Parquet file's schema metadata carries ``slobench.schema_version``. Every column is in
docs/outputs.md. For pandas users:

    pd.read_parquet("reports/<run-id>/requests.parquet")
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from loadgen.results import latency
from loadgen.results.records import read_records
from loadgen.results.rundir import SCHEMA_VERSION, SUMMARY, read_json_object
from loadgen.results.summary import request_frame

SERVER_KEYS = ("queue_ms", "prefill_ms", "decode_ms", "front_end_ms", "held_ms", "source")
STEP_KEYS = ("load", "requested_rps", "offered_rps", "phase")  # step_<key>: the capacity step's
# name -> column type: "string", "Int64", "float64", "list_float" (token_s), "list_int" (chunk_tokens)
COLUMNS = {
    "id": "string", "stage": "Int64", "tier": "string", "scheduled_s": "float64", "sent_s": "float64",
    "first_token_s": "float64", "first_output_s": "float64", "done_s": "float64", "prompt_tokens": "Int64",
    "prompt_tokens_intended": "Int64", "output_tokens": "Int64", "reasoning_tokens": "Int64",
    "cached_tokens": "Int64", "status": "string", "http_status": "Int64", "error": "string",
    "cancel_reason": "string", "conversation": "string", "turn": "Int64",
    "retry_after_s": "float64", "retries": "Int64",
    **{f"server_{k}": ("string" if k == "source" else "float64") for k in SERVER_KEYS},
    "ttft_ms": "float64", "ttfot_ms": "float64", "e2el_ms": "float64", "tpot_ms": "float64",
    "itl_p50_ms": "float64", "itl_p99_ms": "float64", "itl_max_ms": "float64", "lateness_ms": "float64",
    "step_load": "float64", "step_requested_rps": "float64", "step_offered_rps": "float64", "step_phase": "string",
    "chunks": "Int64", "token_s": "list_float", "chunk_tokens": "list_int",
}
LIST_COLUMNS = ("token_s", "chunk_tokens")


def have_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def itl_figures(r: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(p50, p99, max) of a successful request's per-token ITLs (``latency.itl_ms``); Nones otherwise."""
    gaps = latency.itl_ms(r) if latency.succeeded(r) else []
    if not gaps:
        return None, None, None
    return latency.percentile(gaps, 50), latency.percentile(gaps, 99), max(gaps)


def step_loads(steps: list[dict[str, Any]] | None, axis: str = "rate") -> dict[int, dict[str, Any]]:
    """stage -> the step's load figures, from a capacity summary's ``steps`` (``requested_rps``: the
    search's load on the rate axis; on the concurrency axis the load is users and nothing was requested
    in req/s)."""
    out: dict[int, dict[str, Any]] = {}
    for st in steps or []:
        if isinstance(st, dict) and isinstance(st.get("index"), int):
            out[st["index"]] = {"load": st.get("load"), "requested_rps": st.get("load") if axis == "rate" else None,
                                "offered_rps": st.get("offered_rps"), "phase": st.get("phase")}
    return out


def _cell_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def records_table(records: list[dict], steps: list[dict[str, Any]] | None = None, axis: str = "rate") -> pd.DataFrame:
    """The flat export frame (every column present, typed, even for an empty run). ``steps`` and ``axis``: a
    capacity summary's, for each record's step load."""
    recs = []
    for r in records:
        if not isinstance(r, dict):
            continue
        r = dict(r)
        r["token_s"] = r.get("token_s") if isinstance(r.get("token_s"), list) else []
        for k in ("first_token_s", "sent_s", "done_s", "output_tokens", "prompt_tokens", "prompt_tokens_intended",
                  "scheduled_s", "status"):
            r.setdefault(k, None)
        recs.append(r)
    df = request_frame(recs) if recs else pd.DataFrame()
    loads = step_loads(steps, axis)
    step_of = [loads.get(r.get("stage")) or {} for r in recs]
    itl = [itl_figures(r) for r in recs]
    derived: dict[str, list[Any]] = {  # the columns that are not request_frame's
        **{f"server_{k}": [s.get(k) if isinstance(s := r.get("server"), dict) else None for r in recs]
           for k in SERVER_KEYS},
        **{f"step_{k}": [s.get(k) for s in step_of] for k in STEP_KEYS},
        **{name: [x[i] for x in itl] for i, name in enumerate(("itl_p50_ms", "itl_p99_ms", "itl_max_ms"))},
        **{c: [r.get(c) if isinstance(r.get(c), list) else None for r in recs] for c in LIST_COLUMNS},
        "chunks": [len(r["token_s"]) for r in recs],
    }
    out = pd.DataFrame(index=df.index)
    for col, dtype in COLUMNS.items():
        if col in derived:
            src = pd.Series(derived[col], index=df.index, dtype=object)
        else:
            src = df[col] if col in df else pd.Series(None, index=df.index, dtype=object)
        if dtype.startswith("list_"):
            out[col] = src.astype(object)
        elif dtype in ("float64", "Int64"):
            num = pd.to_numeric(src, errors="coerce")
            out[col] = num.round().astype("Int64") if dtype == "Int64" else num.astype("float64")
        else:
            out[col] = src.map(lambda v: None if _cell_missing(v) else str(v)).astype("string")
    return out.reset_index(drop=True)


def parquet_schema():
    import pyarrow as pa

    types = {"string": pa.string(), "Int64": pa.int64(), "float64": pa.float64(),
             "list_float": pa.list_(pa.float64()), "list_int": pa.list_(pa.int64())}
    return pa.schema([pa.field(col, types[dtype]) for col, dtype in COLUMNS.items()],
                     metadata={b"slobench.schema_version": str(SCHEMA_VERSION).encode()})


def export_records(run_dir: str | Path, fmt: str = "auto") -> Path:
    """Write ``requests.parquet`` (``fmt`` ``auto`` with pyarrow, or ``parquet``) or ``requests.csv`` next
    to ``requests.jsonl``, through a temporary file; returns the path written."""
    run_dir = Path(run_dir)
    src = run_dir / "requests.jsonl"
    summary = read_json_object(run_dir / SUMMARY) or {}
    steps = summary.get("steps") if isinstance(summary.get("steps"), list) else None
    df = records_table(read_records(src) if src.is_file() else [], steps, str(summary.get("axis") or "rate"))
    if fmt == "auto":
        fmt = "parquet" if have_pyarrow() else "csv"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = parquet_schema()
        table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **schema.metadata})
        path = run_dir / "requests.parquet"
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        tmp.replace(path)
        return path
    if fmt != "csv":
        raise ValueError(f"export format {fmt!r}: expected auto, parquet or csv")
    df = df.assign(**{c: df[c].map(lambda v: json.dumps(v) if isinstance(v, list) else None) for c in LIST_COLUMNS})
    path = run_dir / "requests.csv"
    tmp = path.with_name(path.name + ".tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(path)
    return path
