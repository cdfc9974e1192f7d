"""Unit tests of the server's pieces that need no engine: request validation, chat templates, metrics, CLI."""

from __future__ import annotations

import argparse
import types

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.request.config import EngineConfig
from engine.server.api_errors import APIError
from engine.server.api_requests import parse_chat_request, parse_completion_request
from engine.server.api_responses import full_response, timing_dict, usage
from engine.server.chat import PLAIN_CHAT_TEMPLATE, ChatTemplateError, render_chat
from engine.server.metrics import ServerMetrics, buckets_1_2_5
from engine.server.server_args import add_server_arguments, config_from_args

MODELS = ("tiny",)


def _err(fn, body) -> APIError:
    with pytest.raises(APIError) as info:
        fn(body, MODELS, 258)
    return info.value


def test_completion_defaults():
    req = parse_completion_request({"prompt": "hi"}, MODELS, 258)
    assert req.kind == "completion" and req.model == "tiny" and req.tier == "standard"
    assert req.prompt == "hi" and req.max_tokens == 16 and not req.stream and not req.include_usage
    params = req.sampling_params(req.max_tokens)
    assert params.n == 1 and params.temperature == 1.0 and params.stop == []


def test_completion_all_fields():
    req = parse_completion_request(
        {
            "model": "tiny", "prompt": [[1, 2, 3]], "max_tokens": 7, "temperature": 0, "top_p": 0.5,
            "top_k": 4, "seed": 3, "n": 2, "stop": "x", "stop_token_ids": [5], "ignore_eos": True,
            "min_tokens": 2, "stream": True, "stream_options": {"include_usage": True},
            "service_tier": "priority", "user": "me", "unknown_field": 1,
        },
        MODELS, 258,
    )  # fmt: skip
    assert req.prompt == [1, 2, 3] and req.tier == "premium" and req.stream and req.include_usage
    p = req.sampling_params(req.max_tokens)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.n) == (7, 0.0, 0.5, 4, 3, 2)
    assert p.stop == ["x"] and p.stop_token_ids == [5] and p.ignore_eos and p.min_tokens == 2


@pytest.mark.parametrize(
    "tier, expected",
    [(None, "standard"), ("default", "standard"), ("flex", "basic"), ("priority", "premium"),
     ("basic", "basic"), ("auto", "standard")],
)  # fmt: skip
def test_service_tiers(tier, expected):
    assert parse_completion_request({"prompt": "a", "service_tier": tier}, MODELS).tier == expected


@pytest.mark.parametrize(
    "body, param",
    [
        ([], None), ({"prompt": ""}, "prompt"), ({}, "prompt"), ({"prompt": 3}, "prompt"),
        ({"prompt": [1, 999]}, "prompt"), ({"prompt": [1, True]}, "prompt[1]"),
        ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "a", "max_tokens": True}, "max_tokens"), ({"prompt": "a", "max_tokens": 2.0}, "max_tokens"),
        ({"prompt": "a", "temperature": -0.1}, "temperature"), ({"prompt": "a", "top_p": 0}, "top_p"),
        ({"prompt": "a", "top_k": -3}, "top_k"), ({"prompt": "a", "n": 0}, "n"),
        ({"prompt": "a", "stop": [""]}, "stop[0]"), ({"prompt": "a", "stop": {"x": 1}}, "stop"),
        ({"prompt": "a", "min_tokens": 9, "max_tokens": 3}, "min_tokens"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "a", "service_tier": "gold"}, "service_tier"), ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "logprobs": 2}, "logprobs"), ({"prompt": "a", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": "a", "frequency_penalty": float("-inf")}, "frequency_penalty"),
        ({"prompt": "a", "repetition_penalty": 0}, "repetition_penalty"), ({"prompt": "a", "min_p": 1.5}, "min_p"),
        ({"prompt": "a", "logit_bias": {"999": 1}}, "logit_bias"),
        ({"prompt": "a", "logit_bias": {"5": 101}}, "logit_bias"),
        ({"prompt": "a", "logit_bias": {"x": 1}}, "logit_bias"), ({"prompt": "a", "top_p": 10**400}, "top_p"),
        ({"prompt": "a", "best_of": 2.5}, "best_of"), ({"prompt": "a", "stop": ["x" * 300]}, "stop[0]"),
        ({"prompt": "a", "seed": 2**64}, "seed"), ({"prompt": "a", "logprobs": -1}, "logprobs"),
        ({"prompt": "a", "stop_token_ids": [300]}, "stop_token_ids"), ({"prompt": "a", "seed": "x"}, "seed"),
        ({"prompt": "a", "temperature": float("nan")}, "temperature"),
    ],
)  # fmt: skip
def test_completion_rejections_name_the_field(body, param):
    err = _err(parse_completion_request, body)
    assert err.status == 400 and err.param == param
    if param:
        assert param.split("[")[0] in err.message
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}


