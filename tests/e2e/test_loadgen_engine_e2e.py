"""End to end against the reference engine (tiny), started by `slobench run` itself as a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.results.records import read_records

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_run_against_the_embedded_reference_engine(tmp_path):
    pytest.importorskip("torch")
    scn = tmp_path / "engine.yaml"
    scn.write_text(
        "name: engine-e2e\nseed: 1\nengine: {model: tiny, max_num_seqs: 8}\n"
        "workload: {input_len: {dist: uniform, min: 8, max: 48}, output_len: 12,"
        " shared_prefix: {num_prompts: 1, length: 32, ratio: 0.5}}\n"
        "tiers: {premium: {weight: 1, slo: {ttft_ms: 5000}}, standard: {weight: 1}}\n"
        "load: {arrival: poisson, rate: 8, requests: 24}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(scn), "--reports", str(tmp_path),
                        "--run-id", "eng", "--json", "--lateness-bound-ms", "100"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "eng"
    recs = read_records(run / "requests.jsonl")
    assert len(recs) == 24 and all(x["status"] == "ok" for x in recs), [x["error"] for x in recs]
    for x in recs:
        s = x["server"]
        assert s and {"queue_ms", "prefill_ms", "decode_ms"} <= set(s), x
        assert x["output_tokens"] == 12  # ignore_eos: exactly max_tokens, from the final usage
        ttft_ms = (x["first_token_s"] - x["scheduled_s"]) * 1000
        # the server's clock starts after our send and stops before our read: it cannot see more
        assert ttft_ms + 0.5 >= s["queue_ms"] + s["prefill_ms"], x
        assert (x["done_s"] - x["scheduled_s"]) * 1000 + 0.5 >= s["queue_ms"] + s["prefill_ms"] + s["decode_ms"], x
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] == 24 and summary["breakdown"]["source"] == "server timing"
    assert summary["tiers"]["premium"]["slo_attainment"] is not None
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(any(k.startswith("vllm:") for k in m.get("metrics", {})) for m in metrics)
    assert (run / "engine.log").exists()
