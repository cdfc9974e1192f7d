"""The five signals in PromQL, for vLLM's names and for the reference engine's own ``slobench:`` ones: what a
dashboard panel plots and what an alert compares with its threshold. Each expression reads the signal as
``slobench watch`` does — TTFT p99 in ms from the histogram's bucket rates, token and rejection counters as
rates, gauges averaged over the range — so a threshold from the rated step means the same in both.

``rng`` is the range: ``$__rate_interval`` on a dashboard, a fixed ``1m`` in alerting rules."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.monitoring.signals import BATCH_FILL, KV, REJECTIONS, TOKEN_RATE, TTFT, TTFT_QUANTILE

EXPORT_FLAVORS = ("vllm", "slobench")


@dataclass(frozen=True)
class Query:
    expr: str  # the value compared with the threshold
    legend: str
    extra: tuple[tuple[str, str], ...] = ()  # (expr, legend) plotted beside it: p50, per tier


def ttft(hist: str, rng: str, by: str = "", q: float = TTFT_QUANTILE) -> str:
    return f"1000 * histogram_quantile({q:g}, sum by (le{by}) (rate({hist}_bucket[{rng}])))"


def queries(flavor: str, rng: str, max_num_seqs: int | None) -> dict[str, Query]:
    """Signal key -> its query in ``flavor``'s names (a signal the server has no series for is left out:
    vLLM counts no admission rejections, and without ``max_num_seqs`` its batch fill has no denominator)."""
    if flavor == "vllm":
        out = {
            TTFT.key: Query(ttft("vllm:time_to_first_token_seconds", rng), "p99",
                            ((ttft("vllm:time_to_first_token_seconds", rng, q=0.5), "p50"),)),
            TOKEN_RATE.key: Query(f"sum(rate(vllm:generation_tokens_total[{rng}]))", "generated tok/s"),
            KV.key: Query(f"avg(avg_over_time(vllm:kv_cache_usage_perc[{rng}]))", "KV usage"),
        }
        if max_num_seqs:
            out[BATCH_FILL.key] = Query(f"sum(avg_over_time(vllm:num_requests_running[{rng}])) / {max_num_seqs}",
                                        f"running / max_num_seqs ({max_num_seqs})")
        return out
    if flavor == "slobench":
        return {
            TTFT.key: Query(ttft("slobench:time_to_first_token_seconds", rng), "p99",
                            ((ttft("slobench:time_to_first_token_seconds", rng, ", tier"), "p99 {{tier}}"),)),
            TOKEN_RATE.key: Query(f"sum(rate(slobench:generation_tokens_total[{rng}]))", "generated tok/s",
                                  ((f"sum by (tier) (rate(slobench:generation_tokens_total[{rng}]))", "{{tier}}"),)),
            KV.key: Query(f"sum(avg_over_time(slobench:kv_cache_usage_perc[{rng}]))", "KV usage",
                          ((f"sum by (tier) (avg_over_time(slobench:kv_cache_usage_perc[{rng}]))", "{{tier}}"),)),
            BATCH_FILL.key: Query(f"sum(avg_over_time(slobench:batch_fill_ratio[{rng}]))", "batch fill",
                                  ((f"sum by (tier) (avg_over_time(slobench:batch_fill_ratio[{rng}]))", "{{tier}}"),)),
            REJECTIONS.key: Query(f"sum(rate(slobench:admission_rejections_total[{rng}]))", "rejections/s",
                                  ((f"sum by (tier) (rate(slobench:admission_rejections_total[{rng}]))", "{{tier}}"),)),
        }
    raise ValueError(f"flavor {flavor!r}: expected one of {', '.join(EXPORT_FLAVORS)}")


def under_load(flavor: str, rng: str, running: float | None) -> str:
    """True (a non-empty result) while the server is under load: at least one request queued on average over
    the range, or as many running as at the rated step (``running``)."""
    prefix = "vllm:" if flavor == "vllm" else "slobench:"
    cond = f"sum(avg_over_time({prefix}num_requests_waiting[{rng}])) >= 1"
    if running:
        cond += f" or sum(avg_over_time({prefix}num_requests_running[{rng}])) >= {running:.6g}"
    return cond


def alert_expr(q: Query, bad: str, threshold: float, load: str) -> str:
    """The alert's condition: above the threshold for a higher-is-bad signal; below it, under load, for a
    lower-is-bad one."""
    if bad == "high":
        return f"{q.expr} > {threshold:.6g}"
    return f"({q.expr} < {threshold:.6g}) and on() ({load})"
