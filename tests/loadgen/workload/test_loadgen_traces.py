from pathlib import Path

import numpy as np
import pytest

from loadgen.workload.arrivals import Arrivals
from loadgen.workload.traces import TraceError, TraceOptions, load_length_stats, load_trace, read_burstgpt

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"
pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"traces not found at {TRACES}")

MOONCAKE_CONV = TRACES / "mooncake" / "conversation_trace.first7500.jsonl"
MOONCAKE_SYN = TRACES / "mooncake" / "synthetic_trace.jsonl"
AZURE_CODE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
AZURE_CONV = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
BURST1 = TRACES / "burstgpt" / "BurstGPT_1.head400.csv"
BURST3 = TRACES / "burstgpt" / "BurstGPT_3.head400.csv"
SHAREGPT = TRACES / "sharegpt" / "ShareGPT_V3_filtered_500.json"
ETALON = TRACES / "etalon_length_stats" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


@pytest.mark.parametrize(
    "path,rows,duration,mean_in,mean_out",
    [
        (MOONCAKE_CONV, 7500, 2301.0, 12487, 348),
        (MOONCAKE_SYN, 3993, 1022.0, 15325, 149),
        (AZURE_CODE, 8819, 3435.9, 2048, 27.9),
        (AZURE_CONV, 19366, 3501.7, 1155, 211),
    ],
)
def test_row_counts_durations_and_token_means_match_the_readme(path, rows, duration, mean_in, mean_out):
    specs, info = load_trace(path)
    assert info.rows == rows and len(specs) == rows
    assert specs[0].arrival_s == 0.0
    assert specs[-1].arrival_s == pytest.approx(duration, abs=0.1)
    assert np.mean([s.prompt_tokens for s in specs]) == pytest.approx(mean_in, rel=0.002)
    assert np.mean([s.max_tokens for s in specs]) == pytest.approx(mean_out, rel=0.005)
    assert all(np.diff([s.arrival_s for s in specs]) >= 0)


def test_mooncake_total_input_tokens_equal_the_trace():
    specs, _ = load_trace(MOONCAKE_CONV, opts=TraceOptions(max_requests=300))
    import json

    rows = [json.loads(line) for line in MOONCAKE_CONV.read_text().splitlines()[:300]]
    materialised = [len(s.prompt_value()) for s in specs]
    assert materialised == [r["input_length"] for r in rows]
    assert sum(s.prompt_tokens for s in specs) == sum(r["input_length"] for r in rows)


def test_mooncake_equal_hash_ids_give_equal_prefixes():
    specs, _ = load_trace(MOONCAKE_CONV, opts=TraceOptions(max_requests=400))
    bs = 512
    blocks: dict[int, list[int]] = {}
    shared = 0
    for s in specs:
        toks = s.prompt_value()
        for k, h in enumerate(s.prompt.hash_ids):
            block = toks[k * bs:(k + 1) * bs]
            if len(block) < bs:  # the cut last block is a prefix of the full one
                assert blocks.get(h, block)[: len(block)] == block
                continue
            if h in blocks:
                shared += 1
                assert blocks[h] == block, f"hash id {h} differs between requests"
            blocks[h] = block
    assert shared > 400  # every request starts with block 0, and many share more
    first = specs[0].prompt_value()
    assert all(s.prompt_value()[:bs] == first[:bs] for s in specs[:50])
    # different ids give different blocks, and a different seed changes every block
    a, b = load_trace(MOONCAKE_CONV, opts=TraceOptions(max_requests=1, seed=1))[0][0], specs[0]
    assert a.prompt_value()[:bs] != b.prompt_value()[:bs]
    assert first[:bs] != first[bs:2 * bs]


def test_mooncake_block_size_is_checked():
    with pytest.raises(TraceError, match="block_size"):
        load_trace(MOONCAKE_CONV, opts=TraceOptions(block_size=16))


