"""Turn run records into a summary with vLLM benchmark_serving's key names.

Every latency and statistic comes from ``loadgen.results.latency`` (the one definition of TTFT, TPOT,
ITL, E2EL, the breakdown and the quantiles); this module only groups and names them:
``mean_*``, ``median_*``, ``std_*``, ``p90_*``, ``p99_*`` in ms, ``null`` when there is no sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from loadgen.results import latency
from loadgen.results.conversation_stats import cancellations_section, conversations_section
from loadgen.results.outcomes import OUTCOMES, outcome_counts
from loadgen.results.scraped import breakdown_histogram_means, scrape_cost
from loadgen.results.slo import mean_of, mean_slos, per_request_slos

METRICS = ("ttft", "ttfot", "tpot", "itl", "chunk_gap", "e2el")
SLO_KEYS = {"ttft": "ttft_ms", "ttfot": "ttfot_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2el_ms"}


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


def request_frame(records: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per record with its latencies in ms (``latency``'s definitions; NaN where undefined, and
    for requests that did not succeed: summary statistics use successful requests only)."""
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return df
    if "prompt_tokens_intended" not in df:  # records of an older slobench
        df["prompt_tokens_intended"] = None
    for col in ("first_token_s", "sent_s", "done_s", "output_tokens", "prompt_tokens", "prompt_tokens_intended"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    ok = [latency.succeeded(r) for r in records]
    nan = math.nan

    def col(fn) -> list[float]:
        return [(v if (v := fn(r)) is not None and good else nan) for r, good in zip(records, ok, strict=True)]

    df["ttft_ms"] = col(latency.ttft_ms)
    df["ttfot_ms"] = col(latency.ttfot_ms)
    df["e2el_ms"] = col(latency.e2el_ms)
    df["tpot_ms"] = col(latency.tpot_ms)
    df["lateness_ms"] = [nan if (v := latency.lateness_ms(r)) is None else v for r in records]
    return df


def meets(df: pd.DataFrame, slo: Mapping[str, float]) -> pd.Series:
    """Per request (row): succeeded and met every SLO in ``slo`` (``latency.meets``)."""
    return pd.Series([latency.meets(r, slo) for r in _rows(df)], index=df.index, dtype=bool)


def _rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    cols = [c for c in ("scheduled_s", "first_token_s", "first_output_s", "token_s", "chunk_tokens", "done_s",
                        "output_tokens", "status") if c in df]
    return df[cols].to_dict("records")


def summarize(
    records: list[Mapping[str, Any]],
    *,
    goodput: Mapping[str, float] | None = None,
    tier_slos: Mapping[str, Mapping[str, float]] | None = None,
    lateness_bound_ms: float = latency.LATENESS_BOUND_MS,
    metrics: list[Mapping[str, Any]] | None = None,
    percentiles: Iterable[float] = (90, 99),
    planned: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``planned``: what the run meant to send beyond its records (``conversation_stats.planned_of``)."""
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
    # the server's count where it gave one, else the intended length
    n_in = float(okd["prompt_tokens"].fillna(okd["prompt_tokens_intended"]).fillna(0).sum())
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
    goodput = per_request_slos(goodput or {})  # a mean SLO is no request's to meet: it is judged per tier
    if goodput:
        good = int(meets(df, goodput).sum())
        out["request_goodput"] = good / duration if duration > 0 else None
        out["goodput_slo"] = dict(goodput)
        out["goodput_fraction"] = good / max(1, int((~cancelled).sum()))
    for name in ("ttft", "ttfot", "tpot", "e2el"):
        latency.describe(name, okd[f"{name}_ms"], percentiles, out)
    ok_records = [r for r in records if latency.succeeded(r)]
    latency.describe("itl", latency.pooled_itl_ms(ok_records), percentiles, out)  # per token
    latency.describe("chunk_gap", latency.pooled_chunk_gap_ms(ok_records), percentiles, out)  # per chunk
    if "reasoning_tokens" in okd and okd["reasoning_tokens"].notna().any():  # a reasoning model: its two counts
        n_think = float(pd.to_numeric(okd["reasoning_tokens"], errors="coerce").fillna(0).sum())
        out["total_reasoning_tokens"] = int(n_think)
        out["total_answer_tokens"] = int(n_out - n_think)

    out["outcomes"] = _outcomes(df, tier_slos or {})
    if "retries" in df:
        out["retries"] = int(pd.to_numeric(df["retries"], errors="coerce").fillna(0).sum())
    errs = df.loc[~ok, "status"].value_counts()
    out["errors"] = {str(k): int(v) for k, v in errs.items()}
    http = df.loc[df["http_status"].notna() & (df["http_status"] != 200), "http_status"].astype(int)
    out["errors_by_http_status"] = {str(k): int(v) for k, v in http.value_counts().items()}
    first_errors = df.loc[~ok & df["error"].notna(), "error"].drop_duplicates().head(5)
    out["error_examples"] = [str(e) for e in first_errors]

    if tier_slos or df["tier"].notna().any():
        out["tiers"] = _tiers(df, tier_slos or {}, percentiles)
    hist = breakdown_histogram_means(metrics[0].get("metrics", {}), metrics[-1].get("metrics", {})) \
        if metrics and len(metrics) >= 2 else None
    out["breakdown"] = latency.breakdown(ok_records, hist)

    planned = planned or {}
    out["conversations"] = conversations_section(records, planned.get("turns"))
    out["cancellations"] = cancellations_section(records, planned.get("cancels"))
    out["prompt_length"] = prompt_length_truth(okd)
    out["scrape"] = scrape_cost(list(metrics or []))
    late = df["lateness_ms"].dropna().to_numpy()
    lat = {
        "p50_ms": latency.percentile(late, 50),
        "p99_ms": latency.percentile(late, 99),
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


def _outcomes(df: pd.DataFrame, tier_slos: Mapping[str, Mapping[str, float]]) -> dict[str, int]:
    """Every request's class (``results.outcomes``), each judged by its own tier's per-request SLOs."""
    total = dict.fromkeys(OUTCOMES, 0)
    for tier, g in df.groupby(df["tier"].fillna("none"), sort=True):
        for k, v in outcome_counts(_rows(g), per_request_slos(tier_slos.get(str(tier)) or {})).items():
            total[k] += v
    return total


def _tiers(df: pd.DataFrame, tier_slos: Mapping[str, Mapping[str, float]], percentiles) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for tier, g in df.groupby(df["tier"].fillna("none"), sort=True):  # cancelled requests too: a class of theirs
        res[str(tier)] = {"outcomes": outcome_counts(_rows(g), per_request_slos(tier_slos.get(str(tier)) or {}))}
    live = df[df["status"] != "cancelled"]
    for tier, g in live.groupby(live["tier"].fillna("none"), sort=True):
        ok = g["status"] == "ok"
        entry: dict[str, Any] = {"requests": len(g), "completed": int(ok.sum()), **res[str(tier)]}
        latency.describe("ttft", g.loc[ok, "ttft_ms"], percentiles, entry)
        latency.describe("ttfot", g.loc[ok, "ttfot_ms"], percentiles, entry)
        slo = tier_slos.get(str(tier))
        if slo:
            entry["slo"] = dict(slo)
            per_request = per_request_slos(slo)
            if per_request:
                met = int(meets(g, per_request).sum())
                entry["slo_met"] = met
                entry["slo_attainment"] = met / len(g) if len(g) else None
            if means := mean_slos(slo):
                entry["slo_means"] = _mean_verdicts(g, means)
        res[str(tier)] = entry
    return res


def _mean_verdicts(g: pd.DataFrame, means: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """The tier's mean SLOs, judged on the whole run: a run-level check, apart from the per-request
    attainment (a failed request's value is inf, as everywhere: one breaks the mean; ``mean_ms`` is then
    null and ``passed`` false)."""
    # the frame's NaN is the records' None (a failed request's first_token_s): slo_value reads None as "never"
    rows = [{k: None if isinstance(x, float) and math.isnan(x) else x for k, x in r.items()} for r in _rows(g)]
    out = {}
    for metric, thr in means.items():
        v = latency.slo_values(rows, metric)
        m = mean_of(v)
        out[metric] = {"threshold_ms": thr, "mean_ms": m if math.isfinite(m) else None, "n": int(v.size),
                       "failed": int((~np.isfinite(v)).sum()), "passed": bool(m <= thr) if v.size else None}
    return out


DRIFT_FLAG = 0.02  # prompts off their intended length by more than this, on average, are flagged


def prompt_length_truth(okd: pd.DataFrame) -> dict[str, Any]:
    """How far the server's prompt token counts are from the intended lengths (successful requests that
    have both): mean relative drift (server - intended) / intended, mean and max absolute drift, and a
    flag when the mean absolute drift exceeds 2%: the load was not the one described (a tokenizer other
    than the server's, a chat template's tokens, a BOS token)."""
    both = okd[["prompt_tokens", "prompt_tokens_intended"]].dropna()
    both = both[both["prompt_tokens_intended"] > 0]
    out: dict[str, Any] = {"requests_compared": int(len(both)), "intended_tokens": None, "server_tokens": None,
                           "mean_drift": None, "mean_abs_drift": None, "max_abs_drift": None, "flagged": False}
    if both.empty:
        out["note"] = ("the server reported no prompt token counts (no usage): lengths are the intended ones, "
                       "unchecked") if okd["prompt_tokens"].isna().all() and len(okd) else None
        return out
    rel = (both["prompt_tokens"] - both["prompt_tokens_intended"]) / both["prompt_tokens_intended"]
    out.update(intended_tokens=int(both["prompt_tokens_intended"].sum()),
               server_tokens=int(both["prompt_tokens"].sum()), mean_drift=float(rel.mean()),
               mean_abs_drift=float(rel.abs().mean()), max_abs_drift=float(rel.abs().max()))
    out["flagged"] = out["mean_abs_drift"] > DRIFT_FLAG
    if out["flagged"]:
        out["note"] = (f"prompts were {100 * out['mean_drift']:+.1f}% off their intended length on average (server "
                       f"count vs intended): pass the server's tokenizer (--tokenizer DIR) for exact lengths")
    return out


def prompt_length_of(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """``prompt_length_truth`` of a run's successful records (a capacity run's, over all its steps)."""
    df = request_frame(list(records))
    if df.empty:
        return prompt_length_truth(pd.DataFrame(columns=["prompt_tokens", "prompt_tokens_intended"]))
    return prompt_length_truth(df[df["status"] == "ok"])
