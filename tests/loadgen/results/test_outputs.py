"""The run folder's outputs as an interface (docs/outputs.md): ``schema_version`` in every summary, ``summarize``
never replacing a summary with one of another kind, ``steps.csv`` beside a capacity run's summary, every record
field in ``requests.parquet``, one headline for the rated capacity, ``slobench --version``."""

from __future__ import annotations

import dataclasses
import json
from importlib import metadata

import pandas as pd
import pyarrow.parquet as pq
import pytest

from loadgen.capacity.headline import headline, search_account
from loadgen.capacity.steps_csv import SLO_FIGURES, write_steps_csv
from loadgen.results.export import COLUMNS, export_records, records_table
from loadgen.results.records import RequestRecord
from loadgen.results.rundir import SCHEMA_VERSION, write_summary
from tests.helpers import MockServers, slobench
from tests.run_folders import make_capacity_run, make_fixed_run

FIXED = "name: out-fixed\nworkload: {input_len: 8, output_len: 4}\nload: {arrival: poisson, rate: 40, requests: 12}\n"
CAPACITY = ("name: out-cap\nworkload: {input_len: 8, output_len: 4}\n"
            "tiers: {premium: {slo: {ttft_ms: 300, tpot_ms: 100}}, standard: {slo: {ttft_ms: 800}}}\n"
            "search: {start: 5, growth: 2, max_load: 5, step_duration_s: 1.5, warmup_s: 0.5, early_pass: false}\n"
            "client: {lateness_bound_ms: 200}\n")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One fixed-load run and one one-step capacity run (never_broke) against the mock, made once."""
    tmp = tmp_path_factory.mktemp("outputs")
    servers = MockServers()
    try:
        url = servers("--ttft-ms", 5, "--itl-ms", 1, "--tokens", 4)
        (tmp / "fixed.yaml").write_text(FIXED)
        (tmp / "cap.yaml").write_text(CAPACITY)
        fixed = slobench("run", tmp / "fixed.yaml", "--target", url, "--out", tmp / "fixed", "--no-scrape",
                         "--no-report", "--lateness-bound-ms", 100)
        assert fixed.returncode == 0, fixed.stderr[-2000:]
        cap = slobench("capacity", tmp / "cap.yaml", "--target", url, "--out", tmp / "cap", "--no-progress",
                       "--no-report", env={"COLUMNS": "300"})
        assert cap.returncode == 0, cap.stderr[-2000:]
    finally:
        servers.stop_all()
    return {"fixed": tmp / "fixed", "cap": tmp / "cap", "cap_stdout": cap.stdout}


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


# ------------------------------------------------------------------ schema_version


def test_every_summary_and_config_carries_the_schema_version(runs):
    assert SCHEMA_VERSION == 2
    fixed, cap = _summary(runs["fixed"]), _summary(runs["cap"])
    assert fixed["schema_version"] == cap["schema_version"] == SCHEMA_VERSION
    assert fixed["kind"] == "run" and cap["kind"] == "capacity"
    config = json.loads((runs["cap"] / "config.json").read_text())
    assert config["schema_version"] == SCHEMA_VERSION and config["kind"] == "capacity"


def test_write_summary_puts_the_schema_version_first(tmp_path):
    write_summary(tmp_path, {"kind": "capacity", "steps": []})
    text = (tmp_path / "summary.json").read_text()
    assert list(json.loads(text)) == ["schema_version", "kind", "steps"]
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, renamed


# ------------------------------------------------------------------ summarize keeps the kind


def test_summarize_refuses_a_capacity_run_and_leaves_its_summary_byte_for_byte(runs, tmp_path):
    for run in (runs["cap"], make_capacity_run(tmp_path / "fixture-cap")):
        before = (run / "summary.json").read_bytes()
        r = slobench("summarize", run)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "is a capacity run" in lines[0] and "left as it is" in lines[0]
        assert (run / "summary.json").read_bytes() == before


def test_summarize_refuses_a_capacity_folder_whose_summary_is_gone(runs, tmp_path):
    """config.json still says what the run was: no fixed-load summary appears in a capacity folder."""
    run = tmp_path / "cap-copy"
    run.mkdir()
    for name in ("requests.jsonl", "config.json"):
        (run / name).write_bytes((runs["cap"] / name).read_bytes())
    r = slobench("summarize", run)
    assert r.returncode == 2 and "is a capacity run" in r.stderr and "Traceback" not in r.stderr
    assert not (run / "summary.json").exists()


def test_summarize_rebuilds_a_fixed_run_of_the_same_kind_with_its_metadata(runs, tmp_path):
    run = tmp_path / "fixed-copy"
    run.mkdir()
    for p in runs["fixed"].iterdir():
        (run / p.name).write_bytes(p.read_bytes())
    old = _summary(run)
    r = slobench("summarize", run, "--json")
    assert r.returncode == 0, r.stderr
    new = _summary(run)
    assert new == json.loads(r.stdout)
    assert new["schema_version"] == SCHEMA_VERSION and new["kind"] == old["kind"] == "run"
    for key in ("scenario", "target", "versions", "git_commit", "started_at", "target_probe", "request_fit"):
        assert new[key] == old[key], key
    assert new["run_id"] == "fixed-copy" and new["requests"] == old["requests"] == 12
    assert new["p99_ttft_ms"] == pytest.approx(old["p99_ttft_ms"])
    assert not list(run.glob("*.tmp"))


def test_summarize_keeps_tier_slos_and_goodput_of_a_fixture_run(tmp_path):
    run = make_fixed_run(tmp_path / "f")
    old = _summary(run)
    assert slobench("summarize", run, "--goodput", "ttft:90").returncode == 0
    new = _summary(run)
    assert new["kind"] == "run" and new["tiers"]["premium"]["slo"] == old["tiers"]["premium"]["slo"]
    assert new["goodput_slo"] == {"ttft_ms": 90.0}
    assert slobench("summarize", run).returncode == 0  # no --goodput: the summary's own SLOs are kept
    assert _summary(run)["goodput_slo"] == {"ttft_ms": 90.0}


# ------------------------------------------------------------------ steps.csv


def test_steps_csv_has_one_row_per_step_with_each_tier_and_slo(runs):
    s = _summary(runs["cap"])
    df = pd.read_csv(runs["cap"] / "steps.csv")
    assert len(df) == len(s["steps"]) >= 1
    assert {"step", "phase", "requested_rps", "offered_rps", "throughput_rps", "output_tok_s", "counted",
            "deciding", "valid", "passed", "window_start_s", "window_end_s"} <= set(df.columns)
    slo_cols = {f"{tier}.{m}.{fig}" for tier, m in (("premium", "ttft_ms"), ("premium", "tpot_ms"),
                                                    ("standard", "ttft_ms")) for fig in SLO_FIGURES}
    assert slo_cols <= set(df.columns)
    for row, st in zip(df.to_dict("records"), s["steps"], strict=True):
        assert row["step"] == st["index"] and row["phase"] == st["phase"]
        assert row["requested_rps"] == st["load"] and row["offered_rps"] == pytest.approx(st["offered_rps"])
        judged = st["tiers"]["premium"]["judged"]["ttft_ms"]
        assert row["premium.ttft_ms.quantile"] == 0.99 and row["premium.ttft_ms.threshold_ms"] == 300
        assert row["premium.ttft_ms.value_ms"] == pytest.approx(judged["value_ms_q"], abs=1e-5)
        assert row["premium.ttft_ms.passed"] == judged["passed"]


def test_steps_csv_of_a_fixture_summary(tmp_path):
    run = make_capacity_run(tmp_path / "c")
    s = _summary(run)
    s["slos"] = {"premium": [{"metric": "ttft_ms", "quantile": 0.99, "threshold_ms": 300.0}]}
    for st in s["steps"]:  # the fixture's tiers have no per-SLO judgement: give premium one
        e = st["tiers"]["premium"]
        e["judged"] = {"ttft_ms": {"value_ms_q": e["ttft_ms_q"], "ci_low_ms": e["ci_low_ms"],
                                   "ci_high_ms": e["ci_high_ms"], "threshold_ms": 300.0, "passed": e["passed"]}}
    df = pd.read_csv(write_steps_csv(run, s))
    assert list(df["step"]) == list(range(len(s["steps"]))) and list(df["requested_rps"]) == [
        st["load"] for st in s["steps"]]
    assert list(df["premium.ttft_ms.passed"]) == [st["tiers"]["premium"]["passed"] for st in s["steps"]]
    assert df["premium.ttft_ms.ci_low_ms"].tolist() == pytest.approx(
        [st["tiers"]["premium"]["ci_low_ms"] for st in s["steps"]])


# ------------------------------------------------------------------ requests.parquet


def test_parquet_carries_every_record_field(tmp_path):
    rec = RequestRecord(id="r1", stage=0, tier="premium", scheduled_s=1.0, sent_s=1.001, first_token_s=1.2,
                        token_s=[1.2, 1.25, 1.35], done_s=1.35, prompt_tokens=40, output_tokens=5, status="ok",
                        http_status=200, server={"queue_ms": 10.0, "prefill_ms": 150.0, "decode_ms": 140.0,
                                                 "front_end_ms": 2.0, "held_ms": 1.0, "source": "slobench timing"},
                        prompt_tokens_intended=40, first_output_s=1.25, reasoning_tokens=1, chunk_tokens=[1, 2, 2],
                        cached_tokens=32, conversation="c7", turn=2, cancel_reason=None)
    cancelled = RequestRecord(id="r2", stage=1, tier="standard", scheduled_s=2.0, sent_s=2.0, status="cancelled",
                              cancel_reason="client: after 3 tokens")
    run = tmp_path / "r"
    run.mkdir()
    (run / "requests.jsonl").write_text(rec.to_json() + "\n" + cancelled.to_json() + "\n")
    (run / "summary.json").write_text(json.dumps({"kind": "capacity", "axis": "rate", "steps": [
        {"index": 0, "load": 8.0, "offered_rps": 7.5, "phase": "ramp"},
        {"index": 1, "load": 16.0, "offered_rps": 15.0, "phase": "ramp"}]}))
    path = export_records(run)
    assert pq.read_schema(path).metadata[b"slobench.schema_version"] == str(SCHEMA_VERSION).encode()
    df = pd.read_parquet(path)
    fields = [f.name for f in dataclasses.fields(RequestRecord)]
    for name in fields:
        if name == "server":
            assert {f"server_{k}" for k in rec.server} <= set(df.columns)
        else:
            assert name in df.columns, name
    a, b = df.iloc[0], df.iloc[1]
    for name in fields:
        if name in ("token_s", "chunk_tokens"):
            assert list(a[name]) == getattr(rec, name)
        elif name == "server":
            assert all(a[f"server_{k}"] == v for k, v in rec.server.items())
        elif getattr(rec, name) is not None:
            assert a[name] == getattr(rec, name), name
    assert a["ttfot_ms"] == pytest.approx(250.0) and a["ttft_ms"] == pytest.approx(200.0)
    # per-token ITL: 50 ms over 2 tokens, then 100 ms over 2 tokens -> 25, 25, 50, 50
    assert (a["itl_p50_ms"], a["itl_max_ms"]) == pytest.approx((37.5, 50.0))
    assert (a["step_load"], a["step_requested_rps"], a["step_offered_rps"], a["step_phase"]) == (8.0, 8.0, 7.5, "ramp")
    assert b["cancel_reason"] == "client: after 3 tokens" and b["step_load"] == 16.0 and pd.isna(b["itl_max_ms"])


def test_the_export_frame_has_every_column_even_when_empty():
    assert list(records_table([]).columns) == list(COLUMNS)


def test_capacity_run_parquet_maps_each_record_to_its_step_load(runs):
    s = _summary(runs["cap"])
    df = pd.read_parquet(export_records(runs["cap"]))
    loads = {st["index"]: st["load"] for st in s["steps"]}
    assert len(df) > 0 and (df["step_load"] == df["stage"].map(loads)).all()
    assert df["step_requested_rps"].notna().all() and df["step_offered_rps"].notna().all()


# ------------------------------------------------------------------ one headline


def test_a_capacity_run_prints_its_headline_once(runs):
    s = _summary(runs["cap"])
    rc = s["rated_capacity"]
    assert s["search_verdict"] == "never_broke" and rc["requested_rps"] == 5
    assert s["headline"] == headline(rc, "never_broke", "rate")
    assert s["headline"].startswith(f"rated capacity at least {rc['rate_rps']:.3g} req/s offered (requested 5 req/s)")
    assert s["verdict_text"].startswith(s["headline"])
    assert runs["cap_stdout"].count("rated capacity") == 1 and s["headline"] in runs["cap_stdout"]


def test_the_search_account_says_its_loads_were_requested():
    assert search_account("never broke: every SLO held up to 64 req/s (max_load); the capacity is at least that",
                          "never_broke", "rate") == ("never broke: every SLO held up to 64 req/s requested (max_load);"
                                                     " the capacity is at least that")
    assert search_account("INVALID (why); the steps say: rated capacity 8 users: every SLO held there and broke at "
                          "9 users (12.5% above)", "rated", "concurrency") == (
        "INVALID (why); the steps say: every SLO held at 8 users and broke at 9 users (12.5% above)")
    text = "never met: the SLO broke at every load tried, down to 0.5 req/s"
    assert search_account(text, "never_met", "rate") == text
    assert headline({"rate_rps": 30.14, "load": 32}, "rated", "concurrency") == "rated capacity 30.1 req/s at 32 users"


# ------------------------------------------------------------------ --version


def test_version_prints_the_installed_version():
    r = slobench("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"slobench {metadata.version('slobench')}"
