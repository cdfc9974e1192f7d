"""`slobench experiments`: every experiment in its reduced form shows the direction of its effect (counts and
steps where possible, never a speed threshold), and the command writes experiments.json and .html, refuses
unknown names and keeps what finished on Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import replace

import pytest

from engine.experiments.registry import EXPERIMENTS
from loadgen import cli
from loadgen.commands.common import EXIT_INTERRUPTED, EXIT_OK, UsageError
from loadgen.commands.experiments import cmd_experiments, register

_cache: dict = {}


def reduced(name: str):
    if name not in _cache:
        _cache[name] = EXPERIMENTS[name].run(reduced=True)
    return _cache[name]


def parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers(dest="cmd"))
    return ap.parse_args(["experiments", *argv])


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_experiment_states_its_claims_and_explains_a_miss(name):
    r = reduced(name)
    doc = json.loads(json.dumps(r.as_dict()))
    assert doc["name"] == name and doc["params"]["form"] == "reduced" and doc["findings"]
    assert all(isinstance(f["holds"], bool) and f["claim"] and f["seed_figure"] and f["measured"] and f["rule"]
               for f in doc["findings"])
    assert all(f["note"] for f in doc["findings"] if not f["holds"])  # a miss says by how much and why
    assert doc["holds"] == all(f["holds"] for f in doc["findings"])
    assert doc["plot"]["series"] and all(len(s["x"]) == len(s["y"]) for s in doc["plot"]["series"].values())


def test_continuous_batching_keeps_the_batch_fuller_and_needs_fewer_steps():
    d = reduced("continuous-batching").data
    assert d["continuous"]["output_tokens"] == d["static"]["output_tokens"]
    assert d["continuous"]["steps"] < d["static"]["steps"]
    assert d["continuous"]["mean_running"] > d["static"]["mean_running"]


def test_paged_fragments_less_and_runs_more_sequences_than_contiguous():
    d = reduced("paged-kv").data
    assert d["paged"]["mean_fragmentation"] < d["contiguous"]["mean_fragmentation"]
    assert d["paged, half blocks"]["mean_fragmentation"] < d["paged"]["mean_fragmentation"]
    assert d["paged"]["mean_running_saturated"] > d["contiguous"]["mean_running_saturated"]
    assert (d["paged, max_tokens asked"]["mean_running_saturated"]
            > 2 * d["contiguous, max_tokens asked"]["mean_running_saturated"])


def test_prefix_sharing_saves_blocks():
    d = reduced("prefix-sharing").data
    assert d["sharing_on"]["mean_blocks_per_seq"] < d["sharing_off"]["mean_blocks_per_seq"]
    assert d["kv_saved"] > 0


def test_chunking_gives_the_decodes_a_token_every_step_while_a_whole_prefill_skips_them():
    """Counted in steps, not timed: chunked, the higher-tier long prompt takes a chunk per step beside every
    decode; whole, it takes one step alone and each running decode misses it."""
    p, d = EXPERIMENTS["chunked-prefill"].reduced, reduced("chunked-prefill").data
    on, off = d["chunked, long prompt premium"], d["whole, long prompt premium"]
    assert on["prefill_steps"] == -(-p.long_prompt_len // p.prefill_chunk_size) and on["decode_steps_missed"] == 0
    assert off["prefill_steps"] == 1 and off["decode_steps_missed"] == p.decodes
    assert d["chunked, long prompt alone"]["prefill_steps"] == on["prefill_steps"]
    # unchunked and ranked below the decodes, the long prompt waits for them instead of stalling them
    assert not d["whole, long prompt standard"]["long_first_token_before_decodes_end"]
    assert d["chunked, long prompt standard"]["long_first_token_before_decodes_end"]


def test_rebatching_less_often_makes_new_requests_wait_more_steps():
    d = reduced("rebatch-interval").data["by_interval"]
    assert d["8"]["mean_queue_steps"] > d["1"]["mean_queue_steps"]
    assert all(0 < v["schedule_share"] < 1 for v in d.values())


def test_premium_queues_less_than_basic_under_tiers():
    d = reduced("priority-tiers").data
    tiered, flat = d["with_tiers"], d["without_tiers"]
    assert tiered["interactive_mean_queue_steps"] < tiered["batch_mean_queue_steps"]
    assert tiered["interactive_mean_queue_steps"] < flat["interactive_mean_queue_steps"]


def test_overload_swaps_and_refuses_but_loses_nothing():
    d = reduced("overload").data
    assert d["lost"] == 0
    assert sum(d["refused"].values()) > 0 and d["served"] > 0
    assert d["served"] + sum(d["refused"].values()) == d["offered"]
    assert sum(d["refused_by_tier"].values()) == sum(d["refused"].values())
    assert d["premium_offered"] > 0 and d["premium_within_promise"] <= d["premium_offered"]
    assert d["swap_outs"] > 0


def test_batch_fill_falls_with_sparse_arrivals_and_reserved_slots():
    d = reduced("batch-fill").data
    assert d["by_rate"]["2.0"]["fill"] < d["by_rate"]["32.0"]["fill"]
    assert d["by_reserved_slots"]["16"]["fill"] < d["by_reserved_slots"]["0"]["fill"]


def test_separated_interactive_traffic_queues_less_than_mixed_with_few_slots():
    d = reduced("mixed-vs-separated").data
    few = d["mixed"]["mixed, 4 slots"]
    assert d["separated"]["interactive_instance"]["interactive_mean_queue_steps"] < few["interactive_mean_queue_steps"]
    assert few["deployment_batch_tok_s"] > 0


def test_the_mixed_instance_is_tuned_with_priority_tiers_too():
    """Premium interactive requests pass the basic batch backlog in the mixed instance: fewer steps queued than
    first come first served on the same slots, and the finding reports the tier-aware tunings."""
    r = reduced("mixed-vs-separated")
    flat, tiered = r.data["mixed"]["mixed, 4 slots"], r.data["mixed"]["mixed, 4 slots, tiers premium/basic"]
    assert tiered["interactive_mean_queue_steps"] < flat["interactive_mean_queue_steps"]
    assert "tiers premium/basic" in r.findings[0].measured and "tiers" in r.findings[0].rule


def test_command_writes_json_and_html(tmp_path, capsys):
    out = tmp_path / "run"
    assert cmd_experiments(parse("prefix-sharing", "--reduced", "--out", str(out), "--no-progress")) == EXIT_OK
    doc = json.loads((out / "experiments.json").read_text())
    assert doc["form"] == "reduced" and not doc["interrupted"]
    assert [e["name"] for e in doc["experiments"]] == ["prefix-sharing"]
    page = (out / "experiments.html").read_text()
    assert "holds here?" in page and "plotly" in page.lower() and "prefix-sharing" in page
    assert "experiments hold here" in capsys.readouterr().out


def test_reports_and_run_id_build_the_folder(tmp_path):
    args = parse("--list", "--reports", str(tmp_path), "--run-id", "x")
    assert cmd_experiments(args) == EXIT_OK  # --list writes nothing
    assert not (tmp_path / "x").exists()


def test_unknown_name_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="unknown experiment 'nope'"):
        cmd_experiments(parse("nope", "--out", str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


def test_ctrl_c_saves_what_finished(tmp_path, monkeypatch):
    def interrupted(_params):
        raise KeyboardInterrupt

    monkeypatch.setitem(EXPERIMENTS, "batch-fill", replace(EXPERIMENTS["batch-fill"], fn=interrupted))
    out = tmp_path / "run"
    code = cmd_experiments(parse("chunked-prefill", "batch-fill", "--reduced", "--out", str(out), "--no-progress"))
    assert code == EXIT_INTERRUPTED
    doc = json.loads((out / "experiments.json").read_text())
    assert doc["interrupted"] and [e["name"] for e in doc["experiments"]] == ["chunked-prefill"]
    assert (out / "experiments.html").exists()


def test_sigterm_ends_the_command_as_ctrl_c_does(tmp_path, monkeypatch):
    """`slobench` turns SIGTERM (a cancelled CI job, `timeout`) outside a run's loop into Ctrl-C's path: what
    finished is saved, exit 130."""
    def terminated(_params):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises in here
        raise AssertionError("SIGTERM did not interrupt the experiment")

    monkeypatch.setitem(EXPERIMENTS, "batch-fill", replace(EXPERIMENTS["batch-fill"], fn=terminated))
    out = tmp_path / "run"
    def left_to_default(*_):  # what the test sees if slobench installs no handler (the default would kill pytest)
        raise AssertionError("slobench left SIGTERM to its default action")

    previous = signal.signal(signal.SIGTERM, left_to_default)
    try:
        code = cli.main(["experiments", "chunked-prefill", "batch-fill", "--reduced", "--out", str(out),
                         "--no-progress"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == EXIT_INTERRUPTED
    doc = json.loads((out / "experiments.json").read_text())
    assert doc["interrupted"] and [e["name"] for e in doc["experiments"]] == ["chunked-prefill"]
