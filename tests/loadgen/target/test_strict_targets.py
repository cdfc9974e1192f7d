"""Strict OpenAI-compatible targets: what `transformers serve` really does (so a change in a new transformers
release shows up here first), and `slobench mock-server --strict`, which imitates a strict server with exact
timing. Both are HTTP-level tests: raw requests, raw status codes and bodies."""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.results.scraped import histogram_mean_delta
from loadgen.target.scrape import parse_metrics
from tests.helpers import post_json, slobench

CHAT = [{"role": "user", "content": "Hello world"}]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (loopback)
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def stream_events(url: str, body: dict) -> tuple[list[dict], bool]:
    """The JSON events of a streamed response, and whether it ended with `data: [DONE]`."""
    req = urllib.request.Request(url, json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 (loopback)
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = r.read().decode()
    data = [block[len("data: "):] for block in raw.split("\n\n") if block.startswith("data: ")]
    done = bool(data) and data[-1] == "[DONE]"
    return [json.loads(d) for d in data if d != "[DONE]"], done


# ---------------------------------------------------------------- transformers serve (a real strict server)

def body_for(ts, endpoint: str, **fields) -> dict:
    base = {"prompt": "Hello world"} if endpoint == "completions" else {"messages": CHAT}
    return {"model": ts.model, "max_tokens": 3, **base, **fields}


@pytest.mark.slow
def test_transformers_serve_endpoints(transformers_serve):
    ts = transformers_serve
    status, body = get(ts.url + "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == [ts.model]  # pinned: its path, as started
    assert get(ts.url + "/health") == (200, b'{"status":"ok"}')
    # No Prometheus endpoint at all: the breakdown has no `metrics` source against this target.
    assert get(ts.url + "/metrics") == (404, b'{"detail":"Not Found"}')


# (endpoint, field, value, HTTP status). Refusals are FastAPI's {"detail": ...}, not OpenAI's {"error": ...}.
FIELDS = [
    ("completions", "ignore_eos", True, 422),
    ("chat/completions", "ignore_eos", True, 422),
    ("completions", "min_tokens", 2, 422),
    ("chat/completions", "min_tokens", 2, 422),
    ("completions", "priority", 1, 422),
    ("chat/completions", "priority", 1, 422),
    ("completions", "top_k", 5, 422),
    ("completions", "service_tier", "default", 422),  # not in the legacy completions schema
    ("chat/completions", "service_tier", "priority", 200),  # accepted and ignored
    ("completions", "max_completion_tokens", 3, 422),
    ("chat/completions", "max_completion_tokens", 3, 200),
    ("chat/completions", "echo", False, 422),
    # Accepted but ignored (a warning in the server log): stream_options (usage always comes), n, user.
    ("completions", "stream_options", {"include_usage": True}, 200),
    ("chat/completions", "stream_options", {"include_usage": True, "continuous_usage_stats": True}, 200),
    ("completions", "n", 1, 200),
    ("completions", "user", "u", 200),
    ("completions", "seed", 7, 200),
    ("chat/completions", "seed", 7, 200),
    ("completions", "temperature", 0.0, 200),
]


@pytest.mark.slow
@pytest.mark.parametrize(("endpoint", "field", "value", "status"), FIELDS)
def test_transformers_serve_fields(transformers_serve, endpoint, field, value, status):
    code, body = post_json(f"{transformers_serve.url}/v1/{endpoint}", body_for(transformers_serve, endpoint,
                                                                               **{field: value}))
    assert code == status, body
    if status == 422:
        assert json.loads(body) == {"detail": f"Unexpected fields in the request: { {field} }"}


@pytest.mark.slow
def test_transformers_serve_refuses_token_prompts_and_other_models(transformers_serve):
    ts = transformers_serve
    for prompt in ([1, 2, 3], ["Hello", "world"]):
        assert post_json(ts.url + "/v1/completions", {"model": ts.model, "prompt": prompt, "max_tokens": 2}) == (
            400, b'{"detail":"prompt must be a string."}')
    code, body = post_json(ts.url + "/v1/completions", {"model": "other", "prompt": "hi", "max_tokens": 2})
    assert code == 400 and json.loads(body)["detail"] == f"Server is pinned to '{ts.model}'; requested 'other'."
    # No model at all is fine: the pinned one answers.
    assert post_json(ts.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2})[0] == 200


@pytest.mark.slow
@pytest.mark.parametrize("stream_options", [None, {"include_usage": False}, {"include_usage": True}])
def test_transformers_serve_completion_stream(transformers_serve, stream_options):
    ts = transformers_serve
    extra = {"stream_options": stream_options} if stream_options is not None else {}
    events, done = stream_events(ts.url + "/v1/completions", body_for(ts, "completions", max_tokens=24, **extra))
    assert not done  # no `data: [DONE]`: the stream just ends after the finish_reason chunk
    *content, last = events
    assert all(e["object"] == "text_completion" and "finish_reason" not in e["choices"][0] and "usage" not in e
               for e in content)
    # usage rides on the finish_reason chunk (text ""), whatever stream_options says; max_tokens is honoured.
    assert last["choices"][0] == {"index": 0, "text": "", "finish_reason": "length"}
    assert last["usage"]["completion_tokens"] == 24
    # Text chunks are not tokens: byte-level tokens that end mid-character are held back and merged.
    assert 0 < len(content) <= 24


@pytest.mark.slow
def test_transformers_serve_chat_stream(transformers_serve):
    ts = transformers_serve
    events, done = stream_events(ts.url + "/v1/chat/completions", body_for(ts, "chat/completions", max_tokens=16))
    assert not done
    first, *content, last = events
    assert first["choices"] == [{"delta": {"role": "assistant"}, "index": 0}]  # no content key: not a token
    assert all(set(e["choices"][0]["delta"]) == {"content"} for e in content)
    assert last["choices"] == [{"delta": {}, "index": 0, "finish_reason": "length"}]
    assert last["usage"]["completion_tokens"] == 16
    assert {e["object"] for e in events} == {"chat.completion.chunk"}


@pytest.mark.slow
def test_transformers_serve_prompt_tokens(transformers_serve, serve_checkpoint):
    from transformers import AutoTokenizer

    ts, tok = transformers_serve, AutoTokenizer.from_pretrained(serve_checkpoint)
    for prompt in ("Hello world", "The quick brown fox jumps over the lazy dog 1234.", "x"):
        code, body = post_json(ts.url + "/v1/completions", {"model": ts.model, "prompt": prompt, "max_tokens": 2})
        usage = json.loads(body)["usage"]
        # the tokenizer's count with its special tokens (here: the BOS its post-processor adds)
        assert usage["prompt_tokens"] == len(tok(prompt).input_ids) == len(tok.encode(prompt,
                                                                                       add_special_tokens=False)) + 1
        assert usage["completion_tokens"] == 2
    code, body = post_json(ts.url + "/v1/chat/completions", {"model": ts.model, "messages": CHAT, "max_tokens": 2})
    chat_ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert json.loads(body)["usage"]["prompt_tokens"] == len(chat_ids)
    # The chat template's overhead ("<s>user: " ... "</s>assistant: ") is counted as prompt tokens.
    assert len(chat_ids) - len(tok.encode("Hello world", add_special_tokens=False)) == 17


@pytest.mark.slow
def test_transformers_serve_ignores_per_request_sampling_under_cb(transformers_serve):
    """Continuous batching keeps the first request's sampling settings (the fixture's greedy warm-up) and does
    not apply stop strings: every request is greedy and runs to max_tokens, whatever it asks."""
    ts = transformers_serve

    def text(**fields) -> tuple[str, str]:
        code, body = post_json(ts.url + "/v1/completions", {"model": ts.model, "prompt": "Hello", "max_tokens": 8,
                                                            **fields})
        assert code == 200
        choice = json.loads(body)["choices"][0]
        return choice["text"], choice["finish_reason"]

    greedy, reason = text()
    assert reason == "length" and greedy
    assert text(temperature=1.5, seed=1) == text(temperature=1.5, seed=2) == (greedy, "length")
    assert text(stop=[greedy[0]]) == (greedy, "length")


@pytest.mark.slow
def test_transformers_serve_whole_response(transformers_serve):
    ts = transformers_serve
    code, body = post_json(ts.url + "/v1/chat/completions", body_for(ts, "chat/completions", max_tokens=5))
    out = json.loads(body)
    assert code == 200 and out["object"] == "chat.completion"
    assert out["choices"][0]["finish_reason"] == "length" and out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["completion_tokens"] == 5


# ---------------------------------------------------------------- slobench mock-server --strict

def strict_body(path: str, **fields) -> dict:
    base = {"prompt": "Hello world"} if path == "/v1/completions" else {"messages": CHAT}
    return {"model": "mock", "max_tokens": 4, **base, **fields}


def refusal(status: int, message: str) -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": "invalid_request_error", "code": status}}


def post(url: str, body: dict) -> tuple[int, dict]:
    code, raw = post_json(url, body)
    return code, json.loads(raw)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_strict_mock_refuses_extension_fields(strict_mock, path):
    assert post(strict_mock + path, strict_body(path, ignore_eos=True, min_tokens=2, stream=True)) == refusal(
        422, "Unexpected fields in the request: {'ignore_eos', 'min_tokens'}")
    assert post(strict_mock + path, strict_body(path, priority=1)) == refusal(
        422, "Unexpected fields in the request: {'priority'}")
    opts = {"include_usage": True, "continuous_usage_stats": True}  # vLLM's; OpenAI knows include_usage only
    assert post(strict_mock + path, strict_body(path, stream=True, stream_options=opts)) == refusal(
        422, "Unexpected fields in the request: {'stream_options.continuous_usage_stats'}")


def test_strict_mock_refuses_non_string_prompts(strict_mock):
    for prompt in ([1, 2, 3], ["Hello"], None):
        assert post(strict_mock + "/v1/completions", strict_body("/v1/completions", prompt=prompt)) == refusal(
            400, "prompt must be a string.")
    assert post(strict_mock + "/v1/chat/completions", strict_body("/v1/chat/completions", messages=[])) == refusal(
        400, "messages must be a non-empty array")


def test_strict_mock_refuses_bad_model_tokens_and_n(strict_mock):
    url = strict_mock + "/v1/completions"
    assert post(url, strict_body("/v1/completions", model="other")) == refusal(404, "The model 'other' does not exist")
    no_model = {k: v for k, v in strict_body("/v1/completions").items() if k != "model"}
    assert post(url, no_model) == refusal(400, "you must provide a model parameter")
    for bad in (0, -1, "8", 2.5, True):
        assert post(url, strict_body("/v1/completions", max_tokens=bad)) == refusal(
            400, "max_tokens must be a positive integer")
    assert post(url, strict_body("/v1/completions", n=2)) == refusal(400, "only n = 1 is supported")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_strict_mock_accepts_the_openai_schema(strict_mock, path):
    known = {"service_tier": "priority", "seed": 3, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"], "n": 1,
             "user": "u", "frequency_penalty": 0.0, "presence_penalty": 0.0, "logit_bias": {}}
    if path == "/v1/chat/completions":
        known.update(max_completion_tokens=3, response_format={"type": "text"}, store=False)
    events, done = stream_events(strict_mock + path, strict_body(path, **known))
    assert done and events[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_strict_mock_usage_only_when_asked_and_no_timing(strict_mock, path):
    events, done = stream_events(strict_mock + path, strict_body(path))
    assert done and not any("usage" in e or "timing" in e for e in events)
    events, done = stream_events(strict_mock + path, strict_body(path, stream_options={"include_usage": True}))
    assert done and events[-1]["choices"] == [] and "timing" not in events[-1]
    assert events[-1]["usage"]["completion_tokens"] == 4
    content = [e for e in events if e["choices"] and (e["choices"][0].get("text") or
                                                      e["choices"][0].get("delta", {}).get("content"))]
    assert len(content) == 4
    if path == "/v1/chat/completions":  # OpenAI's first chunk: the role, with empty content
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_strict_mock_whole_response_after_its_last_token(mock_server):
    url = mock_server("--strict", "--metrics", "--ttft-ms", 100, "--itl-ms", 20)
    code, out = post(url + "/v1/chat/completions", strict_body("/v1/chat/completions", max_completion_tokens=6))
    assert code == 200 and out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": " tok" * 6}
    assert out["usage"]["completion_tokens"] == 6 and "timing" not in out
    # the mock's own account: the first token at ttft, and the body written no sooner than the last, 5 itl later
    page = parse_metrics(get(url + "/metrics")[1].decode())
    prefill_s, answered = histogram_mean_delta({}, page, "vllm:request_prefill_time_seconds")
    decode_s, _ = histogram_mean_delta({}, page, "vllm:request_decode_time_seconds")
    assert answered == 1 and prefill_s == pytest.approx(0.1) and decode_s >= 5 * 0.02 - 1e-6


def test_strict_mock_metrics(strict_mock, mock_server):
    assert get(strict_mock + "/metrics")[0] == 404  # a strict OpenAI server has no Prometheus page
    url = mock_server("--strict", "--metrics")
    status, page = get(url + "/metrics")
    assert status == 200 and b"vllm:num_requests_running" in page


def test_mock_metrics_bytes_pads_a_valid_page(mock_server):
    plain = get(mock_server() + "/metrics")[1]
    status, page = get(mock_server("--metrics-bytes", 1_000_000) + "/metrics")
    # at least the asked-for bytes of padding lines (the rest of the page varies by a byte or two from run to
    # run: its timestamps), and the page's own series still there
    padding = sum(len(line) + 1 for line in page.split(b"\n") if b"mock_padding" in line)  # with its HELP, TYPE
    assert status == 200 and padding >= 1_000_000 and b"mock_padding" not in plain
    families = {f.name: f for f in text_string_to_metric_families(page.decode())}
    assert "vllm:num_requests_running" in families
    assert len(families["mock_padding"].samples) > 20_000


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_strict_mock_reject_field(mock_server, path):
    url = mock_server("--strict", "--reject-field", "service_tier")
    assert post(url + path, strict_body(path, service_tier="default")) == refusal(
        422, "Unexpected fields in the request: {'service_tier'}")


def test_default_mock_accepts_extensions_and_sends_timing(mock_server):
    """The contrast: without --strict, ignore_eos and token-id prompts are fine, and usage carries timing."""
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    events, done = stream_events(url + "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True,
                                                           "stream_options": {"include_usage": True}})
    assert done and events[-1]["usage"]["prompt_tokens"] == 3 and "timing" in events[-1]
    assert get(url + "/metrics")[0] == 200


def test_reject_field_usage_errors():
    r = slobench("mock-server", "--reject-field", "service_tier", timeout=60)
    assert r.returncode == 2 and "--reject-field needs --strict" in r.stderr
    r = slobench("mock-server", "--strict", "--reject-field", "ignore_eos", timeout=60)
    assert r.returncode == 2 and "--reject-field ignore_eos: --strict refuses" in r.stderr
