"""The flags ``run``, ``replay`` and ``capacity`` share: the target and how to reach it, the SLO, the workload
and the load, and what they become (a scenario's overrides, the client's credentials, the target's URL).

Precedence: built-in defaults (the ``your-server`` template when no scenario is named) < the scenario file <
these flags (``loadgen/scenario/flags.py`` says how each applies)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadgen.commands.common import UsageError
from loadgen.scenario.flags import ScenarioFlags, SloFlag, parse_slo

SCENARIO_HELP = ("a scenario: a built-in's name (slobench scenarios lists them) or a YAML file; default: the "
                 "your-server template, with the flags below")
SET_HELP = "override a scenario value by its dotted path (repeatable), e.g. search.start=4"
RUN_EXAMPLES = """examples:
  slobench run --target http://127.0.0.1:8000 --input-len 512 --output-len 128 --rate 4 --duration 60
  slobench run --target http://127.0.0.1:8000 --dataset prompts.jsonl --concurrency 16 --requests 500
  slobench run chat --target http://127.0.0.1:8000 --slo ttft:800 --api-key $KEY
  slobench run my-scenario.yaml --set load.rate=8 --out reports/r8

exit codes: 0 done; 1 the target failed or no request succeeded; 2 bad input; 130 Ctrl-C or SIGTERM"""
REPLAY_EXAMPLES = """examples:
  slobench replay ../shared/traces/azure/AzureLLMInferenceTrace_conv.csv --target http://127.0.0.1:8000 \\
      --max-duration 120 --slo ttft:500
  slobench replay sharegpt.json --rate 4 --max-requests 200 --target http://127.0.0.1:8000/v1

exit codes: 0 done; 1 the target failed or no request succeeded; 2 bad input; 130 Ctrl-C or SIGTERM"""
CAPACITY_EXAMPLES = """examples:
  slobench capacity --target http://127.0.0.1:8000 --slo ttft:500 --input-len 512 --output-len 128
  slobench capacity --target http://host:8000/v1 --api-key $KEY --slo ttft:500 --slo tpot:50@p90 \\
      --dataset prompts.jsonl --header 'X-Tenant: perf'
  slobench capacity your-server.yaml --set search.max_duration_s=600
  slobench capacity chat            # the built-in chat scenario on the embedded reference engine

exit codes: 0 a verdict (rated, never_broke, never_met); 1 the target failed; 2 bad input (a target that
refuses the API key, does not serve the model or is not listening included: nothing is sent); 3 verdict
invalid: it rests on a step whose load generator fell behind, even after re-measuring it (the numbers are
saved; do not trust them); 130 Ctrl-C or SIGTERM"""
SLO_HELP = ("an SLO, repeatable: METRIC:MS[@QUANTILE] with METRIC ttft, ttfot (first answer token), tpot, itl (a "
            "request's longest gap between tokens) or e2el, QUANTILE p50 ... p99.9 (default p99) or mean (the "
            "window's mean; a failed request breaks it; left out of goodput), e.g. --slo ttft:500 --slo tpot:50@p90 "
            "or --slo tpot:50@mean; it replaces the scenario's tiers' SLOs (one tier, standard, without a scenario)")


def add_target_args(p: argparse.ArgumentParser) -> None:
    """Which server, which model, how to reach it and how to fit the requests to it."""
    g = p.add_argument_group("target")
    g.add_argument("--target", metavar="URL",
                   help="base URL of an OpenAI-compatible server, with or without /v1, e.g. http://127.0.0.1:8000 "
                        "(default: the scenario's target, else start the reference engine)")
    g.add_argument("--model", help="model name to send (default: the scenario's, else the first of GET /v1/models)")
    g.add_argument("--api-key", metavar="KEY", default=None,
                   help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY when set)")
    g.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="an HTTP header on every request, repeatable (a gateway's tenant or routing header)")
    g.add_argument("--extra-body", metavar="JSON",
                   help="a JSON object merged into every request's body, e.g. '{\"temperature\": 0}'")
    g.add_argument("--tokenizer", type=Path, metavar="DIR|ID",
                   help="the target model's tokenizer: a Hugging Face folder with tokenizer.json, or a model id "
                        "already in the local Hugging Face cache (never downloaded); for text prompts of the "
                        "exact intended token length (default: the server's /tokenize when it has one, else "
                        "approximate lengths, checked against its usage)")
    g.add_argument("--endpoint", choices=("completions", "chat", "responses"),
                   help="the API every request goes to: /v1/completions, /v1/chat/completions or /v1/responses "
                        "(default: the scenario's client.endpoint, else by prompt kind: chat messages to chat, "
                        "the rest to completions)")
    g.add_argument("--no-probe", action="store_true",
                   help="do not probe what the target accepts: send every optional field and token-id prompts "
                        "(a vLLM-like server)")


def add_slo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo", action="append", default=[], metavar="METRIC:MS[@pQ|@mean]", help=SLO_HELP)


def add_workload_args(p: argparse.ArgumentParser, load: bool) -> None:
    """The workload's lengths, a dataset and a shared prefix; with ``load``, the fixed load too (``run``)."""
    g = p.add_argument_group("workload (override the scenario's)")
    g.add_argument("--input-len", metavar="N|MIN:MAX",
                   help="prompt length in tokens: a number, or a uniform range such as 256:1024")
    g.add_argument("--output-len", metavar="N|MIN:MAX",
                   help="answer length in tokens (max_tokens, with ignore_eos where the target takes it)")
    g.add_argument("--dataset", type=Path, metavar="FILE",
                   help="prompts from a file instead of synthetic ones: JSONL with prompt (or messages, and "
                        "optionally max_tokens) per line, or ShareGPT JSON")
    g.add_argument("--prefix-len", type=int, metavar="N", help="a shared prefix (system prompt) of N tokens")
    g.add_argument("--prefix-share", type=float, metavar="F",
                   help="the share of requests that carry the shared prefix (default 1)")
    if load:
        g.add_argument("--rate", type=float, metavar="REQ/S", help="open-loop arrival rate")
        g.add_argument("--concurrency", type=int, metavar="N", help="a closed loop of N users instead of a rate")
        g.add_argument("--duration", type=float, metavar="S", help="send for S seconds")
        g.add_argument("--requests", type=int, metavar="N", help="send N requests")


