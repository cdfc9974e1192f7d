"""The tokenizer text prompts are measured with: a small protocol (``encode``, ``decode``, ``name``), its
local implementation, a Hugging Face tokenizer folder (``DIR/tokenizer.json``) read by ``tokenizers``, and
a stand-in counting one token per word for a target whose tokenizer is unknown.

``target.tokenize`` implements the same protocol over a server's ``/tokenize`` endpoint. Both count a
text's own tokens: no special tokens (BOS) are added, because a server adds those itself and they count
as overhead, like a chat template's (``text_prompts.to_text``'s ``overhead_tokens``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import tokenizers


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or cannot make text prompts (one line, for the CLI)."""


class Tokenizer(Protocol):
    name: str  # for messages: the folder, or the server and model

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``, without special tokens."""
        ...

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``."""
        ...


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` behind the protocol (a folder's ``tokenizer.json``, or one built in memory)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, name: str = "tokenizer"):
        self._tok = tokenizer
        self.name = name

    @classmethod
    def from_dir(cls, path: str | Path) -> HFTokenizer:
        """``path/tokenizer.json`` (or ``path`` itself when it is that file)."""
        import tokenizers  # lazy: the workload package is imported by every command, most never tokenize

        p = Path(path)
        file = p if p.is_file() else p / "tokenizer.json"
        if not file.is_file():
            if not p.exists():
                raise TokenizerError(f"{p}: no such folder, and no model of that id in the local Hugging Face "
                                     "cache (slobench never downloads one: give a folder with tokenizer.json)")
            raise TokenizerError(f"{p}: no tokenizer.json there (a Hugging Face tokenizer folder has one)")
        try:
            tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TokenizerError(f"{file}: not a tokenizer.json that tokenizers can read ({first})") from e
        return cls(tok, name=file.resolve().parent.name or str(file.parent))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(path: str | Path) -> HFTokenizer:
    """The tokenizer of a Hugging Face tokenizer folder, or of a model id (``org/name``) already in the local
    Hugging Face cache (never downloaded); ``TokenizerError`` naming the path otherwise."""
    folder = Path(path).expanduser()
    if not folder.exists() and (cached := cached_tokenizer_dir(str(path))) is not None:
        folder = cached
    return HFTokenizer.from_dir(folder)


def cached_tokenizer_dir(model_id: str) -> Path | None:
    """The newest snapshot folder holding ``tokenizer.json`` of ``model_id`` in the local Hugging Face hub
    cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), or None."""
    if model_id.count("/") != 1:
        return None
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", hf_home / "hub")).expanduser()
    snapshots = hub / f"models--{model_id.replace('/', '--')}" / "snapshots"
    found = sorted((p.parent for p in snapshots.glob("*/tokenizer.json")), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


class WordTokenizer:
    """One token per whitespace-separated word: the stand-in when the target's tokenizer is unknown. Real
    tokenizers count most common English words as one token (with a leading space) and longer ones as
    several, so lengths made with it are approximate; the server's usage counts say by how much."""

    name = "words (approximate: one token per word)"

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._words: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for w in text.split():
            if w not in self._ids:
                self._ids[w] = len(self._words)
                self._words.append(w)
            out.append(self._ids[w])
        return out

    def decode(self, ids: list[int]) -> str:
        return " ".join(self._words[i] for i in ids)
