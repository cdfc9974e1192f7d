"""The target's own tokenizer, through its ``/tokenize`` and ``/detokenize`` endpoints (vLLM, SGLang), for
text prompts of an exact token length when no local tokenizer folder is given (``--tokenizer DIR``).

Blocking calls, made while the workload is prepared, never during a run; each distinct text is asked
once (prompt building re-encodes the same pieces many times).
"""

from __future__ import annotations

import functools
import json
import urllib.error
import urllib.request

from loadgen.target.discovery import TargetError


class ServerTokenizer:
    """``workload.tokenizer``'s interface over HTTP."""

    def __init__(self, target: str, model: str, timeout_s: float = 30.0, headers: dict[str, str] | None = None):
        self.target, self.model, self.timeout_s = target.rstrip("/"), model, timeout_s
        self.headers = dict(headers or {})
        self.name = f"{self.target}/tokenize ({model})"
        self._encode = functools.lru_cache(maxsize=65536)(self._encode_uncached)

    def _post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.target + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:  # noqa: S310 (the user's target)
                return json.loads(r.read())
        except (OSError, ValueError) as e:
            raise TargetError(f"POST {self.target}{path} failed: {type(e).__name__}: {e}") from e

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        obj = self._post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
        tokens = obj.get("tokens")
        if not isinstance(tokens, list):
            raise TargetError(f"POST {self.target}/tokenize returned no token list")
        return tuple(int(t) for t in tokens)

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, ids: list[int]) -> str:
        obj = self._post("/detokenize", {"model": self.model, "tokens": list(ids)})
        text = obj.get("prompt")
        if not isinstance(text, str):
            raise TargetError(f"POST {self.target}/detokenize returned no text")
        return text
