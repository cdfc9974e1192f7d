"""Text prompts of an exact token length (workload.tokenizer, word_pool, exact_text, text_prompts), on small
tokenizers trained here from generated sentences: byte-level BPE (GPT-2 and Llama-3 pre-tokenizers),
SentencePiece BPE (Metaspace, and Llama-2's legacy normalizer without a pre-tokenizer), word level and
WordPiece; and on fake word tokenizers that merge a pair or count one token too many on long texts."""

from __future__ import annotations

import functools
import pickle
import random
from pathlib import Path

import pytest
from tokenizers import (
    ByteLevelBPETokenizer,
    Regex,
    SentencePieceBPETokenizer,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from loadgen.workload.exact_text import ExactLengthError, TextMaker
from loadgen.workload.specs import BlockPrompt, RequestSpec
from loadgen.workload.synthetic import Conversations, LengthDist, SharedPrefix, SyntheticWorkload
from loadgen.workload.text_prompts import SPOT_CHECKS, to_text
from loadgen.workload.tokenizer import HFTokenizer, TokenizerError, WordTokenizer, load_tokenizer
from loadgen.workload.word_pool import WORDS, build_pool

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
MOONCAKE = Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake" / "conversation_trace.first7500.jsonl"


@functools.lru_cache(maxsize=1)
def corpus() -> list[str]:
    """Sentences over 200 of the pool's candidate words and 60 made-up ones (so some candidates are
    missing from every vocabulary and must be left out)."""
    rnd = random.Random(0)
    made_up = ["".join(rnd.choice("bcdfghklmnprstvz") + rnd.choice("aeiou") for _ in range(3)) for _ in range(60)]
    vocab = list(WORDS[:200]) + made_up
    return [" ".join(rnd.choice(vocab) for _ in range(rnd.randint(5, 15))) for _ in range(600)]


def _bpe(pre, decoder) -> Tokenizer:
    t = Tokenizer(models.BPE())
    t.pre_tokenizer, t.decoder = pre, decoder
    t.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=1200, min_frequency=2, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t


def _sentencepiece() -> Tokenizer:
    t = SentencePieceBPETokenizer()
    t.train_from_iterator(corpus(), vocab_size=800, min_frequency=2, show_progress=False)
    return t._tokenizer


def _llama2_legacy() -> Tokenizer:
    t = _sentencepiece()  # Llama-2's tokenizer.json: ▁ added by the normalizer, BPE over the whole text
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.pre_tokenizer = None
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    return t


def _word_level() -> Tokenizer:
    t = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator(corpus(), trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    return t


def _word_piece() -> Tokenizer:
    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.normalizer, t.pre_tokenizer = normalizers.BertNormalizer(), pre_tokenizers.Whitespace()
    t.decoder = decoders.WordPiece()
    t.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[UNK]"],
                                                              show_progress=False))
    return t


BUILDERS = {
    "gpt2": lambda: _gpt2(),
    "llama3": lambda: _bpe(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                           decoders.ByteLevel()),
    "sentencepiece": _sentencepiece,
    "llama2-legacy": _llama2_legacy,
    "wordlevel": _word_level,
    "wordpiece": _word_piece,
}


def _gpt2() -> Tokenizer:
    t = ByteLevelBPETokenizer()
    t.train_from_iterator(corpus(), vocab_size=1200, min_frequency=2, show_progress=False)
    return t._tokenizer


@functools.cache
def maker_for(name: str, seed: int = 0) -> TextMaker:
    return TextMaker(HFTokenizer(BUILDERS[name](), name), seed=seed)


def ntok(maker: TextMaker, text: str) -> list[int]:
    return maker.tokenizer.encode(text)


