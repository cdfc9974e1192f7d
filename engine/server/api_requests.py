"""OpenAI request validation: a decoded JSON body becomes a `GenerationRequest`, or an `APIError`.

`parse_completion_request` / `parse_chat_request` check every field (prompt or messages, `SamplingParams`
fields: engine/server/api_sampling.py, tier, stream flags) and name the offending one in the error's message and
`param`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.request.sampling import SamplingParams
from engine.request.tiers import normalize_tier
from engine.server.api_errors import APIError, invalid
from engine.server.api_fields import bool_field, int_field, token_id_list, type_name, unsupported, wrong_type
from engine.server.api_sampling import check_unsupported, sampling_fields

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


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
            f"the request body must be a JSON object, got {type_name(body)}",
            param=None,
            code="invalid_json",
        )
    return body


def _model(body: dict, served: tuple[str, ...]) -> str:
    model = body.get("model")
    if model is None:
        return served[0]
    if not isinstance(model, str):
        raise wrong_type("model", "a string", model)
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
        raise wrong_type("service_tier", "a string", tier)
    try:
        return normalize_tier(tier)
    except ValueError as e:
        raise invalid(
            "service_tier",
            f"'service_tier' must be premium, standard or basic (or OpenAI's priority, "
            f"default, flex), got {tier!r}",
        ) from e


def _stream(body: dict) -> tuple[bool, bool]:
    stream = bool_field(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise wrong_type("stream_options", "an object", options)
    if not stream:
        raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")
    include = options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise wrong_type("stream_options.include_usage", "a boolean", include)
    return stream, bool(include)


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
        return token_id_list(prompt, "prompt", vocab_size)
    raise wrong_type("prompt", "a string or an array of token ids", prompt)


def parse_completion_request(
    body: Any, served_models: tuple[str, ...], vocab_size: int | None = None
) -> GenerationRequest:
    body = check_body(body)
    model = _model(body, served_models)
    prompt = parse_prompt(body.get("prompt"), vocab_size)
    stream, include_usage = _stream(body)
    check_unsupported(body, chat=False)
    if body.get("echo") not in (None, False):
        raise unsupported("echo")
    if body.get("suffix") is not None:
        raise unsupported("suffix")
    req = GenerationRequest(
        kind="completion",
        model=model,
        tier=_tier(body),
        stream=stream,
        include_usage=include_usage,
        max_tokens=int_field(body, "max_tokens", 16, lo=1),
        sampling=sampling_fields(body, vocab_size),
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
                raise wrong_type(p, "an object", part)
            if part.get("type") != "text":
                raise APIError(
                    400,
                    f"'{p}.type' must be 'text' (this server takes text only), got {part.get('type')!r}",
                    param=f"{p}.type",
                    code="unsupported",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise wrong_type(f"{p}.text", "a string", text)
            parts.append(text)
        return "".join(parts)
    raise wrong_type(param, "a string or an array of content parts", content)


def parse_messages(messages: Any) -> list[dict[str, str]]:
    if messages is None:
        raise APIError(400, "'messages' is required", param="messages", code="missing_field")
    if not isinstance(messages, list):
        raise wrong_type("messages", "an array", messages)
    if not messages:
        raise invalid("messages", "'messages' must not be empty")
    out = []
    for i, message in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(message, dict):
            raise wrong_type(p, "an object", message)
        role = message.get("role")
        if not isinstance(role, str):
            raise wrong_type(f"{p}.role", "a string", role)
        if role not in CHAT_ROLES:
            raise invalid(f"{p}.role", f"'{p}.role' must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
        if "content" not in message and role != "assistant":
            raise APIError(400, f"'{p}.content' is required", param=f"{p}.content", code="missing_field")
        entry = {"role": role, "content": _content_text(message.get("content"), f"{p}.content")}
        name = message.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise wrong_type(f"{p}.name", "a string", name)
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
    check_unsupported(body, chat=True)
    if body.get("tools"):
        raise unsupported("tools")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise unsupported("response_format", "is not supported by this server (only {'type': 'text'})")
    max_tokens = int_field(body, "max_completion_tokens", None, lo=1)
    if max_tokens is None:
        max_tokens = int_field(body, "max_tokens", None, lo=1)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        raise wrong_type("chat_template_kwargs", "an object", kwargs)
    req = GenerationRequest(
        kind="chat",
        model=model,
        tier=_tier(body),
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        sampling=sampling_fields(body, vocab_size),
        messages=messages,
        add_generation_prompt=bool_field(body, "add_generation_prompt", True),
        chat_template_kwargs=kwargs,
    )
    _check_min_tokens(req)
    return req
