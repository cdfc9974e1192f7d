"""Synthetic workloads: length distributions, shared system prompts and multi-turn conversations, drawn
with a seed into request specs (:mod:`loadgen.workload.specs`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from loadgen.workload.specs import DEFAULT_TOKEN_RANGE, RequestSpec, Segment


@dataclass(slots=True)
class LengthDist:
    """fixed | uniform | normal | lognormal | empirical, clamped to [min, max] and at least 1."""

    dist: str = "fixed"
    value: int = 128  # fixed
    mean: float = 128.0  # normal; lognormal (mean of the lengths, not of the log)
    std: float = 0.0  # normal
    sigma: float = 0.5  # lognormal: std of log(length)
    min: int = 1
    max: int = 1 << 20
    values: Sequence[int] = field(default_factory=list)  # empirical samples

    KINDS = ("fixed", "uniform", "normal", "lognormal", "empirical")

    def __post_init__(self) -> None:
        if self.dist not in self.KINDS:
            raise ValueError(f"dist must be one of {', '.join(self.KINDS)}, got {self.dist!r}")
        if self.min < 1 or self.max < self.min:
            raise ValueError(f"need 1 <= min <= max, got min={self.min} max={self.max}")
        if self.dist == "empirical" and len(self.values) == 0:
            raise ValueError("empirical distribution needs a non-empty 'values'")

    @property
    def longest(self) -> int:
        """The longest length it draws in practice: the largest value (fixed, uniform, empirical), or for
        the unbounded ones the 99.9th percentile (normal: mean + 3.09 std; lognormal: its own), within max."""
        if self.dist == "fixed":
            top = float(self.value)
        elif self.dist == "empirical":
            top = float(max(self.values))
        elif self.dist == "normal":
            top = self.mean + 3.09 * self.std
        elif self.dist == "lognormal":
            top = float(np.exp(np.log(self.mean) - self.sigma**2 / 2 + 3.09 * self.sigma))
        else:
            top = float(self.max)
        return int(min(max(round(top), self.min, 1), self.max))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.dist == "fixed":
            x = np.full(n, float(self.value))
        elif self.dist == "uniform":
            x = rng.integers(self.min, self.max + 1, size=n).astype(float)
        elif self.dist == "normal":
            x = rng.normal(self.mean, self.std, size=n)
        elif self.dist == "lognormal":
            mu = np.log(self.mean) - self.sigma**2 / 2  # so E[length] == mean
            x = rng.lognormal(mu, self.sigma, size=n)
        else:
            x = rng.choice(np.asarray(self.values, dtype=float), size=n, replace=True)
        return np.clip(np.rint(x), max(self.min, 1), self.max).astype(np.int64)


# ---------------------------------------------------------------- synthetic workload


@dataclass(slots=True)
class SharedPrefix:
    """K system prompts of L tokens; a share ``ratio`` of requests starts with one of them."""

    num_prompts: int = 1
    length: int = 256
    ratio: float = 1.0


@dataclass(slots=True)
class Conversations:
    """Multi-turn chats: each turn's prompt is the whole history plus a new user message.

    ``history: real`` (the default): turn k+1 sends turn k's prompt, the server's actual reply and a new
    user message, ``think_time_s`` after turn k's reply ended (the drivers do it, ``drivers.conversations``;
    the specs of turns >= 1 carry only their user message). ``history: synthetic``: the history is drawn
    here, ``answer_tokens`` random tokens standing in for each reply, and turn k is scheduled at the
    conversation's start + k x ``think_time_s`` whatever the server does."""

    turns: int = 3
    think_time_s: float = 2.0  # the user's pause between a reply and the next message
    answer_tokens: int = 32  # history: synthetic: stand-in for the assistant's reply in the history
    history: str = "real"  # real | synthetic

    HISTORIES = ("real", "synthetic")

    def __post_init__(self) -> None:
        if self.history not in self.HISTORIES:
            raise ValueError(f"history must be one of {', '.join(self.HISTORIES)}, got {self.history!r}")


