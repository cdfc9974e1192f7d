"""The capability probe: what a target accepts, found with a few tiny requests before any load is sent.

Strict OpenAI-compatible servers (OpenAI's API, ``transformers serve``, TGI, gateways) reject fields
they do not know (``ignore_eos``: HTTP 422 "Unexpected fields") and token-id prompts ("prompt must be
a string"); lenient ones (vLLM, SGLang, slobench's engine) take them. ``probe_capabilities`` sends one
baseline request per endpoint and then the baseline plus one field at a time, and reads which server it
is from ``/version``, ``/v1/models`` and the names on ``/metrics``. The run then sends only what was accepted
and says in its summary what was dropped and what that means for the numbers
(``Capabilities.notes``). Every probe request asks for 2 tokens; the whole probe takes well under a
second against a warm server (the first request may wait for a server that loads its model lazily).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from loadgen.target.access import AccessError
from loadgen.target.discovery import error_text
from loadgen.target.sse import SSEParser, StreamError, chunk_parts, chunk_usage, decode_chunk

PROBE_TEXT = "Hello there, how are you today?"
PROBE_TOKEN_IDS = [10, 20, 30, 40]  # inside every vocabulary slobench targets (see workload.specs)
# field name -> what it adds to the baseline request
FIELDS: dict[str, dict[str, Any]] = {
    "ignore_eos": {"ignore_eos": True},
    "min_tokens": {"min_tokens": 1},
    "include_usage": {"stream_options": {"include_usage": True}},
    "continuous_usage_stats": {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    "service_tier": {"service_tier": "default"},
    "priority": {"priority": 1},  # not 0: a server without priorities may take 0 and refuse any other value
}
METRIC_PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "tgi_": "tgi", "slobench:": "slobench",
                   "trtllm_": "trtllm"}
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "responses": "/v1/responses"}
TIMEOUT_S = 60.0  # the first request may wait for a model that loads on first use


class ProbeError(RuntimeError):
    """The target answers no completion request at all (one line, for the CLI)."""


@dataclass
class Reply:
    """One probe request's outcome."""

    status: int | None
    error: str | None = None
    text: str = ""
    usage: dict[str, Any] | None = None  # the last usage object seen
    usage_chunks: int = 0  # chunks that carried usage (continuous usage stats: every one)
    content_chunks: int = 0
    timing: bool = False  # slobench's per-request `timing` in the final chunk
    metrics: bool = False  # vLLM's per-request `metrics` object (--enable-per-request-metrics)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


@dataclass
class Capabilities:
    server: str = "unknown"  # vllm | sglang | tgi | trtllm | slobench | transformers | unknown
    evidence: list[str] = field(default_factory=list)  # how the server was recognised
    version: str | None = None
    completions: bool = False  # /v1/completions answers a text prompt
    chat: bool = False  # /v1/chat/completions answers
    responses: bool | None = None  # /v1/responses answers a streamed text input (None: not probed, not asked for)
    token_prompts: bool = False  # /v1/completions takes token ids
    fields: dict[str, bool] = field(default_factory=dict)  # FIELDS name -> accepted (HTTP 200)
    rejections: dict[str, str] = field(default_factory=dict)  # FIELDS name (or "token_prompts") -> the error
    usage_in_stream: bool = False  # include_usage gives a usage object in the stream
    continuous_usage: bool = False  # every chunk carries usage (tokens per chunk known)
    server_timing: bool = False  # per-request queue / prefill / decode: slobench's `timing`
    per_request_metrics: bool = False  # vLLM's per-request `metrics` object
    metric_prefixes: list[str] = field(default_factory=list)
    tokenize_endpoint: bool = False  # POST /tokenize (vLLM, SGLang)
    probe_prompt_tokens: dict[str, int] = field(default_factory=dict)  # endpoint -> usage.prompt_tokens of PROBE_TEXT

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def has_endpoint(self, endpoint: str) -> bool:
        return bool({"completions": self.completions, "chat": self.chat, "responses": self.responses}[endpoint])

    def accepts(self, name: str) -> bool:
        return bool(self.fields.get(name))

    def notes(self, *, dropped: list[str]) -> list[str]:
        """What the run does without the dropped fields, and what it means for the numbers."""
        out = []
        meaning = {
            "ignore_eos": "output lengths are not enforced: the server may stop early at its end-of-sequence "
                          "token; output_tokens are taken from its usage (or counted from the stream)",
            "min_tokens": "no minimum output length is enforced",
            "include_usage": "the server reports no token counts in the stream: output tokens are counted one per "
                             "content chunk and prompt tokens are the intended ones",
            "service_tier": "tiers are client-side labels only: the server does not see them, so tier SLOs "
                            "measure one shared queue",
            "priority": "the tiers' priorities are not sent: every tier waits in the server's one shared queue",
            "token_prompts": "prompts are sent as text of the intended token length",
        }
        for name in dropped:
            out.append(f"{name} not accepted by the server: {meaning.get(name, 'not sent')}")
        if not self.server_timing and not self.per_request_metrics:
            out.append("no per-request server timing: the queue / prefill / decode breakdown comes from the "
                       "server's histograms when it exposes them, else it is not available")
        return out


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Reply:
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as r:
            raw = await r.read()
            if r.status != 200:
                return Reply(r.status, error_text(raw, r.status))
            if not body.get("stream"):
                return _read_json(raw)
            return _read_stream(raw)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return Reply(None, f"{type(e).__name__}: {e}")


