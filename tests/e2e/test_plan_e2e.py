"""Calibration end to end: the probe against the embedded reference engine (``tiny``, started as a
subprocess the way ``slobench capacity`` starts it), a short plan, and a fitted step model that is sane;
and the command's one-line errors on bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from loadgen.commands.common import UsageError
from loadgen.commands.plan import build, cmd_plan, register
from loadgen.planning.step_model import decode_step_s, prefill_s
from loadgen.planning.step_timing import StepTimingSettings, fit_step_times

REPO = Path(__file__).resolve().parents[2]
SHORT = StepTimingSettings(batches=(1, 6), contexts=(32, 160), output_tokens=12, prefill_lengths=(32, 96, 200),
                           rounds=2, prefill_repeats=3)


def parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="slobench")
    register(ap.add_subparsers(dest="cmd"))
    return ap.parse_args(["plan", *argv])


@pytest.mark.slow
def test_probe_fits_a_sane_step_model(embedded_engine, tmp_path):
    cal = fit_step_times(embedded_engine, SHORT, tmp_path)
    m = cal.model
    assert len(cal.observations) == len(SHORT.batches) * len(SHORT.contexts) + len(SHORT.prefill_lengths)
    assert cal.source == "server timing"  # the engine's own per-request timing
    assert m.const_s > 0 and m.per_token_s > 0
    assert min(m.per_seq_s, m.per_pair_s) >= 0
    assert decode_step_s(m, 8, 100) > decode_step_s(m, 1, 100)  # a bigger batch costs more per step
    assert decode_step_s(m, 4, 400) >= decode_step_s(m, 4, 40)
    assert prefill_s(m, 256, 256) > prefill_s(m, 32, 256)  # more prompt, more prefill
    assert prefill_s(m, 512, 256) > prefill_s(m, 256, 256)  # two chunks, two steps
    assert cal.rel_rms < 1.0


@pytest.mark.slow
def test_plan_calibrated_against_a_running_target(embedded_engine, tmp_path):
    out = tmp_path / "plan.json"
    args = parse(str(REPO / "loadgen" / "scenarios" / "chat.yaml"), "--calibrate", embedded_engine,
                 "--requests", "1500", "--draws", "1",
                 "--probe-batches", "1,6", "--probe-contexts", "32,160", "--probe-output", "12",
                 "--probe-prefill", "32,96,200", "--probe-rounds", "2", "--target-rps", "100", "--json", str(out),
                 "--plot", str(tmp_path / "plan.html"), "--load-point", "0.3", "--load-point-s", "3")
    assert cmd_plan(args) == 0
    plan = json.loads(out.read_text())
    cal = plan["models"]["calibrated"]
    # one load point, at 0.3 x the probe fit's prediction; the calibrated model is the probe's fit scaled by its factor
    (lp,) = plan["calibration"]["load_points"]
    assert lp["rate"] == pytest.approx(0.3 * lp["guide_rps"]) and lp["source"] == "server timing"
    assert lp["compared"] > 0.8 * lp["sent"] and 0.25 <= lp["factor"] <= 4.0
    probe, fitted = plan["calibration"]["probe_model"], cal["step_model"]
    for k in ("const_s", "per_seq_s", "per_token_s", "per_pair_s"):
        assert fitted[k] == pytest.approx(probe[k] * lp["factor"])
    assert cal["rated_rps"] > 0
    assert cal["replicas"] >= 1 and cal["gpus"] == cal["replicas"]
    assert cal["closed_form"]["batch"] == 64  # chat.yaml's max_num_seqs; the KV pool holds more
    # the predicted curve's p99 TTFT rises with the load
    ttft = [p["quantiles_ms"]["premium"]["ttft_ms"] for p in cal["curve"]]
    assert ttft[-1] > ttft[0]
    assert (tmp_path / "plan.html").stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["loadgen/scenarios/chat.yaml"], "give --hardware"),
    (["loadgen/scenarios/chat.yaml", "--hardware", "tpu9"], "unknown hardware"),
    (["loadgen/scenarios/chat.yaml", "--hardware", "H100", "--model", "layers=2"], "--model"),
    (["loadgen/scenarios/nope.yaml", "--hardware", "H100"], "no such file"),
    (["loadgen/scenarios/replay-mooncake.yaml", "--hardware", "H100"], "synthetic"),
    (["loadgen/scenarios/chat.yaml", "--hardware", "H100", "--capacity-run", "/nonexistent"], "summary.json"),
    (["loadgen/scenarios/chat.yaml", "--calibrate", "localhost:1"], "expected http"),
    (["loadgen/scenarios/chat.yaml", "--calibrate", "embedded", "--load-point", "0.5,x"], "--load-point"),
    (["loadgen/scenarios/chat.yaml", "--calibrate", "embedded", "--load-point", "2"], "shares in"),
])
def test_bad_input_is_a_usage_error(argv, message, monkeypatch):
    monkeypatch.chdir(REPO)
    args = parse(*argv, "--requests", "200", "--draws", "1")
    with pytest.raises(UsageError, match=message):
        cmd_plan(args)


def test_theory_plan_on_a_spec_sheet_accelerator(tmp_path):
    args = parse(str(REPO / "loadgen" / "scenarios" / "chat.yaml"), "--hardware", "H100", "--requests", "800",
                 "--draws", "1",
                 "--model", "layers=32,hidden=4096,heads=32,kv_heads=8,intermediate=14336,vocab=128256",
                 "--target-rps", "50", "--headroom", "0.2")
    plan = build(args)
    th = plan["models"]["theory"]
    assert plan["tp"] == 1
    assert th["closed_form"]["kv_pool_tokens"] == 426_784  # tests/loadgen/planning/test_plan_theory.py's figure
    assert th["rated_rps"] > 0 and th["replicas"] >= 1


def test_a_capacity_run_gets_the_prediction_in_its_report(tmp_path):
    """--capacity-run leaves prediction.json in the run folder and redraws its report with the predicted
    curve beside the steps and the theory-only error; a capacity report without it says how to get one."""
    from loadgen.report import write_report
    from tests.run_folders import make_capacity_run

    run = make_capacity_run(tmp_path / "cap")
    assert "no prediction.json" in write_report(run).read_text()
    summary = json.loads((run / "summary.json").read_text())
    for st in summary["steps"]:  # the judged quantiles a capacity run records
        for tier, thr in (("premium", 300.0), ("standard", 800.0)):
            e = st["tiers"][tier]
            e["judged"] = {"ttft_ms": {"value_ms_q": e["p99_ttft_ms"], "threshold_ms": thr, "n": e["requests"]}}
    (run / "summary.json").write_text(json.dumps(summary))
    args = parse(str(REPO / "loadgen" / "scenarios" / "chat.yaml"), "--hardware", "H100", "--requests", "600",
                 "--draws", "1",
                 "--model", "layers=32,hidden=4096,heads=32,kv_heads=8,intermediate=14336,vocab=128256",
                 "--capacity-run", str(run))
    assert cmd_plan(args) == 0
    pred = json.loads((run / "prediction.json").read_text())
    measured = summary["rated_capacity"]["rate_rps"]
    th = pred["predicted"]["theory"]
    assert pred["measured_rated_rps"] == measured
    assert th["error"] == pytest.approx(th["rated_rps"] / measured - 1)
    loads = [q["load"] for q in th["curve"]]
    assert loads == sorted(loads) and {s["load"] for s in summary["steps"]} <= set(loads)  # the steps' loads too
    assert [s["quantiles_ms"]["premium"]["ttft_ms"] for s in pred["steps"]] == \
        [s["tiers"]["premium"]["p99_ttft_ms"] for s in sorted(summary["steps"], key=lambda s: s["load"])]
    html = (run / "report.html").read_text()
    assert "Predicted against measured" in html and "no prediction.json" not in html
    assert f"{100 * th['error']:+.1f}%" in html
    assert "measured: premium p99 TTFT" in html and "theory: premium p99 TTFT" in html  # the figure's traces


def test_the_probe_covers_the_scenarios_longest_prompt():
    """By default the probe adds the scenario's longest prompt (at most 4096 tokens) when a prefill chunk
    cannot hold it, so the fit sees a long prompt's later chunks; --probe-prefill replaces the lengths."""
    from loadgen.commands.plan import step_timing_settings

    args = parse("loadgen/scenarios/long-prompt-burst.yaml", "--hardware", "host")
    assert step_timing_settings(args, 256, 1024).prefill_lengths == (32, 128, 256, 1024)
    assert step_timing_settings(args, 256, 1024).chunk == 256
    assert step_timing_settings(args, 256, 100_000).prefill_lengths[-1] == 4096
    assert (step_timing_settings(args, 256, 200).prefill_lengths
            == step_timing_settings(args, None, 1024).prefill_lengths == (32, 128, 256))
    own = parse("loadgen/scenarios/long-prompt-burst.yaml", "--hardware", "host", "--probe-prefill", "64,512")
    assert step_timing_settings(own, 256, 1024).prefill_lengths == (64, 512)
