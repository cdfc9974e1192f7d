"""The service tiers: the engine's three in rank order, and OpenAI's service_tier names that map onto them.

Plain data (no torch): the scheduler, the HTTP front end and the load generator all read the tiers from here.
"""

from __future__ import annotations

TIERS = ("premium", "standard", "basic")  # rank order: the first is served first
TIER_RANK = {tier: rank for rank, tier in enumerate(TIERS)}  # lower rank = higher priority (vLLM's convention)
DEFAULT_TIER = "standard"  # a request that names no tier
# OpenAI's service_tier values map onto ours.
TIER_ALIASES = {"priority": "premium", "default": "standard", "auto": "standard", "flex": "basic"}
TIER_NAMES = TIERS + tuple(TIER_ALIASES)  # every service_tier value a request may carry: ours, then OpenAI's
# the rank of every service_tier value, OpenAI's ranking as the tier it maps onto
TIER_NAME_RANK = {name: TIER_RANK[TIER_ALIASES.get(name, name)] for name in TIER_NAMES}


def normalize_tier(tier: str | None) -> str:
    """Map a request's service_tier (ours or OpenAI's) to one of TIERS; raise ValueError otherwise."""
    if tier is None:
        return DEFAULT_TIER
    tier = TIER_ALIASES.get(tier, tier)
    if tier not in TIERS:
        raise ValueError(f"service_tier must be one of {', '.join(TIERS)} (or priority/default/flex)")
    return tier
