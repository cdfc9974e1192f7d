"""`transformers serve` as a test target: a strict, third-party OpenAI-compatible server.

`make_serve_checkpoint(dir)` writes a tiny random-weight Llama with a real byte-level BPE tokenizer trained
here (nothing is downloaded); `TransformersServe(dir)` runs `transformers serve DIR --continuous-batching
--device cpu` on a free loopback port, waits until its model answers, and stops it (SIGTERM, then kill).
The fixtures in tests/conftest.py wrap both.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from loadgen.target.embedded import free_port, wait_healthy
from tests.helpers import post_json

# Simple enough for any template engine, and its overhead is easy to count: "<s>user: hi</s>assistant: ".
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
BOS, EOS = "<s>", "</s>"
# Without these, continuous batching sizes its KV cache from free memory: ~7 GB on CPU, ~18 s to allocate at
# the first request. 64 pages of 256 tokens (16k tokens, 8 MB here) is plenty for a test.
CB_SIZE = ("--cb-num-blocks", "64", "--cb-max-batch-tokens", "512")
_TEXT = ("the a one every small quick brown lazy red old new fox dog cat bird server client request token "
         "model batch queue cache prompt answer jumps runs waits sends reads writes over under near with "
         "and but then fast slow late early today hello world test load latency")


def sentences(n: int = 2000, seed: int = 0) -> list[str]:
    """Seeded word salad with digits and punctuation: enough variety for a few hundred BPE merges."""
    rng, vocab = random.Random(seed), _TEXT.split()
    out = []
    for _ in range(n):
        words = [rng.choice(vocab) for _ in range(rng.randint(3, 12))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        out.append(" ".join(words).capitalize() + rng.choice(".!?,;:"))
    return out


def train_tokenizer(vocab_size: int = 512):
    """A byte-level BPE (any text round-trips) whose plain encodes start with <s>, like Llama's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sentences(), trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    return tok


def make_serve_checkpoint(path: str | Path, seed: int = 0, eos_reachable: bool = False) -> Path:
    """Write the checkpoint `transformers serve` loads: config, safetensors weights, generation config, and a
    PreTrainedTokenizerFast (tokenizer.json, tokenizer_config.json with the chat template).

    With `eos_reachable=False` the lm_head row of EOS is zero, so its logit is 0 while the argmax of ~500
    random logits is positive: greedy decoding never stops early and every answer is exactly max_tokens long,
    which is what a load test needs. With True the weights are left as drawn (a stop is then chance).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(), bos_token=BOS, eos_token=EOS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    if not eos_reachable:
        with torch.no_grad():
            model.lm_head.weight[fast.eos_token_id].zero_()
    model.save_pretrained(path)
    return path


class TransformersServe:
    """`transformers serve` on a free loopback port, pinned to one local checkpoint; `url`, `model`."""

    def __init__(self, checkpoint: Path, log: Path, timeout_s: float = 120, threads: int = 1) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = str(checkpoint)  # a pinned server lists, and accepts, the name it was started with
        cli = Path(sys.executable).with_name("transformers")  # the venv's, not whichever is first on PATH
        if not cli.exists():
            cli = Path(shutil.which("transformers") or cli)
        # 1 thread: the model is tiny and other tests share the 2 cores; offline: a local path needs no hub.
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        self.log = log
        self._log_file = open(log, "wb")  # noqa: SIM115 (open for the server's lifetime)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(cli), "serve", self.model, "--continuous-batching", "--device", "cpu", "--dtype", "float32",
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning", *CB_SIZE],
            env=env, stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # /health is served only after the pinned model loaded (it is loaded before uvicorn starts).
            wait_healthy(self.url, self.proc, timeout_s, log)
            self.load_s = time.monotonic() - t0
            # The continuous-batching manager starts on the first request and keeps that request's sampling
            # settings for all later ones; a plain greedy warm-up makes that state known before any test.
            status, body = post_json(self.url + "/v1/completions",
                                     {"model": self.model, "prompt": "Hello", "max_tokens": 1}, timeout_s)
            if status != 200:
                raise RuntimeError(f"warm-up request failed: HTTP {status} {body[:300]!r}")
            self.start_s = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def stop(self, grace_s: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the process and nothing else
                self.proc.wait(5)
        self._log_file.close()
