"""The mock server's settings; what it lets in (``--api-key``, ``--check-model``); for ``--strict``, the OpenAI
request schema a strict server checks."""

from __future__ import annotations

import hmac
from dataclasses import dataclass


@dataclass(slots=True)
class MockConfig:
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    tokens: int | None = None  # None: the request's max_tokens
    model: str = "mock"
    strict: bool = False
    reject_fields: tuple[str, ...] = ()  # strict: also refuse these known fields (transformers serve: service_tier)
    metrics: bool | None = None  # serve /metrics; None: yes, unless strict
    metrics_bytes: int = 0  # extra series appended to /metrics, at least this many bytes
    metrics_flavor: str = "vllm"  # whose /metrics names: vllm (the reference engine's) | sglang | tgi | trtllm
    reasoning_tokens: int = 0  # the first N tokens of each answer are reasoning (chat and /v1/responses)
    reasoning_field: str = "reasoning_content"  # the chat delta's reasoning key: reasoning_content | reasoning
    tokens_per_chunk: int = 1  # each chunk carries K tokens' text (speculative decoding, stream intervals)
    per_request_metrics: bool = False  # vLLM's per-request `metrics` object in the final chunk (not `timing`)
    responses: bool = True  # answer POST /v1/responses (the Responses API, streamed)
    # queueing mode (``slots`` > 0): at most ``slots`` requests are served at once, the rest wait FIFO; the
    # first token comes ``ttft_ms + prefill_ms_per_token x prompt tokens`` after the request has a slot
    slots: int = 0  # 0: no queue, every request is served at once (the default mode)
    prefill_ms_per_token: float = 0.0
    models: tuple[str, ...] = ()  # more names it serves besides ``model`` (listed by /v1/models, answered as)
    check_model: bool = False  # 404 (vLLM's words) for a request naming a model it does not serve
    api_key: str | None = None  # every /v1/ request must carry ``Authorization: Bearer <api_key>`` (vLLM's rule)
    request_log: str | None = None  # append one JSON line per HTTP request received (a test aid)
    fcfs: bool = False  # refuse a non-zero ``priority`` with 400: a first-come-first-served server without priorities
    # (status, every, retry_after_s): every ``every``-th completion request answered ``status`` instead (the first
    # rule that matches), with that Retry-After; a test aid for shed (429 / 503 / 529) and failed (500) outcomes
    refuse: tuple[tuple[int, int, float | None], ...] = ()

    def served(self) -> tuple[str, ...]:
        """Every model name it serves, ``model`` first."""
        return (self.model, *self.models)

    def prefill_ms(self, n_in: int) -> float:
        """A request's time from its slot (its arrival without a queue) to its first token."""
        return self.ttft_ms + self.prefill_ms_per_token * n_in


# The OpenAI request schema, per endpoint (openai-python's CompletionCreateParams): what a strict server knows.
# service_tier is OpenAI's (default | flex | priority) and kept on both, so only --reject-field drops it.
_COMMON_FIELDS = frozenset({"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed",
                            "stop", "n", "user", "frequency_penalty", "presence_penalty", "logit_bias", "logprobs",
                            "service_tier"})
STRICT_FIELDS = {
    "/v1/completions": _COMMON_FIELDS | {"prompt", "best_of", "echo", "suffix"},
    "/v1/chat/completions": _COMMON_FIELDS | {
        "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
        "response_format", "metadata", "store", "modalities", "audio", "prediction", "reasoning_effort",
        "verbosity", "web_search_options", "safety_identifier", "prompt_cache_key", "function_call", "functions"},
}
STRICT_FIELDS["/v1/responses"] = frozenset({
    "model", "input", "stream", "stream_options", "max_output_tokens", "temperature", "top_p", "instructions",
    "metadata", "reasoning", "store", "text", "tools", "tool_choice", "parallel_tool_calls", "user", "service_tier",
    "previous_response_id", "truncation", "include", "background", "max_tool_calls", "top_logprobs",
    "prompt_cache_key", "safety_identifier", "conversation", "prompt"})
STRICT_STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})


def authorized(cfg: MockConfig, path: str, headers: dict[str, str]) -> bool:
    """Whether a request may pass ``--api-key``: as vLLM's middleware, only paths under /v1 are guarded
    (/health and /metrics stay open) and the scheme is ``Bearer`` in any case."""
    if cfg.api_key is None or not path.startswith("/v1"):
        return True
    scheme, _, key = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(key.encode(), cfg.api_key.encode())


def unknown_model(cfg: MockConfig, req) -> str | None:
    """With ``check_model``, the model a request names that the mock does not serve (None: fine, or unchecked).
    A request that names none gets the first, as vLLM's does."""
    if not cfg.check_model or not isinstance(req, dict) or req.get("model") in (None, *cfg.served()):
        return None
    return str(req["model"])


def refusal(cfg: MockConfig, n: int) -> tuple[int, float | None] | None:
    """(status, Retry-After) for the ``n``-th completion request (from 1) under ``refuse``, else None."""
    for status, every, retry_after_s in cfg.refuse:
        if n % every == 0:
            return status, retry_after_s
    return None


def priority_refusal(cfg: MockConfig, req) -> str | None:
    """With ``fcfs``, a 400 (in vLLM's words) for a request that asks for a priority the scheduler cannot give."""
    if not cfg.fcfs or not isinstance(req, dict) or req.get("priority") in (None, 0):
        return None
    return f"Got priority {req['priority']} but Priority scheduling is not enabled."


def answer_model(cfg: MockConfig, req: dict) -> str:
    """The model name an answer carries: the request's when the mock serves it (vLLM echoes the served name
    asked for), else the first."""
    asked = req.get("model")
    return asked if isinstance(asked, str) and asked in cfg.served() else cfg.model


def set_text(names) -> str:
    """A set as Python prints it, sorted so the message is stable: {'ignore_eos', 'min_tokens'}."""
    return "{" + ", ".join(repr(n) for n in sorted(names)) + "}"


def strict_check(cfg: MockConfig, path: str, req) -> tuple[int, str] | None:
    """(status, message) for a request a strict OpenAI server refuses, else None."""
    if not isinstance(req, dict):
        return 400, "the body must be a JSON object"
    unexpected = set(req) - (STRICT_FIELDS[path] - set(cfg.reject_fields))
    opts = req.get("stream_options")
    if isinstance(opts, dict):
        unexpected |= {f"stream_options.{k}" for k in set(opts) - STRICT_STREAM_OPTIONS}
    if unexpected:  # transformers serve's words; vLLM and OpenAI refuse these too, in their own words
        return 422, f"Unexpected fields in the request: {set_text(unexpected)}"
    if not req.get("model"):
        return 400, "you must provide a model parameter"
    if req["model"] not in cfg.served():
        return 404, f"The model '{req['model']}' does not exist"
    if path == "/v1/completions" and not isinstance(req.get("prompt"), str):
        return 400, "prompt must be a string."
    if path == "/v1/chat/completions" and not (isinstance(req.get("messages"), list) and req["messages"]):
        return 400, "messages must be a non-empty array"
    if path == "/v1/responses" and not (isinstance(req.get("input"), str) or (isinstance(req.get("input"), list)
                                                                            and req["input"])):
        return 400, "input must be a string or a non-empty array"
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = req.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            return 400, f"{key} must be a positive integer"
    if req.get("n") not in (None, 1):
        return 400, "only n = 1 is supported"
    return None
