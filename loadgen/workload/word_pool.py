"""The words text prompts are made of, each checked against the tokenizer: one token in the middle of a
text (after a space), in every pair with every other pool word, and, for the starters, at the very start
of a text too. A text of ``n`` pool words joined by single spaces is then ``n`` tokens, which is how
``exact_text`` builds texts of an exact length without encoding each one.

Only ``encode`` and ``decode`` are used (no vocabulary listing), so a server's ``/tokenize`` endpoint works
as well as a local ``tokenizer.json``; the checks take a few hundred calls, most of them of ~500 tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loadgen.workload.tokenizer import Tokenizer, TokenizerError

# Common English words: whole tokens (with their leading space) in GPT-2/Llama-3 byte-level BPE, Llama-2
# SentencePiece and word-level vocabularies alike. Candidates only: every one is checked.
_WORD_TEXT = """
the of and to in is was for on that with as by at from his her an be this which or had are not but it
were they have one all their has been who she more there we would other when what time can some these two
first into may only its new people also after used many most over such made about than them then out where
year well him through between both city under world while during known later part state high since each
three school name until work life series several last long being found before end day house because area
against way just family own form even will number so still back same second left music often group game
water off four land field power place line early side air book light night point head body room order story
hand word plant fire river death team party court army short great small large hold free full real open
round true clear white black red green blue gold dark deep close north south west east king town road sea
ship train car horse dog cat bird fish tree leaf rock sand snow rain wind sun moon star sky stone iron wood
glass paper cloth bread milk salt sugar tea coffee wine apple corn rice meat egg cake soup table chair bed
door window wall floor roof garden street bridge tower castle church market bank shop hotel office farm
village island valley hill forest lake coast desert mountain bay port gate path track wheel engine machine
tool knife box bag cup bowl plate bottle letter card page note song dance game film art color shape size
speed weight heat cold voice sound smell taste touch sight mind heart blood bone skin hair face eye ear nose
mouth arm leg foot finger friend child mother father brother sister son daughter husband wife doctor teacher
student worker farmer soldier captain leader member player writer painter singer driver judge police guard
"""
WORDS = tuple(dict.fromkeys(_WORD_TEXT.split()))

MAX_WORDS = 256  # the pair check encodes 2 x MAX_WORDS^2 tokens: ~0.1 s locally
MAX_STARTERS = 32
MIN_WORDS = 8
PAIR_ROUNDS = 12  # rounds of the pair check, each dropping the words it caught merging


@dataclass(frozen=True, slots=True)
class WordPool:
    words: tuple[str, ...]  # one token each after a space, in any pair
    ids: tuple[int, ...]  # that token, per word
    starters: tuple[int, ...]  # indices of the words that are one token at the start of a text as well
    sep: str = " "  # what joins words; "" for a byte-level tokenizer, where every character is a token


def build_pool(tok: Tokenizer, candidates: Iterable[str] = WORDS, *, max_words: int = MAX_WORDS,
               max_starters: int = MAX_STARTERS) -> WordPool:
    """The checked words of ``candidates`` (their order kept, so the pool is deterministic), at most
    ``max_words``; ``TokenizerError`` when fewer than ``MIN_WORDS`` or no starter survive."""
    cands = [w for w in dict.fromkeys(candidates) if w.isalpha() and w.islower()]
    anchor = next(((w, i) for w in cands if (i := _one_token(tok, w)) is not None), None)
    if anchor is None:
        if (chars := _char_pool(tok)) is not None:
            return chars
        raise TokenizerError(f"{tok.name}: none of {len(cands)} candidate words is one token on its own")
    ids = _ids_after_a_space(tok, anchor, cands)
    words = [w for w in cands if w in ids][:max_words]
    starter_ok: dict[str, bool] = {}
    for _ in range(PAIR_ROUNDS):
        if len(words) < MIN_WORDS:
            break
        starters = _starters(tok, words, ids, starter_ok, max_starters)
        if not starters:
            raise TokenizerError(f"{tok.name}: no candidate word is one token at the start of a text")
        bad = _pair_failures(tok, words, ids, words[starters[0]])
        if not bad:
            return WordPool(tuple(words), tuple(ids[w] for w in words), tuple(starters))
        words = [w for w in words if w not in bad]
    raise TokenizerError(f"{tok.name}: only {len(words)} of {len(cands)} candidate words stay one token each "
                         f"next to one another; text prompts need at least {MIN_WORDS}")


def _char_pool(tok: Tokenizer) -> WordPool | None:
    """A byte- or character-level tokenizer (the reference engine's presets): no word is one token, but
    every letter is, wherever it stands, so letters joined without spaces are one token each."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    ids = [_one_token(tok, c) for c in letters]
    if any(i is None for i in ids):
        return None
    text = "".join(a + b for a in letters for b in letters)  # every pair, each letter at the start once
    if tok.encode(text) != [ids[letters.index(c)] for c in text] or tok.decode(tok.encode(text)) != text:
        return None
    return WordPool(tuple(letters), tuple(ids), tuple(range(len(letters))), sep="")


def _one_token(tok: Tokenizer, text: str) -> int | None:
    ids = tok.encode(text)
    return ids[0] if len(ids) == 1 and tok.decode(ids) == text else None


def _ids_after_a_space(tok: Tokenizer, anchor: tuple[str, int], cands: list[str]) -> dict[str, int]:
    """word -> its one token after a space, tested in groups behind the anchor word (a group that is one
    token per word and decodes back passes whole; a failing one is halved), so it takes few calls."""
    out: dict[str, int] = {}

    def test(batch: list[str]) -> None:
        text = anchor[0] + " " + " ".join(batch)
        ids = tok.encode(text)
        if len(ids) == len(batch) + 1 and ids[0] == anchor[1] and tok.decode(ids) == text:
            out.update(zip(batch, ids[1:], strict=True))
        elif len(batch) > 1:
            test(batch[: len(batch) // 2])
            test(batch[len(batch) // 2:])

    for i in range(0, len(cands), 64):
        test(cands[i: i + 64])
    return out


def _starters(tok: Tokenizer, words: list[str], ids: dict[str, int], ok: dict[str, bool], most: int) -> list[int]:
    """Indices of words that are one token at the start of a text and keep the next word's token after
    them (``ok`` remembers the verdicts across the pair check's rounds)."""
    out = []
    for i, w in enumerate(words):
        if len(out) == most:
            break
        if w not in ok:
            first = _one_token(tok, w)
            nxt = words[1] if i == 0 else words[0]
            ok[w] = first is not None and tok.encode(f"{w} {nxt}") == [first, ids[nxt]]
        if ok[w]:
            out.append(i)
    return out


def _pair_failures(tok: Tokenizer, words: list[str], ids: dict[str, int], start: str) -> set[str]:
    """Words caught in a pair that does not tokenize as its two tokens. Per word ``a`` one text
    ``start a w0 a w1 … a wk`` holds every pair ``(a, w)`` and ``(w, a)``; at the first token that differs
    from the expected ids, its word and the next are dropped (it split, or merged with the next; the next
    round checks what remains)."""
    bad: set[str] = set()
    start_id = tok.encode(start)[0]
    for a in words:
        seq = [x for w in words for x in (a, w)]
        got = tok.encode(start + " " + " ".join(seq))
        want = [start_id, *(ids[w] for w in seq)]
        if got == want:
            continue
        p = next((i for i, (g, e) in enumerate(zip(got, want, strict=False)) if g != e), min(len(got), len(want)))
        bad.update(seq[j] for j in (p - 1, p) if 0 <= j < len(seq))  # text position p is seq[p - 1]
    return bad
