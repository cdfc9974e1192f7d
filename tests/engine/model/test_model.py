"""Our Llama-family model against transformers, through the paged cache; loader, presets, tokenizers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.model.attention import AttentionMetadata
from engine.model.loader import ModelLoadError, load_model
from engine.model.model import ModelConfig, allocate_kv_cache, rope_inv_freq
from engine.model.tokenizer import ByteTokenizer, HFTokenizer
from tests.conftest import HF_VARIANTS, make_hf_checkpoint

CPU = torch.device("cpu")
BLOCK = 4
ATOL = 1e-4


class PagedRunner:
    """Drives CausalLM like the engine does: sequences own block lists, every step is one flat batch."""

    def __init__(self, model, cfg, num_blocks: int = 64) -> None:
        self.model = model
        self.kv = allocate_kv_cache(cfg, num_blocks, BLOCK, CPU, torch.float32)

    def step(self, items: list[tuple[list[int], int, list[int]]]) -> list[torch.Tensor]:
        """items: (new token ids, tokens already cached, block table). Returns float32 logits per item."""
        ids, pos, slots, qlens, ctxs = [], [], [], [], []
        for new, start, table in items:
            ids += new
            pos += range(start, start + len(new))
            slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, start + len(new))]
            qlens.append(len(new))
            ctxs.append(start + len(new))
        width = max(len(t) for _, _, t in items)
        tables = torch.tensor([t + [0] * (width - len(t)) for _, _, t in items], dtype=torch.int32)
        cu = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
        meta = AttentionMetadata(qlens, ctxs, cu, torch.tensor(ctxs, dtype=torch.int32), tables, torch.tensor(slots))
        logits = self.model.compute_logits(self.model(torch.tensor(ids), torch.tensor(pos), meta, self.kv))
        return list(logits.split(qlens))


@pytest.fixture(scope="module")
def hf_models():
    """transformers' own model for a checkpoint folder, loaded once per folder."""
    from transformers import AutoModelForCausalLM

    cache = {}

    def get(folder: Path):
        if folder not in cache:
            cache[folder] = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        return cache[folder]

    return get


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("hf_checkpoint", list(HF_VARIANTS), indirect=True)
def test_logits_match_transformers(hf_checkpoint, hf_models):
    hf = hf_models(hf_checkpoint)
    model, cfg, _ = load_model(str(hf_checkpoint), CPU, torch.float32)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, cfg.vocab_size, (11,), generator=gen).tolist()
    ref = hf_logits(hf, prompt)

    # Whole-prompt prefill, blocks deliberately out of order.
    run = PagedRunner(model, cfg)
    table = [9, 3, 17]
    (got,) = run.step([(prompt, 0, table)])
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)

    # Chunked prefill: the second chunk attends to the first through the cache.
    run = PagedRunner(model, cfg)
    table = [5, 30, 2, 11]
    (first,) = run.step([(prompt[:5], 0, table)])
    (second,) = run.step([(prompt[5:], 5, table)])
    torch.testing.assert_close(torch.cat([first, second]), ref, atol=ATOL, rtol=0)

    # Greedy decode steps (crossing a block boundary at position 12), each against a full HF recompute.
    seq = list(prompt)
    last = second[-1]
    for _ in range(4):
        seq.append(int(last.argmax()))
        (out,) = run.step([(seq[-1:], len(seq) - 1, table)])
        torch.testing.assert_close(out[0], hf_logits(hf, seq)[-1], atol=ATOL, rtol=0)
        last = out[0]