def test_unknown_model_is_404():
    err = _err(parse_completion_request, {"prompt": "a", "model": "gpt-9"})
    assert err.status == 404 and err.param == "model" and err.code == "model_not_found"


def test_chat_request():
    req = parse_chat_request(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "he"}, {"type": "text", "text": "llo"}]},
            ],
            "max_completion_tokens": 5, "max_tokens": 99, "service_tier": "flex",
        },
        MODELS,
    )  # fmt: skip
    assert req.messages[1] == {"role": "user", "content": "hello"}
    assert req.max_tokens == 5 and req.tier == "basic"
    assert parse_chat_request({"messages": [{"role": "user", "content": "x"}]}, MODELS).max_tokens is None


@pytest.mark.parametrize(
    "body, param",
    [
        ({}, "messages"), ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"), ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
    ],
)  # fmt: skip
def test_chat_rejections_name_the_field(body, param):
    err = _err(parse_chat_request, body)
    assert err.status == 400 and err.param == param


def test_chat_templates():
    messages = [{"role": "user", "content": "hi"}]
    assert render_chat(messages) == "<|user|>\nhi\n<|assistant|>\n"
    assert render_chat(messages, PLAIN_CHAT_TEMPLATE, add_generation_prompt=False) == "<|user|>\nhi\n"
    # A Hugging Face style template: bos_token, loop controls, raise_exception.
    hf = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
        "[{{ m['role'] | upper }}] {{ m['content'] | trim }}{{ eos_token }}{% endfor %}"
        "{% if messages[-1]['role'] == 'assistant' %}{{ raise_exception('last must be user') }}{% endif %}"
    )
    out = render_chat([{"role": "system", "content": "s"}, *messages], hf, bos_token="<s>", eos_token="</s>")
    assert out == "<s>[USER] hi</s>"
    with pytest.raises(ChatTemplateError, match="last must be user"):
        render_chat([{"role": "assistant", "content": "x"}], hf)
    with pytest.raises(ChatTemplateError):
        render_chat(messages, "{% for %}")
    with pytest.raises(ChatTemplateError):  # the sandbox refuses attribute tricks
        render_chat(messages, "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}")


def _fake_output(rid, tier, n_prompt, n_gen, finished, t0=100.0, reason="length"):
    toks = list(range(n_gen))
    timing = None
    if finished:
        times = [t0 + 0.01 + 0.002 * i for i in range(n_gen)]
        timing = types.SimpleNamespace(
            queue_ms=3.0, prefill_ms=7.0, decode_ms=(times[-1] - times[0]) * 1e3, tier=tier, arrival_time=t0,
            first_scheduled_time=t0 + 0.003, first_token_time=times[0], finished_time=times[-1], token_times=times,
        )  # fmt: skip
    comp = types.SimpleNamespace(
        index=0, token_ids=toks, new_token_ids=toks, text="", new_text="", finish_reason=reason if finished else None
    )
    return types.SimpleNamespace(
        request_id=rid, tier=tier, prompt_token_ids=[0] * n_prompt, outputs=[comp], finished=finished, timing=timing
    )


