"""report.html from recorded run folders: capacity searches, fixed-load runs, an empty run, a run where
every request failed, no metrics, no summary; escaping; the A-vs-B page; the records export; the CLI.
The page is checked in a real browser in test_report_browser.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from loadgen.cli import main
from loadgen.report import auto_report, write_compare, write_report
from loadgen.report import data as d
from loadgen.report.html import script_json
from loadgen.results.export import export_records, records_table
from tests.run_folders import XSS, make_capacity_run, make_empty_run, make_fixed_run, write_run

REPO = Path(__file__).resolve().parents[3]


def _plots(html: str) -> list[dict]:
    """The figures embedded in a page, parsed back from their JSON script elements."""
    blobs = re.findall(r'<script type="application/json" class="plot-data" data-target="([^"]+)">(.*?)</script>',
                       html, re.S)
    return [{"id": i, **json.loads(b)} for i, b in blobs]


def _no_raw_run_markup(html: str) -> None:
    """Nothing from the run reaches the page unescaped: the only <script> elements are ours."""
    assert "<img" not in html
    scripts = re.findall(r"<script\b[^>]*>", html)
    assert all(s in ("<script>",) or 'class="plot-data"' in s for s in scripts), scripts
    # the error strings are there, but as text
    assert "&lt;/script&gt;&lt;img src=x onerror=" in html


def plots_by_title(html: str) -> dict[str, dict]:
    """The page's figures by their title (``layout.meta.title``)."""
    return {p["layout"]["meta"]["title"]: p for p in _plots(html)}


CAPACITY_PLOTS = {"Throughput against offered load", "Latency against offered load",
                  "The rating's evidence: requests over each SLO against offered load",
                  "TTFT at the rated and first failing loads",
                  "Inter-token latency at the rated and first failing loads",
                  "TPOT at the rated and first failing loads", "E2E latency at the rated and first failing loads",
                  "Where the time goes", "Service health over the run"}


def test_capacity_report(tmp_path):
    run = make_capacity_run(tmp_path / "cap")
    out = write_report(run)
    html = out.read_text()
    assert out == run / "report.html"
    plots = _plots(html)
    assert len(plots) == 9 and f'data-plots-expected="{len(plots)}"' in html
    assert all(f'id="{p["id"]}"' in html for p in plots)
    by = plots_by_title(html)
    assert set(by) == CAPACITY_PLOTS
    lat = by["Latency against offered load"]
    names = {t.get("name") for t in lat["data"]}
    assert {"premium p50", "premium p99", "standard p99", "basic p99"} <= names
    shapes = lat["layout"]["shapes"]
    assert any(s.get("y0") == 300.0 and s.get("type") == "line" for s in shapes)  # premium SLO line
    assert any(s.get("x0") == 10.0 for s in shapes)  # rated capacity
    thr = by["Throughput against offered load"]
    assert any(s.get("x0") == 8.0 for s in thr["layout"]["shapes"])  # spec capacity (20% headroom)
    bars = [t for t in by["Where the time goes"]["data"] if t["type"] == "bar"]
    assert [t["name"] for t in bars] == ["queue", "prefill", "network + frontend", "decode"]
    assert len(bars[0]["x"]) == 7
    health = by["Service health over the run"]
    panels = {a["text"] for a in health["layout"]["annotations"] if "text" in a}
    assert {"TTFT (ms)", "output tokens/s", "KV usage (%)", "batch fill ratio", "admission rejections/s"} <= panels
    assert "no data" not in " ".join(panels)
    # tables and metadata
    for text in ("Load steps", "bisect", "stopped early", "Per-tier percentiles at the rated and first failing loads",
                 "Errors by status", "rejected", "0123456789abcdef", "aiohttp", "Rated capacity 10 req/s offered",
                 "concurrency at rated", "judged over windows of"):
        assert text in html, text
    assert "chat&lt;script&gt;" in html and "&lt;b&gt;target&lt;/b&gt;" in html
    _no_raw_run_markup(html)
    # records exported next to requests.jsonl
    df = pd.read_parquet(run / "requests.parquet")
    assert len(df) == len(d.load_run(run).requests)


def test_fixed_run_report_skips_what_does_not_apply(tmp_path):
    run = make_fixed_run(tmp_path / "fixed")
    html = write_report(run).read_text()
    plots = _plots(html)
    assert len(plots) == 4  # breakdown, TTFT CDF, ITL CDF, health: no load axis for one load level
    assert "TTFT against load: a single load level: no load axis to plot" in html
    cdf = plots[1]
    assert {t["name"].split(" ")[0] for t in cdf["data"]} == {"premium", "standard"}
    assert cdf["data"][0]["y"][-1] == 1.0
    assert "200 of 200 requests succeeded" in html


