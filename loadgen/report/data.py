"""Load a run folder (``requests.jsonl``, ``metrics.jsonl``, ``summary.json``) into pandas frames.

Everything here works from the folder alone and tolerates what a crash or an older slobench leaves:
no records, no metrics, a partial or missing summary, unknown keys. Missing data comes back as empty
frames and ``None``, never as an exception; only a folder with none of the three files is an error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadgen.results.records import read_records
from loadgen.results.rundir import read_metrics
from loadgen.results.summary import request_frame, summarize

RECORD_COLUMNS = ("id", "stage", "tier", "scheduled_s", "sent_s", "first_token_s", "token_s", "done_s",
                  "prompt_tokens", "output_tokens", "status", "http_status", "error", "server")


class RunDataError(Exception):
    """The folder is not a run folder (one line, for the CLI)."""


@dataclass
class RunData:
    path: Path
    summary: dict[str, Any]
    requests: pd.DataFrame  # one row per record, with ttft_ms / e2el_ms / tpot_ms / lateness_ms
    metrics: pd.DataFrame  # index t (s since the run start), one column per scraped series
    config: dict[str, Any] = field(default_factory=dict)
    summary_rebuilt: bool = False  # summary.json was missing or unreadable: rebuilt from the records

    @property
    def run_id(self) -> str:
        return str(self.summary.get("run_id") or self.path.name)

    @property
    def kind(self) -> str:
        k = self.summary.get("kind")
        if k:
            return str(k)
        return "capacity" if isinstance(self.summary.get("steps"), list) else "run"

    @property
    def is_capacity(self) -> bool:
        return self.kind == "capacity"

    @property
    def tiers(self) -> list[str]:
        names: set[str] = set()
        if not self.requests.empty:
            names.update(str(t) for t in self.requests["tier"].unique())
        names.update(str(t) for t in (self.summary.get("slo") or {}))
        return sorted(names)

    @property
    def ok(self) -> pd.DataFrame:
        if self.requests.empty:
            return self.requests
        return self.requests[self.requests["status"] == "ok"]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def records_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """``summary.request_frame`` with every contract column present and ``tier`` filled (``none``)."""
    clean = [r for r in records if isinstance(r, dict)]
    for r in clean:
        for c in RECORD_COLUMNS:
            r.setdefault(c, None)
        if not isinstance(r["token_s"], list):
            r["token_s"] = []
    df = request_frame(clean)
    if df.empty:
        df = pd.DataFrame({c: pd.Series(dtype=object) for c in RECORD_COLUMNS})
        for c in ("ttft_ms", "e2el_ms", "tpot_ms", "lateness_ms"):
            df[c] = pd.Series(dtype=float)
        return df
    df["scheduled_s"] = pd.to_numeric(df["scheduled_s"], errors="coerce")
    df["stage"] = pd.to_numeric(df["stage"], errors="coerce").fillna(0).astype(int)
    df["tier"] = df["tier"].fillna("none").astype(str)
    df["status"] = df["status"].fillna("unknown").astype(str)
    return df


def metrics_frame(samples: list[dict[str, Any]]) -> pd.DataFrame:
    """Scraped samples -> a frame indexed by ``t`` with one column per series key."""
    rows = [(float(s["t"]), s["metrics"]) for s in samples
            if isinstance(s.get("metrics"), dict) and isinstance(s.get("t"), (int, float))]
    if not rows:
        return pd.DataFrame(index=pd.Index([], name="t", dtype=float))
    df = pd.DataFrame.from_records([m for _, m in rows], index=pd.Index([t for t, _ in rows], name="t"))
    return df.apply(pd.to_numeric, errors="coerce").sort_index()


def load_run(path: str | Path) -> RunData:
    p = Path(path)
    if not p.is_dir():
        raise RunDataError(f"{p}: not a folder")
    req, met, summ = p / "requests.jsonl", p / "metrics.jsonl", p / "summary.json"
    if not (req.is_file() or summ.is_file()):
        raise RunDataError(f"{p}: not a run folder (neither requests.jsonl nor summary.json)")
    records = read_records(req) if req.is_file() else []
    samples = read_metrics(met)
    summary = _read_json(summ)
    rebuilt = summary is None
    if summary is None:
        summary = summarize(records, metrics=samples)
        summary["run_id"] = p.name
    config = _read_json(p / "config.json") or {}
    return RunData(p, summary, records_frame(records), metrics_frame(samples), config, rebuilt)


# ------------------------------------------------------------------ derived views


def percentile(values, q: float) -> float | None:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, q)) if v.size else None


def itl_ms(df: pd.DataFrame) -> np.ndarray:
    """Every gap between content chunks of successful requests, pooled (ms)."""
    gaps = [np.diff(np.asarray(ts, dtype=float)) for ts in df.get("token_s", []) if isinstance(ts, list)
            and len(ts) > 1]
    return np.concatenate(gaps) * 1000.0 if gaps else np.empty(0)


def ecdf(values, max_points: int = 1000) -> tuple[list[float], list[float]]:
    """Sorted values and their cumulative fractions, thinned to at most ``max_points`` (keeping the
    extremes) so a long run does not bloat the page."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[~np.isnan(v)]
    if not v.size:
        return [], []
    y = np.arange(1, v.size + 1) / v.size
    if v.size > max_points:
        idx = np.unique(np.concatenate([np.linspace(0, v.size - 1, max_points).astype(int),
                                        np.arange(max(0, v.size - 20), v.size)]))
        v, y = v[idx], y[idx]
    return v.round(4).tolist(), y.round(6).tolist()


