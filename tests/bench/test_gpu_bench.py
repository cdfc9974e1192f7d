"""bench/gpu_bench.py runs end to end on the CPU, its Triton parity check interpreted (its figures need a GPU; its
code must not rot without one), and its pure pieces: the exact device-name table, each decode row's full-batch
check."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_bench = load_bench()


def test_the_gpu_bench_writes_every_figure_on_a_cpu(tmp_path):
    """The whole script on a tiny model, its parity check included: the Triton kernel through triton's CPU
    interpreter (TRITON_INTERPRET=1, set before triton is imported) against the torch reference."""
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, "bench/gpu_bench.py", "--device", "cpu", "--shape", "tiny", "--batches", "1", "3",
           "--context", "40", "--prefill-tokens", "96", "--decode-steps", "4", "--prefill-repeats", "1",
           "--kv-tokens", "4096", "--parity-tokens", "16", "--json", str(out)]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["cuda_graphs"] is False
    parity = result["parity"]
    assert parity["attention"] == {"triton": "triton_paged_attention", "reference": "paged_attention"}
    # fp32 on both sides (the kernel's "ieee" dots): greedy tokens agree, the 381-token prompt's too.
    assert parity["prompt_lengths"] == [49, 65, 128, 248, 53, 381] and parity["tokens_each"] == 16
    assert parity["all_identical"] and parity["first_divergence"] == [None] * 6
    assert [row["batch"] for row in result["decode"]] == [1, 3]
    for row in result["decode"]:
        assert row["step_ms"] > 0 and row["roofline_ms"] > 0 and row["roofline_fraction"] > 0
        # Every timed step ran the row's whole batch.
        assert row["running_seqs"] == {"min": row["batch"], "median": row["batch"], "max": row["batch"]}
    # Weights once, plus each sequence's cached K/V: more sequences, more bytes.
    assert result["decode"][1]["bytes_per_step"] > result["decode"][0]["bytes_per_step"]
    assert result["prefill"]["tokens"] == 96 and result["prefill"]["tokens_per_s"] > 0
    assert result["model"]["layers"] == 2 and result["hardware"]["name"] == "host"
    assert result["hardware_source"].startswith("measured here")
    assert result["attention"] == "paged_attention"  # the timed engine on the CPU: the torch reference


# ---- the device table ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, bandwidth_tb_s", [
    ("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0), ("NVIDIA H100 NVL", 3.9), ("NVIDIA H200", 4.8),
    ("NVIDIA A100-SXM4-80GB", 2.039), ("NVIDIA A100 80GB PCIe", 1.935), ("NVIDIA A100-SXM4-40GB", 1.555),
    ("NVIDIA A100-PCIE-40GB", 1.555), ("NVIDIA L4", 0.3), ("NVIDIA L40S", 0.864),
])
def test_an_exact_device_name_gets_its_datasheet_bandwidth(name, bandwidth_tb_s):
    assert gpu_bench.device_profile(name).bandwidth_bytes_s == pytest.approx(bandwidth_tb_s * 1e12)


def test_the_h100_pcie_and_nvl_are_not_the_sxm_part():
    sxm, pcie, nvl = (gpu_bench.device_profile(f"NVIDIA H100 {v}") for v in ("80GB HBM3", "PCIe", "NVL"))
    assert len({sxm.bandwidth_bytes_s, pcie.bandwidth_bytes_s, nvl.bandwidth_bytes_s}) == 3
    assert len({sxm.flops, pcie.flops, nvl.flops}) == 3
    assert len({sxm.name, pcie.name, nvl.name}) == 3


@pytest.mark.parametrize("name", ["NVIDIA H100", "nvidia h100 80gb hbm3", "NVIDIA H100 80GB HBM3 ", "H100",
                                  "NVIDIA GeForce RTX 4090", "NVIDIA H800", ""])
def test_any_other_name_gets_no_figures(name):
    assert gpu_bench.device_profile(name) is None


def test_an_unknown_cuda_device_gets_no_roofline_and_says_why(monkeypatch):
    monkeypatch.setattr(gpu_bench.torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 Future Edition")
    hw, note = gpu_bench.hardware(argparse.Namespace(hardware=None, device="cuda", dtype=None))
    assert hw is None and "NVIDIA H100 Future Edition" in note and "no roofline" in note


def test_a_known_cuda_device_names_its_datasheet(monkeypatch):
    monkeypatch.setattr(gpu_bench.torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 PCIe")
    hw, note = gpu_bench.hardware(argparse.Namespace(hardware=None, device="cuda", dtype=None))
    assert hw.name == "H100 PCIe" and "datasheet" in note


# ---- each decode row runs its whole batch -----------------------------------------------------------------------
def test_running_seqs_summarises_steps_that_all_ran_the_batch():
    assert gpu_bench.running_seqs([4, 4, 4], 4) == {"min": 4, "median": 4, "max": 4}


@pytest.mark.parametrize("counts", [[4, 3, 4], [4, 4, 5], [], [0]])
def test_a_step_that_ran_another_count_is_an_error_not_a_row(counts):
    with pytest.raises(RuntimeError, match="not 4 each"):
        gpu_bench.running_seqs(counts, 4)


def test_each_sequence_gets_its_share_of_the_kv_cache():
    for batch in (1, 3, 8, 256):
        n = gpu_bench.decode_max_tokens(1 << 18, batch, 512, 16, 32768)
        assert batch * (512 + n) <= 1 << 18 and (512 + n) % 16 == 0 and 512 + n <= 32768
    assert gpu_bench.decode_max_tokens(1 << 18, 256, 512, 16, 32768) == 512  # far past 32 steps + warm-up
    assert gpu_bench.decode_max_tokens(1 << 20, 1, 512, 16, 4096) == 4096 - 512  # the model's length caps it


def test_decode_rows_without_a_profile_carry_no_roofline():
    args = argparse.Namespace(device="cpu", dtype=None, prefill_tokens=64, kv_tokens=2048, batches=[1, 2],
                              context=20, decode_steps=3, decode_warmup=1)
    engine = gpu_bench.make_engine(gpu_bench.register_shape("small"), args, use_triton=False, max_seqs=2)
    rows = gpu_bench.decode(engine, args, None)
    assert [(r["batch"], r["running_seqs"]["min"], r["running_seqs"]["max"]) for r in rows] == [(1, 1, 1), (2, 2, 2)]
    assert all(r["roofline_ms"] is None and r["roofline_fraction"] is None and r["step_ms"] > 0 for r in rows)
    assert not engine.has_unfinished_requests()  # the row's sequences were ended after its timed steps


def test_a_sequence_that_finishes_drops_the_count_of_the_steps_after_it():
    """The audit's case: a sequence with too few max_tokens ends mid-way; the steps after it run fewer sequences."""
    args = argparse.Namespace(device="cpu", dtype=None, prefill_tokens=64, kv_tokens=2048)
    engine = gpu_bench.make_engine(gpu_bench.register_shape("small"), args, use_triton=False, max_seqs=2)
    for max_tokens in (3, 50):
        engine.add_request(list(range(3, 23)), gpu_bench.SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    engine.step()  # both prefilled: one token out each
    counts = [gpu_bench.timed_step(engine, "cpu")[2] for _ in range(4)]
    assert counts == [2, 2, 1, 1]  # the short one's last token is in the second step
    with pytest.raises(RuntimeError, match=r"ran \[2, 2, 1, 1\] sequences, not 2 each"):
        gpu_bench.running_seqs(counts, 2)