def _read_json(raw: bytes) -> Reply:
    try:
        obj = json.loads(raw)
    except ValueError:
        return Reply(200, "response is not JSON")
    rep = Reply(200, usage=obj.get("usage"))
    rep.metrics = isinstance(obj.get("metrics"), dict)
    return rep


def _read_stream(raw: bytes) -> Reply:
    rep = Reply(200)
    parser = SSEParser()
    try:
        for ev in [*parser.feed(raw), *parser.close()]:
            obj = decode_chunk(ev.data)
            if obj is None:
                continue
            text, reasoning = chunk_parts(obj)
            if text or reasoning:
                rep.text += text
                rep.content_chunks += 1
            if usage := chunk_usage(obj):
                rep.usage = usage
                rep.usage_chunks += 1
            rep.timing = rep.timing or isinstance(obj.get("timing"), dict)
            rep.metrics = rep.metrics or isinstance(obj.get("metrics"), dict)
    except StreamError as e:
        rep.error = str(e)
    return rep


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int | None, bytes]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            return r.status, await r.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None, b""


async def probe_capabilities(target: str, model: str, headers: dict[str, str] | None = None,
                             endpoint: str | None = None, extra_body: dict[str, Any] | None = None) -> Capabilities:
    """Probe ``target`` (its base URL) serving ``model``; ``endpoint`` is the one the run must use
    (completions | chat | responses), None for either completions endpoint. Raises ProbeError when that
    endpoint (or, with None, neither completions endpoint) answers a plain text request; AccessError when
    it refuses the credentials. ``headers`` go with every request, ``extra_body`` into every body (the run
    sends them too: a gateway may need its fields)."""
    target = target.rstrip("/")
    extra = dict(extra_body or {})
    async with aiohttp.ClientSession(headers=headers or {}) as s:
        caps = Capabilities()
        base = {"model": model, "prompt": PROBE_TEXT, "max_tokens": 2, "stream": True, **extra}
        chat = {"model": model, "messages": [{"role": "user", "content": PROBE_TEXT}], "max_tokens": 2,
                "stream": True, **extra}
        # the baselines first, one at a time: a server that loads its model on first use does it once
        comp = await _post(s, target + "/v1/completions", base)
        chat_rep = await _post(s, target + "/v1/chat/completions", chat)
        caps.completions, caps.chat = comp.ok, chat_rep.ok
        if comp.status in (401, 403) and chat_rep.status in (401, 403):
            raise AccessError(f"{target} refused the completion requests ({comp.error}): pass --api-key KEY or "
                              "set OPENAI_API_KEY (or check the one given)")
        resp = {"model": model, "input": PROBE_TEXT, "max_output_tokens": 2, "stream": True, **extra}
        resp_rep = await _post(s, target + "/v1/responses", resp) if endpoint == "responses" else None
        if resp_rep is not None:
            caps.responses = resp_rep.ok
            if not resp_rep.ok:
                raise ProbeError(f"{target} does not answer the Responses API (POST /v1/responses: {resp_rep.error}) "
                                 f"for model {model!r}; use --endpoint completions or chat")
            if isinstance(resp_rep.usage, dict) and isinstance(resp_rep.usage.get("prompt_tokens"), int):
                caps.probe_prompt_tokens["responses"] = resp_rep.usage["prompt_tokens"]
        for name, rep in (("completions", comp), ("chat", chat_rep)):
            if endpoint == name and not rep.ok:
                raise ProbeError(f"{target} does not answer {ENDPOINT_PATHS[name]} ({rep.error}) for model {model!r}")
        if not (comp.ok or chat_rep.ok or caps.responses):
            raise ProbeError(f"{target} answers neither /v1/completions ({comp.error}) nor /v1/chat/completions "
                             f"({chat_rep.error}) for model {model!r}")
        if resp_rep is not None:
            url, body = target + "/v1/responses", resp
        elif comp.ok and endpoint != "chat":
            url, body = target + "/v1/completions", base
        else:
            url, body = target + "/v1/chat/completions", chat
        names = [n for n in FIELDS if resp_rep is None or "usage" not in n]  # Responses: usage comes anyway
        tries = [_post(s, url, {**body, **FIELDS[n]}) for n in names]
        if comp.ok:
            names.append("token_prompts")  # always on /v1/completions: the only endpoint that takes token ids
            tries.append(_post(s, target + "/v1/completions", {**base, "prompt": PROBE_TOKEN_IDS}))
        usage_tries = [_post(s, u, {**b, "stream": False}) for u, b, ok in
                       ((target + "/v1/completions", base, comp.ok), (target + "/v1/chat/completions", chat,
                                                                       chat_rep.ok)) if ok]
        replies = await asyncio.gather(*tries, *usage_tries)
        for name, rep in zip(names, replies[:len(names)], strict=True):
            if name == "token_prompts":
                caps.token_prompts = rep.ok
            else:
                caps.fields[name] = rep.ok
            if not rep.ok:
                caps.rejections[name] = rep.error or f"HTTP {rep.status}"
            if name == "include_usage":
                caps.usage_in_stream = rep.ok and rep.usage is not None
            if name == "continuous_usage_stats":
                caps.continuous_usage = rep.ok and rep.usage_chunks > 1
        by_endpoint = [e for e, ok in (("completions", comp.ok), ("chat", chat_rep.ok)) if ok]
        for endpoint, rep in zip(by_endpoint, replies[len(names):], strict=True):
            if rep.ok and isinstance(rep.usage, dict) and isinstance(rep.usage.get("prompt_tokens"), int):
                caps.probe_prompt_tokens[endpoint] = rep.usage["prompt_tokens"]
            caps.per_request_metrics = caps.per_request_metrics or rep.metrics
        first = resp_rep if resp_rep is not None else comp if comp.ok else chat_rep
        if resp_rep is not None:
            caps.usage_in_stream = resp_rep.usage is not None
        caps.server_timing = first.timing or any(r.timing for r in replies)
        caps.per_request_metrics = caps.per_request_metrics or first.metrics or any(r.metrics for r in replies)
        await _identify(s, target, model, caps)
    return caps


