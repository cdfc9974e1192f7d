"""A CPU engine's steps reuse freed heap memory instead of faulting in fresh pages (engine/host_memory.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.host_memory import keep_freed_memory

# 32 sequences sampling over a 32,000-word vocabulary (4 MB of logits a step, as the engine-speed checkpoint):
# prints the minor page faults of 20 decode steps. glibc's setting is per process, hence a process per mode.
PROBE = """
import random, resource, sys
from engine.config import EngineConfig
from engine.engine import Engine
from engine.sampling import SamplingParams
engine = Engine(EngineConfig(model=sys.argv[1], admission="queue-length", keep_freed_host_memory=sys.argv[2] == "1"))
rng = random.Random(0)
for _ in range(32):
    engine.add_request([rng.randrange(4, 32000) for _ in range(48)], SamplingParams(max_tokens=40, ignore_eos=True))
for _ in range(5):
    engine.step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    engine.step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def step_faults(checkpoint, keep: bool) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, str(checkpoint), "1" if keep else "0"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not keep_freed_memory(), reason="needs glibc's allocator (mallopt)")
def test_steps_stop_page_faulting_with_freed_memory_kept(hf_checkpoint_factory):
    checkpoint = hf_checkpoint_factory("llama", vocab_size=32000)
    default, kept = step_faults(checkpoint, False), step_faults(checkpoint, True)
    assert default > 20 * 500  # each step maps its large tensors afresh: ~1,000 faults per 4 MB
    assert kept < default / 10


def test_it_is_applied_once_and_answers_the_same():
    assert keep_freed_memory() == keep_freed_memory()
