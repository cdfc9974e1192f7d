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

from loadgen.capacity.rating import step_load
from loadgen.results import latency
from loadgen.results.records import read_records
from loadgen.results.rundir import PREDICTION, read_metrics
from loadgen.results.slo import mean_of
from loadgen.results.summary import request_frame, summarize

RECORD_COLUMNS = ("id", "stage", "tier", "scheduled_s", "sent_s", "first_token_s", "token_s", "done_s",
                  "prompt_tokens", "output_tokens", "status", "http_status", "error", "server",
                  "prompt_tokens_intended", "first_output_s", "reasoning_tokens", "chunk_tokens", "cached_tokens",
                  "conversation", "turn", "cancel_reason")


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
    prediction: dict[str, Any] | None = None  # prediction.json (``slobench plan --capacity-run``), if any

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
    prediction = _read_json(p / PREDICTION)
    if not isinstance((prediction or {}).get("predicted"), dict):
        prediction = None  # not one slobench plan wrote: the report goes without it
    return RunData(p, summary, records_frame(records), metrics_frame(samples), config, rebuilt, prediction)


# ------------------------------------------------------------------ derived views


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0..100) of the finite values (``latency.percentile``)."""
    return latency.percentile(values, q)


def itl_ms(df: pd.DataFrame) -> np.ndarray:
    """Every gap between content chunks of the frame's requests, pooled (ms)."""
    return latency.pooled_itl_ms(records_of(df))


def records_of(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The frame's rows as record dicts, for ``latency``'s per-request functions (a pandas NaN back to the
    record's None)."""
    cols = [c for c in RECORD_COLUMNS if c in df.columns]
    rows = df[cols].to_dict("records")
    for r in rows:
        if not isinstance(r.get("token_s"), list):
            r["token_s"] = []
        for k, v in r.items():
            if isinstance(v, float) and math.isnan(v):
                r[k] = None
    return rows


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


def tier_table(run: RunData, df: pd.DataFrame | None = None,
               tier_summaries: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Percentiles per tier (plus ``all``) of the records of ``df`` (default: the whole run), with the SLO
    attainment of ``tier_summaries`` (summaries' ``tiers`` sections, pooled; default: the run's)."""
    df = run.requests if df is None else df
    if df.empty:
        return []
    live = df[df["status"] != "cancelled"]
    slo_summary = pooled_attainment(tier_summaries if tier_summaries is not None else [run.summary.get("tiers") or {}])
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
        row["slo_attainment"] = slo_summary.get(tier)
        rows.append(row)
    return rows


def pooled_attainment(tier_summaries: list[dict[str, Any]]) -> dict[str, float | None]:
    """{tier: requests that met its SLOs / its requests} over several summaries' ``tiers`` sections (one
    summary: its own ``slo_attainment``)."""
    met: dict[str, float] = {}
    total: dict[str, float] = {}
    for tiers in tier_summaries:
        for tier, e in (tiers or {}).items():
            if not isinstance(e, dict) or not isinstance(e.get("slo_attainment"), (int, float)):
                continue
            n = e.get("requests") if isinstance(e.get("requests"), (int, float)) else None
            m = e.get("slo_met") if isinstance(e.get("slo_met"), (int, float)) else None
            if n is None or m is None:  # an older summary: its attainment alone, weighted by one
                n, m = 1.0, float(e["slo_attainment"])
            met[tier] = met.get(tier, 0.0) + float(m)
            total[tier] = total.get(tier, 0.0) + float(n)
    out: dict[str, float | None] = {t: (met[t] / total[t] if total[t] else None) for t in total}
    return out


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
    """The breakdown of one stage's records (per-request server timing only: a fixed run's scrape is not
    split by stage)."""
    return latency.breakdown(records_of(g))


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
            if not any(isinstance(bd.get(f"mean_{k}_ms"), (int, float)) for k in latency.BREAKDOWN_PARTS):
                g = run.requests[run.requests["stage"] == s["index"]] if not run.requests.empty else run.requests
                bd = _stage_breakdown(g) if not g.empty else bd
            s["breakdown"] = bd
            s["offered"] = offered_load(s, str(run.summary.get("axis") or "rate"))
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
            if isinstance(slo, dict) and slo.get("threshold_ms") is not None:  # the SLO rule: failures at inf
                vals = latency.slo_values(records_of(tg), "ttft_ms")
                q = (None if not vals.size else mean_of(vals) if slo.get("statistic") == "mean"
                     else latency.quantile(vals, float(slo.get("quantile", 0.99))))
                tiers[tier]["passed"] = q is not None and q <= float(slo["threshold_ms"])
        out.append({
            "index": int(stage), "load": round(len(g) / span, 3) if span > 0 else None,
            "phase": "fixed", "passed": None, "stopped_early": False, "duration_s": dur, "requests": len(g),
            "completed": len(ok), "tiers": tiers, "breakdown": _stage_breakdown(g),
        })
    return out


def offered_load(step: dict[str, Any], axis: str) -> float | None:
    """The load a capacity step offered the target: ``offered_rps`` (the requests sent in its window / the
    window's length, the rate ``rated_capacity.rate_rps`` pools), else where the rating places it
    (``capacity.rating.step_load``); its users on the concurrency axis."""
    if axis == "concurrency":
        return _finite(step.get("load"))
    offered = _finite(step.get("offered_rps"))
    return offered if offered is not None and offered > 0 else step_load(step, axis)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


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
