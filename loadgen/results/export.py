"""Export a run's records as ``requests.parquet`` (pyarrow) or ``requests.csv`` (without pyarrow).

One row per request with the record fields of docs/ARCHITECTURE.md, the server timing flattened
(``server_queue_ms``, ``server_prefill_ms``, ``server_decode_ms``) and the derived latencies in ms
(``ttft_ms``, ``e2el_ms``, ``tpot_ms``, ``lateness_ms``; null where undefined, e.g. failed requests).
``token_s`` stays a list column in Parquet and becomes a JSON string in CSV. For pandas users:

    pd.read_parquet("reports/<run-id>/requests.parquet")
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from loadgen.results.records import read_records
from loadgen.results.summary import request_frame

COLUMNS = {  # name -> pandas dtype of the exported column
    "id": "string", "stage": "Int64", "tier": "string", "scheduled_s": "float64", "sent_s": "float64",
    "first_token_s": "float64", "done_s": "float64", "prompt_tokens": "Int64",
    "prompt_tokens_intended": "Int64", "output_tokens": "Int64",
    "status": "string", "http_status": "Int64", "error": "string",
    "server_queue_ms": "float64", "server_prefill_ms": "float64", "server_decode_ms": "float64",
    "ttft_ms": "float64", "e2el_ms": "float64", "tpot_ms": "float64", "lateness_ms": "float64",
    "chunks": "Int64", "token_s": "object",
}


def have_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def records_table(records: list[dict]) -> pd.DataFrame:
    """The flat export frame (every column present, typed, even for an empty run)."""
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
    out = pd.DataFrame(index=df.index)
    for col, dtype in COLUMNS.items():
        if col.startswith("server_"):
            key = col[len("server_"):]
            src = df["server"].map(lambda s, k=key: s.get(k) if isinstance(s, dict) else None) \
                if "server" in df else pd.Series(None, index=df.index, dtype=object)
        elif col == "chunks":
            src = df["token_s"].map(len) if "token_s" in df else pd.Series(dtype=object)
        else:
            src = df[col] if col in df else pd.Series(None, index=df.index, dtype=object)
        if dtype == "object":
            out[col] = src.astype(object)
        elif dtype in ("float64", "Int64"):
            num = pd.to_numeric(src, errors="coerce")
            out[col] = num.round().astype("Int64") if dtype == "Int64" else num.astype("float64")
        else:
            out[col] = src.map(lambda v: None if v is None or (isinstance(v, float) and v != v) else str(v)) \
                .astype("string")
    return out.reset_index(drop=True)


def export_records(run_dir: str | Path, fmt: str = "auto") -> Path:
    """Write ``requests.parquet`` (``fmt`` ``auto`` with pyarrow, or ``parquet``) or ``requests.csv`` next
    to ``requests.jsonl``; returns the path written."""
    run_dir = Path(run_dir)
    src = run_dir / "requests.jsonl"
    df = records_table(read_records(src) if src.is_file() else [])
    if fmt == "auto":
        fmt = "parquet" if have_pyarrow() else "csv"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        fields = []
        for col, dtype in COLUMNS.items():
            t = {"string": pa.string(), "Int64": pa.int64(), "float64": pa.float64(),
                 "object": pa.list_(pa.float64())}[dtype]
            fields.append(pa.field(col, t))
        schema = pa.schema(fields)
        table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
        path = run_dir / "requests.parquet"
        pq.write_table(table, path)
        return path
    if fmt != "csv":
        raise ValueError(f"export format {fmt!r}: expected auto, parquet or csv")
    df = df.assign(token_s=df["token_s"].map(lambda ts: json.dumps(ts) if isinstance(ts, list) else None))
    path = run_dir / "requests.csv"
    df.to_csv(path, index=False)
    return path