class FakeWords:
    """A word tokenizer with faults: ``merges`` pairs become one token; texts of more than ``extra_after``
    words get one token more (with ``odd_only``, only those of an odd number of words: then no text has
    an odd count above the limit)."""

    EXTRA, UNK = 9998, 9999

    def __init__(self, vocab, merges=(), extra_after: int | None = None, odd_only: bool = False):
        self.name = "fake-words"
        self.ids = {w: i for i, w in enumerate(vocab)}
        self.words = {i: w for w, i in self.ids.items()} | {self.UNK: "<unk>"}
        self.merges = {pair: 5000 + k for k, pair in enumerate(merges)}
        self.words |= {i: " ".join(pair) for pair, i in self.merges.items()}
        self.extra_after, self.odd_only = extra_after, odd_only

    def encode(self, text: str) -> list[int]:
        words, out, i = text.split(" "), [], 0
        while i < len(words):
            if (words[i], words[i + 1] if i + 1 < len(words) else None) in self.merges:
                out.append(self.merges[(words[i], words[i + 1])])
                i += 2
            else:
                out.append(self.ids.get(words[i], self.UNK))
                i += 1
        if self.extra_after is not None and len(words) > self.extra_after and (not self.odd_only or len(words) % 2):
            out.append(self.EXTRA)
        return out

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.words[i] for i in ids if i != self.EXTRA)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_texts_have_exactly_n_tokens_and_shorter_ones_are_prefixes(name):
    m = maker_for(name)
    assert len(m.pool.words) >= 8 and m.pool.starters
    for n in [*range(1, 130), *range(130, 2001, 41), 2000]:
        text = m.text(("k", n), n)
        assert len(ntok(m, text)) == n, (name, n, text[:80])
    long = m.text(("same",), 1500)
    for n in (1, 7, 512, 1499):
        assert long.startswith(m.text(("same",), n) + " ")  # a cut block or trimmed turn: a prefix of the whole


def test_texts_are_deterministic_per_seed_and_key():
    tok = HFTokenizer(_gpt2(), "gpt2")
    a, b = TextMaker(tok, seed=3), TextMaker(tok, seed=3)
    assert a.text(("body", 3, 17), 300) == b.text(("body", 3, 17), 300)
    assert a.text(("body", 3, 17), 300) != a.text(("body", 3, 18), 300)
    assert a.text(("body", 3, 17), 300) != TextMaker(tok, seed=4, pool=a.pool).text(("body", 3, 17), 300)
    import numpy as np  # numpy ints in a key are the plain ints they equal
    assert a.text(("prefix", np.int64(2)), 40) == a.text(("prefix", 2), 40)


def test_pool_words_stay_one_token_and_unknown_words_are_left_out():
    m = maker_for("wordlevel")
    assert not set(m.pool.words) - set(WORDS[:200])  # only words the vocabulary has ([UNK] never decodes back)
    start = m.pool.words[m.pool.starters[0]]
    for w, i in zip(m.pool.words, m.pool.ids, strict=True):
        assert ntok(m, f"{start} {w}")[1:] == [i]


def test_pairs_that_merge_across_a_space_are_dropped_from_the_pool():
    vocab = list(WORDS[:40])
    pool = build_pool(FakeWords(vocab, merges=[("of", "and")]), vocab)
    assert "of" not in pool.words and len(pool.words) >= 30
    clean = build_pool(FakeWords(vocab), vocab)
    assert clean.words == tuple(vocab)


def test_a_tokenizer_folder_loads_and_a_folder_without_one_is_a_clear_error(tmp_path):
    folder = tmp_path / "my-tokenizer"
    folder.mkdir()
    _word_level().save(str(folder / "tokenizer.json"))
    tok = load_tokenizer(folder)
    assert tok.name == "my-tokenizer"
    want = _word_level().encode("the of", add_special_tokens=False).ids
    assert tok.encode("the of") == load_tokenizer(folder / "tokenizer.json").encode("the of") == want
    assert tok.decode(want) == "the of"
    for bad in (tmp_path / "missing", tmp_path):
        with pytest.raises(TokenizerError) as e:
            load_tokenizer(bad)
        assert isinstance(e.value, ValueError) and str(bad) in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="broken") as e:
        load_tokenizer(tmp_path / "broken")
    assert "\n" not in str(e.value)


