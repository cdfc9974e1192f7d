"""The sampling fields of a completions or chat body, each checked at its numerical edges (vLLM's ranges where
it has them): a value outside them is a 400 naming the field; what passes is safe for the sampler.

JSON as Python reads it allows NaN and ±Infinity (and integers of any size): every number is checked finite
and within its range, every integer within its own (`seed` within torch's, the counts within this server's
caps). `logprobs` and `top_logprobs` are not implemented here: a request that asks for them is a 400 naming
the field, as is a combination vLLM refuses (`top_logprobs` without `logprobs`, `min_tokens` above
`max_tokens`).
"""

from __future__ import annotations

from typing import Any

from engine.server.api_errors import invalid
from engine.server.api_fields import bool_field, float_field, int_field, token_id_list, unsupported, wrong_type

MAX_N = 32
MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 256  # characters in one stop string: the hold-back check runs on each token of each sequence
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # entries of logit_bias
MAX_TOP_LOGPROBS = 20  # vLLM's and OpenAI's
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # torch's seeds


def _ranged(body: dict, key: str, default: float, lo: float, hi: float | None, lo_open: bool = False) -> float:
    """A finite number in [lo, hi] ((lo, hi] when lo_open; no upper bound when hi is None)."""
    value = float_field(body, key, default)
    if (value <= lo if lo_open else value < lo) or (hi is not None and value > hi):
        left = "(" if lo_open else "["
        right = f"{hi:g}]" if hi is not None else "inf)"
        raise invalid(key, f"'{key}' must be in {left}{lo:g}, {right}, got {value!r}")
    return value


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list):
        raise wrong_type("stop", "a string or an array of strings", stop)
    if len(stop) > MAX_STOP:
        raise invalid("stop", f"'stop' takes at most {MAX_STOP} strings, got {len(stop)}")
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise wrong_type(f"stop[{i}]", "a string", s)
        if not s:
            raise invalid(f"stop[{i}]", "'stop' strings must not be empty")
        if len(s) > MAX_STOP_CHARS:
            raise invalid(f"stop[{i}]", f"'stop' strings take at most {MAX_STOP_CHARS} characters, got {len(s)}")
    return list(stop)


def _stop_token_ids(body: dict, vocab_size: int | None) -> list[int]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return []
    if not isinstance(ids, list):
        raise wrong_type("stop_token_ids", "an array of integers", ids)
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise invalid("stop_token_ids", f"'stop_token_ids' takes at most {MAX_STOP_TOKEN_IDS} ids, got {len(ids)}")
    return list(dict.fromkeys(token_id_list(ids, "stop_token_ids", vocab_size)))


def _logit_bias(body: dict, vocab_size: int | None) -> dict[int, float]:
    """OpenAI's `logit_bias`: token id (a string of digits, or an integer) -> a bias in [-100, 100]."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise wrong_type("logit_bias", "an object of token id: bias", bias)
    if len(bias) > MAX_LOGIT_BIAS:
        raise invalid("logit_bias", f"'logit_bias' takes at most {MAX_LOGIT_BIAS} tokens, got {len(bias)}")
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise invalid("logit_bias", f"'logit_bias' keys must be token ids, got {key!r}") from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise invalid("logit_bias", f"'logit_bias' holds token id {token}, outside the vocabulary "
                                        f"[0, {vocab_size})")
        out[token] = _ranged({"logit_bias": value}, "logit_bias", 0.0, -100.0, 100.0)
    return out


def check_unsupported(body: dict, chat: bool) -> None:
    """The fields this server does not implement, when they ask for something (a neutral value passes)."""
    if chat:
        logprobs = body.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise wrong_type("logprobs", "a boolean", logprobs)
        top = int_field(body, "top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
        if top is not None and not logprobs:
            raise invalid("top_logprobs", "'top_logprobs' is only allowed when 'logprobs' is true")
        if logprobs:
            raise unsupported("logprobs")
    else:
        if int_field(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS) is not None:
            raise unsupported("logprobs")


def sampling_fields(body: dict, vocab_size: int | None) -> dict[str, Any]:
    """The body's `SamplingParams` fields but max_tokens, every one checked."""
    n = int_field(body, "n", 1, lo=1, hi=MAX_N)
    best_of = int_field(body, "best_of", None, lo=1)
    if best_of is not None and best_of != n:
        raise unsupported("best_of", "is not supported by this server (only equal to n)")
    return {
        "n": n,
        "temperature": _ranged(body, "temperature", 1.0, 0.0, None),
        "top_p": _ranged(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        "top_k": int_field(body, "top_k", 0, lo=-1),
        "min_p": _ranged(body, "min_p", 0.0, 0.0, 1.0),
        "presence_penalty": _ranged(body, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": _ranged(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "repetition_penalty": _ranged(body, "repetition_penalty", 1.0, 0.0, None, lo_open=True),
        "logit_bias": _logit_bias(body, vocab_size),
        "seed": int_field(body, "seed", None, lo=SEED_MIN, hi=SEED_MAX),
        "stop": _stop(body),
        "stop_token_ids": _stop_token_ids(body, vocab_size),
        "ignore_eos": bool_field(body, "ignore_eos", False),
        "min_tokens": int_field(body, "min_tokens", 0, lo=0),
    }
