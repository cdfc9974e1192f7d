"""TTFT, TPOT, ITL, E2EL and the SLO quantile are defined once, in ``loadgen.results.latency``: the source
computes them nowhere else, and the summary, the capacity step, the report and the Locust collector
give exactly the same figures for one set of records."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from loadgen.capacity.step_stats import tier_entry
from loadgen.drivers.locust.collect import Collector
from loadgen.drivers.locust.stages import staged_load_from_specs
from loadgen.report import data as report_data
from loadgen.results import latency
from loadgen.results.records import RequestRecord
from loadgen.results.slo import SLO
from loadgen.results.summary import summarize
from loadgen.workload.specs import RequestSpec

REPO = Path(__file__).resolve().parents[3]
LATENCY = REPO / "loadgen" / "results" / "latency.py"
TOKEN_TIMES = {"first_token_s", "token_s", "sent_s"}  # what TTFT, E2EL, ITL and lateness are made of
TIMES = TOKEN_TIMES | {"scheduled_s", "done_s"}
QUANTILE_FUNCS = {"percentile", "quantile", "median", "nanpercentile", "nanquantile", "nanmedian"}
NUMERIC_MODULES = {"np", "numpy", "pd", "pandas", "statistics"}


def _mentions(node: ast.AST, fields: set[str]) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in fields:
            return True
        if isinstance(n, ast.Constant) and n.value in fields:
            return True
    return False


def _per_request_time(node: ast.AST, fields: set[str]) -> bool:
    """A record's time field itself, not an aggregate over many (``df["scheduled_s"].min()`` spans a run)."""
    return not isinstance(node, ast.Call) and _mentions(node, fields)


def _latency_arithmetic(node: ast.BinOp) -> bool:
    left, right = node.left, node.right
    return (_per_request_time(left, TOKEN_TIMES) or _per_request_time(right, TOKEN_TIMES)
            or (_per_request_time(left, TIMES) and _per_request_time(right, TIMES)))


def _numeric_quantile(func: ast.Attribute) -> bool:
    """``np.percentile``, ``series.quantile``, ``df.groupby(...).median`` ...; not ``settings.quantile(tier)``."""
    owner = func.value
    return isinstance(owner, (ast.Subscript, ast.Call, ast.Attribute)) or (
        isinstance(owner, ast.Name) and owner.id in NUMERIC_MODULES)


