"""Tokenizers: bytes for the random-weight presets, Hugging Face `tokenizer.json` for real checkpoints."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int
    eos_token_ids: list[int]
    bos_token_id: int | None
    chat_template: str | None  # Jinja, rendered with `messages` and `add_generation_prompt`

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; add_special_tokens=False for text that already carries them (a rendered chat)."""
        ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def incomplete_tail(self, ids: list[int]) -> int | None:
        """How many trailing ids begin a character that later ids may still complete (0: none); None when the
        tokenizer cannot tell (then text ending in U+FFFD is held back whole)."""
        ...


# A plain-text chat format: the byte tokenizer has no special tokens worth putting in a prompt.
BYTE_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; specials follow (bos = 256, eos = 257)."""

    SPECIALS = ("<|bos|>", "<|eos|>")

    def __init__(self) -> None:
        self.bos_token_id: int | None = 256
        self.eos_token_ids: list[int] = [257]
        self.vocab_size = 256 + len(self.SPECIALS)
        self.chat_template: str | None = BYTE_CHAT_TEMPLATE

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out, pending = [], bytearray()
        for i in ids:
            if i < 256:
                pending.append(i)
                continue
            if skip_special_tokens or i >= self.vocab_size:
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            out.append(self.SPECIALS[i - 256])
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def incomplete_tail(self, ids: list[int]) -> int:
        """The trailing bytes that are the valid start of a character still missing bytes. An invalid byte is
        rendered U+FFFD for good whatever follows, so only these wait (a random-weight model emits such bytes
        often: holding the text before them too would add steps to its first token)."""
        tail = bytearray()
        for i in reversed(ids[-4:]):  # a UTF-8 character is at most 4 bytes
            if i >= 256:
                break
            tail.insert(0, i)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        decoder.decode(bytes(tail), final=False)
        return len(decoder.getstate()[0])  # one id per byte


class HFTokenizer:
    """`tokenizers` over a checkpoint folder's tokenizer.json, configured like transformers would.

    bos/eos and the chat template come from tokenizer_config.json (or chat_template.jinja); eos ids from
    generation_config.json come first because that is what the model was tuned to stop on.
    """

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        folder = Path(folder)
        self._tok = _Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg = _read_json(folder / "tokenizer_config.json")
        gen = _read_json(folder / "generation_config.json")
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)

        self.bos_token_id = self._token_id(cfg.get("bos_token"))
        if self.bos_token_id is None and isinstance(gen.get("bos_token_id"), int):
            self.bos_token_id = gen["bos_token_id"]
        eos: list[int] = []
        gen_eos = gen.get("eos_token_id")
        eos += [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        cfg_eos = self._token_id(cfg.get("eos_token"))
        if cfg_eos is not None and cfg_eos not in eos:
            eos.append(cfg_eos)
        self.eos_token_ids: list[int] = eos

        # With an explicit add_bos_token/add_eos_token (Llama 2 style) we add specials ourselves; otherwise
        # tokenizer.json's post-processor decides (Llama 3 adds bos, Qwen adds nothing).
        self._add_bos = cfg.get("add_bos_token")
        self._add_eos = cfg.get("add_eos_token")
        self.chat_template: str | None = _chat_template(cfg, folder)

    def _token_id(self, token: str | dict | None) -> int | None:
        if isinstance(token, dict):  # older configs serialise AddedToken as {"content": ...}
            token = token.get("content")
        return self._tok.token_to_id(token) if token else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not add_special_tokens:
            return self._tok.encode(text, add_special_tokens=False).ids
        if self._add_bos is None and self._add_eos is None:
            return self._tok.encode(text, add_special_tokens=True).ids
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if self._add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        if self._add_eos and self.eos_token_ids:
            ids = [*ids, self.eos_token_ids[0]]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def incomplete_tail(self, ids: list[int]) -> None:
        # Byte-level BPE renders a partial character as U+FFFD and cannot tell it from an invalid one, nor which
        # tokens it spans: the caller holds back text ending in U+FFFD whole, as vLLM's detokenizer does.
        return None


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _chat_template(cfg: dict, folder: Path) -> str | None:
    template = cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None and (folder / "chat_template.jinja").is_file():  # transformers >= 4.50 layout
        template = (folder / "chat_template.jinja").read_text()
    return template
