"""bench/gpu_bench.py runs end to end on the CPU (its figures need a GPU; its code must not rot without one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_bench_writes_every_figure_on_a_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, "bench/gpu_bench.py", "--device", "cpu", "--shape", "small", "--batches", "1", "3",
           "--context", "40", "--prefill-tokens", "96", "--decode-steps", "4", "--prefill-repeats", "1",
           "--kv-tokens", "4096", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["cuda_graphs"] is False
    assert "TRITON_INTERPRET" in result["parity"]["skipped"]  # no CUDA: the Triton path is not compared here
    assert [row["batch"] for row in result["decode"]] == [1, 3]
    for row in result["decode"]:
        assert row["step_ms"] > 0 and row["roofline_ms"] > 0 and row["roofline_fraction"] > 0
    # Weights once, plus each sequence's cached K/V: more sequences, more bytes.
    assert result["decode"][1]["bytes_per_step"] > result["decode"][0]["bytes_per_step"]
    assert result["prefill"]["tokens"] == 96 and result["prefill"]["tokens_per_s"] > 0
    assert result["model"]["layers"] == 8 and result["hardware"]["name"] == "host"