def test_the_word_stand_in_counts_one_token_per_word():
    specs = SyntheticWorkload(input_len=LengthDist(value=50), shared_prefix=SharedPrefix(1, 20, 1.0)).generate(
        [0.0] * 5, seed=1)
    maker = to_text(specs, WordTokenizer(), chat=True, overhead_tokens=0)
    assert all(len(s.prompt[0]["content"].split(" ")) == s.prompt_tokens == 70 for s in specs)
    assert maker.tokenizer.decode(maker.tokenizer.encode("the of the")) == "the of the"


class ByteLevel:
    """The reference engine's presets: one token per UTF-8 byte, so no word is one token."""

    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")


def test_a_byte_level_tokenizer_gets_letters_joined_without_spaces():
    maker = TextMaker(ByteLevel())
    assert maker.pool.sep == "" and len(maker.pool.words) == 26
    specs = SyntheticWorkload(input_len=LengthDist(value=30), shared_prefix=SharedPrefix(1, 20, 1.0)).generate(
        [0.0] * 4, seed=3)
    to_text(specs, maker, verify=True)
    assert all(len(ByteLevel().encode(s.prompt)) == s.prompt_tokens == 50 for s in specs)
    assert maker.mismatches == 0
    assert len({s.prompt[:20] for s in specs}) == 1  # the shared prefix is equal text


def test_a_tokenizer_without_usable_words_is_a_clear_error():
    with pytest.raises(TokenizerError, match="fake-words") as e:
        TextMaker(FakeWords(["zorb", "quux"]))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["gpt2", "sentencepiece", "wordlevel"])
def test_shared_prefixes_stay_equal_text_and_equal_leading_token_ids(name):
    m = maker_for(name)
    wl = SyntheticWorkload(input_len=LengthDist("uniform", min=5, max=300), shared_prefix=SharedPrefix(3, 64, 0.7))
    specs = wl.generate([0.01 * i for i in range(120)], seed=5)
    ids_before = [list(s.prompt) for s in specs]
    to_text(specs, m)
    groups: dict[tuple, list[int]] = {}
    for s, ids in zip(specs, ids_before, strict=True):
        assert isinstance(s.prompt, str) and s.prompt_tokens == len(ids) == len(ntok(m, s.prompt))
        has_prefix = s.segments[0].key[0] == "prefix"
        groups.setdefault(tuple(ids[:64]) if has_prefix else ("none", s.id), []).append(s.prompt)
    shared = [g for g in groups.values() if len(g) > 1]
    assert len(shared) == 3
    heads = set()
    for texts in shared:
        words = texts[0].split(" ")[:64]
        assert all(t.split(" ")[:64] == words for t in texts)  # equal text prefix
        assert len({tuple(ntok(m, t)[:64]) for t in texts}) == 1  # and equal token ids as a prefix
        heads.add(" ".join(words))
    assert len(heads) == 3


