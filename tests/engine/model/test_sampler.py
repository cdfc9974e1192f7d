"""The sampler draws from the distribution its parameters define, batched, and seeded rows stay reproducible."""

from __future__ import annotations

import math

import torch

from engine.model.sampler import Sampler, inverse_cdf
from engine.request.sampling import SamplingParams
from engine.request.sequence import Sequence

EOS = 3


def seq(params: SamplingParams, *, outputs: int = 0, seeded: bool = False) -> Sequence:
    s = Sequence("r", 0, [7] * (4 + outputs), 4, params, "standard", 0.0)
    if seeded:
        s.generator = Sampler(torch.device("cpu"), [EOS]).generator_for(params, 0)
    return s


def draw_many(probs: list[float], params: SamplingParams, rows: int = 20_000) -> list[int]:
    logits = torch.tensor(probs).log().expand(rows, -1).contiguous()
    return Sampler(torch.device("cpu"), [EOS]).sample(logits, [seq(params) for _ in range(rows)])


def test_drawn_frequencies_match_the_softmax():
    torch.manual_seed(0)
    probs = [0.1, 0.2, 0.3, 0.4, 0.0]  # the last has no mass: never drawn
    tokens = draw_many(probs, SamplingParams(temperature=1.0, ignore_eos=True))
    n = len(tokens)
    for token, p in enumerate(probs):
        observed = tokens.count(token) / n
        assert abs(observed - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (token, observed, p)


def test_temperature_sharpens_the_distribution():
    torch.manual_seed(1)
    probs = [0.25, 0.75]
    tokens = draw_many(probs, SamplingParams(temperature=0.5))
    expected = 0.75**2 / (0.75**2 + 0.25**2)  # p^(1/T), renormalised
    observed = tokens.count(1) / len(tokens)
    assert abs(observed - expected) <= 4 * math.sqrt(expected * (1 - expected) / len(tokens))


def test_top_k_and_top_p_never_draw_outside_their_set():
    torch.manual_seed(2)
    probs = [0.05, 0.1, 0.15, 0.3, 0.4]
    assert set(draw_many(probs, SamplingParams(top_k=2), rows=4000)) == {3, 4}
    assert set(draw_many(probs, SamplingParams(top_p=0.6), rows=4000)) == {3, 4}  # 0.4 + 0.3 reaches 0.6


def test_greedy_and_drawn_rows_share_one_batch():
    torch.manual_seed(3)
    logits = torch.tensor([[0.0, 5.0, 1.0], [9.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    seqs = [seq(SamplingParams(temperature=0)), seq(SamplingParams(top_k=1)), seq(SamplingParams(temperature=0))]
    assert Sampler(torch.device("cpu"), [EOS]).sample(logits, seqs) == [1, 0, 2]


def test_min_tokens_bans_eos_until_reached():
    logits = torch.tensor([[0.0, 0.0, 0.0, 50.0]])  # EOS (3) is all but certain
    sampler = Sampler(torch.device("cpu"), [EOS])
    early = seq(SamplingParams(min_tokens=2, max_tokens=8), outputs=1)
    assert sampler.sample(logits, [early]) != [EOS]
    assert sampler.sample(logits, [seq(SamplingParams(min_tokens=2, max_tokens=8), outputs=2)]) == [EOS]
    assert logits[0, EOS] == 50.0  # the caller's logits are untouched


def test_a_seeded_row_draws_the_same_tokens_whatever_shares_its_batch():
    params = SamplingParams(seed=1234, temperature=1.0)
    mine_logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    sampler = Sampler(torch.device("cpu"), [EOS])

    def run(batch_rows: int, position: int) -> list[int]:
        mine = seq(params, seeded=True)
        out = []
        for _ in range(5):
            logits = torch.randn(batch_rows, 1000)
            logits[position] = mine_logits
            batch = [seq(SamplingParams(temperature=1.0)) for _ in range(batch_rows)]
            batch[position] = mine
            out.append(sampler.sample(logits, batch)[position])
        return out

    alone = run(1, 0)
    assert len(set(alone)) > 1  # five draws from a flat-ish distribution: not one token repeated
    assert run(6, 3) == alone
    assert run(4, 0) == alone


def test_the_two_level_search_lands_in_the_cdf_interval_of_its_point():
    """Against a float64 CDF over the whole vocabulary: the token found is the one whose interval holds the
    point (up to float32 rounding), for vocabularies that tile into blocks and for a prime one that is padded."""
    gen = torch.Generator().manual_seed(5)
    for vocab in (32_000, 32_003, 7, 1):
        weights = torch.rand(64, vocab, generator=gen) ** 4
        weights[:, ::3] = 0.0  # tokens without mass, among the rest
        weights[:, -1] = 1.0  # at least one with it
        uniform = torch.rand(64, generator=gen)
        uniform[:2] = torch.tensor([0.0, 1.0 - 2**-24])  # the edges of [0, 1)
        tokens = inverse_cdf(weights, uniform)
        cdf = weights.double().cumsum(-1)
        point = uniform.double() * cdf[:, -1]
        for row, token in enumerate(tokens.tolist()):
            assert weights[row, token] > 0, (vocab, row, token)
            low = cdf[row, token - 1] if token > 0 else 0.0
            tol = 1e-5 * float(cdf[row, -1])
            assert low - tol <= point[row] <= cdf[row, token] + tol, (vocab, row, token)


def test_greedy_takes_the_first_of_tied_maxima():
    logits = torch.tensor([[1.0, 5.0, 5.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    seqs = [seq(SamplingParams(temperature=0)) for _ in range(2)]
    assert Sampler(torch.device("cpu"), [EOS]).sample(logits, seqs) == [1, 0]


def test_sampling_leaves_the_callers_logits_alone():
    logits = torch.randn(3, 50)
    before = logits.clone()
    Sampler(torch.device("cpu"), [EOS]).sample(logits, [seq(SamplingParams(temperature=0.7)) for _ in range(3)])
    assert torch.equal(logits, before)
