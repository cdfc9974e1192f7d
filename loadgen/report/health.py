"""The five service-health signals over a run, as time series for the report: TTFT, output token
rate, KV usage, batch fill ratio and admission rejections, from the records (client side) and the
scraped ``/metrics`` (server side)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from loadgen.report.data import RunData, percentile
from loadgen.results.server_metrics import SERVERS

# each server's cumulative generated-token counter and KV-use gauges (results.server_metrics names)
GENERATION_COUNTERS = ("vllm:generation_tokens", "sglang:generation_tokens", "trtllm_generation_tokens")
KV_GAUGES = tuple(n for srv in SERVERS for n in srv.kv_usage)


def _bucket(run: RunData) -> float:
    df = run.requests
    end = 0.0
    if not df.empty:
        end = float(np.nanmax(pd.to_numeric(df["done_s"], errors="coerce").to_numpy(dtype=float),
                              initial=0.0))
    if len(run.metrics.index):
        end = max(end, float(run.metrics.index.max()))
    return max(1.0, math.ceil(end / 300.0))


def _series(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """Columns of one metric family (``name`` or ``name{...}``, and ``name_total`` for counters)."""
    cols = [c for c in df.columns if c.split("{", 1)[0] in (name, name + "_total")]
    return df[cols]


def _label(col: str, key: str) -> str | None:
    if "{" not in col:
        return None
    for part in col.split("{", 1)[1].rstrip("}").split(","):
        k, _, v = part.partition("=")
        if k == key:
            return v.strip('"')
    return None


def _by_tier(df: pd.DataFrame, name: str) -> dict[str, pd.Series]:
    cols = _series(df, name)
    out: dict[str, pd.Series] = {}
    for c in cols.columns:
        tier = _label(c, "tier") or "all"
        s = cols[c]
        out[tier] = out[tier].add(s, fill_value=0) if tier in out else s
    return out


def _rate(s: pd.Series) -> pd.Series:
    """Per-second rate of a cumulative counter (a counter reset counts as 0)."""
    s = s.dropna()
    if len(s) < 2:
        return s.iloc[0:0]
    dt = np.diff(s.index.to_numpy(dtype=float))
    dv = np.diff(s.to_numpy(dtype=float))
    r = np.where((dt > 0) & (dv >= 0), dv / np.where(dt > 0, dt, 1), 0.0)
    return pd.Series(r, index=s.index[1:])


def health(run: RunData) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """The five service-health signals over the run, each ``{line name: (t, values)}``; an empty dict
    for a signal with no data. Client-side signals come from the records (bucketed by scheduled time),
    server-side ones from ``metrics.jsonl`` (``vllm:`` names, or SGLang's and TRT-LLM's token counter and KV
    gauge; ``slobench:`` per-tier names when scraped)."""
    out: dict[str, dict[str, tuple[list[float], list[float]]]] = {
        "ttft": {}, "token_rate": {}, "kv_usage": {}, "batch_fill": {}, "rejections": {}}
    width = _bucket(run)
    df, m = run.requests, run.metrics

    def pack(s: pd.Series) -> tuple[list[float], list[float]]:
        s = s.dropna()
        return [round(float(x), 3) for x in s.index], [round(float(v), 4) for v in s.to_numpy()]

    if not df.empty:
        ok = df[df["status"] == "ok"].dropna(subset=["ttft_ms"])
        if not ok.empty:
            b = (ok["scheduled_s"] // width) * width
            for q in (50, 99):
                out["ttft"][f"client p{q}"] = pack(ok.groupby(b)["ttft_ms"].agg(lambda s, q=q: percentile(s, q)))
        ts = [t for lst in df["token_s"] if isinstance(lst, list) for t in lst]
        if ts:
            b = (np.asarray(ts, dtype=float) // width) * width
            counts = pd.Series(1, index=b).groupby(level=0).sum() / width
            out["token_rate"]["client chunks/s"] = pack(counts)
        rej = df[df["status"] == "rejected"]
        if not rej.empty:
            b = (rej["scheduled_s"] // width) * width
            out["rejections"]["client 429s/s"] = pack(rej.groupby(b).size() / width)
    if not m.empty:
        # server TTFT per tier from slobench:'s histogram is cumulative: mean over each scrape interval
        for tier, s in _by_tier(m, "slobench:output_tokens_per_second").items():
            out["token_rate"][f"server {tier} tok/s"] = pack(s)
        if not any(k.startswith("server") for k in out["token_rate"]):
            for name in GENERATION_COUNTERS:  # the first server's counter on the page
                gen = _series(m, name).sum(axis=1, min_count=1)
                if gen.notna().sum() >= 2:
                    out["token_rate"]["server tok/s"] = pack(_rate(gen))
                    break
        for name in KV_GAUGES:  # vLLM's (or its older name), SGLang's, TRT-LLM's: the first on the page
            kv = _series(m, name)
            if not kv.empty:
                out["kv_usage"]["KV usage %"] = pack(kv.max(axis=1) * 100)
                break
        for tier, s in _by_tier(m, "slobench:kv_cache_usage_perc").items():
            out["kv_usage"][f"{tier} %"] = pack(s * 100)
        fill = _by_tier(m, "slobench:batch_fill_ratio")
        for tier, s in fill.items():
            out["batch_fill"][tier] = pack(s)
        if len(fill) > 1:
            out["batch_fill"]["total"] = pack(sum(fill.values()))
        for tier, s in _by_tier(m, "slobench:admission_rejections").items():
            out["rejections"][f"server {tier}/s"] = pack(_rate(s))
        sums, counts = _by_tier(m, "slobench:time_to_first_token_seconds_sum"), \
            _by_tier(m, "slobench:time_to_first_token_seconds_count")
        for tier, s in sums.items():
            c = counts.get(tier)
            if c is None:
                continue
            ds, dc = s.diff(), c.diff()
            mean = (ds / dc.where(dc > 0) * 1000.0).dropna()
            if len(mean):
                out["ttft"][f"server {tier} mean"] = pack(mean)
    return out


def step_spans(run: RunData) -> list[tuple[int, float, float]]:
    """(stage, first scheduled_s, last done_s) per stage, to mark steps on the time series."""
    df = run.requests
    if df.empty or df["stage"].nunique() < 2:
        return []
    g = df.groupby("stage")
    return [(int(k), float(a), float(b)) for k, a, b in
            zip(g.groups, g["scheduled_s"].min(), g["done_s"].max().fillna(g["scheduled_s"].max()), strict=False)]