@pytest.mark.parametrize("hf_checkpoint", ["llama", "qwen3"], indirect=True)
def test_mixed_batch_of_two_sequences(hf_checkpoint, hf_models):
    """Two sequences of different lengths share flat batches: prefill together, then a prefill chunk
    next to a decode, then decodes only (the vectorized path with padding)."""
    hf = hf_models(hf_checkpoint)
    model, cfg, _ = load_model(str(hf_checkpoint), CPU, torch.float32)
    gen = torch.Generator().manual_seed(1)
    a = torch.randint(2, cfg.vocab_size, (13,), generator=gen).tolist()
    b = torch.randint(2, cfg.vocab_size, (6,), generator=gen).tolist()
    ta, tb = [7, 2, 12, 0, 5], [3, 10, 1]  # interleaved, non-contiguous
    run = PagedRunner(model, cfg)

    out_a, out_b = run.step([(a[:9], 0, ta), (b, 0, tb)])
    torch.testing.assert_close(out_a, hf_logits(hf, a[:9]), atol=ATOL, rtol=0)
    torch.testing.assert_close(out_b, hf_logits(hf, b), atol=ATOL, rtol=0)

    b.append(int(out_b[-1].argmax()))
    out_a, out_b = run.step([(a[9:], 9, ta), (b[-1:], len(b) - 1, tb)])
    torch.testing.assert_close(out_a, hf_logits(hf, a)[9:], atol=ATOL, rtol=0)
    torch.testing.assert_close(out_b[0], hf_logits(hf, b)[-1], atol=ATOL, rtol=0)

    for _ in range(2):
        a.append(int(out_a[-1].argmax()))
        b.append(int(out_b[-1].argmax()))
        out_a, out_b = run.step([(a[-1:], len(a) - 1, ta), (b[-1:], len(b) - 1, tb)])
        torch.testing.assert_close(out_a[0], hf_logits(hf, a)[-1], atol=ATOL, rtol=0)
        torch.testing.assert_close(out_b[0], hf_logits(hf, b)[-1], atol=ATOL, rtol=0)


def test_config_reads_v4_and_v5_rope_layouts():
    base = dict(
        vocab_size=10, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        max_position_embeddings=1024, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    v4 = ModelConfig.from_hf_config({**base, "rope_theta": 5e5, "rope_scaling": {"type": "llama3", **scaling}})
    v5 = ModelConfig.from_hf_config({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **scaling}})
    assert v4 == v5
    assert v4.rope_theta == 5e5 and v4.rope_scaling["rope_type"] == "llama3"
    assert v4.head_dim == 16 and v4.num_key_value_heads == 4  # derived when absent
    plain = rope_inv_freq(ModelConfig.from_hf_config({**base, "rope_theta": 5e5}))
    scaled = rope_inv_freq(v4)
    assert torch.equal(scaled[0], plain[0]) and torch.allclose(scaled[-1], plain[-1] / 8)  # high kept, low slowed

    with pytest.raises(ValueError, match="unsupported rope_type 'yarn'"):
        rope_inv_freq(ModelConfig.from_hf_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))

    mistral = ModelConfig.from_hf_config({**base, "architectures": ["MistralForCausalLM"], "sliding_window": 256})
    assert mistral.max_position_embeddings == 256  # no sliding window kernel: capped at the window
    qwen2 = ModelConfig.from_hf_config({**base, "architectures": ["Qwen2ForCausalLM"], "eos_token_id": [5, 6]})
    assert qwen2.attention_bias and not qwen2.o_proj_bias and qwen2.eos_token_ids == [5, 6]


def test_sharded_checkpoint_is_really_sharded(hf_checkpoint_factory):
    folder = hf_checkpoint_factory("llama-sharded")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1


# ---- loader errors ------------------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_unknown_model_names_presets(tmp_path):
    with pytest.raises(ModelLoadError, match=r"not a preset \(tiny, small"):
        load_model("no-such-model", CPU, torch.float32)


def test_missing_config(tmp_path):
    with pytest.raises(ModelLoadError, match="missing config.json"):
        load_model(str(tmp_path), CPU, torch.float32)


def test_unsupported_architecture_lists_supported(hf_checkpoint, tmp_path):
    folder = _copy(hf_checkpoint, tmp_path / "ckpt")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'GPT2LMHeadModel'.*Qwen3ForCausalLM"):
        load_model(str(folder), CPU, torch.float32)


def test_missing_tokenizer(hf_checkpoint, tmp_path):
    folder = _copy(hf_checkpoint, tmp_path / "ckpt")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="missing tokenizer.json"):
        load_model(str(folder), CPU, torch.float32)


