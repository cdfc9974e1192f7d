"""Turn run records into a summary with vLLM benchmark_serving's key names.

Formulas (DESIGN.md): TTFT = first non-empty content chunk - scheduled send; E2EL = last content chunk -
scheduled send; TPOT = (E2EL - TTFT) / (output_tokens - 1) for requests with more than one output
token; ITL = every gap between content chunks, pooled. Latency statistics use successful requests
only (as vLLM does) and exact percentiles of the raw samples (numpy's linear interpolation, vLLM's
too); ``mean_*``, ``median_*``, ``std_*``, ``p90_*``, ``p99_*`` in ms, ``null`` when there is no sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2el_ms"}
BREAKDOWN = ("queue_ms", "prefill_ms", "decode_ms")
# vLLM histograms whose sum/count deltas give the breakdown when records carry no server timing
BREAKDOWN_HISTOGRAMS = {
    "queue_ms": "vllm:request_queue_time_seconds",
    "prefill_ms": "vllm:request_prefill_time_seconds",
    "decode_ms": "vllm:request_decode_time_seconds",
}


def parse_goodput(items: Iterable[str]) -> dict[str, float]:
    """``["ttft:300", "tpot:50"]`` -> ``{"ttft_ms": 300.0, "tpot_ms": 50.0}``; ValueError on bad input."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_KEYS:
            raise ValueError(f"goodput SLO {item!r}: expected NAME:MS with NAME one of {', '.join(SLO_KEYS)}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"goodput SLO {item!r}: {value!r} is not a number of milliseconds") from None
        if not ms > 0:
            raise ValueError(f"goodput SLO {item!r}: must be > 0 ms")
        out[SLO_KEYS[name]] = ms
    return out


def _stats(name: str, values: np.ndarray, out: dict[str, Any], percentiles: Iterable[float]) -> None:
    v = np.asarray(values, dtype=float)
    empty = v.size == 0
    out[f"mean_{name}_ms"] = None if empty else float(v.mean())
    out[f"median_{name}_ms"] = None if empty else float(np.median(v))
    out[f"std_{name}_ms"] = None if empty else float(v.std())
    for p in percentiles:
        key = f"p{p:g}_{name}_ms"
        out[key] = None if empty else float(np.percentile(v, p))


def request_frame(records: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per record with the derived per-request latencies in ms (NaN where undefined)."""
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return df
    for col in ("first_token_s", "sent_s", "done_s", "output_tokens", "prompt_tokens"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    last = df["token_s"].map(lambda ts: ts[-1] if ts else math.nan)
    ok = df["status"] == "ok"
    df["ttft_ms"] = ((df["first_token_s"] - df["scheduled_s"]) * 1000.0).where(ok)
    df["e2el_ms"] = ((last - df["scheduled_s"]) * 1000.0).where(ok)
    n_out = df["output_tokens"]
    df["tpot_ms"] = ((df["e2el_ms"] - df["ttft_ms"]) / (n_out - 1)).where(ok & (n_out > 1))
    df["lateness_ms"] = (df["sent_s"] - df["scheduled_s"]) * 1000.0
    return df


def meets(df: pd.DataFrame, slo: Mapping[str, float]) -> pd.Series:
    """Per request: succeeded and met every SLO in ``slo`` (keys ttft_ms / tpot_ms / e2el_ms)."""
    good = df["status"] == "ok"
    for key, limit in slo.items():
        col = df[key]
        if key == "tpot_ms":  # a single-token answer has no TPOT: it cannot miss it
            col = col.fillna(0.0)
        good &= col <= limit
    return good


def summarize(
    records: list[Mapping[str, Any]],
    *,
    goodput: Mapping[str, float] | None = None,
    tier_slos: Mapping[str, Mapping[str, float]] | None = None,
    lateness_bound_ms: float = 10.0,
    metrics: list[Mapping[str, Any]] | None = None,
    percentiles: Iterable[float] = (90, 99),
) -> dict[str, Any]:
    percentiles = tuple(percentiles)
    out: dict[str, Any] = {"requests": len(records)}
    df = request_frame(records)
    if df.empty:
        out.update(completed=0, failed=0, duration=0.0, valid=False, invalid_reason="no requests recorded")
        return out
    ok = df["status"] == "ok"
    cancelled = df["status"] == "cancelled"
    duration = float(df["done_s"].max() - df["scheduled_s"].min())
    okd = df[ok]
    n_in = float(okd["prompt_tokens"].fillna(0).sum())
    n_out = float(okd["output_tokens"].fillna(0).sum())
    out.update(
        duration=duration,
        completed=int(ok.sum()),
        failed=int((~ok & ~cancelled).sum()),
        cancelled=int(cancelled.sum()),
        total_input_tokens=int(n_in),
        total_output_tokens=int(n_out),
        request_throughput=ok.sum() / duration if duration > 0 else None,
        request_goodput=None,
        output_throughput=n_out / duration if duration > 0 else None,
        total_token_throughput=(n_in + n_out) / duration if duration > 0 else None,
    )
    if goodput:
        good = int(meets(df, goodput).sum())
        out["request_goodput"] = good / duration if duration > 0 else None
        out["goodput_slo"] = dict(goodput)
        out["goodput_fraction"] = good / max(1, int((~cancelled).sum()))
    for name in ("ttft", "tpot", "e2el"):
        _stats(name, okd[f"{name}_ms"].dropna().to_numpy(), out, percentiles)
    itl = [np.diff(ts) for ts in okd["token_s"] if len(ts) > 1]
    _stats("itl", np.concatenate(itl) * 1000.0 if itl else np.empty(0), out, percentiles)

    errs = df.loc[~ok, "status"].value_counts()
    out["errors"] = {str(k): int(v) for k, v in errs.items()}
    http = df.loc[df["http_status"].notna() & (df["http_status"] != 200), "http_status"].astype(int)
    out["errors_by_http_status"] = {str(k): int(v) for k, v in http.value_counts().items()}
    first_errors = df.loc[~ok & df["error"].notna(), "error"].drop_duplicates().head(5)
    out["error_examples"] = [str(e) for e in first_errors]

    if tier_slos or df["tier"].notna().any():
        out["tiers"] = _tiers(df, tier_slos or {}, percentiles)
    out["breakdown"] = _breakdown(okd, metrics)

    late = df["lateness_ms"].dropna().to_numpy()
    lat = {
        "p50_ms": float(np.percentile(late, 50)) if late.size else None,
        "p99_ms": float(np.percentile(late, 99)) if late.size else None,
        "max_ms": float(late.max()) if late.size else None,
        "bound_ms": lateness_bound_ms,
    }
    out["client_lateness"] = lat
    out["valid"] = lat["p99_ms"] is not None and lat["p99_ms"] <= lateness_bound_ms
    if not out["valid"]:
        out["invalid_reason"] = (
            f"client p99 lateness {lat['p99_ms']:.1f} ms exceeds the {lateness_bound_ms:g} ms bound: the "
            "load generator could not keep the schedule, so the offered load was lower than asked"
            if lat["p99_ms"] is not None else "no request was sent"
        )
    return out


def _tiers(df: pd.DataFrame, tier_slos: Mapping[str, Mapping[str, float]], percentiles) -> dict[str, Any]:
    res: dict[str, Any] = {}
    live = df[df["status"] != "cancelled"]
    for tier, g in live.groupby(live["tier"].fillna("none"), sort=True):
        ok = g["status"] == "ok"
        entry: dict[str, Any] = {"requests": len(g), "completed": int(ok.sum())}
        ttft = g.loc[ok, "ttft_ms"].dropna().to_numpy()
        _stats("ttft", ttft, entry, percentiles)
        slo = tier_slos.get(str(tier))
        if slo:
            met = int(meets(g, slo).sum())
            entry["slo"] = dict(slo)
            entry["slo_met"] = met
            entry["slo_attainment"] = met / len(g) if len(g) else None
        res[str(tier)] = entry
    return res


def _breakdown(okd: pd.DataFrame, metrics: list[Mapping[str, Any]] | None) -> dict[str, Any]:
    server = okd["server"].dropna() if "server" in okd else pd.Series(dtype=object)
    server = server[server.map(lambda s: isinstance(s, dict) and bool(s))]
    if len(server):
        sdf = pd.DataFrame.from_records(list(server))
        out: dict[str, Any] = {"source": "timing", "requests": len(sdf)}
        for k in BREAKDOWN:
            if k in sdf:
                v = pd.to_numeric(sdf[k], errors="coerce").dropna().to_numpy()
                out[f"mean_{k}"] = float(v.mean()) if v.size else None
                out[f"p50_{k}"] = float(np.percentile(v, 50)) if v.size else None
                out[f"p99_{k}"] = float(np.percentile(v, 99)) if v.size else None
        return out
    if metrics and len(metrics) >= 2:
        first, last = metrics[0].get("metrics", {}), metrics[-1].get("metrics", {})
        out = {"source": "metrics"}
        for k, hist in BREAKDOWN_HISTOGRAMS.items():
            ds = _family_total(last, hist + "_sum") - _family_total(first, hist + "_sum")
            dc = _family_total(last, hist + "_count") - _family_total(first, hist + "_count")
            out[f"mean_{k}"] = ds / dc * 1000.0 if dc > 0 else None
        if any(out[f"mean_{k}"] is not None for k in BREAKDOWN):
            return out
    return {"source": None}


def _family_total(sample: Mapping[str, float], name: str) -> float:
    """Sum of every labelled series of one sample name (``name`` or ``name{...}``)."""
    return float(sum(v for k, v in sample.items() if k == name or k.startswith(name + "{")))
