"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) in plain torch, reading K/V through a paged cache.

One forward runs a flattened batch: every sequence's new tokens concatenated, prefill chunks and decodes
mixed. Projections are fused (qkv, gate+up) so a layer is four matmuls; `hf_weight_map` says which slice
of which fused parameter each Hugging Face tensor fills, so checkpoints load unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.attention import AttentionMetadata, paged_attention, write_kv
from engine.model.model_config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, float], torch.Tensor]


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse RoPE frequencies [head_dim / 2], float32, with transformers' formulas for each rope_type."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_type {rope_type!r} (supported: default, linear, llama3)")


class RotaryEmbedding:
    """cos/sin for arbitrary positions, computed per forward (cheap next to the matmuls, no length cap).

    Not an nn.Module buffer on purpose: casting the model to bfloat16 must not round the frequencies.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        self.inv_freq = rope_inv_freq(cfg)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        return freqs.cos().to(dtype)[:, None, :], freqs.sin().to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [T, H, D] by half-split pairs (HF's rotate_half convention, not interleaved)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 and scale in the input dtype, exactly like transformers.
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        kv_cache: KVCache,
        attention_fn: AttentionFn,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        k_cache, v_cache = kv_cache
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        out = attention_fn(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, meta, kv_cache, attention_fn) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, meta, kv_cache, attention_fn)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """The `model.` prefix of HF checkpoints: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, attention_fn: AttentionFn | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg)
        # Swappable so the runner can choose the Triton kernel on CUDA; the torch reference otherwise.
        self.attention_fn: AttentionFn = attention_fn or paged_attention

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm for the flattened batch's new tokens."""
        x = self.model.embed_tokens(input_ids)
        rope = self.rotary(positions, x.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, rope, meta, kv_cache, self.attention_fn)
        return self.model.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, vocab]; the caller picks the rows it samples from (last token per sequence)."""
        return self.lm_head(hidden).float()

    def hf_weight_map(self) -> dict[str, tuple[str, int, int]]:
        """HF tensor name -> (our parameter name, row offset, rows) for every tensor the model needs.

        Unfused tensors map to their whole parameter (offset 0, rows = its first dimension).
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        cfg = self.cfg
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        inter = cfg.intermediate_size
        fused = {
            "self_attn.qkv_proj": [("self_attn.q_proj", 0, q), ("self_attn.k_proj", q, kv),
                                   ("self_attn.v_proj", q + kv, kv)],
            "mlp.gate_up_proj": [("mlp.gate_proj", 0, inter), ("mlp.up_proj", inter, inter)],
        }  # fmt: skip
        mapping: dict[str, tuple[str, int, int]] = {}
        for name, param in params.items():
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue  # shares embed_tokens; tied checkpoints carry no lm_head tensor
            for ours, parts in fused.items():
                if f".{ours}." in name:
                    for theirs, offset, rows in parts:
                        mapping[name.replace(ours, theirs)] = (name, offset, rows)
                    break
            else:
                mapping[name] = (name, 0, param.shape[0])
        return mapping


def allocate_kv_cache(
    cfg: ModelConfig, num_blocks: int, block_size: int, device: torch.device, dtype: torch.dtype
) -> list[KVCache]:
    """Per layer (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim], zeroed."""
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    return [
        (torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
        for _ in range(cfg.num_hidden_layers)
    ]

