"""The sizes of a decoder-only transformer that planning needs: parameters, KV per token, FLOPs per token.

A shape comes from the engine's own model config (a preset, or a checkpoint's ``config.json`` read by the
engine's reader: ``commands/plan.py`` does that, as loadgen reaches the engine only from its commands), any
object with the same attribute names, or explicit sizes (``layers=32,hidden=4096,...``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "fp8": 1, "int8": 1}

# explicit-size keys and the ModelShape field each sets
SIZE_KEYS = {"layers": "layers", "hidden": "hidden", "heads": "heads", "kv_heads": "kv_heads",
             "head_dim": "head_dim", "intermediate": "intermediate", "vocab": "vocab", "tied": "tied"}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False  # input and output embeddings are one matrix
    dtype_bytes: int = 2  # weights and KV cache
    name: str = "model"

    def __post_init__(self) -> None:
        for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "dtype_bytes"):
            if getattr(self, k) < 1:
                raise ValueError(f"model size {k} must be >= 1, got {getattr(self, k)}")

    @property
    def params_per_layer(self) -> int:
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate  # SwiGLU: gate, up, down
        return q_o + k_v + mlp + 2 * self.hidden  # two RMSNorms

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.params_per_layer + embeddings + self.hidden  # the final norm

    @property
    def weights_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def matmul_flops_per_token(self) -> int:
        """2 FLOPs per weight a token passes through (the input embedding is a lookup, not a matmul)."""
        per_layer = self.params_per_layer - 2 * self.hidden  # norms are not matmuls
        return 2 * (self.layers * per_layer + self.vocab * self.hidden)  # + the output projection

    @property
    def attention_flops_per_pair(self) -> int:
        """QK^T and PV for one query token against one cached token, every layer and head."""
        return 4 * self.layers * self.heads * self.head_dim

    def as_dict(self) -> dict:
        return asdict(self) | {"params": self.params, "weights_bytes": self.weights_bytes,
                               "kv_bytes_per_token": self.kv_bytes_per_token}


def from_config(cfg, dtype_bytes: int = 2, name: str = "model") -> ModelShape:
    """From the engine's ``ModelConfig`` (or anything with its attribute names)."""
    return ModelShape(layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, heads=cfg.num_attention_heads,
                      kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, intermediate=cfg.intermediate_size,
                      vocab=cfg.vocab_size, tied=bool(cfg.tie_word_embeddings), dtype_bytes=dtype_bytes, name=name)


def from_sizes(text: str, dtype_bytes: int = 2) -> ModelShape:
    """``layers=32,hidden=4096,heads=32,kv_heads=8,intermediate=14336,vocab=128256`` (head_dim defaults to
    hidden / heads, kv_heads to heads, tied to false); ValueError naming what is wrong."""
    given: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in SIZE_KEYS:
            raise ValueError(f"model size {part!r}: expected KEY=VALUE with KEY one of {', '.join(SIZE_KEYS)}")
        given[key] = value
    missing = [k for k in ("layers", "hidden", "heads", "intermediate", "vocab") if k not in given]
    if missing:
        raise ValueError(f"model sizes lack {', '.join(missing)}")
    try:
        sizes = {k: int(v) for k, v in given.items() if k != "tied"}
    except ValueError:
        raise ValueError(f"model sizes must be integers: {text!r}") from None
    sizes.setdefault("kv_heads", sizes["heads"])
    sizes.setdefault("head_dim", sizes["hidden"] // sizes["heads"])
    tied = given.get("tied", "false").lower() in ("1", "true", "yes")
    return ModelShape(**sizes, tied=tied, dtype_bytes=dtype_bytes, name="explicit sizes")


def dtype_bytes_of(name: str) -> int:
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_BYTES)}") from None
