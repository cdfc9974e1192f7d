"""Accelerator profiles: memory, HBM bandwidth and dense bf16 compute, from the vendors' public spec sheets,
or measured on this host (the embedded engine runs on the CPU here).

Spec-sheet figures (dense, i.e. without the 2:4 sparsity the sheets also quote; SXM / OAM parts; "GB" as
printed, taken as 10^9 bytes, so memory is a little understated):

- H100 SXM: 80 GB HBM3, 3.35 TB/s, 989 TFLOPS bf16 (NVIDIA H100 Tensor Core GPU datasheet; 1,979 sparse).
- H200 SXM: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS bf16 (NVIDIA H200 datasheet).
- B200: 180 GB HBM3e, 8 TB/s, 2,250 TFLOPS bf16 (NVIDIA DGX B200 datasheet: 1,440 GB and 64 TB/s for 8
  GPUs; HGX B200's 4.5 PFLOPS bf16 is with sparsity).
- A100 80GB SXM: 80 GB HBM2e, 2,039 GB/s, 312 TFLOPS bf16 (NVIDIA A100 datasheet).
- L40S: 48 GB GDDR6, 864 GB/s, 362 TFLOPS bf16 (NVIDIA L40S datasheet: 362.05; 733 sparse).
- L4: 24 GB GDDR6, 300 GB/s, 121 TFLOPS bf16 (NVIDIA L4 datasheet; 242 sparse).
- MI300X: 192 GB HBM3, 5.3 TB/s, 1,307 TFLOPS bf16 (AMD Instinct MI300X datasheet: 1,307.4 dense).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bytes: float
    bandwidth_bytes_s: float  # memory bandwidth
    flops: float  # dense bf16 (or, measured, the dtype it was measured in)
    source: str  # the spec sheet, or how it was measured

    def as_dict(self) -> dict:
        return asdict(self)


ACCELERATORS: dict[str, Accelerator] = {a.name.lower(): a for a in (
    Accelerator("H100", 80 * GB, 3.35 * TB, 989e12, "NVIDIA H100 SXM datasheet"),
    Accelerator("H200", 141 * GB, 4.8 * TB, 989e12, "NVIDIA H200 SXM datasheet"),
    Accelerator("B200", 180 * GB, 8.0 * TB, 2250e12, "NVIDIA DGX B200 datasheet (per GPU)"),
    Accelerator("A100-80GB", 80 * GB, 2.039 * TB, 312e12, "NVIDIA A100 80GB SXM datasheet"),
    Accelerator("L40S", 48 * GB, 0.864 * TB, 362e12, "NVIDIA L40S datasheet"),
    Accelerator("L4", 24 * GB, 0.300 * TB, 121e12, "NVIDIA L4 datasheet"),
    Accelerator("MI300X", 192 * GB, 5.3 * TB, 1307e12, "AMD Instinct MI300X datasheet"),
)}


def lookup(name: str) -> Accelerator:
    """The profile of ``name`` (case-insensitive); KeyError naming the known ones otherwise."""
    try:
        return ACCELERATORS[name.lower()]
    except KeyError:
        known = ", ".join(a.name for a in ACCELERATORS.values())
        raise KeyError(f"unknown hardware {name!r}; known: {known}, or 'host' (measured here)") from None


def measure_host(threads: int = 1, dtype: str = "float32", size: int = 512, repeat: int = 20) -> Accelerator:
    """This machine's CPU as torch sees it with ``threads`` threads (the embedded engine's default is one):
    matmul FLOPs and copy bandwidth, best of ``repeat``. Memory is what the machine has. It measures the engine's
    own kernels, so it needs torch (the engine extra): a ValueError saying so without it."""
    import os

    try:
        import torch
    except ImportError:
        raise ValueError("--hardware host measures this machine with torch, as the reference engine runs: it needs "
                         "the engine extra (pip install 'slobench[engine]'); or name a spec sheet, e.g. H100") from None

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dt = getattr(torch, dtype)
        a, b = torch.randn(size, size, dtype=dt), torch.randn(size, size, dtype=dt)
        src = torch.empty(64 * 1024 * 1024 // 4, dtype=torch.float32)  # 64 MiB: past every cache level
        dst = torch.empty_like(src)
        best_mm, best_cp = float("inf"), float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            torch.mm(a, b)
            best_mm = min(best_mm, time.perf_counter() - t)
            t = time.perf_counter()
            dst.copy_(src)
            best_cp = min(best_cp, time.perf_counter() - t)
    finally:
        torch.set_num_threads(old)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Accelerator("host", float(memory), 2 * src.numel() * 4 / best_cp, 2 * size**3 / best_mm,
                       f"measured here: torch {dtype} {size}x{size} matmul and a 64 MiB copy, {threads} thread(s)")