def test_mooncake_blocks_with_equal_hash_ids_give_equal_text_prefixes():
    m = maker_for("gpt2")
    specs = [RequestSpec("a", 0.0, BlockPrompt((1, 2, 3), 1500, 512), 8, prompt_tokens=1500),
             RequestSpec("b", 0.0, BlockPrompt((1, 2, 4, 5), 1900, 512), 8, prompt_tokens=1900),
             RequestSpec("c", 0.0, BlockPrompt((1, 2), 700, 512), 8, prompt_tokens=700),
             RequestSpec("d", 0.0, BlockPrompt((7, 2), 700, 512), 8, prompt_tokens=700)]
    tokens_before = [s.prompt.tokens() for s in specs]
    to_text(specs, m)
    a, b, c, d = (s.prompt for s in specs)
    ia, ib, ic, idd = (ntok(m, t) for t in (a, b, c, d))
    assert [len(x) for x in (ia, ib, ic, idd)] == [1500, 1900, 700, 700]
    assert ia[:1024] == ib[:1024] and ia[1024:1040] != ib[1024:1040]  # two shared blocks, then different ones
    assert a.startswith(c) and ic == ia[:700]  # a prompt cut inside block 2 is a prefix of one that has all of it
    assert ia[:512] != idd[:512]  # a different first block: nothing shared, even with block 2 equal
    assert [len(t) for t in tokens_before] == [1500, 1900, 700, 700]


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"trace not found at {MOONCAKE}")
def test_a_mooncake_trace_keeps_its_prefix_sharing_as_text():
    from loadgen.workload.traces import TraceOptions, load_trace

    m = maker_for("gpt2")
    specs, _ = load_trace(MOONCAKE, opts=TraceOptions(max_requests=400))
    by_two: dict[tuple, list] = {}
    for s in specs:
        by_two.setdefault(s.prompt.hash_ids[:2], []).append(s)
    deep = [g[:2] for g in by_two.values() if len(g) > 1][:3]  # pairs sharing two blocks or more
    assert len(deep) == 3
    pairs = [tuple(specs[:2]), *deep]  # every row starts with block 0 (the trace's system prompt)
    hash_ids = {s.id: s.prompt.hash_ids for p in pairs for s in p}
    to_text([s for p in pairs for s in p], m)
    parted = 0  # pairs whose blocks part after the shared ones
    for a, b in pairs:
        ha, hb = hash_ids[a.id], hash_ids[b.id]
        k = next((n for n, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y), min(len(ha), len(hb)))
        ia, ib = ntok(m, a.prompt), ntok(m, b.prompt)
        assert (len(ia), len(ib)) == (a.prompt_tokens, b.prompt_tokens)
        shared = min(k * 512, len(ia), len(ib))
        assert k >= 1 and ia[:shared] == ib[:shared]
        if k < min(len(ha), len(hb)):  # then the next blocks differ
            assert ia[shared: shared + 16] != ib[shared: shared + 16]
            parted += 1
    assert parted >= 1, "no pair's blocks part: the check that different hash ids give different text never ran"


def test_conversation_history_is_a_text_prefix_of_the_next_turn():
    m = maker_for("llama3")
    wl = SyntheticWorkload(input_len=LengthDist("uniform", min=3, max=60), shared_prefix=SharedPrefix(1, 30, 1.0),
                           conversations=Conversations(turns=4, think_time_s=1.0, answer_tokens=20,
                                                                     history="synthetic"))
    for chat, overhead in ((False, 0), (True, 5)):
        specs = wl.generate([0.1 * i for i in range(40)], seed=2)
        intended = {s.id: s.prompt_tokens for s in specs}
        to_text(specs, m, chat=chat, overhead_tokens=overhead)
        by_conv: dict[str, list] = {}
        for s in sorted(specs, key=lambda s: s.turn):
            content = s.prompt[0]["content"] if chat else s.prompt
            if chat:
                assert s.prompt == [{"role": "user", "content": content}]
            assert s.prompt_tokens == intended[s.id] and len(ntok(m, content)) == intended[s.id] - overhead
            by_conv.setdefault(s.conversation, []).append(content)
        assert len(by_conv) == 10
        for turns in by_conv.values():
            assert all(later.startswith(earlier + " ") for earlier, later in zip(turns, turns[1:], strict=False))


def test_chat_overhead_is_subtracted_leaving_at_least_one_token():
    m = maker_for("sentencepiece")
    specs = [RequestSpec("a", 0.0, list(range(10, 110)), 4, prompt_tokens=100),
             RequestSpec("b", 0.0, list(range(10, 20)), 4, prompt_tokens=10),
             RequestSpec("c", 0.0, "already text", 4)]
    to_text(specs, m, chat=True, overhead_tokens=30)
    assert [len(ntok(m, s.prompt[0]["content"])) for s in specs[:2]] == [70, 1]
    assert [s.prompt_tokens for s in specs] == [100, 10, None]
    assert specs[2].prompt == [{"role": "user", "content": "already text"}] and specs[2].kind == "chat"


