"""Every sampling knob at its numerical edges, over HTTP, while a neighbour streams (issue 39).

Random values over the whole range JSON allows for each knob (Python's JSON: NaN, ±Infinity, integers of any
size, denormals), alone and combined with n > 1 and a seed: each request either gets a 400 naming a field it
sent, or completes with n choices; the neighbour's greedy stream, running beside it, ends with the tokens it
has alone; the server stays healthy.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine import Engine, EngineConfig
from engine.server.testing import BackgroundServer
from tests.helpers import post_json

pytestmark = pytest.mark.timeout(600)

NEIGHBOUR = {"prompt": [11, 22, 33, 44, 55], "max_tokens": 40, "temperature": 0, "ignore_eos": True,
             "stream": True}
VOCAB = 259  # the tiny preset's byte vocabulary and its specials; ids past it are probed too

floats = st.floats(allow_nan=True, allow_infinity=True)
edge_floats = st.sampled_from([0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-45, 1e-8, 0.5, 1.0,
                               1.0000001, 2.0, 100.0, 1e300, 1.7976931348623157e308, float("inf"), float("-inf"),
                               float("nan"), -5e-324, -1.0, -2.0, -100.0, -1e300])
ints = st.one_of(st.integers(-3, 300), st.integers(-(2**70), 2**70), st.sampled_from([2**63 - 1, 2**64 - 1, 2**64,
                                                                                      -(2**63), -(2**63) - 1]))
numbers = st.one_of(floats, edge_floats, ints)
anything = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=4), st.lists(st.integers(-2, 3), max_size=2))
texts = st.text(max_size=300)

KNOBS = {
    "temperature": st.one_of(numbers, anything),
    "top_p": st.one_of(numbers, anything),
    "top_k": st.one_of(numbers, anything),
    "min_p": st.one_of(numbers, anything),
    "presence_penalty": st.one_of(numbers, anything),
    "frequency_penalty": st.one_of(numbers, anything),
    "repetition_penalty": st.one_of(numbers, anything),
    "logit_bias": st.one_of(anything, st.dictionaries(st.one_of(st.integers(-3, 300).map(str), st.text(max_size=3)),
                                                      numbers, max_size=6)),
    "seed": st.one_of(ints, anything),
    "n": st.one_of(st.integers(-1, 40), anything),
    "best_of": st.one_of(st.integers(-1, 6), anything),
    "logprobs": st.one_of(st.integers(-1, 25), anything),
    "max_tokens": st.one_of(st.integers(-1, 24), ints, anything.filter(lambda v: v is not None)),  # None: the
    # rest of a chat's context, slow here
    "min_tokens": st.one_of(st.integers(-1, 30), ints, anything),
    "stop": st.one_of(anything, texts, st.lists(texts, max_size=20)),
    "stop_token_ids": st.one_of(anything, st.lists(st.one_of(st.integers(-3, 300), ints), max_size=30)),
}
CHAT_KNOBS = {"logprobs": st.one_of(st.booleans(), anything), "top_logprobs": st.one_of(st.integers(-1, 25), anything)}


@pytest.fixture(scope="module")
def server():
    engine = Engine(EngineConfig(model="tiny", admission="queue-length", max_num_seqs=8))
    with BackgroundServer(engine) as srv:
        srv.reference = stream_tokens(srv.url, [])  # the neighbour alone
        yield srv


def stream_tokens(url: str, during: list[dict], chat: bool = False) -> list[str]:
    """The neighbour's streamed text pieces; once its first piece is out, each body of `during` is posted (so
    they share its batch) and its (status, parsed body) appended to `during`'s results."""
    req = urllib.request.Request(url + "/v1/completions", json.dumps(NEIGHBOUR).encode(),
                                 {"Content-Type": "application/json"})
    pieces: list[str] = []
    pending = list(during)
    during.clear()
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 (loopback)
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, f"the neighbour's stream failed: {event}"
            pieces.append(event["choices"][0]["text"])
            while pending:
                body = pending.pop(0)
                path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
                status, raw_body = post_json(url + path, body, timeout=120)
                during.append((body, status, json.loads(raw_body)))
    return pieces


def check_answer(body: dict, status: int, answer: dict) -> None:
    if status == 400:
        param = answer["error"]["param"]
        assert param is not None, answer
        field = param.split("[")[0].split(".")[0]
        assert field in body, f"400 names {param!r}, a field the request did not send: {answer}"
        return
    assert status == 200, f"{status}: {answer} for {body}"
    n = body.get("n") if isinstance(body.get("n"), int) else 1
    assert len(answer["choices"]) == n
    assert all(c["finish_reason"] in ("stop", "length") for c in answer["choices"]), answer


def exercise(server, bodies: list[dict]) -> None:
    results = list(bodies)
    pieces = stream_tokens(server.url, results)
    assert len(results) == len(bodies), "the neighbour ended before the requests beside it were sent"
    for body, status, answer in results:
        check_answer(body, status, answer)
    assert "".join(pieces) == "".join(server.reference), "the neighbour's tokens changed"
    assert urllib.request.urlopen(server.url + "/health", timeout=10).status == 200  # noqa: S310
    server.call(server.engine.check_integrity)


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_each_knob_alone_over_its_whole_range(server, knob):
    @settings(max_examples=6, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(value=KNOBS[knob])
    def check(value):
        exercise(server, [{"prompt": "edge", "max_tokens": 6, knob: value}])

    check()


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(knobs=st.fixed_dictionaries({}, optional=KNOBS), n=st.integers(1, 12), seed=st.one_of(st.none(), ints),
       chat=st.booleans(), chat_knobs=st.fixed_dictionaries({}, optional=CHAT_KNOBS))
@example(knobs={"top_p": 1e-300}, n=1, seed=None, chat=False, chat_knobs={})  # the report
@example(knobs={"temperature": 5e-324, "top_p": 5e-324, "min_p": 1.0}, n=4, seed=2**64 - 1, chat=False, chat_knobs={})
@example(knobs={"repetition_penalty": 1e-300, "presence_penalty": 2.0, "logit_bias": {"5": 100, "6": -100}},
         n=3, seed=0, chat=True, chat_knobs={})
def test_knobs_combined_with_n_and_a_seed(server, knobs, n, seed, chat, chat_knobs):
    body = {"max_tokens": 6, "n": n, **knobs}
    if seed is not None:
        body["seed"] = seed
    if chat:
        body.pop("logprobs", None)
        body.update(chat_knobs, messages=[{"role": "user", "content": "edge"}])
    else:
        body["prompt"] = "edge"
    exercise(server, [body, {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}])