def test_empty_run(tmp_path):
    run = make_empty_run(tmp_path / "empty")
    html = write_report(run).read_text()
    assert _plots(html) == []
    assert "No requests recorded" in html and "no requests recorded." in html
    assert "INVALID RUN" in html  # summarize() marks an empty run invalid
    df = pd.read_parquet(run / "requests.parquet")
    assert len(df) == 0 and "ttft_ms" in df.columns


def test_every_request_failed(tmp_path):
    run = make_fixed_run(tmp_path / "failed", fail_all=True)
    html = write_report(run).read_text()
    assert "No request succeeded (200 sent)" in html
    assert "no successful request, so no latency to plot" in html
    plots = _plots(html)
    assert len(plots) == 1  # health: client-side 429s and the scraped server signals
    assert any(t["name"] == "client 429s/s" for t in plots[0]["data"])
    assert "conn_error" in html and "rejected" in html
    _no_raw_run_markup(html)


def test_no_metrics_no_summary_no_timing(tmp_path):
    run = make_fixed_run(tmp_path / "bare", metrics=False, summary=False, timing=False)
    html = write_report(run).read_text()
    assert "summary.json was missing or unreadable" in html
    assert "no breakdown" in html and "no metrics.jsonl in the run folder" in html
    assert len(_plots(html)) == 3


def test_partial_and_old_summaries(tmp_path):
    """A crash's torn last line, a summary from an older slobench, a capacity search with no rated point."""
    run = make_fixed_run(tmp_path / "old")
    with open(run / "requests.jsonl", "a") as f:
        f.write('{"id": "torn", "stage": 0, "tier"')
    (run / "summary.json").write_text(json.dumps({"requests": 200, "completed": 200}))
    (run / "metrics.jsonl").write_text("not json\n" + (run / "metrics.jsonl").read_text())
    html = write_report(run).read_text()
    assert "says nothing about the run&#39;s validity" in html
    cap = make_capacity_run(tmp_path / "never", knee=0.5)
    s = json.loads((cap / "summary.json").read_text())
    assert s["verdict"] == "never_met" and s["rated_capacity"] is None
    html = write_report(cap).read_text()
    assert "the SLO was never met" in html and len(_plots(html)) == 9
    (cap / "summary.json").write_text("{broken")
    assert "summary.json was missing" in write_report(cap).read_text()


