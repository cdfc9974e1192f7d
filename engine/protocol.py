"""OpenAI request validation and response shapes for the engine's HTTP server.

`parse_completion_request` / `parse_chat_request` turn a decoded JSON body into a `GenerationRequest`
(prompt or messages, `SamplingParams` fields, tier, stream flags) or raise `APIError` whose message
names the offending field. The chunk and response builders produce OpenAI's wire format plus the
slobench extensions (`timing`, `service_tier`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from engine.config import normalize_tier
from engine.sampling import SamplingParams

MAX_N = 32
MAX_STOP = 16
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An error the server returns as OpenAI's error JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type or _default_type(status)
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


# ---------------------------------------------------------------------------------------- field checks


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _wrong_type(param: str, expected: str, value: Any) -> APIError:
    return APIError(
        400, f"'{param}' must be {expected}, got {_type_name(value)}", param=param, code="invalid_type"
    )


def _int(body: dict, key: str, default: int | None, lo: int | None = None, hi: int | None = None):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(key, "an integer", value)
    if lo is not None and value < lo:
        raise invalid(key, f"'{key}' must be at least {lo}, got {value}")
    if hi is not None and value > hi:
        raise invalid(key, f"'{key}' must be at most {hi}, got {value}")
    return value


def _float(body: dict, key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong_type(key, "a number", value)
    value = float(value)
    if not math.isfinite(value):
        raise invalid(key, f"'{key}' must be a finite number")
    return value


def _bool(body: dict, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _wrong_type(key, "a boolean", value)
    return value


def _unsupported(key: str, what: str = "is not supported by this server") -> APIError:
    """A known OpenAI field this engine does not implement, given a non-neutral value."""
    return APIError(400, f"'{key}' {what}", param=key, code="unsupported")


def _check_unsupported(body: dict) -> None:
    for key in ("presence_penalty", "frequency_penalty"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or value != 0):
            raise _unsupported(key, "is not supported by this server (only 0)")
    value = body.get("repetition_penalty")
    if value is not None and (isinstance(value, bool) or value != 1):
        raise _unsupported("repetition_penalty", "is not supported by this server (only 1)")
    if body.get("logit_bias"):
        raise _unsupported("logit_bias")


# ------------------------------------------------------------------------------------------- requests


@dataclass
class GenerationRequest:
    kind: str  # "completion" | "chat"
    model: str
    tier: str
    stream: bool
    include_usage: bool
    max_tokens: int | None  # None: the rest of the context (chat's default)
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields except max_tokens
    prompt: str | list[int] | None = None  # completions
    messages: list[dict[str, str]] | None = None  # chat, content flattened to text
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(max_tokens=max_tokens, **self.sampling)
        except ValueError as e:  # the field checks above should have caught it; name it anyway
            message = str(e)
            param = message.split()[0] if message else None
            raise invalid(param or "body", message) from e


def check_body(body: Any) -> dict:
    if not isinstance(body, dict):
        raise APIError(
            400,
            f"the request body must be a JSON object, got {_type_name(body)}",
            param=None,
            code="invalid_json",
        )
    return body


def _model(body: dict, served: tuple[str, ...]) -> str:
    model = body.get("model")
    if model is None:
        return served[0]
    if not isinstance(model, str):
        raise _wrong_type("model", "a string", model)
    if model not in served:
        raise APIError(
            404,
            f"the model '{model}' does not exist; this server serves '{served[0]}'",
            param="model",
            code="model_not_found",
        )
    return model


def _tier(body: dict) -> str:
    tier = body.get("service_tier")
    if tier is not None and not isinstance(tier, str):
        raise _wrong_type("service_tier", "a string", tier)
    try:
        return normalize_tier(tier)
    except ValueError as e:
        raise invalid(
            "service_tier",
            f"'service_tier' must be premium, standard or basic (or OpenAI's priority, "
            f"default, flex), got {tier!r}",
        ) from e


def _stream(body: dict) -> tuple[bool, bool]:
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise _wrong_type("stream_options", "an object", options)
    if not stream:
        raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")
    include = options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise _wrong_type("stream_options.include_usage", "a boolean", include)
    return stream, bool(include)


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list):
        raise _wrong_type("stop", "a string or an array of strings", stop)
    if len(stop) > MAX_STOP:
        raise invalid("stop", f"'stop' takes at most {MAX_STOP} strings, got {len(stop)}")
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise _wrong_type(f"stop[{i}]", "a string", s)
        if not s:
            raise invalid(f"stop[{i}]", "'stop' strings must not be empty")
    return list(stop)


def _token_id_list(value: list, param: str, vocab_size: int | None) -> list[int]:
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            raise _wrong_type(f"{param}[{i}]", "an integer token id", t)
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            raise invalid(
                param,
                f"'{param}' holds token id {t} at position {i}, outside the vocabulary [0, {vocab_size})",
            )
    return value


def _sampling(body: dict, vocab_size: int | None) -> dict[str, Any]:
    n = _int(body, "n", 1, lo=1, hi=MAX_N)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise _unsupported("best_of", "is not supported by this server (only equal to n)")
    temperature = _float(body, "temperature", 1.0)
    if temperature < 0:
        raise invalid("temperature", f"'temperature' must be non-negative, got {temperature}")
    top_p = _float(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise invalid("top_p", f"'top_p' must be in (0, 1], got {top_p}")
    top_k = _int(body, "top_k", 0, lo=-1)
    seed = _int(body, "seed", None, lo=_SEED_MIN, hi=_SEED_MAX)
    stop_token_ids = body.get("stop_token_ids")
    if stop_token_ids is None:
        stop_token_ids = []
    elif not isinstance(stop_token_ids, list):
        raise _wrong_type("stop_token_ids", "an array of integers", stop_token_ids)
    else:
        _token_id_list(stop_token_ids, "stop_token_ids", vocab_size)
    return {
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "stop": _stop(body),
        "stop_token_ids": list(stop_token_ids),
        "ignore_eos": _bool(body, "ignore_eos", False),
        "min_tokens": _int(body, "min_tokens", 0, lo=0),
    }


def _check_min_tokens(req: GenerationRequest) -> None:
    min_tokens = req.sampling["min_tokens"]
    if req.max_tokens is not None and min_tokens > req.max_tokens:
        raise invalid(
            "min_tokens", f"'min_tokens' ({min_tokens}) must not exceed 'max_tokens' ({req.max_tokens})"
        )


def parse_prompt(prompt: Any, vocab_size: int | None) -> str | list[int]:
    if prompt is None:
        raise APIError(400, "'prompt' is required", param="prompt", code="missing_field")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise invalid(
                "prompt",
                f"'prompt' holds {len(prompt)} prompts; this server takes one per "
                "request (send them as separate requests)",
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("prompt", "'prompt' must not be empty")
        return prompt
    if isinstance(prompt, list):
        if not prompt:
            raise invalid("prompt", "'prompt' must not be empty")
        return _token_id_list(prompt, "prompt", vocab_size)
    raise _wrong_type("prompt", "a string or an array of token ids", prompt)


def parse_completion_request(
    body: Any, served_models: tuple[str, ...], vocab_size: int | None = None
) -> GenerationRequest:
    body = check_body(body)
    model = _model(body, served_models)
    prompt = parse_prompt(body.get("prompt"), vocab_size)
    stream, include_usage = _stream(body)
    _check_unsupported(body)
    if body.get("echo") not in (None, False):
        raise _unsupported("echo")
    if body.get("logprobs") is not None:
        raise _unsupported("logprobs")
    if body.get("suffix") is not None:
        raise _unsupported("suffix")
    req = GenerationRequest(
        kind="completion",
        model=model,
        tier=_tier(body),
        stream=stream,
        include_usage=include_usage,
        max_tokens=_int(body, "max_tokens", 16, lo=1),
        sampling=_sampling(body, vocab_size),
        prompt=prompt,
    )
    _check_min_tokens(req)
    return req


def _content_text(content: Any, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            p = f"{param}[{j}]"
            if not isinstance(part, dict):
                raise _wrong_type(p, "an object", part)
            if part.get("type") != "text":
                raise APIError(
                    400,
                    f"'{p}.type' must be 'text' (this server takes text only), got {part.get('type')!r}",
                    param=f"{p}.type",
                    code="unsupported",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise _wrong_type(f"{p}.text", "a string", text)
            parts.append(text)
        return "".join(parts)
    raise _wrong_type(param, "a string or an array of content parts", content)


def parse_messages(messages: Any) -> list[dict[str, str]]:
    if messages is None:
        raise APIError(400, "'messages' is required", param="messages", code="missing_field")
    if not isinstance(messages, list):
        raise _wrong_type("messages", "an array", messages)
    if not messages:
        raise invalid("messages", "'messages' must not be empty")
    out = []
    for i, message in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _wrong_type(p, "an object", message)
        role = message.get("role")
        if not isinstance(role, str):
            raise _wrong_type(f"{p}.role", "a string", role)
        if role not in CHAT_ROLES:
            raise invalid(f"{p}.role", f"'{p}.role' must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
        if "content" not in message and role != "assistant":
            raise APIError(400, f"'{p}.content' is required", param=f"{p}.content", code="missing_field")
        entry = {"role": role, "content": _content_text(message.get("content"), f"{p}.content")}
        name = message.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise _wrong_type(f"{p}.name", "a string", name)
            entry["name"] = name
        out.append(entry)
    return out


def parse_chat_request(
    body: Any, served_models: tuple[str, ...], vocab_size: int | None = None
) -> GenerationRequest:
    body = check_body(body)
    model = _model(body, served_models)
    messages = parse_messages(body.get("messages"))
    stream, include_usage = _stream(body)
    _check_unsupported(body)
    if body.get("logprobs") not in (None, False):
        raise _unsupported("logprobs")
    if body.get("tools"):
        raise _unsupported("tools")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise _unsupported("response_format", "is not supported by this server (only {'type': 'text'})")
    max_tokens = _int(body, "max_completion_tokens", None, lo=1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", None, lo=1)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        raise _wrong_type("chat_template_kwargs", "an object", kwargs)
    req = GenerationRequest(
        kind="chat",
        model=model,
        tier=_tier(body),
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        sampling=_sampling(body, vocab_size),
        messages=messages,
        add_generation_prompt=_bool(body, "add_generation_prompt", True),
        chat_template_kwargs=kwargs,
    )
    _check_min_tokens(req)
    return req


# ------------------------------------------------------------------------------------------ responses


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def timing_dict(timing: Any, tier: str) -> dict[str, Any] | None:
    if timing is None:
        return None
    return {
        "queue_ms": round(timing.queue_ms, 3),
        "prefill_ms": round(timing.prefill_ms, 3),
        "decode_ms": round(timing.decode_ms, 3),
        "tier": getattr(timing, "tier", None) or tier,
    }


def completion_chunk(rid: str, created: int, model: str, index: int, text: str, finish: str | None) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
    }


def chat_chunk(rid: str, created: int, model: str, index: int, delta: dict, finish: str | None) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def usage_chunk(kind: str, rid: str, created: int, model: str, usage_: dict, timing: dict | None) -> dict:
    chunk = {
        "id": rid,
        "object": "text_completion" if kind == "completion" else "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }
    if timing is not None:
        chunk["timing"] = timing
    return chunk


def full_response(
    kind: str,
    rid: str,
    created: int,
    model: str,
    tier: str,
    choices: list[tuple[int, str, str | None]],
    usage_: dict,
    timing: dict | None,
) -> dict:
    """choices: (index, text, finish_reason) for each of the n completions."""
    if kind == "completion":
        body_choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
            for i, text, finish in choices
        ]
        obj = "text_completion"
    else:
        body_choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            for i, text, finish in choices
        ]
        obj = "chat.completion"
    response = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "service_tier": tier,
        "choices": body_choices,
        "usage": usage_,
    }
    if timing is not None:
        response["timing"] = timing
    return response


def now_s() -> int:
    return int(time.time())
