"""A model's shape as plain data, importable without torch: ``ModelConfig`` (read from a Hugging Face
config.json), the architectures by ``model_type``, and the random-weight presets. ``slobench plan`` sizes a
model from these alone, so the client plans without the engine extra installed."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.model.tokenizer import ByteTokenizer


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # HF dict with "rope_type" ("linear" | "llama3"); None: plain RoPE
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (Qwen2 always; Llama/Qwen3 when attention_bias is set)
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    architecture: str = "LlamaForCausalLM"
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    o_proj_bias: bool = False  # Llama/Qwen3's attention_bias also covers o_proj; Qwen2's does not

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelConfig:
        """Read a Hugging Face config.json (transformers v4 `rope_scaling` or v5 `rope_parameters`)."""
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else ARCH_BY_MODEL_TYPE.get(cfg.get("model_type", ""), "")
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads

        # v5 nests theta and scaling in rope_parameters; v4 has top-level rope_theta + rope_scaling.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_scaling = None
        if rope_type != "default":
            rope_scaling = {**rope, "rope_type": rope_type}
            rope_scaling.pop("type", None)
            if rope_type == "llama3":
                rope_scaling.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])

        max_pos = cfg.get("max_position_embeddings", 4096)
        # Sliding-window attention is not implemented: within the window it equals full attention, so we
        # cap the usable length at the window instead of silently computing something else past it.
        window = cfg.get("sliding_window")
        if window and cfg.get("use_sliding_window", arch == "MistralForCausalLM") and window < max_pos:
            max_pos = window

        eos = cfg.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        is_qwen2 = arch == "Qwen2ForCausalLM"
        bias = bool(cfg.get("attention_bias", False))
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=is_qwen2 or bias,
            qk_norm=arch == "Qwen3ForCausalLM",
            architecture=arch,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            o_proj_bias=bias and not is_qwen2,
        )


ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _byte_preset(**sizes) -> ModelConfig:
    tok = ByteTokenizer()
    return ModelConfig(
        vocab_size=tok.vocab_size,
        rope_theta=500000.0,
        max_position_embeddings=8192,  # traces carry long prompts
        architecture="LlamaForCausalLM",
        bos_token_id=tok.bos_token_id,
        eos_token_ids=list(tok.eos_token_ids),
        **sizes,
    )


# Random-weight presets so the suite runs with nothing downloaded. `tiny` is sized so a 512-token prefill
# takes ~0.1 s on one core of a 2-core CI box, which keeps scheduling effects visible at small loads.
PRESETS: dict[str, ModelConfig] = {
    "tiny": _byte_preset(
        hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32,
    ),
    "small": _byte_preset(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, head_dim=64,
    ),
}  # fmt: skip
