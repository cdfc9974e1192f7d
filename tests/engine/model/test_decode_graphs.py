"""Decode steps on static, padded buffers (engine/model/decode_graphs.py): the path CUDA graphs replay.

Capturing needs a GPU; the padded path itself runs anywhere (`decode_graphs="eager"`), and these tests hold it
to the ordinary path: the same tokens, pad rows that touch only the scratch block, the sizes it pads to.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.model.decode_graphs import decode_graph_plan, graph_batch_sizes

PROMPTS = [[5, 6, 7], list(range(10, 40)), [9] * 17, list(range(50, 53)), list(range(60, 100))]


def test_batch_sizes_and_the_plan_per_mode():
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert graph_batch_sizes(5) == [1, 2, 4, 5] and graph_batch_sizes(1) == [1]
    engine = Engine(EngineConfig(model="tiny", max_num_seqs=12))
    assert decode_graph_plan("eager", "cpu", engine.model, 12) == ([1, 2, 4, 8, 12], False)
    assert decode_graph_plan("auto", "cpu", engine.model, 12) == (None, False)  # no GPU: the ordinary path
    assert decode_graph_plan("off", "cuda", engine.model, 12) == (None, False)
    assert decode_graph_plan("auto", "cuda", engine.model, 12) == (None, False)  # torch attention: not capturable
    assert engine.runner.decode_graphs is None
    with pytest.raises(ValueError, match="decode_graphs"):
        EngineConfig(decode_graphs="always")


def test_the_padded_path_generates_what_the_ordinary_one_does():
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    ordinary = Engine(EngineConfig(model="tiny", decode_graphs="off")).generate(PROMPTS, params)
    padded = Engine(EngineConfig(model="tiny", decode_graphs="eager"))
    runs = []
    run = padded.runner.decode_graphs.run
    padded.runner.decode_graphs.run = lambda batch, tables: runs.append(len(batch)) or run(batch, tables)
    got = padded.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ordinary]
    assert 5 in runs  # five decodes ran as a batch of 8, three rows padded


def test_pad_rows_write_only_the_scratch_block():
    engine = Engine(EngineConfig(model="tiny", decode_graphs="eager", max_num_seqs=8))
    for prompt in PROMPTS[:3]:
        engine.add_request(prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    for _ in range(4):
        engine.step()  # past every prefill: the next step is three decodes, run as four rows
    seqs = [s for r in engine.requests.values() for s in r.seqs]
    assert all(s.num_computed == s.num_tokens - 1 for s in seqs)
    bs = engine.config.block_size
    expected = {(engine.block_manager.block_table(s.seq_id)[s.num_computed // bs], s.num_computed % bs)
                for s in seqs}
    scratch = engine.runner.decode_graphs.scratch_block
    before = [k.clone() for k, _ in engine.runner.kv_caches]
    engine.step()
    for old, (new, _) in zip(before, engine.runner.kv_caches, strict=True):
        changed = (old != new).flatten(2).any(-1).nonzero().tolist()
        assert {(b, o) for b, o in changed if b != scratch} == expected
        assert {(b, o) for b, o in changed if b == scratch} <= {(scratch, 0)}


TRITON_PARITY = """
from engine import Engine, EngineConfig, SamplingParams
prompts = [[5, 6, 7], list(range(10, 40)), [9] * 17]
params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
ref = Engine(EngineConfig(model="tiny", use_triton=False, decode_graphs="off")).generate(prompts, params)
tri = Engine(EngineConfig(model="tiny", use_triton=True, decode_graphs="eager")).generate(prompts, params)
got, want = [o.token_ids for o in tri], [o.token_ids for o in ref]
assert got == want, (got, want)
print("padded triton ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_padded_path_on_the_triton_kernel_interpreted():
    """The kernel a captured graph would replay, on the padded buffers, under TRITON_INTERPRET=1."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", TRITON_PARITY], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert "padded triton ok" in proc.stdout, proc.stderr[-3000:]


def test_the_padded_path_keeps_sampled_and_seeded_rows_reproducible():
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
    a = Engine(EngineConfig(model="tiny", decode_graphs="off")).generate(PROMPTS[:3], params)
    b = Engine(EngineConfig(model="tiny", decode_graphs="eager")).generate(PROMPTS[:3], params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