def _samples(text):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_render_and_parse():
    m = ServerMetrics("tiny", max_num_seqs=8, max_model_len=1024)
    m.record_outputs([_fake_output("a", "premium", 5, 4, True), _fake_output("b", "basic", 3, 2, False)])
    stats = types.SimpleNamespace(
        kv_usage=0.25, fragmentation=0.01, prefix_query_tokens=10, prefix_hit_tokens=4, num_running=2,
        num_waiting=1, num_swapped=0, num_preemptions=1, admission_rejections={"basic": 3},
        running_by_tier={"premium": 1, "basic": 1}, waiting_by_tier={"basic": 1},
    )  # fmt: skip
    m.update_stats(stats, now=1.0)
    m.update_stats(stats, now=2.0)  # cumulative counters only count their increase
    s = _samples(m.render().decode())
    base = (("engine", "0"), ("model_name", "tiny"))
    assert s[("vllm:e2e_request_latency_seconds_count", base)] == 1
    assert s[("vllm:request_queue_time_seconds_sum", base)] == pytest.approx(0.003)
    assert s[("vllm:inter_token_latency_seconds_count", base)] == 3
    assert s[("vllm:generation_tokens_total", base)] == 6
    assert s[("vllm:prompt_tokens_total", base)] == 8  # both requests produced their first tokens
    assert s[("vllm:prefix_cache_hits_total", base)] == 4
    assert s[("vllm:num_preemptions_total", base)] == 1
    assert s[("vllm:kv_cache_usage_perc", base)] == 0.25
    assert (
        s[("vllm:request_success_total", (("engine", "0"), ("finished_reason", "length"), ("model_name", "tiny")))] == 1
    )
    tier = lambda t: (("model_name", "tiny"), ("tier", t))
    assert s[("slobench:admission_rejections_total", tier("basic"))] == 3
    assert s[("slobench:batch_fill_ratio", tier("premium"))] == 1 / 8
    assert s[("slobench:time_to_first_token_seconds_count", tier("premium"))] == 1
    assert s[("slobench:time_to_first_token_seconds_count", tier("basic"))] == 0
    assert s[("slobench:kv_cache_usage_perc", tier("premium"))] == pytest.approx(0.125)
    assert ("slobench:output_tokens_per_second", tier("premium")) in s
    # buckets start at 1 ms
    assert (
        s[("vllm:time_to_first_token_seconds_bucket", (("engine", "0"), ("le", "0.001"), ("model_name", "tiny")))] == 0
    )


def test_buckets_1_2_5():
    assert buckets_1_2_5(100) == [1, 2, 5, 10, 20, 50, 100]


def test_cli_maps_onto_engine_config():
    parser = add_server_arguments(argparse.ArgumentParser())
    assert config_from_args(parser.parse_args([])) == EngineConfig()
    args = parser.parse_args(
        ["--model", "tiny", "--max-num-seqs", "8", "--max-num-batched-tokens", "256", "--block-size", "32",
         "--num-kv-blocks", "100", "--no-prefix-caching", "--no-chunked-prefill", "--prefill-chunk-size", "64",
         "--rebatch-interval", "2", "--batching", "static", "--kv-allocation", "contiguous", "--kv-watermark",
         "0.8", "--premium-reserved-kv-frac", "0.1", "--premium-reserved-slots", "2", "--max-waiting-per-tier",
         "premium=4,basic=9", "--seed", "5", "--device", "cpu", "--dtype", "float32", "--port", "0"]
    )  # fmt: skip
    c = config_from_args(args)
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.block_size, c.num_kv_blocks) == (8, 256, 32, 100)
    assert not c.enable_prefix_caching and not c.enable_chunked_prefill and c.prefill_chunk_size == 64
    assert (c.rebatch_interval, c.batching, c.kv_allocation, c.kv_watermark) == (2, "static", "contiguous", 0.8)
    assert (c.premium_reserved_kv_frac, c.premium_reserved_slots, c.seed) == (0.1, 2, 5)
    assert c.max_waiting_per_tier == {"premium": 4, "standard": 512, "basic": 9}
    # the spellings the load generator's scenario options produce
    c = config_from_args(parser.parse_args(["--no-enable-prefix-caching", "--max-waiting-per-tier", '{"basic": 1}']))
    assert not c.enable_prefix_caching and c.max_waiting_per_tier["basic"] == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-waiting-per-tier", "gold=3"])


def test_admission_flags():
    parser = add_server_arguments(argparse.ArgumentParser())
    assert config_from_args(parser.parse_args([])).admission == "slo"
    c = config_from_args(parser.parse_args(["--admission", "queue-length", "--tier-ttft-slo-ms", "standard=500"]))
    assert c.admission == "queue-length" and c.tier_ttft_slo_ms == {"premium": 300, "standard": 500}
    c = config_from_args(parser.parse_args(["--tier-ttft-slo-ms", '{"basic": 5000, "premium": 0}',
                                            "--admission-target-frac", "0.7"]))
    assert c.tier_ttft_slo_ms == {"premium": 0, "standard": 800, "basic": 5000} and c.admission_target_frac == 0.7
    with pytest.raises(SystemExit):
        parser.parse_args(["--admission", "fifo"])
    assert "--admission {slo,queue-length}" in parser.format_help()


def test_response_shapes():
    t = types.SimpleNamespace(queue_ms=1.23456, prefill_ms=2.0, decode_ms=3.0, tier="basic", held_ms=41.00049)
    body = full_response(
        "chat", "id", 1, "tiny", "basic", [(0, "hi", "stop")], usage(3, 1), timing_dict(t, "basic")
    )
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert body["timing"] == {"queue_ms": 1.235, "prefill_ms": 2.0, "decode_ms": 3.0, "tier": "basic", "held_ms": 41.0}
