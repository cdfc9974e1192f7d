"""bench/gpu_bench.py runs end to end on the CPU (its figures need a GPU; its code must not rot without one), and
its pure piece: the exact device-name table."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_bench = load_bench()


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
    assert result["hardware_source"].startswith("measured here")


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
