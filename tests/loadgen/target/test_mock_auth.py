"""`slobench mock-server --api-key / --models / --check-model / --log-requests`: what the mock lets in, in vLLM's
words, and what it logs it received (so client-side flags such as --api-key, --header and --extra-body can be
asserted server-side). HTTP-level tests: raw requests, raw status codes and bodies."""

from __future__ import annotations

import json
import urllib.request

import pytest

from loadgen.target.discovery import error_text
from tests.helpers import MockServers, slobench

KEY = "sk-test-123"
CHAT = [{"role": "user", "content": "Hello"}]
# every route the mock answers under /v1, with a body it serves
ROUTES = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"model": "alpha", "prompt": "Hello", "max_tokens": 2, "stream": True}),
    ("POST", "/v1/chat/completions", {"model": "alpha", "messages": CHAT, "max_tokens": 2, "stream": True}),
    ("POST", "/v1/responses", {"model": "alpha", "input": "Hello", "max_output_tokens": 2, "stream": True}),
]
NOT_FOUND = {"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "code": 404}}


def call(url: str, method: str, path: str, body: dict | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data, {"Content-Type": "application/json", **(headers or {})},
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 (loopback)
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A mock with every new flag on: (url, request log path)."""
    log = tmp_path_factory.mktemp("mock-auth") / "requests.jsonl"
    servers = MockServers()
    try:
        url = servers("--ttft-ms", 1, "--itl-ms", 1, "--api-key", KEY, "--models", "alpha,beta", "--check-model",
                      "--log-requests", log)
        yield url, log
    finally:
        servers.stop_all()


def logged(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
def test_api_key_guards_every_v1_path(guarded, method, path, body):
    url, _ = guarded
    unauthorized = (401, b'{"error": "Unauthorized"}')  # vLLM's --api-key answer, byte for byte
    assert call(url, method, path, body) == unauthorized
    assert call(url, method, path, body, bearer("sk-wrong")) == unauthorized
    assert call(url, method, path, body, {"Authorization": KEY}) == unauthorized  # no scheme
    status, raw = call(url, method, path, body, bearer(KEY))
    assert status == 200, raw
    assert call(url, method, path, body, {"Authorization": f"bearer {KEY}"})[0] == 200  # the scheme in any case


def test_health_and_metrics_stay_open(guarded):
    url, _ = guarded
    assert call(url, "GET", "/health") == (200, b"ok")
    status, page = call(url, "GET", "/metrics")
    assert status == 200
    assert b"vllm:" in page


def test_request_log_has_method_path_headers_and_body(guarded):
    url, log = guarded
    body = {"model": "beta", "prompt": "logged", "max_tokens": 1, "stream": True, "extra": {"top_k": 5}}
    assert call(url, "POST", "/v1/completions", body, {**bearer(KEY), "X-Trace-Tag": "t-1"})[0] == 200
    assert call(url, "POST", "/v1/completions", body, {"X-Trace-Tag": "t-2"})[0] == 401
    assert call(url, "GET", "/v1/models", None, {**bearer(KEY), "X-Trace-Tag": "t-3"})[0] == 200
    lines = {e["headers"].get("x-trace-tag"): e for e in logged(log)}
    served, refused, listed = lines["t-1"], lines["t-2"], lines["t-3"]
    assert (served["method"], served["path"], served["body"]) == ("POST", "/v1/completions", body)
    assert served["headers"]["authorization"] == f"Bearer {KEY}"
    assert served["headers"]["content-type"] == "application/json"
    assert all(name == name.lower() for name in served["headers"])
    assert refused["body"] == body and "authorization" not in refused["headers"]  # logged before the check
    assert (listed["method"], listed["path"], listed["body"]) == ("GET", "/v1/models", None)


def test_check_model_answers_vllm_404_and_serves_every_name(guarded):
    url, _ = guarded
    for method, path, body in ROUTES[1:]:
        status, raw = call(url, method, path, {**body, "model": "nope"}, bearer(KEY))
        assert (status, json.loads(raw)) == (404, NOT_FOUND), path
    status, raw = call(url, "GET", "/v1/models", None, bearer(KEY))
    assert [m["id"] for m in json.loads(raw)["data"]] == ["alpha", "beta"]
    for name in ("alpha", "beta"):  # an answer carries the name asked for
        status, raw = call(url, "POST", "/v1/completions", {**ROUTES[1][2], "model": name}, bearer(KEY))
        first = json.loads(raw.split(b"data: ", 2)[1].split(b"\n", 1)[0])
        assert (status, first["model"]) == (200, name)
    no_model = {k: v for k, v in ROUTES[2][2].items() if k != "model"}
    assert call(url, "POST", "/v1/chat/completions", no_model, bearer(KEY))[0] == 200  # none named: the first


def test_default_mock_needs_no_key_and_serves_any_model(mock_server):
    url = mock_server("--ttft-ms", 1, "--itl-ms", 1)
    status, raw = call(url, "POST", "/v1/completions", {**ROUTES[1][2], "model": "anything"})
    assert status == 200, raw
    assert json.loads(raw.split(b"data: ", 2)[1].split(b"\n", 1)[0])["model"] == "mock"
    assert json.loads(call(url, "GET", "/v1/models")[1])["data"] == [{"id": "mock", "object": "model"}]


def test_error_text_reads_the_mocks_401_and_404(guarded):
    url, _ = guarded
    status, raw = call(url, "POST", "/v1/chat/completions", ROUTES[2][2])
    assert error_text(raw, status) == "HTTP 401: Unauthorized (a missing or wrong API key: --api-key)"
    status, raw = call(url, "POST", "/v1/chat/completions", {**ROUTES[2][2], "model": "nope"}, bearer(KEY))
    assert error_text(raw, status) == "HTTP 404: The model `nope` does not exist."
    # OpenAI's own 401 shape reads as its message, with the same hint
    openai_401 = json.dumps({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                       "code": "invalid_api_key"}}).encode()
    assert error_text(openai_401, 401) == "HTTP 401: Incorrect API key provided (a missing or wrong API key: --api-key)"


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "a", "--models", "b,c"], "pass --model or --models, not both"),
    (["--models", "a,,b"], "must not be empty"),
    (["--api-key", ""], "must not be empty"),
    (["--log-requests", "/nonexistent-dir/x.jsonl"], "no such directory"),
])
def test_bad_flags_are_usage_errors(args, message):
    r = slobench("mock-server", "--port", 1, *args, timeout=60)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