async def _identify(s: aiohttp.ClientSession, target: str, model: str, caps: Capabilities) -> None:
    """Which server this is: the names on /metrics, /version, /v1/models' owned_by, POST /tokenize."""
    status, raw = await _get(s, target + "/metrics")
    if status != 200:
        status, raw = await _get(s, target + "/prometheus/metrics")  # TRT-LLM's path
    if status == 200:
        text = raw.decode("utf-8", "replace")
        for prefix in METRIC_PREFIXES:
            if f"\n{prefix}" in "\n" + text:
                caps.metric_prefixes.append(prefix)
        if caps.metric_prefixes:
            # the engine's own names win over the vllm: names it also serves for dashboards
            known = [METRIC_PREFIXES[p] for p in caps.metric_prefixes]
            caps.server = "slobench" if "slobench" in known else known[0]
            caps.evidence.append(f"/metrics names {', '.join(caps.metric_prefixes)}")
    status, raw = await _get(s, target + "/version")
    if status == 200:
        try:
            caps.version = str(json.loads(raw).get("version"))
            caps.evidence.append("/version")
        except (ValueError, AttributeError):
            pass
    status, raw = await _get(s, target + "/v1/models")
    if status == 200:
        try:
            owners = {m.get("owned_by") for m in json.loads(raw).get("data") or [] if isinstance(m, dict)}
        except (ValueError, AttributeError):
            owners = set()
        for owner in sorted(o for o in owners if isinstance(o, str)):
            caps.evidence.append(f"/v1/models owned_by {owner}")
            if caps.server == "unknown" and owner.lower() in ("vllm", "sglang", "tgi", "slobench"):
                caps.server = owner.lower()
    try:
        async with s.post(target + "/tokenize", json={"model": model, "prompt": PROBE_TEXT},
                          timeout=aiohttp.ClientTimeout(total=10)) as r:
            obj = await r.json(content_type=None) if r.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        obj = None
    caps.tokenize_endpoint = isinstance(obj, dict) and isinstance(obj.get("tokens"), list)
