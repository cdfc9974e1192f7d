"""Shared fixtures: small random-weight Hugging Face checkpoints built on the fly (nothing is downloaded).

`make_hf_checkpoint(path, arch, **overrides)` writes one; the session-scoped `hf_checkpoint` fixture
returns a cached folder for a variant name, either through indirect parametrization
(`@pytest.mark.parametrize("hf_checkpoint", ["qwen3"], indirect=True)`) or "llama" by default.

Targets: `mock_server` starts `slobench mock-server`s for a test; `embedded_engine` is the reference engine in a
process of its own, shared by a module. Strict targets (tests/loadgen/target/test_strict_targets.py):
`transformers_serve`, a real `transformers serve` on a tiny Llama (`serve_checkpoint`, see tests/transformers_serve.py),
and `strict_mock`, `slobench mock-server --strict`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Variant name -> (transformers config class name, config overrides, save options). Sizes are shared.
HF_VARIANTS: dict[str, tuple[str, dict, dict]] = {
    "llama": ("LlamaConfig", {}, {}),
    "llama-linear": ("LlamaConfig", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, {}),
    # original_max_position_embeddings is small so head_dim 16's wavelengths fall in all three bands.
    "llama-llama3": (
        "LlamaConfig",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
        {},
    ),  # fmt: skip
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True}, {}),
    "llama-sharded": ("LlamaConfig", {}, {"max_shard_size": "40KB"}),
    "mistral": ("MistralConfig", {"sliding_window": None}, {}),
    "qwen2": ("Qwen2Config", {}, {}),
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True}, {}),
}

SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    # Large enough that attention is far from uniform: a wrong rotation or mask moves the logits by far
    # more than the 1e-4 tolerance (HF's default 0.02 would hide small errors).
    initializer_range=0.15,
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. ",
    "Hello world, this is a small test of the paged attention engine! ",
    "user assistant system: 0123456789 <> {} [] ()",
] * 8
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def _build_tokenizer():
    """Byte-level BPE over a tiny corpus: ~300 ids, round-trips any ASCII text, specials <s> and </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    # Like Llama 3's tokenizer.json: the post-processor adds <s> to plain encodes.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tok


def make_hf_checkpoint(path: str | Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    """Write a float32 random-weight checkpoint of variant `arch` (see HF_VARIANTS) into `path`.

    Norm weights and biases are randomized too (HF initializes them to 1 and 0), so a norm or bias that
    is loaded into the wrong place changes the output.
    """
    import torch
    import transformers

    cls_name, variant, save_opts = HF_VARIANTS[arch]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = _build_tokenizer()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE})
    )

    cfg_kwargs = {**SIZES, "vocab_size": tok.get_vocab_size() + 4, "bos_token_id": 0, "eos_token_id": 1}
    cfg_kwargs.update(variant)
    cfg_kwargs.update(overrides)
    config = getattr(transformers, cls_name)(**cfg_kwargs)
    config.architectures = [cls_name.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(path, **save_opts)
    return path


@pytest.fixture(scope="session")
def hf_checkpoint_factory(tmp_path_factory):
    """Callable (arch="llama", **overrides) -> folder; each distinct checkpoint is built once a session."""
    cache: dict[tuple, Path] = {}

    def get(arch: str = "llama", **overrides) -> Path:
        key = (arch, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in cache:
            cache[key] = make_hf_checkpoint(tmp_path_factory.mktemp(f"hf-{arch}"), arch, **overrides)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def hf_checkpoint(request, hf_checkpoint_factory) -> Path:
    """Folder of a small HF checkpoint: the variant given by indirect parametrization, else "llama"."""
    return hf_checkpoint_factory(getattr(request, "param", "llama"))


@pytest.fixture
def mock_server():
    """Start `slobench mock-server` targets: `url = mock_server("--ttft-ms", 20)`; `.last` is the process."""
    from tests.helpers import MockServers

    servers = MockServers()
    yield servers
    servers.stop_all()


@pytest.fixture(scope="module")
def embedded_engine(request, tmp_path_factory) -> str:
    """URL of the reference engine served by a process of its own (`EmbeddedEngine`), shared by the module: the
    `tiny` preset with the settings given by indirect parametrization
    (`@pytest.mark.parametrize("embedded_engine", [{"max_num_seqs": 2}], indirect=True)`), else as it is."""
    pytest.importorskip("torch")
    from loadgen.target.embedded import EmbeddedEngine

    config = {"model": "tiny", **getattr(request, "param", {})}
    with EmbeddedEngine(config, log_path=tmp_path_factory.mktemp("engine") / "engine.log") as url:
        yield url


@pytest.fixture(scope="session")
def serve_checkpoint(tmp_path_factory) -> Path:
    """Folder of the tiny Llama that `transformers_serve` serves (its tokenizer counts what the server counts)."""
    from tests.transformers_serve import make_serve_checkpoint

    return make_serve_checkpoint(tmp_path_factory.mktemp("serve-llama"))


@pytest.fixture(scope="session")
def transformers_serve(serve_checkpoint, tmp_path_factory):
    """A running `transformers serve --continuous-batching --device cpu` on `serve_checkpoint`, shared by the
    session: `.url`, `.model` (the id it lists and accepts), `.log`, `.start_s`. Mark tests that use it slow.
    Skipped where transformers' serving extra (fastapi, uvicorn) is not installed."""
    pytest.importorskip("fastapi", reason="transformers serve needs `pip install 'transformers[serving]'`")
    pytest.importorskip("uvicorn", reason="transformers serve needs `pip install 'transformers[serving]'`")
    from tests.transformers_serve import TransformersServe

    server = TransformersServe(serve_checkpoint, tmp_path_factory.mktemp("serve-log") / "transformers-serve.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def strict_mock():
    """URL of `slobench mock-server --strict` (model "mock", ttft 5 ms, itl 1 ms), shared by the session."""
    from tests.helpers import MockServers

    servers = MockServers()
    yield servers("--strict", "--ttft-ms", 5, "--itl-ms", 1)
    servers.stop_all()
