"""Build a model and its tokenizer from a preset name (random weights) or a local HF checkpoint folder."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.model.model import AttentionFn, CausalLM, rope_inv_freq
from engine.model.model_config import ARCH_BY_MODEL_TYPE, PRESETS, ModelConfig
from engine.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class ModelLoadError(ValueError):
    pass


def load_model(
    model: str,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    use_triton: bool | None = None,
) -> tuple[CausalLM, ModelConfig, Tokenizer]:
    """Return (model in eval mode on device/dtype, its config, its tokenizer).

    use_triton None (EngineConfig's default) picks the Triton kernel on CUDA when triton imports and the
    torch reference otherwise; True insists on it; False always uses the torch reference.
    """
    device = torch.device(device)
    attention_fn = choose_attention_fn(device, use_triton)
    if model in PRESETS:
        cfg = dataclasses.replace(PRESETS[model], eos_token_ids=list(PRESETS[model].eos_token_ids))
        lm = CausalLM(cfg, attention_fn)
        init_random_weights(lm, seed)
        return lm.to(device=device, dtype=dtype).eval(), cfg, ByteTokenizer()

    folder = Path(model).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(
            f"unknown model {model!r}: not a preset ({', '.join(PRESETS)}) and not a local checkpoint folder"
        )
    cfg = read_hf_config(folder)
    tokenizer = _hf_tokenizer(folder, cfg)
    files = weight_files(folder)

    with torch.device("meta"):
        lm = CausalLM(cfg, attention_fn)
    lm = lm.to(dtype).to_empty(device=device)  # cast while still on meta: no full-size float32 copy
    if cfg.tie_word_embeddings:  # to_empty re-creates parameters, which unties them
        lm.lm_head.weight = lm.model.embed_tokens.weight
    load_weights(lm, files)
    return lm.eval(), cfg, tokenizer


def _hf_tokenizer(folder: Path, cfg: ModelConfig) -> Tokenizer:
    if not (folder / "tokenizer.json").is_file():
        raise ModelLoadError(f"{folder}: missing tokenizer.json (only fast `tokenizers` files are supported)")
    tokenizer = HFTokenizer(folder)
    # transformers stops on config.json's eos ids too when generation_config.json does not list them.
    tokenizer.eos_token_ids += [t for t in cfg.eos_token_ids if t not in tokenizer.eos_token_ids]
    return tokenizer


def load_tokenizer(model: str) -> tuple[ModelConfig, Tokenizer]:
    """The model's config and tokenizer without its weights (the HTTP front end of an engine-core process)."""
    if model in PRESETS:
        return PRESETS[model], ByteTokenizer()
    folder = Path(model).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(
            f"unknown model {model!r}: not a preset ({', '.join(PRESETS)}) and not a local checkpoint folder"
        )
    cfg = read_hf_config(folder)
    return cfg, _hf_tokenizer(folder, cfg)


def choose_attention_fn(device: torch.device, use_triton: bool | None = None) -> AttentionFn:
    from engine.model.attention import paged_attention

    if use_triton is False or (use_triton is None and device.type != "cuda"):
        return paged_attention
    try:  # imported only here: CPU installs never need triton
        from engine.model.triton_attention import triton_paged_attention
    except ImportError as e:
        if use_triton:
            raise ModelLoadError(f"use_triton=True but triton is not importable: {e}") from e
        return paged_attention  # the torch reference still runs on CUDA, just slower
    if device.type != "cuda" and not os.environ.get("TRITON_INTERPRET"):
        raise ModelLoadError("the Triton kernel needs a CUDA device (or TRITON_INTERPRET=1 on CPU)")
    return triton_paged_attention


def read_hf_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder}: missing config.json (is this a Hugging Face checkpoint folder?)")
    raw = json.loads(path.read_text())
    # `architectures` decides; model_type only stands in when it is absent (some hand-written configs).
    archs = raw.get("architectures") or [ARCH_BY_MODEL_TYPE.get(raw.get("model_type", ""), raw.get("model_type"))]
    if archs[0] not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{folder}: unsupported architecture {archs[0]!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if raw.get("hidden_act", "silu") != "silu" or raw.get("mlp_bias"):
        raise ModelLoadError(f"{folder}: only SwiGLU MLPs without bias are supported")
    try:
        cfg = ModelConfig.from_hf_config(raw)
        rope_inv_freq(cfg)  # validates rope_type
    except (KeyError, ValueError) as e:
        raise ModelLoadError(f"{folder}: bad config.json: {e}") from e
    # Old configs may omit tie_word_embeddings; the weights then tell (no lm_head tensor means tied).
    if "tie_word_embeddings" not in raw:
        try:
            names = {n for f in weight_files(folder) for n in _tensor_names(f)}
            cfg.tie_word_embeddings = "lm_head.weight" not in names
        except ModelLoadError:
            pass  # reported again, with context, when the weights load
    return cfg


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ModelLoadError(f"{folder}: missing weights file(s) {', '.join(missing)} named in {index.name}")
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        extra = " (.bin/.pt weights are not supported; convert to safetensors)" if any(folder.glob("*.bin")) else ""
        raise ModelLoadError(f"{folder}: missing weights file: no *.safetensors found{extra}")
    return files


def _tensor_names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


def _tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open handles are not iterable
                yield name, f.get_tensor(name)


@torch.no_grad()
def load_weights(lm: CausalLM, files: list[Path]) -> None:
    """Copy checkpoint tensors into the (possibly fused) parameters, converting dtype and device."""
    mapping = lm.hf_weight_map()
    params = dict(lm.named_parameters())
    seen: set[str] = set()
    for name, tensor in _tensors(files):
        if name not in mapping:
            if not name.endswith("rotary_emb.inv_freq") and not (
                name == "lm_head.weight" and lm.cfg.tie_word_embeddings
            ):
                log.warning("ignoring checkpoint tensor %s", name)
            continue
        ours, offset, rows = mapping[name]
        target = params[ours].narrow(0, offset, rows)
        if target.shape != tensor.shape:
            raise ModelLoadError(
                f"tensor {name}: checkpoint shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(tensor)
        seen.add(name)
    missing = sorted(set(mapping) - seen)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(f"missing tensor(s) in checkpoint: {shown}")


@torch.no_grad()
def init_random_weights(lm: CausalLM, seed: int) -> None:
    """Seeded random weights that still produce varied text.

    Embeddings ~N(0, 1) and linear weights ~N(0, 1.25/sqrt(fan_in)): with the usual 0.02 a random model
    attends almost uniformly and greedy decoding falls into a 1-3 token loop at once. The unembedding is
    scaled so logits have std ~3 (a peaked next-token distribution, like a trained model, rather than
    near-uniform noise). Special tokens get zero logits, so under any sampling they practically never
    appear (p ~ 4e-5 per token): requests end at max_tokens, as traces specify.
    """
    gen = torch.Generator().manual_seed(seed)
    cfg = lm.cfg
    for name, p in lm.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        elif name == "model.embed_tokens.weight":
            p.normal_(0.0, 1.0, generator=gen)
        elif name == "lm_head.weight":
            p.normal_(0.0, 3.0 / math.sqrt(cfg.hidden_size), generator=gen)
        else:  # [out, in]: std 1.25/sqrt(in) keeps activations O(1) and attention context-dependent
            p.normal_(0.0, 1.25 / math.sqrt(p.shape[1]), generator=gen)
    specials = [t for t in [cfg.bos_token_id, *cfg.eos_token_ids] if t is not None]
    if not cfg.tie_word_embeddings:
        lm.lm_head.weight[specials] = 0.0