def test_token_ids_without_structure_become_text_by_content():
    m = maker_for("wordpiece")
    ids = list(range(10, 90))
    specs = [RequestSpec("a", 0.0, list(ids), 4, prompt_tokens=80), RequestSpec("b", 0.0, list(ids), 4,
                                                                                 prompt_tokens=80),
             RequestSpec("c", 0.0, ids[:79] + [5], 4, prompt_tokens=80), RequestSpec("d", 0.0, "text", 4)]
    to_text(specs, m)
    assert specs[0].prompt == specs[1].prompt != specs[2].prompt and specs[3].prompt == "text"
    assert specs[0].kind == "text" and len(ntok(m, specs[0].prompt)) == 80


def test_token_ids_are_not_changed_by_the_text_structure():
    wl = SyntheticWorkload(input_len=LengthDist("uniform", min=5, max=50), shared_prefix=SharedPrefix(2, 16, 0.5),
                           conversations=Conversations(turns=3, history="synthetic"))
    a, b = wl.generate([0.1 * i for i in range(30)], seed=9), wl.generate([0.1 * i for i in range(30)], seed=9)
    assert [s.prompt for s in a] == [s.prompt for s in b]
    assert all(sum(seg.tokens for seg in s.segments) == len(s.prompt) == s.prompt_tokens for s in a)
    to_text(b, maker_for("gpt2"))
    assert [s.prompt_tokens for s in a] == [s.prompt_tokens for s in b]


def test_conversion_encodes_only_the_spot_checks():
    """Speed: lengths come from the checked pool, not from encoding every prompt; only the first
    ``SPOT_CHECKS`` prompts are encoded whole."""
    m = maker_for("gpt2")
    encoded = []

    class Counting:
        name = "counting"

        def encode(self, text):
            encoded.append(text)
            return m.tokenizer.encode(text)

        def decode(self, ids):
            return m.tokenizer.decode(ids)

    counting = TextMaker(Counting(), pool=m.pool)
    specs = SyntheticWorkload(input_len=LengthDist(value=1000)).generate([0.0] * 500, seed=1)
    to_text(specs, counting)
    assert len(encoded) == SPOT_CHECKS and counting.checks == SPOT_CHECKS and counting.mismatches == 0


def test_a_tokenizer_that_breaks_the_pool_guarantee_is_caught_and_repaired():
    vocab = list(WORDS[:60])
    fake = FakeWords(vocab, extra_after=600)  # one token too many on long texts: the pool cannot see it
    specs = [RequestSpec(f"r{i}", 0.0, [1] * n, 4, prompt_tokens=n) for i, n in enumerate([100, 701, 100] * 10)]
    maker = to_text(specs, TextMaker(fake, pool=build_pool(fake, vocab)))
    assert maker.mismatches >= 1 and maker.checks == len(specs)  # the first miss made every later prompt checked
    assert all(len(fake.encode(s.prompt)) == s.prompt_tokens for s in specs)


def test_an_unreachable_length_is_a_clear_error():
    vocab = list(WORDS[:60])
    fake = FakeWords(vocab, extra_after=600, odd_only=True)  # above 600 words every count is even
    specs = [RequestSpec("r", 0.0, [1] * 701, 4, prompt_tokens=701)]
    with pytest.raises(ExactLengthError, match="fake-words.*701") as e:
        to_text(specs, TextMaker(fake, pool=build_pool(fake, vocab)))
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    with pytest.raises(ValueError):
        maker_for("gpt2").text(("k",), 0)


def test_specs_with_segments_pickle_for_the_sharded_driver():
    s = SyntheticWorkload(shared_prefix=SharedPrefix(1, 8, 1.0)).generate([0.0], seed=1)[0]
    assert pickle.loads(pickle.dumps(s)).segments == s.segments and s.segments[0].key == ("prefix", 1, 0)