def test_time_scale_and_rate_override_keep_the_burst_shape():
    base, _ = load_trace(MOONCAKE_CONV, opts=TraceOptions(max_requests=1000))
    fast, info = load_trace(MOONCAKE_CONV, opts=TraceOptions(max_requests=1000, time_scale=0.1))
    t0 = np.array([s.arrival_s for s in base])
    t1 = np.array([s.arrival_s for s in fast])
    assert info.time_factor == 0.1
    np.testing.assert_allclose(t1, t0 * 0.1)
    rated, info = load_trace(MOONCAKE_CONV, opts=TraceOptions(max_requests=1000, rate=20.0))
    t2 = np.array([s.arrival_s for s in rated])
    assert (len(t2) - 1) / t2[-1] == pytest.approx(20.0)
    np.testing.assert_allclose(t2 / t2[-1], t0 / t0[-1])  # same shape: bursts stay bursts
    assert np.sum(np.diff(t2) == 0) == np.sum(np.diff(t0) == 0)


def test_start_offset_max_duration_and_max_requests():
    specs, info = load_trace(MOONCAKE_CONV, opts=TraceOptions(start_offset_s=600, max_duration_s=30, time_scale=0.5))
    base, _ = load_trace(MOONCAKE_CONV)
    t = np.array([s.arrival_s for s in base])
    expected = np.sum((t >= 600) & ((t - t[t >= 600][0]) * 0.5 < 30))
    assert len(specs) == expected and specs[0].arrival_s == 0 and specs[-1].arrival_s < 30
    specs, _ = load_trace(AZURE_CONV, opts=TraceOptions(max_requests=123))
    assert len(specs) == 123


def test_azure_seven_decimal_timestamps():
    specs, _ = load_trace(AZURE_CODE, opts=TraceOptions(max_requests=3))
    # 18:17:03.9799600 -> 18:17:04.0319600 -> ...: 52 ms exactly, 100 ns resolution kept
    assert specs[1].arrival_s == pytest.approx(0.0520000, abs=1e-6)
    total = sum(s.prompt_tokens for s in load_trace(AZURE_CODE)[0])
    rows = AZURE_CODE.read_text().splitlines()[1:]
    assert total == sum(int(r.split(",")[1]) for r in rows)


@pytest.mark.parametrize("path,rows,failed,mean_in_ok", [(BURST1, 400, 17, 543.6), (BURST3, 400, 1, 618.9)])
def test_burstgpt_both_layouts_and_failed_rows(path, rows, failed, mean_in_ok):
    specs, info = load_trace(path)
    assert info.rows == rows and info.skipped_failed == failed and len(specs) == rows - failed
    assert np.mean([s.prompt_tokens for s in specs]) == pytest.approx(mean_in_ok, abs=0.1)
    kept, skipped = read_burstgpt(path, skip_failed=False)
    assert len(kept) == rows and skipped == 0


def test_burstgpt_sessions_and_float_timestamps():
    specs, _ = load_trace(BURST3)
    assert specs[-1].arrival_s == pytest.approx(41_453, abs=1)
    all_rows, _ = read_burstgpt(BURST3, skip_failed=False)
    assert len({r.session for r in all_rows if r.session}) == 135  # the README's count, all rows
    assert len({s.conversation for s in specs if s.conversation}) == 134  # one session was one failed row


def test_sharegpt_text_prompts_with_an_arrival_process():
    opts = TraceOptions(arrivals=Arrivals("poisson", rate=5.0), output_len=64, seed=3)
    specs, info = load_trace(SHAREGPT, opts=opts)
    assert len(specs) == 500 and info.rows == 500
    assert all(isinstance(s.prompt, str) and s.max_tokens == 64 and s.prompt_tokens is None for s in specs)
    assert specs[0].prompt.startswith("How to stop automatic updates")
    assert 4.0 < 499 / specs[-1].arrival_s < 6.0
    again, _ = load_trace(SHAREGPT, opts=opts)
    assert [s.arrival_s for s in again] == [s.arrival_s for s in specs]


def test_length_stats_for_empirical_distributions():
    ins, outs = load_length_stats(ETALON)
    assert len(ins) == len(outs) == 30_731
    assert np.mean(ins) == pytest.approx(2340, rel=0.01) and max(outs) == 1024


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.jsonl")
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        load_trace(bad)
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    with pytest.raises(TraceError, match=r"x.jsonl:1: not a Mooncake row"):
        load_trace(bad)
