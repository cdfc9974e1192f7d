"""A capacity run's report shows what users compare: throughput and latencies against offered load, the
rating's evidence (each window's share over each SLO, the fits, the crossing, the interval), distributions at
the rated load and the first failing one (not pooled over every load), and one headline number."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from loadgen.capacity.crossing import slo_crossing
from loadgen.report import data as d
from loadgen.report import write_compare, write_report
from loadgen.report.html import fmt
from tests.run_folders import make_capacity_run, write_run

from .test_report import _plots, plots_by_title

EVIDENCE = "The rating's evidence: requests over each SLO against offered load"


def _summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def _records(run) -> list[dict]:
    return [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def cap(tmp_path_factory):
    run = make_capacity_run(tmp_path_factory.mktemp("cap") / "cap")
    html = write_report(run).read_text()
    return run, html, plots_by_title(html)


def test_throughput_against_offered_load(cap):
    run, _, by = cap
    steps = _summary(run)["steps"]
    fig = by["Throughput against offered load"]
    done = next(t for t in fig["data"] if t["name"] == "completed req/s")
    expect = sorted((s["offered_rps"], s["throughput_rps"]) for s in steps)
    assert list(zip(done["x"], done["y"], strict=True)) == expect
    tok = next(t for t in fig["data"] if t["name"] == "output tok/s")
    assert tok["yaxis"] == "y2" and max(tok["y"]) == max(s["output_tok_s"] for s in steps)


def test_latencies_against_offered_load_per_tier(cap):
    run, _, by = cap
    fig = by["Latency against offered load"]
    panels = [a["text"] for a in fig["layout"]["annotations"] if a["text"].endswith("(ms)")]
    assert panels == ["TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2E latency (ms)"]  # no reasoning: no TTFOT panel
    p99 = [t for t in fig["data"] if t["name"] == "premium p99"]
    assert len(p99) == 4 and [t["showlegend"] for t in p99] == [True, False, False, False]
    # the TTFT panel's premium p99 at each offered load: that step's window's successful requests
    steps = sorted(_summary(run)["steps"], key=lambda s: s["offered_rps"])
    recs = _records(run)
    for x, y in zip(p99[0]["x"], p99[0]["y"], strict=True):
        st = next(s for s in steps if s["offered_rps"] == x)
        ttft = [1000 * (r["first_token_s"] - r["scheduled_s"]) for r in recs
                if r["stage"] == st["index"] and r["tier"] == "premium" and r["status"] == "ok"]
        assert y == pytest.approx(float(np.quantile(ttft, 0.99)))


def test_the_rating_evidence_plot(cap):
    run, html, by = cap
    s = _summary(run)
    rc = s["rated_capacity"]
    fig = by[EVIDENCE]
    names = [t["name"] for t in fig["data"]]
    for slo in ("premium TTFT", "standard TTFT"):
        assert f"{slo} windows" in names and f"{slo} isotonic fit" in names
    win = next(t for t in fig["data"] if t["name"] == "premium TTFT windows")
    shares = sorted((st["planned_rps"], 100 * st["tiers"]["premium"]["judged"]["ttft_ms"]["over"]
                     / st["tiers"]["premium"]["judged"]["ttft_ms"]["n"]) for st in s["steps"])
    top = fig["layout"]["yaxis"]["range"][1] / 1.04
    assert list(win["x"]) == [x for x, _ in shares]
    assert list(win["y"]) == pytest.approx([min(y, top) for _, y in shares])
    assert "triangle-up" in win["marker"]["symbol"]  # the 16 req/s window is over the axis' top
    # the crossing: the same function over the same counts, where the rating put it
    crossing = next(t for t in fig["data"] if t["name"].startswith("premium TTFT crossing"))
    by_load = sorted((st["planned_rps"], st["tiers"]["premium"]["judged"]["ttft_ms"]) for st in s["steps"])
    c, _, _ = slo_crossing(np.array([x for x, _ in by_load]), np.array([j["over"] for _, j in by_load], float),
                           np.array([j["n"] for _, j in by_load], float), 0.01)
    assert crossing["x"] == [c]
    assert c == pytest.approx(next(x["load"] for x in rc["interval"]["crossings"] if x["tier"] == "premium"))
    assert crossing["y"] == pytest.approx([1.0])  # the SLO's level: 1 % may be over
    # the interval band and the estimate
    rects = [sh for sh in fig["layout"]["shapes"] if sh["type"] == "rect"]
    assert [(r["x0"], r["x1"]) for r in rects] == [(rc["ci_low"], rc["ci_high"])]
    assert any(sh.get("x0") == rc["estimate"] for sh in fig["layout"]["shapes"] if sh["type"] == "line")
    assert "premium TTFT" in html and "95% interval" in html


def test_distributions_at_the_rated_and_first_failing_loads(cap):
    run, html, by = cap
    s = _summary(run)
    rated = [st for st in s["steps"] if st["index"] in s["rated_capacity"]["steps"]]
    failing = [st for st in s["steps"] if st["load"] == s["first_fail_load"] and st["passed"] is False]
    assert [st["index"] for st in rated] == [5] and [st["index"] for st in failing] == [4]
    for title in ("TTFT", "Inter-token latency", "TPOT", "E2E latency"):
        fig = by[f"{title} at the rated and first failing loads"]
        meta = fig["layout"]["meta"]
        # the records of those windows only (30 and 36), not the run's 183
        assert meta["records"] == {"rated": rated[0]["requests"], "first failing": failing[0]["requests"]} \
            == {"rated": 30, "first failing": 36}
        assert meta["steps"] == {"rated": [5], "first failing": [4]}
        curves = [t for t in fig["data"] if "SLO" not in t["name"]]
        oks = [tuple(map(int, re.search(r"\((\d+) of (\d+) ok\)", t["name"]).groups())) for t in curves]
        assert sum(n for _, n in oks) == 30 + 36
        assert [t["line"]["dash"] for t in curves] == ["solid"] * 3 + ["dash"] * 3
    ttft = by["TTFT at the rated and first failing loads"]
    assert {t["name"] for t in ttft["data"] if "SLO" in t["name"]} == {"premium SLO p99 ≤ 300 ms",
                                                                       "standard SLO p99 ≤ 800 ms"}
    rated_premium = next(t for t in ttft["data"] if t["name"].startswith("rated 10 · premium"))
    recs = [r for r in _records(run) if r["stage"] == 5 and r["tier"] == "premium"]
    assert len(rated_premium["x"]) == len(recs) == 10
    assert max(rated_premium["x"]) == pytest.approx(max(1000 * (r["first_token_s"] - r["scheduled_s"]) for r in recs),
                                                    abs=1e-3)
    # the per-tier tables are of the same windows
    assert "rated: 10 req/s offered (step 5)" in html and "first failing: 12 req/s offered (step 4)" in html


def _tile(html: str, label: str) -> str:
    m = re.search(r'<div class="v">([^<]*)\s*<small>[^<]*</small></div><div class="k">' + re.escape(label), html)
    assert m, label
    return m.group(1).strip()


def test_one_headline_number(tmp_path):
    """The tile and the verdict both say rated_capacity.rate_rps (the offered rate), never the search's
    requested load that verdict_text may name."""
    run = make_capacity_run(tmp_path / "cap")
    s = _summary(run)
    s["rated_capacity"].update(rate_rps=60.1934, requested_rps=61.3, spec_rate_rps=48.15)
    s["verdict_text"] = "rated capacity 61.3 req/s: every SLO held there"
    (run / "summary.json").write_text(json.dumps(s))
    html = write_report(run).read_text()
    verdict = re.search(r'<div class="verdict good">([^<]*)</div>', html).group(1)
    assert _tile(html, "rated capacity (offered)") == fmt(60.1934) == "60.19"
    assert verdict.startswith("Rated capacity 60.19 req/s offered (requested 61.3 req/s)")
    assert re.findall(r"Rated capacity ([\d.]+)", verdict) == ["60.19"]
    assert "rated capacity 61.3" not in verdict
    # the step table's load column is the offered load, the requested one beside it
    assert "<th>offered req/s</th>\n<th>requested req/s</th>" in html


def test_the_step_table_shows_offered_and_requested(tmp_path):
    run = make_capacity_run(tmp_path / "cap")
    s = _summary(run)
    for st in s["steps"]:
        st["offered_rps"] = st["load"] * 0.9 + 0.0123  # a draw that offered less than asked
    (run / "summary.json").write_text(json.dumps(s))
    html = write_report(run).read_text()
    row = re.search(r"<tr><td>4</td><td class=\"l\">[^<]*</td><td>([^<]*)</td>\s*<td>([^<]*)</td>", html)
    assert row and row.groups() == (fmt(12 * 0.9 + 0.0123), "12")
    steps = d.steps(d.load_run(run))
    assert [st["offered"] for st in steps] == [st["load"] * 0.9 + 0.0123 for st in s["steps"]]


def test_a_reasoning_model_gets_a_ttfot_panel(tmp_path):
    run = make_capacity_run(tmp_path / "cap")
    recs = _records(run)
    for r in recs:
        if r["status"] == "ok":  # 3 tokens of thinking before the answer
            r["first_output_s"] = r["token_s"][3]
    write_run(run, recs, _summary(run), None)
    fig = plots_by_title(write_report(run).read_text())["Latency against offered load"]
    panels = [a["text"] for a in fig["layout"]["annotations"] if a["text"].endswith("(ms)")]
    assert panels == ["TTFT (ms)", "TTFOT (ms)", "TPOT (ms)", "ITL (ms)", "E2E latency (ms)"]


def test_a_summary_without_counts_says_why_there_is_no_evidence(tmp_path):
    run = make_capacity_run(tmp_path / "cap")
    s = _summary(run)
    for st in s["steps"]:
        for e in st["tiers"].values():
            e.pop("judged", None)
        st.pop("window_s")  # an older summary: each step's records are its whole stage
    (run / "summary.json").write_text(json.dumps(s))
    html = write_report(run).read_text()
    by = plots_by_title(html)
    assert EVIDENCE not in by and "no step counted its requests over an SLO" in html
    assert by["TTFT at the rated and first failing loads"]["layout"]["meta"]["records"] == \
        {"rated": 30, "first failing": 36}


def test_never_met_draws_the_lowest_failing_load(tmp_path):
    run = make_capacity_run(tmp_path / "never", knee=0.5)
    html = write_report(run).read_text()
    by = plots_by_title(html)
    meta = by["TTFT at the rated and first failing loads"]["layout"]["meta"]
    assert meta["steps"] == {"first failing": [0]} and meta["records"] == {"first failing": 6}
    assert "the SLO was never met" in html and "Rated capacity" not in html
    assert len(_plots(html)) == 9


def test_health_draws_only_the_signals_it_has(tmp_path):
    run = make_capacity_run(tmp_path / "nometrics", metrics=False)
    html = write_report(run).read_text()
    health = plots_by_title(html)["Service health over the run"]
    panels = {a["text"] for a in health["layout"]["annotations"] if not a["text"].startswith("#")}
    assert "KV usage (%)" not in panels and "batch fill ratio" not in panels and "TTFT (ms)" in panels
    assert re.search(r"no data for: [^.]*KV usage \(%\), batch fill ratio", html)


def test_the_comparison_sets_the_rated_loads_side_by_side(tmp_path):
    """A vs B per tier: each capacity run at its rated load (10 req/s for 3 s in A: 10 requests a tier), not
    its loads pooled (61 a tier)."""
    a = make_capacity_run(tmp_path / "a")
    b = make_capacity_run(tmp_path / "b", scale=0.8, seed=1)
    html = write_compare(a, b).read_text()
    assert "Per tier (at the rated load)" in html
    rows = dict((t, (x, y)) for t, x, y in re.findall(
        r'<tr><td class="l">(\w+)</td><td class="l">requests</td><td>(\d+)</td>\s*<td>(\d+)</td>', html))
    rated_b = [r for r in _records(b) if r["stage"] in _summary(b)["rated_capacity"]["steps"]]
    assert rows == {"all": ("30", str(len(rated_b))),
                    **{t: ("10", str(sum(r["tier"] == t for r in rated_b))) for t in ("premium", "standard", "basic")}}
