"""Greedy outputs token-identical to Hugging Face transformers, through every path the scheduler can take."""

from __future__ import annotations

import random

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams

MAX_NEW = 8
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)


def hf_greedy(folder, prompts: list[list[int]]) -> list[list[int]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            for _ in range(MAX_NEW):
                nxt = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            outs.append(ids[0, len(p):].tolist())
    return outs


def some_prompts(n: int, vocab: int, seed: int = 0, shared: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = shared or []
    return [prefix + [rng.randrange(2, vocab) for _ in range(rng.randint(3, 40))] for _ in range(n)]


def engine_for(folder, **kw) -> Engine:
    return Engine(EngineConfig(model=str(folder), block_size=8, kv_cache_tokens=4096, **kw))


def run(engine: Engine, prompts) -> list[list[int]]:
    outs = [o.token_ids for o in engine.generate(prompts, GREEDY)]
    engine.check_integrity()
    return outs


@pytest.mark.parametrize("hf_checkpoint", ["llama", "llama-llama3", "mistral", "qwen2", "qwen3"], indirect=True)
def test_batched_greedy_matches_transformers(hf_checkpoint):
    engine = engine_for(hf_checkpoint)
    prompts = some_prompts(4, engine.model_config.vocab_size)
    assert run(engine, prompts) == hf_greedy(hf_checkpoint, prompts)


@pytest.fixture(scope="module")
def llama_case(hf_checkpoint_factory):
    folder = hf_checkpoint_factory("llama")
    system = [random.Random(9).randrange(2, 250) for _ in range(24)]  # three full blocks of 8
    prompts = some_prompts(5, 250, seed=3, shared=system)
    return folder, prompts, hf_greedy(folder, prompts)


def test_chunked_prefill_matches_transformers(llama_case):
    folder, prompts, expected = llama_case
    assert run(engine_for(folder, prefill_chunk_size=8, max_num_batched_tokens=16), prompts) == expected
    assert run(engine_for(folder, enable_chunked_prefill=False), prompts) == expected


def test_prefix_cache_hits_match_transformers(llama_case):
    folder, prompts, expected = llama_case
    engine = engine_for(folder)
    run(engine, prompts[:1])  # caches the shared system prompt
    assert run(engine, prompts) == expected
    assert engine.stats().prefix_hit_tokens >= 24 * len(prompts)


def test_swap_out_and_in_matches_transformers(llama_case):
    folder, prompts, expected = llama_case
    # Small chunks admit many requests on their first block; their growth then overflows 16 blocks.
    engine = engine_for(folder, num_kv_blocks=16, prefill_chunk_size=8, max_num_batched_tokens=32,
                        rebatch_interval=1, enable_prefix_caching=False)
    assert run(engine, prompts) == expected
    assert engine.stats().num_swap_outs > 0


def test_recompute_preemption_matches_transformers(llama_case):
    folder, prompts, expected = llama_case
    engine = engine_for(folder, num_kv_blocks=16, num_host_blocks=0, prefill_chunk_size=8,
                        max_num_batched_tokens=32, rebatch_interval=1)
    assert run(engine, prompts) == expected
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.num_swap_outs == 0


def test_text_prompt_uses_the_checkpoint_tokenizer(llama_case):
    folder, _, _ = llama_case
    engine = engine_for(folder)
    text = "Hello world, the quick brown fox"
    ids = engine.tokenizer.encode(text)
    assert engine.generate(text, GREEDY)[0].token_ids == hf_greedy(folder, [ids])[0]
