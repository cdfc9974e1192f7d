"""The warm-cache check: a run whose prompts hit the target's prefix cache beyond what its workload shares is
flagged, with both rates (loadgen/workload/sharing.py, loadgen/results/prefix_cache.py)."""

from __future__ import annotations

import json

import pytest

from loadgen.results.prefix_cache import WARM_MARGIN, prefix_cache_check
from loadgen.workload.sharing import PrefixShare
from loadgen.workload.specs import BlockPrompt, RequestSpec, Segment
from loadgen.workload.synthetic import LengthDist, SharedPrefix, SyntheticWorkload
from tests.helpers import slobench


def spec(i: int, segs: list[tuple[str, int]]) -> RequestSpec:
    n = sum(t for _, t in segs)
    return RequestSpec(f"r{i}", float(i), [1] * n, 4, prompt_tokens=n,
                       segments=tuple(Segment((k,), t) for k, t in segs))


def test_shared_tokens_follow_the_segments_in_send_order():
    ps = PrefixShare()
    ps.add([spec(3, [("p", 100), ("b0", 20), ("x", 5)]),  # sent last: shares p and 20 tokens of b0
            spec(0, [("p", 100), ("b0", 50)]),
            spec(1, [("p", 100), ("b1", 50)]),  # shares p
            spec(2, [("p", 60)])])  # a cut segment is a prefix of the whole one: 60 shared
    assert ps.prompt_tokens == 150 + 150 + 60 + 125
    assert ps.shareable_tokens == 0 + 100 + 60 + 120
    # nothing follows a cut segment: b0 after a 60-token p is not b0 after the whole p
    ps.add([spec(4, [("p", 60), ("b0", 50)])])
    assert ps.shareable_tokens == 280 + 60


def test_workloads_without_and_with_sharing():
    no_share = SyntheticWorkload(input_len=LengthDist(value=64), output_len=LengthDist(value=4))
    ps = PrefixShare()
    ps.add(no_share.generate([0.1 * i for i in range(20)], seed=1))
    assert ps.share == 0.0
    shared = SyntheticWorkload(input_len=LengthDist(value=64), output_len=LengthDist(value=4),
                               shared_prefix=SharedPrefix(num_prompts=1, length=64, ratio=1.0))
    ps = PrefixShare()
    ps.add(shared.generate([0.1 * i for i in range(20)], seed=1))
    assert ps.share == pytest.approx(19 * 64 / (20 * 128))  # every prefix but the first one's
    blocks = PrefixShare()  # Mooncake blocks: equal hash ids, equal leading blocks
    blocks.add([RequestSpec("a", 0.0, BlockPrompt((1, 2), 1000, 512), 4, prompt_tokens=1000),
                RequestSpec("b", 1.0, BlockPrompt((1, 3), 700, 512), 4, prompt_tokens=700)])
    assert blocks.shareable_tokens == 512


def test_a_later_turn_with_real_history_shares_the_previous_prompt_and_reply():
    from loadgen.workload.synthetic import Conversations

    wl = SyntheticWorkload(input_len=LengthDist(value=40), output_len=LengthDist(value=8),
                           conversations=Conversations(turns=3, think_time_s=0.5))
    specs = wl.generate([0.0, 0.1, 0.2, 5.0, 5.1, 5.2], seed=2)  # two conversations of three turns
    assert sum(s.follow_up for s in specs) == 4
    ps = PrefixShare()
    ps.add(specs)
    # per conversation: turn 1 = 40 new; turn 2 = 40 + 8 history + 40 new; turn 3 = 96 history + 40 new
    assert ps.prompt_tokens == 2 * (40 + 88 + 136)
    assert ps.shareable_tokens == 2 * (0 + 48 + 96)


def test_check_flags_hits_beyond_the_workloads_share():
    recs = [{"status": "ok", "prompt_tokens": 100, "cached_tokens": 96}, {"status": "ok", "prompt_tokens": 100,
                                                                            "cached_tokens": 80}]
    pc = prefix_cache_check(recs, None, 0.1)
    assert pc["observed_hit_rate"] == pytest.approx(0.88) and pc["warm_cache"] is True
    assert pc["source"] == "usage.prompt_tokens_details.cached_tokens"
    assert "88.0%" in pc["note"] and "10.0%" in pc["note"]
    assert prefix_cache_check(recs, None, 0.88 - WARM_MARGIN / 2)["warm_cache"] is False  # within the margin
    # vLLM's counters when usage says nothing
    samples = [{"t": 0, "metrics": {"vllm:prefix_cache_hits_total": 10.0, "vllm:prefix_cache_queries_total": 100.0}},
               {"t": 5, "metrics": {"vllm:prefix_cache_hits_total": 410.0, "vllm:prefix_cache_queries_total": 900.0}}]
    pc = prefix_cache_check([{"status": "ok", "prompt_tokens": 100}], samples, 0.0)
    assert pc["observed_hit_rate"] == pytest.approx(0.5) and pc["warm_cache"] is True
    assert pc["source"] == "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total" and pc["tokens"] == 800
    none = prefix_cache_check([{"status": "ok", "prompt_tokens": 100}], [], 0.0)
    assert none["observed_hit_rate"] is None and none["warm_cache"] is False and "no prefix-cache" in none["note"]


SCENARIO = """
name: warm
seed: 5
workload:
  type: synthetic
  input_len: 96
  output_len: 2
load: {arrival: poisson, rate: 8, requests: 16}
"""


@pytest.mark.slow
def test_a_repeated_seed_against_a_running_server_is_flagged(engine_server, tmp_path):
    scn = tmp_path / "warm.yaml"
    scn.write_text(SCENARIO)
    out = []
    for k in range(2):
        r = slobench("run", scn, "--target", engine_server.url, "--out", tmp_path / f"run{k}", "--no-report")
        assert r.returncode == 0, r.stderr
        out.append(json.loads((tmp_path / f"run{k}" / "summary.json").read_text()))
        assert out[-1]["completed"] == 16
    first, second = out[0]["prefix_cache"], out[1]["prefix_cache"]
    assert first["expected_hit_rate"] == 0.0 and second["expected_hit_rate"] == 0.0
    assert first["warm_cache"] is False, first
    assert second["warm_cache"] is True and second["observed_hit_rate"] > 0.5, second
    assert "warm cache" in second["note"]