def slo_flags(args: argparse.Namespace) -> list[SloFlag]:
    """The ``--slo`` flags; a UsageError for a malformed one."""
    from loadgen.scenario.model import ScenarioError

    try:
        return [parse_slo(t) for t in getattr(args, "slo", None) or []]
    except ScenarioError as e:
        raise UsageError(str(e)) from None


def scenario_flags(args: argparse.Namespace) -> ScenarioFlags:
    """The scenario overrides the command line gives; a UsageError for a malformed one."""
    from loadgen.scenario.model import ScenarioError

    g = lambda name: getattr(args, name, None)  # noqa: E731 (not every command has every flag)
    for name in ("rate", "duration"):
        if g(name) is not None and not g(name) > 0:
            raise UsageError(f"--{name} must be > 0, got {g(name):g}")
    for name in ("concurrency", "requests"):
        if g(name) is not None and g(name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {g(name)}")
    try:
        return ScenarioFlags(slos=slo_flags(args), input_len=g("input_len"),
                             output_len=g("output_len"), dataset=g("dataset"), prefix_len=g("prefix_len"),
                             prefix_share=g("prefix_share"), rate=g("rate"), concurrency=g("concurrency"),
                             duration_s=g("duration"), requests=g("requests"))
    except ScenarioError as e:
        raise UsageError(str(e)) from None


def check_driver_support(scn, driver: str) -> None:
    """``client.retries`` and a shed budget need the replayer: Locust's users do not resend a refused request,
    and its ramp judges every refusal."""
    if driver != "locust":
        return
    if getattr(scn, "retries", 0):
        raise UsageError("client.retries: the Locust driver does not resend shed requests; use the default "
                         "driver (--driver aiohttp) or set client.retries: 0")
    if any((getattr(scn, "tier_max_shed", None) or {}).values()):
        raise UsageError("slo.max_shed: the Locust driver judges every refusal; use the default driver "
                         "(--driver aiohttp) for a shed budget")


def target_url(given: str | None) -> str | None:
    """The target's base URL (``/v1`` and a trailing slash dropped); a UsageError for one that is not http(s)."""
    from loadgen.target.access import base_url

    if not given:
        return None
    if not given.startswith(("http://", "https://")):
        raise UsageError(f"--target must be an http(s) URL, got {given!r}")
    return base_url(given)


DEFAULT_SCENARIO = "your-server"  # the built-in defaults: the template a user copies for their own server


def scenario_from_args(args: argparse.Namespace, needs_slo: bool = False):
    """The scenario of ``run`` or ``capacity``: the named one (a built-in or a file; the ``your-server``
    template when none), ``--set`` and the flags applied, ``--seed``. ``needs_slo``: without a named scenario
    an SLO must be given (a rating against a default promise would rate the wrong thing)."""
    from loadgen.scenario.builtin import embedded_engine_note, resolve_scenario
    from loadgen.scenario.model import ScenarioError
    from loadgen.scenario.parse import load_scenario

    flags = scenario_flags(args)
    if needs_slo and not args.scenario and not flags.slos:
        raise UsageError("no SLO to rate against: give one, e.g. --slo ttft:500 (p99 TTFT under 500 ms), or name a "
                         "scenario (slobench scenarios lists the built-in ones)")
    try:
        path = resolve_scenario(args.scenario or DEFAULT_SCENARIO)
        scn = load_scenario(path, overrides=list(getattr(args, "set", None) or []), flags=flags)
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    if args.seed is not None:
        scn.seed = args.seed
        if scn.trace_options:
            scn.trace_options.seed = args.seed
    if getattr(args, "target", None) and (note := embedded_engine_note(path)):
        print(note, file=sys.stderr)
    return scn, path