def tier_table(run: RunData) -> list[dict[str, Any]]:
    """Whole-run percentiles per tier (plus ``all``) from the records."""
    df = run.requests
    if df.empty:
        return []
    live = df[df["status"] != "cancelled"]
    slo_summary = run.summary.get("tiers") or {}
    rows = []
    groups = [(t, g) for t, g in live.groupby("tier", sort=True)]
    if len(groups) > 1:
        groups.append(("all", live))
    for tier, g in groups:
        ok = g[g["status"] == "ok"]
        it = itl_ms(ok)
        row: dict[str, Any] = {"tier": tier, "requests": len(g), "completed": len(ok),
                               "failed": int((g["status"] != "ok").sum())}
        for name, vals in (("ttft", ok["ttft_ms"]), ("tpot", ok["tpot_ms"]), ("itl", it), ("e2el", ok["e2el_ms"])):
            for q in (50, 90, 99):
                row[f"p{q}_{name}_ms"] = percentile(vals, q)
        att = (slo_summary.get(tier) or {}).get("slo_attainment")
        row["slo_attainment"] = att
        rows.append(row)
    return rows


def errors_table(run: RunData, examples: int = 1) -> list[dict[str, Any]]:
    df = run.requests
    if df.empty:
        errs = run.summary.get("errors") or {}
        return [{"status": k, "http_status": None, "count": v, "example": None} for k, v in errs.items()]
    bad = df[df["status"] != "ok"]
    rows = []
    http = bad["http_status"].map(lambda x: None if x is None or (isinstance(x, float) and math.isnan(x))
                                  else int(x))
    for (status, code), g in bad.assign(_http=http).groupby(["status", "_http"], dropna=False, sort=True):
        ex = g["error"].dropna()
        code = None if code is None or (isinstance(code, float) and math.isnan(code)) else int(code)
        rows.append({"status": status, "http_status": code, "count": len(g),
                     "example": str(ex.iloc[0])[:500] if len(ex) else None})
    rows.sort(key=lambda r: -r["count"])
    return rows


def _stage_breakdown(g: pd.DataFrame) -> dict[str, Any]:
    ok = g[g["status"] == "ok"]
    srv = ok["server"].map(lambda s: s if isinstance(s, dict) and s else None).dropna()
    if not len(srv):
        return {"source": None}
    sdf = pd.DataFrame.from_records(list(srv), index=srv.index).apply(pd.to_numeric, errors="coerce")
    q = sdf.get("queue_ms", pd.Series(0.0, index=sdf.index)).fillna(0)
    pf = sdf.get("prefill_ms", pd.Series(0.0, index=sdf.index)).fillna(0)
    dec = sdf.get("decode_ms", pd.Series(np.nan, index=sdf.index))
    net = (ok.loc[sdf.index, "ttft_ms"] - q - pf).clip(lower=0)
    return {"queue_ms": float(q.mean()), "prefill_ms": float(pf.mean()), "network_ms": float(net.mean()),
            "decode_ms": float(dec.mean()) if dec.notna().any() else None, "source": "timing"}