@dataclass(slots=True)
class SyntheticWorkload:
    input_len: LengthDist = field(default_factory=LengthDist)
    output_len: LengthDist = field(default_factory=lambda: LengthDist(value=64))
    shared_prefix: SharedPrefix | None = None
    tiers: dict[str, float] = field(default_factory=dict)  # tier -> weight; empty: no tier
    conversations: Conversations | None = None
    token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE
    ignore_eos: bool = True

    def generate(self, arrivals: Sequence[float], seed: int = 0) -> list[RequestSpec]:
        """One request per arrival time (a conversation turn counts as a request)."""
        rng = np.random.default_rng(seed)
        n = len(arrivals)
        lo, hi = self.token_range
        in_lens = self.input_len.sample(rng, n)
        out_lens = self.output_len.sample(rng, n)
        tiers = self._tiers(rng, n)
        prefixes: list[list[int]] = []
        use_prefix = np.zeros(n, dtype=bool)
        which = np.zeros(n, dtype=np.int64)
        if self.shared_prefix and self.shared_prefix.num_prompts > 0:
            sp = self.shared_prefix
            prefixes = [rng.integers(lo, hi, sp.length).tolist() for _ in range(sp.num_prompts)]
            use_prefix = rng.random(n) < sp.ratio
            which = rng.integers(0, sp.num_prompts, size=n)
        if self.conversations:
            return self._conversations(arrivals, rng, in_lens, out_lens, tiers, prefixes, use_prefix, which, seed)
        specs = []
        for i, t in enumerate(arrivals):
            body = rng.integers(lo, hi, int(in_lens[i])).tolist()
            prompt = (prefixes[which[i]] + body) if use_prefix[i] else body
            segs = [_segment(("body", seed, i), len(body))]
            if use_prefix[i]:
                segs.insert(0, _segment(("prefix", seed, int(which[i])), len(prefixes[which[i]])))
            specs.append(
                RequestSpec(
                    id=f"r{i}", arrival_s=float(t), prompt=prompt, max_tokens=int(out_lens[i]),
                    tier=tiers[i], ignore_eos=self.ignore_eos, prompt_tokens=len(prompt), segments=_segments(segs),
                )
            )
        return specs

    def _tiers(self, rng: np.random.Generator, n: int) -> list[str | None]:
        if not self.tiers:
            return [None] * n
        names = list(self.tiers)
        w = np.asarray([self.tiers[k] for k in names], dtype=float)
        idx = rng.choice(len(names), size=n, p=w / w.sum())
        return [names[j] for j in idx]

    def _conversations(self, arrivals, rng, in_lens, out_lens, tiers, prefixes, use_prefix, which, seed):
        conv = self.conversations
        lo, hi = self.token_range
        specs: list[RequestSpec] = []
        n = len(arrivals)
        n_conv = -(-n // conv.turns)
        i = 0
        for c in range(n_conv):
            start = float(arrivals[c * conv.turns]) if c * conv.turns < n else float(arrivals[-1])
            history: list[int] = prefixes[which[c]][:] if (prefixes and use_prefix[c]) else []
            segs = [_segment(("prefix", seed, int(which[c])), len(history))]  # the history's text, segment by segment
            for turn in range(conv.turns):
                if i >= n:
                    break
                user = rng.integers(lo, hi, int(in_lens[i])).tolist()
                history = history + user
                segs.append(_segment(("user", seed, c, turn), int(in_lens[i])))
                real = turn > 0 and conv.history == "real"  # the driver prepends the history and the reply
                prompt, prompt_segs = (user, segs[-1:]) if real else (list(history), segs)
                specs.append(
                    RequestSpec(
                        id=f"c{c}t{turn}", arrival_s=start + turn * conv.think_time_s, prompt=prompt,
                        max_tokens=int(out_lens[i]), tier=tiers[c * conv.turns], ignore_eos=self.ignore_eos,
                        prompt_tokens=len(prompt), conversation=f"c{c}", turn=turn,
                        segments=_segments(prompt_segs), follow_up=real, think_time_s=conv.think_time_s,
                    )
                )
                history = history + rng.integers(lo, hi, conv.answer_tokens).tolist()
                segs.append(_segment(("answer", seed, c, turn), conv.answer_tokens))
                i += 1
        specs.sort(key=lambda s: s.arrival_s)
        return specs


def _segment(key: tuple, tokens: int) -> Segment | None:
    return Segment(key, int(tokens)) if tokens > 0 else None


def _segments(segs: list[Segment | None]) -> tuple[Segment, ...]:
    """The text structure of a prompt (``workload.text_prompts``); the token ids stay as they were drawn."""
    return tuple(s for s in segs if s is not None)