def test_missing_weights_file(hf_checkpoint, hf_checkpoint_factory, tmp_path):
    folder = _copy(hf_checkpoint, tmp_path / "ckpt")
    for f in folder.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match="missing weights file"):
        load_model(str(folder), CPU, torch.float32)
    sharded = _copy(hf_checkpoint_factory("llama-sharded"), tmp_path / "sharded")
    victim = sorted(sharded.glob("*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(ModelLoadError, match=f"missing weights file.*{victim.name}"):
        load_model(str(sharded), CPU, torch.float32)


def test_missing_tensor_is_named(hf_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(hf_checkpoint, tmp_path / "ckpt")
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing tensor.*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(str(folder), CPU, torch.float32)


def test_dtype_conversion(hf_checkpoint):
    model, _, _ = load_model(str(hf_checkpoint), CPU, torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


# ---- presets ------------------------------------------------------------------------------------------


def _greedy(model, cfg, prompt: list[int], n: int) -> list[int]:
    run = PagedRunner(model, cfg, num_blocks=(len(prompt) + n) // BLOCK + 2)
    table = list(range(len(run.kv[0][0])))
    (logits,) = run.step([(prompt, 0, table)])
    out = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        (logits,) = run.step([(out[-1:], len(prompt) + len(out) - 1, table)])
    return out


def test_tiny_preset_is_seeded_and_not_degenerate():
    model, cfg, tok = load_model("tiny", CPU, torch.float32, seed=0)
    assert cfg.vocab_size == tok.vocab_size and cfg.max_position_embeddings >= 4096
    again, _, _ = load_model("tiny", CPU, torch.float32, seed=0)
    other, _, _ = load_model("tiny", CPU, torch.float32, seed=1)
    w = model.model.layers[0].self_attn.qkv_proj.weight
    assert torch.equal(w, again.model.layers[0].self_attn.qkv_proj.weight)
    assert not torch.equal(w, other.model.layers[0].self_attn.qkv_proj.weight)

    prompt = tok.encode("The quick brown fox jumps over the lazy dog.")
    out = _greedy(model, cfg, prompt, 32)
    assert len(set(out)) >= 8, out  # greedy text varies rather than repeating one token
    assert not set(out) & {tok.bos_token_id, *tok.eos_token_ids}  # specials have zero logits
    assert out != _greedy(model, cfg, tok.encode("Something else entirely"), 32)


# ---- tokenizers ---------------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip_and_invalid_utf8():
    tok = ByteTokenizer()
    ids = tok.encode("héllo ✓")
    assert ids[0] == tok.bos_token_id and tok.decode(ids) == "héllo ✓"
    assert tok.encode("ab", add_special_tokens=False) == [97, 98]
    assert tok.decode([104, 0xE2, 0x9C]) == "h\ufffd"  # a cut multi-byte character
    assert tok.decode([256, 104, 257], skip_special_tokens=False) == "<|bos|>h<|eos|>"


def test_hf_tokenizer_reads_folder(hf_checkpoint, tmp_path):
    tok = HFTokenizer(hf_checkpoint)
    text = "Hello world, the quick brown fox! 123 {x}"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id == 0  # tokenizer.json's post-processor adds <s>
    assert tok.decode(ids) == text
    assert tok.encode(text, add_special_tokens=False) == ids[1:]
    assert tok.eos_token_ids == [1] and "messages" in tok.chat_template
    assert tok.vocab_size == 300

    # Explicit add_bos_token=False wins over the post-processor; generation_config eos ids come first.
    folder = _copy(hf_checkpoint, tmp_path / "ckpt")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": False}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 1]}))
    tok = HFTokenizer(folder)
    assert tok.encode(text)[0] != 0 and tok.eos_token_ids == [7, 1]


def test_make_hf_checkpoint_is_reproducible(tmp_path):
    from safetensors.torch import load_file

    a = load_file(make_hf_checkpoint(tmp_path / "a", "qwen2") / "model.safetensors")
    b = load_file(make_hf_checkpoint(tmp_path / "b", "qwen2") / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "model.layers.0.self_attn.q_proj.bias" in a


def test_attention_backend_choice():
    from engine.model.attention import paged_attention
    from engine.model.loader import choose_attention_fn

    assert choose_attention_fn(CPU) is paged_attention
    assert choose_attention_fn(CPU, use_triton=False) is paged_attention
    model, _, _ = load_model("tiny", CPU, torch.float32, use_triton=False)
    assert model.attention_fn is paged_attention


def test_loader_stops_on_config_eos_ids_too(hf_checkpoint_factory):
    folder = hf_checkpoint_factory("llama", eos_token_id=[1, 5])
    _, cfg, tok = load_model(str(folder), CPU, torch.float32)
    assert cfg.eos_token_ids == [1, 5] and tok.eos_token_ids == [1, 5]