def steps(run: RunData) -> list[dict[str, Any]]:
    """Load steps: the capacity summary's ``steps``, else one step per record ``stage`` (a fixed-load run
    is one step) with the load taken as the achieved request rate."""
    raw = run.summary.get("steps")
    if isinstance(raw, list) and raw:
        out = []
        for i, s in enumerate(raw):
            if not isinstance(s, dict):
                continue
            s = dict(s)
            s.setdefault("index", i)
            s.setdefault("tiers", {})
            bd = s.get("breakdown") if isinstance(s.get("breakdown"), dict) else {}
            if not any(isinstance(bd.get(k), (int, float)) for k in ("queue_ms", "prefill_ms", "decode_ms")):
                g = run.requests[run.requests["stage"] == s["index"]] if not run.requests.empty else run.requests
                bd = _stage_breakdown(g) if not g.empty else bd
            s["breakdown"] = bd
            out.append(s)
        return out
    df = run.requests
    if df.empty:
        return []
    out = []
    slos = run.summary.get("slo") or {}
    for stage, g in df.groupby("stage", sort=True):
        span = float(g["scheduled_s"].max() - g["scheduled_s"].min())
        dur = float(g["done_s"].max() - g["scheduled_s"].min()) if g["done_s"].notna().any() else span
        ok = g[g["status"] == "ok"]
        tiers = {}
        for tier, tg in g.groupby("tier", sort=True):
            tok = tg[tg["status"] == "ok"]
            tiers[tier] = {"requests": len(tg), "p50_ttft_ms": percentile(tok["ttft_ms"], 50),
                           "p99_ttft_ms": percentile(tok["ttft_ms"], 99), "passed": None}
            slo = slos.get(tier) if isinstance(slos, dict) else None
            if isinstance(slo, dict) and slo.get("threshold_ms") is not None:
                q = percentile(tok["ttft_ms"], 100 * float(slo.get("quantile", 0.99)))
                tiers[tier]["passed"] = q is not None and q <= float(slo["threshold_ms"])
        out.append({
            "index": int(stage), "load": round(len(g) / span, 3) if span > 0 else None,
            "phase": "fixed", "passed": None, "stopped_early": False, "duration_s": dur, "requests": len(g),
            "completed": len(ok), "tiers": tiers, "breakdown": _stage_breakdown(g),
        })
    return out


def load_axis(run: RunData) -> tuple[str, str]:
    """(axis name, axis label) of the load steps."""
    axis = run.summary.get("axis") or ("rate" if run.is_capacity else "achieved rate")
    return str(axis), ("concurrency (requests in flight)" if axis == "concurrency" else "load (requests/s)")


def rated_load(run: RunData) -> tuple[float | None, float | None]:
    """(rated, spec) capacity on the steps' load axis, when the run has them."""
    rc = run.summary.get("rated_capacity")
    if not isinstance(rc, dict):
        return None, None
    axis, _ = load_axis(run)
    if axis == "concurrency":  # the steps' load is the number of users; rc["concurrency"] is what was in flight
        rated = rc.get("load") if isinstance(rc.get("load"), (int, float)) else rc.get("concurrency")
        head = run.summary.get("headroom")
        spec = rated * (1 - head) if isinstance(rated, (int, float)) and isinstance(head, (int, float)) else None
        return rated, spec
    return rc.get("rate_rps"), rc.get("spec_rate_rps")


# ------------------------------------------------------------------ time series (service health)


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
    server-side ones from ``metrics.jsonl`` (``vllm:`` names, ``slobench:`` per-tier names when scraped)."""
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
                out["ttft"][f"client p{q}"] = pack(ok.groupby(b)["ttft_ms"].quantile(q / 100))
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
            gen = _series(m, "vllm:generation_tokens").sum(axis=1, min_count=1)
            if gen.notna().sum() >= 2:
                out["token_rate"]["server tok/s"] = pack(_rate(gen))
        kv = _series(m, "vllm:kv_cache_usage_perc")
        if kv.empty:
            kv = _series(m, "vllm:gpu_cache_usage_perc")
        if not kv.empty:
            out["kv_usage"]["KV usage %"] = pack(kv.max(axis=1) * 100)
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
