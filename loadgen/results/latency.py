"""The one definition of every latency slobench reports (docs/ARCHITECTURE.md, "Metric definitions").

The summary, the capacity search, the report, the gate and the Locust driver all call these functions,
so they can never disagree about the same records. A record is a :class:`RequestRecord` or its JSON
dict (``requests.jsonl``); times are seconds on the run's clock, latencies milliseconds.

- **TTFT** = first token of any kind (reasoning or answer) − scheduled send (never the actual send: no
  coordinated omission). **TTFOT** = first answer (content) token − scheduled send: a reasoning model
  thinks first, so TTFOT − TTFT is its thinking time (equal for other models). **E2EL** = last token
  chunk − scheduled send. **TPOT** = (E2EL − TTFT) / (output tokens − 1), for answers of more than one
  token. **ITL** is per token: the gap before a chunk shared over the k tokens it carried, k equal
  samples (``chunk_tokens``, from usage deltas; one each without them), as SGLang's benchmark counts
  it; **chunk gaps** are the raw gaps between token chunks, reported apart. **Lateness** = actual send
  − scheduled send (the client's own delay). These are the formulas and JSON key names of vLLM's
  benchmark.
- **Summary statistics** (``describe``) use successful requests only, as vLLM does, and exact
  quantiles of the raw samples with linear interpolation (numpy's default, vLLM's too).
- **SLO values** (``slo_value``) are judged on *every* request: one that failed (429, error, read
  timeout) counts as ``inf`` — it broke the promise; one cut off before the event (still in flight, or
  cancelled at the end of a step) counts as the time it had waited, a lower bound. ``quantile`` is
  ``inf`` once it reaches a failed request, so a breach found with lower bounds is a real breach. A
  request's ``itl_ms`` SLO value is its longest per-token ITL (``worst_itl_ms``). A
  request the workload cancels on purpose (its cancellation mix: a user closing the tab) is no sample
  of any latency SLO: it is counted apart, with its reason.
- **Breakdown**: TTFT = queue + prefill + the rest (network and front end), and decode time, from the
  target's per-request timing when it sends one (vLLM's ``metrics`` object, slobench's ``timing``), else
  from its histograms' deltas over the run; ``source`` and ``source_detail`` say which.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

SLO_METRICS = ("ttft_ms", "ttfot_ms", "tpot_ms", "itl_ms", "e2el_ms")
# a run whose p99 client lateness exceeds this did not keep its schedule: it is marked invalid
LATENESS_BOUND_MS = 10.0
BREAKDOWN_PARTS = ("queue", "prefill", "network", "decode")


def _get(r: Any, name: str) -> Any:
    return r.get(name) if isinstance(r, Mapping) else getattr(r, name)


# ------------------------------------------------------------------ per request


def ttft_ms(r: Any) -> float | None:
    """Time to the first token of any kind (reasoning or answer), when one arrived."""
    first = _get(r, "first_token_s")
    return None if first is None else (first - _get(r, "scheduled_s")) * 1000.0


def ttfot_ms(r: Any) -> float | None:
    """Time to the first output (answer, content) token, when one arrived. A record of an older slobench,
    which had no ``first_output_s``, counted content only: its first token is its first output token."""
    has = ("first_output_s" in r) if isinstance(r, Mapping) else hasattr(r, "first_output_s")
    first = _get(r, "first_output_s") if has else _get(r, "first_token_s")
    return None if first is None else (first - _get(r, "scheduled_s")) * 1000.0


def generation_ms(r: Any) -> float | None:
    """From the first token to the last (the client's view of decode), when two or more chunks arrived."""
    ts = _get(r, "token_s")
    first = _get(r, "first_token_s")
    return (ts[-1] - first) * 1000.0 if ts and first is not None and len(ts) > 1 else None


def e2el_ms(r: Any) -> float | None:
    """Time to the last token, when any arrived."""
    ts = _get(r, "token_s")
    return (ts[-1] - _get(r, "scheduled_s")) * 1000.0 if ts else None


def _chunk_tokens(r: Any) -> list[int] | None:
    """Tokens per chunk of ``token_s`` when the server's usage deltas said (None: one each)."""
    ks = r.get("chunk_tokens") if isinstance(r, Mapping) else getattr(r, "chunk_tokens", None)
    if ks is None or isinstance(ks, float) or len(ks) != len(_get(r, "token_s") or ()):
        return None
    return [int(k) for k in ks]


def output_tokens(r: Any) -> int:
    """The server's count (usage) when it sent one, else the chunks' tokens (one per chunk without usage)."""
    n = _get(r, "output_tokens")
    if n is not None and not (isinstance(n, float) and math.isnan(n)):
        return int(n)
    ks = _chunk_tokens(r)
    return sum(ks) if ks is not None else len(_get(r, "token_s") or ())


def tpot_ms(r: Any) -> float | None:
    """Mean time per output token after the first; None for a one-token (or token-less) answer."""
    n = output_tokens(r)
    first, last = ttft_ms(r), e2el_ms(r)
    if n <= 1 or first is None or last is None:
        return None
    return (last - first) / (n - 1)


def chunk_gap_ms(r: Any) -> list[float]:
    """Every gap between consecutive token chunks."""
    ts = _get(r, "token_s") or ()
    return [(b - a) * 1000.0 for a, b in zip(ts, ts[1:], strict=False)]


def itl_ms(r: Any) -> list[float]:
    """Per-token inter-token latencies: each chunk gap shared over the k tokens of the chunk it ends, k
    equal samples (``chunk_tokens``); one sample per gap when the tokens per chunk are not known. The
    extra tokens of the first chunk have no gap: they came with the first token."""
    gaps = chunk_gap_ms(r)
    ks = _chunk_tokens(r)
    if ks is None:
        return gaps
    out: list[float] = []
    for g, k in zip(gaps, ks[1:], strict=True):
        out.extend([g / k] * k if k > 1 else [g])
    return out


def worst_itl_ms(r: Any) -> float | None:
    """The request's longest per-token inter-token latency (the longest stall its reader saw), the value an
    ``itl`` SLO judges: "p99 ITL <= 50 ms" holds when 99 % of requests never waited over 50 ms for a token.
    None for an answer of one chunk."""
    gaps = itl_ms(r)
    return max(gaps) if gaps else None


def lateness_ms(r: Any) -> float | None:
    sent = _get(r, "sent_s")
    return None if sent is None else (sent - _get(r, "scheduled_s")) * 1000.0


def sojourn_s(r: Any) -> float | None:
    """Time in the system, scheduled send to the end of the request (Little's law uses its mean)."""
    done = _get(r, "done_s")
    return None if done is None else done - _get(r, "scheduled_s")


def succeeded(r: Any) -> bool:
    return _get(r, "status") == "ok"


def client_cancelled(r: Any) -> bool:
    """Cancelled on purpose by the workload's cancellation mix (``cancel_reason`` "client: ..."), not cut
    off by the end of a run or a step."""
    reason = r.get("cancel_reason") if isinstance(r, Mapping) else getattr(r, "cancel_reason", None)
    return _get(r, "status") == "cancelled" and bool(reason) and str(reason).startswith("client")


def slo_value(r: Any, metric: str, now_s: float | None = None) -> float:
    """A request's value for one SLO metric, by the rule above: exact when known, ``inf`` for a failed
    request, the time waited so far for one still in flight (``done_s`` None, judged at ``now_s``) or
    cut off, NaN when it says nothing (the TPOT of an unfinished request)."""
    if client_cancelled(r):
        return math.nan  # a planned cancellation (a user closing the tab) is no latency sample, by rule
    sched = _get(r, "scheduled_s")
    done = _get(r, "done_s")
    pending = done is None
    end = now_s if pending else done
    cut = pending or _get(r, "status") == "cancelled"
    waited = (end - sched) * 1000.0 if cut and end is not None else math.inf
    if metric in ("ttft_ms", "ttfot_ms"):
        v = ttft_ms(r) if metric == "ttft_ms" else ttfot_ms(r)
        return v if v is not None else waited
    if metric == "e2el_ms":
        v = e2el_ms(r)
        return v if (not cut and succeeded(r) and v is not None) else waited
    if metric in ("tpot_ms", "itl_ms"):
        if cut:
            return math.nan
        if not succeeded(r):
            return math.inf
        v = tpot_ms(r) if metric == "tpot_ms" else worst_itl_ms(r)
        return 0.0 if v is None else v  # a one-token answer has no TPOT or ITL: it cannot miss it
    raise ValueError(f"unknown SLO metric {metric!r} (expected one of {', '.join(SLO_METRICS)})")


def slo_values(records: Iterable[Any], metric: str, now_s: float | None = None) -> np.ndarray:
    """``slo_value`` of each record, the ones that say nothing (NaN) left out."""
    v = np.asarray([slo_value(r, metric, now_s) for r in records], dtype=float)
    return v[~np.isnan(v)]


def meets(r: Any, slos: Mapping[str, float]) -> bool:
    """Succeeded and met every SLO in ``slos`` (``{"ttft_ms": 300, ...}``)."""
    return succeeded(r) and all(slo_value(r, k) <= limit for k, limit in slos.items())


# ------------------------------------------------------------------ over many requests


def quantile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The q-quantile (0..1) with linear interpolation; ``inf`` when it touches a failed request (an
    exact hit on a finite sample below the first ``inf`` stays finite); NaN without values."""
    v = np.sort(np.asarray(values, dtype=float))
    if v.size == 0:
        return math.nan
    return float(quantile_of_sorted(v[None, :], q)[0])


def quantile_of_sorted(rows: np.ndarray, q: float) -> np.ndarray:
    """``quantile`` of each row of a matrix whose rows are sorted ascending (the bootstrap's resamples)."""
    n = rows.shape[1]
    pos = q * (n - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    a, b = rows[:, lo], rows[:, hi]
    frac = pos - lo
    with np.errstate(invalid="ignore"):
        out = a + (b - a) * frac
    if frac == 0:
        return a.astype(float)
    return np.where(np.isfinite(b), out, math.inf)


def describe(name: str, values: Iterable[float] | np.ndarray, percentiles: Iterable[float] = (90, 99),
             out: dict[str, Any] | None = None) -> dict[str, Any]:
    """``mean_/median_/std_/pN_{name}_ms`` of finite samples (NaN and None dropped), ``None`` when empty."""
    out = {} if out is None else out
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[~np.isnan(v)]
    empty = v.size == 0
    out[f"mean_{name}_ms"] = None if empty else float(v.mean())
    out[f"median_{name}_ms"] = None if empty else quantile(v, 0.5)
    out[f"std_{name}_ms"] = None if empty else float(v.std())
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = None if empty else quantile(v, p / 100.0)
    return out


def percentile(values: Iterable[float] | np.ndarray, p: float) -> float | None:
    """The p-th percentile (0..100) of the finite samples, None when there are none."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[~np.isnan(v)]
    return quantile(v, p / 100.0) if v.size else None


def pooled_itl_ms(records: Iterable[Any]) -> np.ndarray:
    """Every per-token inter-token latency of the given (successful) requests, pooled."""
    gaps = [g for r in records for g in itl_ms(r)]
    return np.asarray(gaps, dtype=float)


def pooled_chunk_gap_ms(records: Iterable[Any]) -> np.ndarray:
    """Every gap between token chunks of the given (successful) requests, pooled."""
    gaps = [g for r in records for g in chunk_gap_ms(r)]
    return np.asarray(gaps, dtype=float)


# ------------------------------------------------------------------ where TTFT goes


# where a breakdown came from: the record's server["source"] -> the breakdown's source_detail
SERVER_SOURCES = {"vllm metrics": "vLLM per-request metrics object (--enable-per-request-metrics)",
                  "slobench timing": "slobench engine timing object"}


def breakdown(records: Sequence[Any], histogram_means: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The queue / prefill / network / decode split of the successful requests, in ms.

    From per-request server timing (``server`` = ``{queue_ms, prefill_ms, decode_ms, source}``) when the
    target sends it: means, medians and p99s, with network = TTFT − queue − prefill − held per request (held:
    the reference engine's first token → first text, an incomplete character held back; 0 elsewhere). Otherwise
    from ``histogram_means`` (the target's histogram deltas over the run, ``{queue_ms, prefill_ms,
    decode_ms, requests}``, and ``source``, e.g. "sglang histograms", when the caller knows it): means
    only, network = mean TTFT − mean queue − mean prefill. ``source`` says which ("server timing" | the
    histograms' source, "vllm histograms" by default | None); ``source_detail`` says exactly where from."""
    ok = [r for r in records if succeeded(r) and ttft_ms(r) is not None]
    timed = [r for r in ok if isinstance(_get(r, "server"), Mapping) and "queue_ms" in _get(r, "server")
             and "prefill_ms" in _get(r, "server")]
    out: dict[str, Any] = {"source": None, "source_detail": None, "requests": 0,
                           **{f"mean_{part}_ms": None for part in BREAKDOWN_PARTS}}
    ttfts = [ttft_ms(r) for r in ok]
    if timed:
        parts = {
            "queue": [float(_get(r, "server")["queue_ms"]) for r in timed],
            "prefill": [float(_get(r, "server")["prefill_ms"]) for r in timed],
            # held_ms (the reference engine: its first token's text held back) is the engine's, not the network's
            "network": [ttft_ms(r) - _get(r, "server")["queue_ms"] - _get(r, "server")["prefill_ms"]
                        - _get(r, "server").get("held_ms", 0.0) for r in timed],
            "decode": [float(_get(r, "server")["decode_ms"]) for r in timed if "decode_ms" in _get(r, "server")],
        }
        kinds = sorted({str(_get(r, "server").get("source") or "slobench timing") for r in timed})
        detail = "; ".join(SERVER_SOURCES.get(k, k) for k in kinds)
        out.update(source="server timing", source_detail=detail, requests=len(timed))
        for part, vals in parts.items():
            out[f"mean_{part}_ms"] = float(np.mean(vals)) if vals else None
            out[f"p50_{part}_ms"] = percentile(vals, 50)
            out[f"p99_{part}_ms"] = percentile(vals, 99)
        # the reference engine's own parts, where given: its front end's share (within network) and its first
        # text held back after the first token (taken out of network above)
        for key in ("front_end", "held"):
            vals = [float(_get(r, "server")[f"{key}_ms"]) for r in timed if f"{key}_ms" in _get(r, "server")]
            if vals:
                out.update({f"mean_{key}_ms": float(np.mean(vals)), f"p50_{key}_ms": percentile(vals, 50),
                            f"p99_{key}_ms": percentile(vals, 99)})
    elif histogram_means and any(histogram_means.get(k) is not None for k in ("queue_ms", "prefill_ms", "decode_ms")):
        q, p = histogram_means.get("queue_ms"), histogram_means.get("prefill_ms")
        mean_ttft = float(np.mean(ttfts)) if ttfts else None
        known = mean_ttft is not None and q is not None and p is not None
        source = histogram_means.get("source") or "vllm histograms"
        detail = histogram_means.get("source_detail") or (
            f"the target's /metrics histogram deltas over the run ({source})")
        out.update(source=source, source_detail=detail, requests=histogram_means.get("requests"),
                   mean_queue_ms=q, mean_prefill_ms=p, mean_network_ms=mean_ttft - q - p if known else None,
                   mean_decode_ms=histogram_means.get("decode_ms"))
    out["mean_ttft_ms"] = float(np.mean(ttfts)) if ttfts else None
    return out