def test_not_a_run_folder(tmp_path, capsys):
    with pytest.raises(d.RunDataError):
        d.load_run(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "Traceback" not in err


def test_script_json_cannot_close_the_script_element():
    s = script_json(json.dumps({"e": XSS}))
    assert "<" not in s and ">" not in s and "&" not in s and "\u2028" not in s
    assert json.loads(s) == {"e": XSS}


def test_tier_names_and_errors_are_escaped_in_plots(tmp_path):
    recs = make_fixed_run(tmp_path / "x", n=20)
    lines = (recs / "requests.jsonl").read_text().splitlines()
    evil = [json.dumps({**json.loads(x), "tier": "</script><script>alert(3)</script>"}) for x in lines]
    (recs / "requests.jsonl").write_text("\n".join(evil) + "\n")
    (recs / "summary.json").unlink()
    html = write_report(recs).read_text()
    assert "alert(3)" in html  # the tier name is shown ...
    assert "<script>alert(3)" not in html and "</script><script>alert" not in html  # ... never as markup
    assert any("alert(3)" in t["name"] for p in _plots(html) for t in p["data"])


def test_compare_page(tmp_path):
    a = make_capacity_run(tmp_path / "a")
    b = make_capacity_run(tmp_path / "b", scale=0.8, seed=1)
    out = write_compare(a, b)
    assert out == b / "compare-a.html"
    html = out.read_text()
    row = re.search(r"<td class=\"l\">rated_capacity.rate_rps</td><td>([^<]*)</td><td>([^<]*)</td>\s*"
                    r"<td class=\"(\w+)\">([^<]*)</td>", html)
    assert row and row.groups() == ("10", "8", "worse", "-2")
    assert "-20.0%" in html
    assert len(_plots(html)) == 4
    # a fixed run against a failed one: still a page, with what applies
    f1, f2 = make_fixed_run(tmp_path / "f1"), make_fixed_run(tmp_path / "f2", fail_all=True)
    html = write_compare(f1, f2, tmp_path / "c.html").read_text()
    assert "error_rate" in html and "neither run has several load steps" in html


def test_export_parquet_and_csv(tmp_path):
    run = make_fixed_run(tmp_path / "e", n=30)
    p = export_records(run)
    df = pd.read_parquet(p)
    assert len(df) == 30 and list(df["token_s"].iloc[0]) and df["chunks"].iloc[0] == 8
    assert df["server_prefill_ms"].notna().all() and df["ttft_ms"].between(60, 100).all()
    c = export_records(run, fmt="csv")
    dc = pd.read_csv(c)
    assert len(dc) == 30 and json.loads(dc["token_s"].iloc[0]) == list(df["token_s"].iloc[0])
    failed = records_table([{"id": "a", "status": "timeout", "error": "x"}])
    assert failed["ttft_ms"].isna().all() and failed["status"].iloc[0] == "timeout"


def test_export_falls_back_to_csv_without_pyarrow(tmp_path, monkeypatch):
    import loadgen.results.export as ex

    monkeypatch.setattr(ex, "have_pyarrow", lambda: False)
    run = make_fixed_run(tmp_path / "csv", n=10)
    write_report(run)
    assert (run / "requests.csv").is_file() and not (run / "requests.parquet").exists()
    assert len(pd.read_csv(run / "requests.csv")) == 10


def test_auto_report_never_raises(tmp_path, capsys, monkeypatch):
    assert auto_report(tmp_path / "nope") is None
    assert "warning: could not write the HTML report" in capsys.readouterr().err
    monkeypatch.setenv("SLOBENCH_NO_REPORT", "1")
    assert auto_report(make_fixed_run(tmp_path / "r")) is None


def test_cli_report_and_compare(tmp_path, capsys):
    a = make_capacity_run(tmp_path / "a")
    b = make_fixed_run(tmp_path / "b")
    assert main(["report", str(a), "-o", str(tmp_path / "out" / "r.html")]) == 0
    assert (tmp_path / "out" / "r.html").is_file()
    assert main(["report", str(b), "--no-export"]) == 0
    assert not (b / "requests.parquet").exists()
    assert main(["report", str(a), str(b)]) == 0
    assert (b / "compare-a.html").is_file()
    assert "report:" in capsys.readouterr().out


def test_concurrency_axis(tmp_path):
    run = make_capacity_run(tmp_path / "conc", axis="concurrency")
    html = write_report(run).read_text()
    thr = plots_by_title(html)["Throughput against offered load"]
    assert thr["layout"]["xaxis"]["title"]["text"].startswith("users")
    # rated at 10 users (the step's load), spec 8 (20% headroom), not the in-flight count (2)
    assert {s.get("x0") for s in thr["layout"]["shapes"] if s.get("x0") is not None} >= {10.0, 8.0}
    assert "Rated capacity 10 req/s served at 10 users" in html


def test_capacity_with_records_but_no_step_breakdown(tmp_path):
    """Steps without a breakdown get one from the records' server timing of that stage."""
    run = make_capacity_run(tmp_path / "c")
    s = json.loads((run / "summary.json").read_text())
    for st in s["steps"]:
        st.pop("breakdown")
    write_run(run, [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()], s, None)
    steps = d.steps(d.load_run(run))
    assert all(st["breakdown"]["source"] == "server timing" and st["breakdown"]["mean_network_ms"] >= 0 for st in steps)


@pytest.mark.slow
def test_run_against_the_mock_server_writes_the_report(tmp_path):
    """End to end: `slobench run` against `slobench mock-server` leaves report.html and requests.parquet."""
    from loadgen.target.embedded import free_port, wait_healthy

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SLOBENCH_NO_REPORT", None)
    port = free_port()
    mock = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "mock-server", "--port", str(port), "--ttft-ms", "30",
                             "--itl-ms", "5", "--tokens", "6"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, mock, 30)
        scn = tmp_path / "s.yaml"
        scn.write_text("name: rep\nworkload: {input_len: 12, output_len: 6}\n"
                       "tiers: {premium: {weight: 1, slo: {ttft_ms: 1000}}, standard: {weight: 1}}\n"
                       "load: {arrival: poisson, rate: 30, requests: 40}\n")
        r = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(scn), "--target", url, "--reports",
                            str(tmp_path), "--run-id", "r1", "--lateness-bound-ms", "50"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    finally:
        mock.send_signal(signal.SIGTERM)
        mock.wait(10)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "r1"
    assert f"report: {run / 'report.html'}" in r.stderr
    html = (run / "report.html").read_text()
    plots = _plots(html)
    assert len(plots) == 4
    assert pd.read_parquet(run / "requests.parquet")["status"].eq("ok").sum() == 40
    # the mock's 30 ms first token: the TTFT CDF starts there
    assert min(plots[1]["data"][0]["x"]) >= 29
    # and the gate passes the run against itself
    g = subprocess.run([sys.executable, "-m", "loadgen.cli", "gate", str(run), "--baseline", str(run / "summary.json"),
                        "--junit", str(tmp_path / "j.xml")], cwd=REPO, env=env, capture_output=True, text=True)
    assert g.returncode == 0, g.stdout + g.stderr
