"""The table ``run``, ``replay`` and ``summarize`` print: latency percentiles, throughput, errors,
client lateness, the server-side breakdown and per-tier SLO attainment (the share of requests that met the
tier's per-request SLOs; its mean SLOs, ``--slo tpot:50@mean``, each a verdict of their own), or the summary as
JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadgen.results.slo import MEAN_SUFFIX


def _num(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def print_summary(s: dict[str, Any], run_dir: Path, as_json: bool) -> None:
    if as_json:
        print(json.dumps(s, indent=2, default=float))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"slobench {s.get('run_id', '')}", show_header=True)
    t.add_column("metric")
    for c in ("mean", "median", "p90", "p99"):
        t.add_column(c, justify="right")
    rows = ["ttft", "tpot", "itl", "e2el"]
    if s.get("total_reasoning_tokens"):  # a reasoning model: the first answer token comes after its thinking
        rows.insert(1, "ttfot")
    if s.get("mean_chunk_gap_ms") is not None and s.get("mean_chunk_gap_ms") != s.get("mean_itl_ms"):
        rows.insert(rows.index("itl") + 1, "chunk_gap")  # several tokens a chunk: ITL is per token, gaps apart
    for m in rows:
        label = "chunk gap" if m == "chunk_gap" else m.upper()
        t.add_row(
            f"{label} (ms)", *(_num(s.get(f"{c}_{m}_ms")) for c in ("mean", "median", "p90", "p99")))
    con.print(t)
    lat = s.get("client_lateness", {})
    con.print(
        f"requests {s.get('requests')}  completed {s.get('completed')}  failed {s.get('failed')}  "
        f"cancelled {s.get('cancelled', 0)}  duration {_num(s.get('duration'))} s\n"
        f"request throughput {_num(s.get('request_throughput'))} req/s  "
        f"goodput {_num(s.get('request_goodput'))} req/s  output {_num(s.get('output_throughput'))} tok/s\n"
        f"errors {s.get('errors') or '{}'}  client lateness p50 {_num(lat.get('p50_ms'))} ms "
        f"p99 {_num(lat.get('p99_ms'))} ms  valid {s.get('valid')}"
    )
    bd = s.get("breakdown") or {}
    if bd.get("source"):
        con.print(f"breakdown ({bd['source']}): queue {_num(bd.get('mean_queue_ms'))} ms  prefill "
                  f"{_num(bd.get('mean_prefill_ms'))} ms  decode {_num(bd.get('mean_decode_ms'))} ms (means)")
    for tier, e in (s.get("tiers") or {}).items():
        if "slo_attainment" in e:
            per_request = {k: v for k, v in e["slo"].items() if k not in mean_keys(e)}
            con.print(f"tier {tier}: {e['slo_met']}/{e['requests']} met {per_request} "
                      f"({100 * e['slo_attainment']:.1f}%)")
        for metric, m in (e.get("slo_means") or {}).items():  # a run-level check, apart from attainment
            verdict = "-" if m.get("passed") is None else ("PASS" if m["passed"] else "FAIL")
            failed = m.get("mean_ms") is None and m.get("n")
            mean = "inf (a request failed)" if failed else f"{_num(m.get('mean_ms'))} ms"
            con.print(f"tier {tier}: mean {metric[:-3].upper()} {mean} over {m.get('n')} requests, SLO <= "
                      f"{m['threshold_ms']:g} ms: {verdict}")
    if not s.get("valid", True) and s.get("invalid_reason"):
        con.print(f"[bold red]INVALID RUN:[/] {s['invalid_reason']}")
    print_target_fit(con, s)
    con.print(f"results: {run_dir}/ (requests.jsonl, metrics.jsonl, summary.json)")


def mean_keys(tier: dict[str, Any]) -> set[str]:
    """The tier's ``slo`` keys of mean SLOs (``tpot_ms@mean``): judged apart, not per request."""
    return {k for k in tier.get("slo") or {} if k.endswith(MEAN_SUFFIX)}


def print_target_fit(con, s: dict[str, Any]) -> None:
    """What the target did not accept and what that means; prompt lengths off their intent; a warm cache."""
    from rich.markup import escape

    probe = s.get("target_probe") or {}
    fit = s.get("request_fit") or {}
    if fit.get("dropped"):
        con.print(f"target ({probe.get('server', 'unknown')}): not sent: {', '.join(fit['dropped'])}")
    for note in fit.get("notes") or []:
        con.print(f"[yellow]note:[/] {escape(note)}")
    pl = s.get("prompt_length") or {}
    if pl.get("flagged") and pl.get("note"):
        con.print(f"[bold yellow]prompt lengths:[/] {escape(pl['note'])}")
    pc = s.get("prefix_cache") or {}
    if pc.get("warm_cache") and pc.get("note"):
        con.print(f"[bold yellow]prefix cache:[/] {escape(pc['note'])}")
