"""The rated capacity in words: one headline, said the same way everywhere.

The headline is the *offered* rate (``rated_capacity.rate_rps``), with the requested rate beside it
(``requested_rps``); on the concurrency axis the throughput at the rated number of users. The summary
keeps it as ``headline``; ``verdict_text`` begins with it; the console prints it once and then the
search's account of its steps (``search_text``), which speaks in the search's own loads (requested) and
says so. The search (``capacity/search.py``) words its verdict in requested loads; this module takes that
text apart at its head, so the headline's number is never contradicted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loadgen.capacity.search import fmt_load as fmt  # the search words its loads so

INVALID_SEP = "; the steps say: "  # the search's text of an invalid verdict: "INVALID (why); the steps say: ..."
RATED_HEAD = "rated capacity "


def headline(rated: dict[str, Any] | None, search_verdict: str | None, axis: str) -> str | None:
    """``rated capacity 60.2 req/s offered (requested 61.3 req/s)`` (``at least`` when the SLOs never broke);
    ``rated capacity 30.1 req/s at 32 users`` on the concurrency axis; None without a rating."""
    if not rated or search_verdict not in ("rated", "never_broke") or rated.get("rate_rps") is None:
        return None
    at_least = "at least " if search_verdict == "never_broke" else ""
    text = f"rated capacity {at_least}{fmt(rated['rate_rps'])} req/s"
    if axis == "concurrency":
        return text + (f" at {rated['load']:.0f} users" if rated.get("load") is not None else "")
    if rated.get("requested_rps") is not None:
        text += f" offered (requested {fmt(rated['requested_rps'])} req/s)"
    return text


def interval_span(rated: dict[str, Any], number: Callable[[Any], str] = lambda x: f"{x:.3g}") -> str:
    """``30.1–35.2``; an end the windows could not bound (``ci_unbounded``) is the word ``unbounded``, never
    the search's reach printed as if it were a bound."""
    open_ends = rated.get("ci_unbounded") or rated.get("unbounded") or ()  # a summary's, or the report's
    low = "unbounded" if "low" in open_ends else number(rated["ci_low"])
    high = "unbounded" if "high" in open_ends else number(rated["ci_high"])
    return f"{low}–{high}"


def split_invalid(text: str) -> tuple[str, str]:
    """(the ``INVALID (...); the steps say: `` prefix or "", the search's account)."""
    if text.startswith("INVALID (") and INVALID_SEP in text:
        i = text.index(INVALID_SEP) + len(INVALID_SEP)
        return text[:i], text[i:]
    return "", text


def search_account(text: str, search_verdict: str | None, axis: str) -> str:
    """The search's text without its own head, in words that say its loads were requested: ``rated
    capacity 61.3 req/s: every SLO held there and broke at 65 req/s ...`` becomes ``every SLO held at 61.3
    req/s requested and broke at 65 req/s ...``; ``never broke: every SLO held up to 61.3 req/s ...``
    gains ``requested``. Other texts (never_met) are left as they are."""
    prefix, body = split_invalid(text)
    unit = " req/s"
    if search_verdict == "rated" and body.startswith(RATED_HEAD) and ": every SLO held there" in body:
        head, rest = body.split(": every SLO held there", 1)
        load = head[len(RATED_HEAD):]
        if axis == "rate" and load.endswith(unit):
            load += " requested"
        body = f"every SLO held at {load}{rest}"
    elif search_verdict == "never_broke" and axis == "rate":
        lead = "never broke: every SLO held up to "
        if body.startswith(lead) and unit in body:
            i = body.index(unit) + len(unit)
            body = body[:i] + " requested" + body[i:]
    return prefix + body


def verdict_text(text: str, rated: dict[str, Any] | None, search_verdict: str | None, axis: str) -> tuple[str, str]:
    """(``verdict_text``, ``search_text``) from the search's text: the headline, then the search's account."""
    account = search_account(text, search_verdict, axis)
    head = headline(rated, search_verdict, axis)
    if head is None:
        return account, account
    prefix, body = split_invalid(account)
    joint = ": " if search_verdict == "rated" else "; "  # never_broke: its account has a head of its own
    return f"{prefix}{head}{joint}{body}", account
