"""Before any load: find the model, probe what the target accepts, fit the requests to it, and make the
workload's prompts text of their intended length when the target takes only text.

``prepare_target`` runs once per run (fixed or capacity), before the clock starts; ``PreparedTarget.adapt``
converts each batch of request specs (a fixed run's, or each capacity step's) in place. The tokenizer
that measures the text is, in order: ``--tokenizer DIR``; the server's own ``/tokenize``; none — then
lengths are approximate (about one token per word), the summary says so, and the server's usage counts
show the real lengths (``summary.prompt_length``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.target.access import Access, check_target
from loadgen.target.capabilities import PROBE_TEXT, Capabilities, probe_capabilities
from loadgen.target.request_shape import (
    RequestShape,
    TargetFit,
    fit_request_shape,
    priority_note,
    tier_priorities,
)
from loadgen.target.tokenize import ServerTokenizer
from loadgen.workload.exact_text import TextMaker
from loadgen.workload.specs import RequestSpec
from loadgen.workload.text_prompts import to_text
from loadgen.workload.tokenizer import Tokenizer, WordTokenizer, load_tokenizer


@dataclass
class TargetOptions:
    """How to fit the requests to the target (the command line and the scenario's ``client`` section)."""

    probe: bool = True  # False: trust the target to accept every field and token-id prompts
    tokenizer_dir: Path | None = None
    access: Access = field(default_factory=Access)  # --api-key, --header: on every request
    extra_body: dict[str, Any] = field(default_factory=dict)  # --extra-body: merged into every request's body
    explicit: set[str] = field(default_factory=set)  # fields asked for explicitly: an error when rejected
    send_tier: bool | None = None  # False: never send tiers; None: when accepted
    send_priority: bool | None = None  # False: never send priorities; None: with 2+ tiers, when accepted
    tier_priority: dict[str, int] = field(default_factory=dict)  # tiers.<t>.priority, set explicitly
    tier_headers: dict[str, dict[str, str]] = field(default_factory=dict)  # tiers.<t>.headers
    continuous_usage: bool | None = None  # False: never ask for usage in every chunk; None: when accepted
    endpoint: str | None = None  # completions | chat | responses (--endpoint, client.endpoint); None: by prompt kind


@dataclass
class PreparedTarget:
    model: str
    fit: TargetFit
    caps: Capabilities | None = None  # None: not probed
    maker: TextMaker | None = None  # texts of exact lengths, when prompts must be text
    tokenizer_source: str | None = None
    overhead_tokens: int = 0  # tokens the server adds to every prompt (BOS, the chat template)
    warnings: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # what every request carries (Authorization, --header)
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request's body

    @property
    def shape(self) -> RequestShape:
        return self.fit.shape

    def adapt(self, specs: list[RequestSpec]) -> None:
        """Make the specs' prompts what the target takes (in place; a no-op for a lenient target)."""
        if self.maker is not None:
            self.maker = to_text(specs, self.maker, chat=self.shape.chat, overhead_tokens=self.overhead_tokens)

    def as_summary(self) -> dict[str, Any]:
        """The ``target_probe`` and ``request_fit`` keys of ``summary.json``."""
        fit = self.fit.as_dict() | {"tokenizer": self.tokenizer_source, "overhead_tokens": self.overhead_tokens}
        fit["notes"] = list(fit["notes"]) + list(self.warnings)  # what preparing the text adds to the fit's own
        return {"target_probe": self.caps.as_dict() if self.caps else None, "request_fit": fit}


def prepare_target(target: str, model: str | None, specs: list[RequestSpec], opts: TargetOptions) -> PreparedTarget:
    """Blocking (call it before the run's event loop starts). Raises AccessError (nothing listens, the
    credentials are refused, the model is not served), TargetError (no model to send), ProbeError (it answers
    no completion request), TargetFitError (an explicit field is rejected), TokenizerError (a bad
    ``--tokenizer`` folder)."""
    headers = opts.access.http_headers()
    tokenizer = load_tokenizer(opts.tokenizer_dir) if opts.tokenizer_dir else None  # a bad folder fails first
    model = check_target(target, model, headers)
    prepared = _prepare(target, model, specs, opts, tokenizer, headers)
    prepared.headers, prepared.extra_body = headers, dict(opts.extra_body)
    return prepared


def _prepare(target: str, model: str, specs: list[RequestSpec], opts: TargetOptions, tokenizer: Tokenizer | None,
             headers: dict[str, str]) -> PreparedTarget:
    real_history = any(s.follow_up for s in specs)  # token ids cannot carry the server's reply: text or chat
    tiers = sorted({s.tier for s in specs if s.tier})
    if not opts.probe:
        wanted = wanted_priorities(tiers, "unknown", opts)
        shape = RequestShape(service_tier=opts.send_tier is not False, endpoint=opts.endpoint,
                             chat=opts.endpoint == "chat", priorities=wanted, tier_headers=dict(opts.tier_headers))
        notes = ["the target was not probed (--no-probe): every optional field and token-id prompts are sent"]
        prepared = PreparedTarget(model, TargetFit(shape, notes=notes + ([priority_note(wanted, "unknown")]
                                                                         if wanted else [])))
        if real_history:
            prepared.maker = TextMaker(tokenizer or WordTokenizer())
            prepared.tokenizer_source = (f"--tokenizer {tokenizer.name}" if tokenizer
                                         else "none: about one token per word")
            prepared.warnings.append(HISTORY_NOTE.format(kind="text"))
        return prepared
    caps = asyncio.run(probe_capabilities(target, model, headers, endpoint=opts.endpoint, extra_body=opts.extra_body))
    fit = fit_request_shape(caps, explicit=opts.explicit, uses_tiers=bool(tiers),
                            token_prompts=any(s.kind == "tokens" for s in specs), endpoint=opts.endpoint,
                            priorities=wanted_priorities(tiers, caps.server, opts))
    fit.shape.tier_headers = dict(opts.tier_headers)
    if opts.send_tier is False:
        fit.shape.service_tier = False
    if opts.continuous_usage is False and fit.shape.continuous_usage:
        fit.shape.continuous_usage = False
        fit.notes.append("client.continuous_usage: false: usage only in the final chunk, so each chunk counts as one "
                         "token for ITL (chunk_tokens null)")
    prepared = PreparedTarget(model, fit, caps)
    if real_history and not (fit.shape.text_prompts or fit.shape.chat):
        fit.shape.chat = caps.chat  # the main path: the reply goes back as an assistant message
        prepared.warnings.append(HISTORY_NOTE.format(kind="chat messages" if caps.chat else "text"))
    if fit.shape.text_prompts or fit.shape.chat or real_history:
        _text_source(prepared, target, tokenizer, headers)
    return prepared


def wanted_priorities(tiers: list[str], server: str, opts: TargetOptions) -> dict[str, int]:
    """The tiers' priorities to send, if the target takes them: none with one tier (unless asked for), none
    when ``client.send_priority`` is false, none to the reference engine (it schedules by ``service_tier``)."""
    if opts.send_priority is False or server == "slobench" or not tiers:
        return {}
    if len(tiers) < 2 and not opts.send_priority and not opts.tier_priority:
        return {}
    return tier_priorities(tiers, server, opts.tier_priority)


HISTORY_NOTE = ("conversations with real history are sent as {kind}: each turn carries the previous prompt, the "
                "server's actual reply and the new user message (a reply's token ids are not known); turns after "
                "the first have no intended prompt length (prompt_length compares first turns only)")


def _text_source(prepared: PreparedTarget, target: str, tokenizer: Tokenizer | None,
                 headers: dict[str, str]) -> None:
    """The tokenizer the texts are measured with, and the tokens the server adds to each prompt."""
    caps = prepared.caps
    if tokenizer is not None:
        prepared.tokenizer_source = f"--tokenizer {tokenizer.name}"
    elif caps.tokenize_endpoint:
        tokenizer = ServerTokenizer(target, prepared.model, headers=headers)
        prepared.tokenizer_source = f"the server's /tokenize ({prepared.model})"
    else:
        tokenizer = WordTokenizer()
        prepared.tokenizer_source = "none: about one token per word"
        prepared.warnings.append("no tokenizer for the target's model (pass --tokenizer DIR): prompt lengths are "
                                 "approximate, about one token per word; the server's usage counts are the real "
                                 "ones (summary: prompt_length)")
    endpoint = "responses" if prepared.shape.endpoint == "responses" else "chat" if prepared.shape.chat \
        else "completions"
    counted = caps.probe_prompt_tokens.get(endpoint)
    if counted is not None and not isinstance(tokenizer, WordTokenizer):
        # what the server adds to every prompt (a BOS, the chat template): the texts are that much shorter
        prepared.overhead_tokens = max(0, counted - len(tokenizer.encode(PROBE_TEXT)))
    prepared.maker = TextMaker(tokenizer)