def offences(path: Path) -> list[str]:
    """Latency arithmetic on record times, or a quantile/percentile/median computed by numpy or pandas."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.Div)) and _latency_arithmetic(node):
            out.append(f"{where}:{node.lineno}: latency arithmetic on record times")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in QUANTILE_FUNCS \
                and _numeric_quantile(node.func):
            out.append(f"{where}:{node.lineno}: .{node.func.attr}() outside results/latency.py")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "diff" and any(
                _mentions(a, TIMES) for a in node.args):
            out.append(f"{where}:{node.lineno}: inter-token gaps outside results/latency.py")
    return out


def test_no_latency_is_computed_outside_the_latency_module():
    bad = [o for p in sorted((REPO / "loadgen").rglob("*.py")) if p != LATENCY for o in offences(p)]
    assert not bad, "\n".join(bad)


def test_the_check_catches_a_second_definition(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import numpy as np\n"
                       "def ttft(r):\n    return (r.first_token_s - r.scheduled_s) * 1000\n"
                       "def p99(v):\n    return np.percentile(v, 99)\n"
                       "def itl(r):\n    return np.diff(r['token_s'])\n")
    assert len(offences(planted)) == 3


def records() -> list[RequestRecord]:
    """Two tiers, successes with varied timing, a 429, an error before the first token, a request cut off
    while waiting and one cut off while decoding."""
    out = []
    for i in range(40):
        tier = "premium" if i % 3 == 0 else "standard"
        sched = 0.1 * i
        first = sched + 0.05 + 0.004 * (i % 7) + (0.3 if i % 11 == 0 else 0.0)
        toks = [first + 0.02 * k + 0.001 * (i % 5) * k for k in range(1 + i % 6)]
        out.append(RequestRecord(f"r{i}", 0, tier, sched, sent_s=sched + 0.0005, first_token_s=first,
                                 token_s=toks, done_s=toks[-1] + 0.001, prompt_tokens=16,
                                 output_tokens=len(toks), server={"queue_ms": 1.0 + i % 4, "prefill_ms": 30.0,
                                                                  "decode_ms": 20.0}))
    out.append(RequestRecord("rej", 0, "premium", 4.05, sent_s=4.05, done_s=4.06, status="rejected",
                             http_status=429, error="HTTP 429: busy"))
    out.append(RequestRecord("err", 0, "standard", 4.15, sent_s=4.15, done_s=4.3, status="http_error",
                             http_status=500, error="HTTP 500: boom"))
    out.append(RequestRecord("cut", 0, "premium", 4.25, sent_s=4.25, done_s=5.0, status="cancelled",
                             error="run stopped"))
    out.append(RequestRecord("mid", 0, "standard", 4.35, sent_s=4.35, first_token_s=4.5, token_s=[4.5, 4.6],
                             done_s=4.7, status="cancelled", error="run stopped"))
    return out


def test_summary_capacity_report_and_locust_agree_exactly(tmp_path):
    dicts = [json.loads(r.to_json()) for r in records()]
    recs = [RequestRecord(**d) for d in dicts]  # as every consumer reads them: from requests.jsonl
    slos = {"premium": {"ttft_ms": 300.0}, "standard": {"ttft_ms": 800.0}}
    summary = summarize(dicts, tier_slos=slos)

    run = tmp_path / "run"
    run.mkdir()
    (run / "requests.jsonl").write_text("".join(json.dumps(d) + "\n" for d in dicts))
    (run / "summary.json").write_text(json.dumps(summary))
    rd = report_data.load_run(run)
    table = {row["tier"]: row for row in report_data.tier_table(rd)}

    specs = [RequestSpec(r.id, r.scheduled_s, [1, 2], 4, tier=r.tier) for r in recs]
    col = Collector(tmp_path / "locust", staged_load_from_specs(specs, tier_slos=slos), 0.99)
    col.feed("w", {"records": [r.to_json() for r in recs], "counters": {}, "finished": True})
    locust_q = {j.tier: j.value_ms for j in col.judge(0, final=True)}
    col.close()

    for tier in ("premium", "standard"):
        rs = [r for r in recs if r.tier == tier]
        ok_ttft = [latency.ttft_ms(r) for r in rs if latency.succeeded(r)]
        p99 = latency.percentile(ok_ttft, 99)
        cap = tier_entry(rs, [SLO("ttft_ms", slos[tier]["ttft_ms"], 0.99)], 0.99, 0.95, seed=0)
        # successful requests' p99 TTFT: summary, capacity step and report
        assert summary["tiers"][tier]["p99_ttft_ms"] == p99
        assert cap["p99_ttft_ms"] == p99
        assert table[tier]["p99_ttft_ms"] == p99
        # the SLO quantile (failures at inf, cut-off requests at their lower bound): capacity and Locust
        slo_q = latency.quantile(latency.slo_values(rs, "ttft_ms"), 0.99)
        assert cap["judged"]["ttft_ms"]["value_ms_q"] == (slo_q if math.isfinite(slo_q) else None)
        assert locust_q[tier] == (slo_q if math.isfinite(slo_q) else None)
    ok = [r for r in recs if latency.succeeded(r)]
    assert summary["p99_itl_ms"] == pytest.approx(latency.quantile(latency.pooled_itl_ms(ok), 0.99), rel=0, abs=0)
    assert summary["mean_tpot_ms"] == pytest.approx(
        sum(t for r in ok if (t := latency.tpot_ms(r)) is not None) / sum(1 for r in ok if latency.tpot_ms(r)))
    assert table["all"]["p99_itl_ms"] == latency.percentile(latency.pooled_itl_ms(ok), 99)
    assert summary["breakdown"] == latency.breakdown(ok)


def test_the_slo_rule_for_failed_and_cut_off_requests():
    ok = RequestRecord("a", 0, None, 1.0, first_token_s=1.2, token_s=[1.2, 1.3, 1.5], done_s=1.5, output_tokens=3)
    assert latency.ttft_ms(ok) == pytest.approx(200) and latency.e2el_ms(ok) == pytest.approx(500)
    assert latency.tpot_ms(ok) == pytest.approx(150) and latency.itl_ms(ok) == pytest.approx([100, 200])
    failed = RequestRecord("b", 0, None, 1.0, done_s=1.1, status="rejected")
    assert latency.slo_value(failed, "ttft_ms") == math.inf and latency.slo_value(failed, "tpot_ms") == math.inf
    waiting = RequestRecord("c", 0, None, 1.0)
    assert latency.slo_value(waiting, "ttft_ms", now_s=1.7) == pytest.approx(700)
    assert math.isnan(latency.slo_value(waiting, "tpot_ms", now_s=1.7))
    one = RequestRecord("d", 0, None, 1.0, first_token_s=1.1, token_s=[1.1], done_s=1.1, output_tokens=1)
    assert latency.tpot_ms(one) is None and latency.slo_value(one, "tpot_ms") == 0.0  # cannot miss a TPOT SLO
    assert latency.quantile([1.0, 2.0, math.inf], 0.5) == 2.0 and latency.quantile([1.0, math.inf], 0.99) == math.inf
    with pytest.raises(ValueError, match="unknown SLO metric"):
        latency.slo_value(ok, "ttft")
