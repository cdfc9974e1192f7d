"""What slobench sends to a target, fitted to what the probe found it accepts.

``fit_request_shape`` turns ``probe.Capabilities`` into a ``RequestShape`` (the optional fields sent,
the endpoint, whether prompts must be text) and a list of what was dropped, with what that means for
the numbers. A field the user asked for explicitly (``workload.ignore_eos: true``, ``client.send_tier:
true``) that the target rejects is an error before any load is sent, not a silent drop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.request.tiers import TIER_NAME_RANK
from loadgen.target.capabilities import ENDPOINT_PATHS, Capabilities

# servers that serve the highest priority value first (SGLang, unless --schedule-low-priority-values-first);
# vLLM, and any server not recognised, serve the lowest first
HIGHER_FIRST = frozenset({"sglang"})


class TargetFitError(ValueError):
    """The target rejects something the user asked for explicitly (one line, for the CLI)."""


@dataclass(slots=True)
class RequestShape:
    """The optional parts of a request body (docs/ARCHITECTURE.md, "The reference engine's HTTP API")."""

    ignore_eos: bool = True  # send a spec's ignore_eos (vLLM, SGLang, slobench: enforce max_tokens)
    include_usage: bool = True  # stream_options.include_usage: token counts in the final chunk
    service_tier: bool = True  # send a spec's tier as service_tier
    text_prompts: bool = False  # token-id prompts become text before they are sent (strict servers)
    chat: bool = False  # every prompt goes to /v1/chat/completions (a target without /v1/completions)
    endpoint: str | None = None  # completions | chat | responses, as asked (--endpoint); None: by prompt kind
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage in every chunk (tokens per chunk)
    priorities: dict[str, int] = field(default_factory=dict)  # tier -> the request's ``priority``; {}: none sent
    tier_headers: dict[str, dict[str, str]] = field(default_factory=dict)  # tier -> headers its requests carry

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tier_priorities(tiers: Iterable[str], server: str, explicit: Mapping[str, int] | None = None) -> dict[str, int]:
    """Each tier's ``priority`` value: the one set in the scenario (``tiers.<t>.priority``), else its rank among
    the tiers (premium 0, standard 1, basic 2, in vLLM's convention: lower is served first), reversed for a
    server that serves the highest value first (``HIGHER_FIRST``)."""
    explicit = dict(explicit or {})
    order = sorted(tiers, key=lambda t: TIER_NAME_RANK.get(t, len(TIER_NAME_RANK)))
    top = len(order) - 1
    return {t: explicit.get(t, top - i if server in HIGHER_FIRST else i) for i, t in enumerate(order)}


def priority_note(priorities: Mapping[str, int], server: str) -> str:
    order = "highest" if server in HIGHER_FIRST else "lowest"
    return ("each tier's requests carry a priority (" + ", ".join(f"{t} {p}" for t, p in priorities.items())
            + f"; {server if server != 'unknown' else 'the server'} serves the {order} value first when it schedules "
            "by priority: vLLM with --scheduling-policy priority; under FCFS it accepts the field and ignores it)")


@dataclass
class TargetFit:
    shape: RequestShape
    dropped: list[str] = field(default_factory=list)  # what the workload would send but the target rejects
    notes: list[str] = field(default_factory=list)  # what the run does instead, and what it means

    def as_dict(self) -> dict[str, Any]:
        return {"shape": self.shape.as_dict(), "dropped": list(self.dropped), "notes": list(self.notes)}


def fit_request_shape(caps: Capabilities, *, explicit: Iterable[str] = (), uses_tiers: bool = True,
                      token_prompts: bool = True, endpoint: str | None = None,
                      priorities: Mapping[str, int] | None = None) -> TargetFit:
    """The request shape for a workload against a target: ``explicit`` names the fields the user asked
    for (errors when rejected); ``uses_tiers`` / ``token_prompts`` say whether the workload has tiers and
    token-id prompts at all (nothing to drop otherwise); ``endpoint`` is the one asked for (``--endpoint``,
    ``client.endpoint``), None for the default: by prompt kind; ``priorities`` the tiers' priority values to
    send (None or empty: none), sent only when the target accepts ``priority``."""
    explicit = set(explicit)
    if endpoint is not None and not caps.has_endpoint(endpoint):
        raise TargetFitError(f"--endpoint {endpoint}: the target does not answer {ENDPOINT_PATHS[endpoint]}")
    for name in sorted(explicit):
        if name == "service_tier" and not caps.accepts("service_tier"):
            raise TargetFitError(f"client.send_tier: the target rejects service_tier "
                                 f"({caps.rejections.get('service_tier', 'not accepted')})")
        if name == "priority" and not caps.accepts("priority"):
            raise TargetFitError(f"client.send_priority: the target rejects priority "
                                 f"({caps.rejections.get('priority', 'not accepted')})")
        if name == "ignore_eos" and not caps.accepts("ignore_eos"):
            raise TargetFitError(f"workload.ignore_eos: the target rejects ignore_eos "
                                 f"({caps.rejections.get('ignore_eos', 'not accepted')}); set ignore_eos: false "
                                 "to let it stop at its end-of-sequence token")
    responses = endpoint == "responses"
    shape = RequestShape(ignore_eos=caps.accepts("ignore_eos"), include_usage=caps.accepts("include_usage"),
                         service_tier=caps.accepts("service_tier"),
                         chat=endpoint == "chat" or (endpoint is None and not caps.completions),
                         text_prompts=responses or not caps.token_prompts, endpoint=endpoint,
                         continuous_usage=not responses and caps.continuous_usage,
                         priorities=dict(priorities or {}) if caps.accepts("priority") else {})
    dropped = [name for name, sent, needed in (("ignore_eos", shape.ignore_eos, True),
                                               ("priority", bool(shape.priorities), bool(priorities)),
                                               ("include_usage", shape.include_usage, not responses),
                                               ("service_tier", shape.service_tier, uses_tiers),
                                               ("token_prompts", not shape.text_prompts,
                                                token_prompts and not responses))
               if needed and not sent]
    notes = caps.notes(dropped=dropped)
    if shape.priorities:
        notes.append(priority_note(shape.priorities, caps.server))
    if not shape.continuous_usage and not responses:
        notes.append("no usage in every chunk (stream_options.continuous_usage_stats): tokens per chunk are not "
                     "known, so each chunk counts as one token for ITL (chunk_tokens null)")
    if responses:
        notes.append("requests go to the Responses API (/v1/responses): prompts are sent as text (or chat messages) "
                     "as input, max_output_tokens caps the answer, usage comes with response.completed; tokens per "
                     "event are not known, so each text delta counts as one token for ITL")
    elif shape.chat and endpoint is None:
        notes.append("the target has no /v1/completions: every prompt is sent as a chat message to "
                     "/v1/chat/completions (its template adds tokens, accounted for in the prompt lengths)")
    return TargetFit(shape, dropped, notes)
