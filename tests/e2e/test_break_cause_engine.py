"""The cause of the break proved on the reference engine, where it is known by construction: each scenario
binds on one cause and the rating names it (``rated_capacity.cause``).

- **queue**: two batch slots, short prompts and answers: requests wait for a slot long before anything else
  slows them.
- **kv**: a KV pool a few blocks larger than one request's whole need, with many batch slots: under load the
  engine preempts to make room, nearly once per request.
- **prefill_interference**: 3,072-token prompts among short chats, without chunked prefill, judged on each
  request's gaps between tokens: a long prompt's prefill runs alone in its step and stalls every decode, its
  gap tens of times a decode step's.

Each was checked with a busy process on one of the two cores as well as alone.

Refusing admission is off in all three (``admission: queue-length``), so nothing is shed, and the searches are
short: each run takes a minute or two on 2 cores."""

from __future__ import annotations

import json

import pytest

from tests.helpers import slobench

pytestmark = pytest.mark.slow

SEARCH = ("search: {start: 2, growth: 2.0, tolerance: 0.2, step_duration_s: 6, warmup_s: 2, max_duration_s: 90}\n"
          "client: {lateness_bound_ms: 100}\n")
SCENARIOS = {
    "queue": """\
name: cause-queue
engine: {model: tiny, max_num_seqs: 2, admission: queue-length}
workload: {input_len: 32, output_len: 24}
tiers: {standard: {slo: {ttft_ms: {threshold: 400, quantile: 0.9}}}}
""",
    "kv": """\
name: cause-kv
engine: {model: tiny, max_num_seqs: 32, num_kv_blocks: 14, admission: queue-length, enable_prefix_caching: false}
workload: {input_len: 64, output_len: 96}
tiers: {standard: {slo: {ttft_ms: {threshold: 1500, quantile: 0.9}}}}
""",
    "prefill_interference": """\
name: cause-prefill
engine: {model: tiny, max_num_seqs: 64, enable_chunked_prefill: false, max_num_batched_tokens: 4096,
         admission: queue-length}
workload: {input_len: {dist: empirical, values: [32, 32, 32, 32, 32, 32, 3072]}, output_len: 48}
tiers: {standard: {slo: {ttft_ms: {threshold: 20000, quantile: 0.9}, itl_ms: {threshold: 150, quantile: 0.9}}}}
""",
}


@pytest.mark.parametrize("cause", list(SCENARIOS))
def test_each_scenario_is_attributed_to_its_cause(cause, tmp_path):
    scn = tmp_path / f"{cause}.yaml"
    scn.write_text(SCENARIOS[cause] + SEARCH)
    r = slobench("capacity", scn, "--out", tmp_path / "run", "--no-report", "--no-progress", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    rc = s["rated_capacity"]
    assert s["verdict"] == "rated", s["verdict_text"]
    assert rc["cause"]["cause"] == cause, (rc["cause"]["why"], rc["cause"]["evidence"])
    assert f"cause of the break (step {rc['cause']['failing_step']}): {cause}" in r.stdout
