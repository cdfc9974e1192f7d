"""After the model runs: a sampled token joins its sequence, stops are checked, text is decoded, outputs built.

One function per concern: `token_stop_reason` (stop tokens, length), `detokenize_step` (incremental text),
`trim_at_stop_string` (stop strings), `build_output` (what the engine returns for a request this step).
"""

from __future__ import annotations

from engine.model.tokenizer import Tokenizer
from engine.request.outputs import CompletionOutput, RequestOutput
from engine.request.sequence import Request, Sequence
from engine.request.timing import request_timing


def stop_prefix_overlap(text: str, stops: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


def trim_at_stop_string(seq: Sequence, checked: int) -> bool:
    """Cut the text at the earliest stop string; True if one was found. The first `checked` chars held none."""
    p = seq.params
    if not p.stop or seq.num_output_tokens < p.min_tokens:
        return False
    # Only the tail can hold a new match: the text before it was already checked.
    start = max(0, checked - max(len(s) for s in p.stop) + 1)
    hits = [i for i in (seq.text.find(s, start) for s in p.stop) if i >= 0]
    if not hits:
        return False
    seq.text = seq.text[: min(hits)]
    return True


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: list[int], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def append_token(self, seq: Sequence, token: int) -> str | None:
        """Add the sampled token and its text; the finish reason if it ends the sequence, else None."""
        seq.token_ids.append(token)
        reason = self.token_stop_reason(seq, token)
        checked = len(seq.text)
        seq.text += self.detokenize_step(seq, final=reason is not None)
        if reason is None and trim_at_stop_string(seq, checked):
            reason = "stop"
        return reason

    def token_stop_reason(self, seq: Sequence, token: int) -> str | None:
        """The finish reason this token causes, if any.

        "stop": a stop or end-of-sequence token, once min_tokens are out; "length": max_tokens or the context
        is reached.
        """
        p = seq.params
        n_out = seq.num_output_tokens
        if n_out >= p.min_tokens and (token in p.stop_token_ids
                                      or (not p.ignore_eos and token in self.eos_token_ids)):
            return "stop"
        if n_out >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def detokenize_step(self, seq: Sequence, final: bool) -> str:
        """Text the newest token adds, decoding only a short window (constant work per token).

        The window starts a few tokens back so tokenizers that merge across token boundaries (leading
        spaces, multi-byte characters split over byte tokens) still render right. The trailing tokens of a
        character still incomplete are held back until the tokens that complete it arrive; the text before
        them goes out (a tokenizer that cannot tell which tokens those are holds back text ending in U+FFFD).
        """
        ids = seq.output_ids
        end = len(ids)
        after = self.tokenizer.decode(ids[seq.prefix_offset :])
        if not final and after.endswith("\ufffd"):  # an incomplete character always decodes to U+FFFD
            tail = self.tokenizer.incomplete_tail(ids)
            if tail is None:
                return ""
            if tail:
                end = max(seq.read_offset, end - tail)
                after = self.tokenizer.decode(ids[seq.prefix_offset : end])
        before = self.tokenizer.decode(ids[seq.prefix_offset : seq.read_offset])
        if len(after) <= len(before):
            return ""
        seq.prefix_offset, seq.read_offset = seq.read_offset, end
        return after[len(before) :]


def build_output(request: Request, finished: bool) -> RequestOutput:
    """Everything generated so far plus what is new since the last output; marks the new part emitted."""
    completions = []
    for seq in request.seqs:
        new_ids = seq.output_ids[seq.num_emitted_tokens :]
        visible = len(seq.text)
        if not seq.is_finished:
            # Hold back a tail that may still grow into a stop string: it must never be streamed.
            visible -= stop_prefix_overlap(seq.text, seq.params.stop)
        new_text = seq.text[seq.emitted_text_len : visible]
        seq.num_emitted_tokens = seq.num_output_tokens
        seq.emitted_text_len = max(seq.emitted_text_len, visible)
        completions.append(CompletionOutput(seq.index, list(seq.output_ids), seq.text[:visible], new_ids,
                                            new_text, seq.finish_reason))
    return RequestOutput(request.request_id, request.tier, request.prompt_ids, completions, finished,
                         request_timing(request) if finished else None,
                         request.seqs[0].num_cached_prefix if request.seqs else 0,
                         request.error if finished else None, request.retry_after_s if finished else None)
