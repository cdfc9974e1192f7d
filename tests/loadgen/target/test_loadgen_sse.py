import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.target.sse import DONE, SSEParser, StreamError, chunk_content, decode_chunk


def _chunk(text, finish=None):
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}, ensure_ascii=False)


STREAM = (
    b": keep-alive comment\n\n"
    b"data: " + _chunk("Hel").encode() + b"\n\n"
    b"event: message\r\ndata:" + _chunk("lo \u00e9").encode() + b"\r\n\r\n"  # no space after colon, CRLF, UTF-8
    b": another comment\n"
    b"data: {\"choices\": [{\"index\": 0,\n"  # one event in three data lines
    b"data:  \"text\": \"!\",\n"
    b"data: \"finish_reason\": \"length\"}]}\n\n"
    b"retry: 100\n\n"  # no data: no event
    b"data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 3}}\r\r"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    _chunk("Hel"),
    _chunk("lo \u00e9"),
    '{"choices": [{"index": 0,\n "text": "!",\n"finish_reason": "length"}]}',
    '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}',
    DONE,
]


def _parse(pieces):
    p = SSEParser()
    out = []
    for piece in pieces:
        out += [e.data for e in p.feed(piece)]
    return out + [e.data for e in p.close()]


def test_whole_stream():
    assert _parse([STREAM]) == EXPECTED


def test_every_single_split_point():
    for i in range(len(STREAM) + 1):
        assert _parse([STREAM[:i], STREAM[i:]]) == EXPECTED, f"split at byte {i}"


def test_byte_by_byte():
    assert _parse([STREAM[i:i + 1] for i in range(len(STREAM))]) == EXPECTED


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_splits(cuts):
    cuts = sorted(set(cuts))
    bounds = [0, *cuts, len(STREAM)]
    assert _parse([STREAM[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]) == EXPECTED


def test_event_field_and_decoded_content():
    events = SSEParser().feed(b"event: delta\nid: 7\ndata: " + _chunk("x").encode() + b"\n\n")
    assert events[0].event == "delta" and events[0].id == "7"
    assert chunk_content(decode_chunk(events[0].data)) == "x"
    chat = {"choices": [{"delta": {"role": "assistant", "content": "hi"}}]}
    assert chunk_content(chat) == "hi"
    assert chunk_content({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert decode_chunk(DONE) is None


def test_error_object_inside_a_200_stream_split_everywhere():
    err = b'data: {"error": {"message": "KV cache exhausted", "type": "server_error", "code": 503}}\n\n'
    stream = b"data: " + _chunk("a").encode() + b"\n\n" + err + b"data: [DONE]\n\n"
    for i in range(len(stream) + 1):
        datas = _parse([stream[:i], stream[i:]])
        assert len(datas) == 3
        assert chunk_content(decode_chunk(datas[0])) == "a"
        with pytest.raises(StreamError, match="503: KV cache exhausted"):
            decode_chunk(datas[1])


def test_malformed_chunk_is_a_stream_error():
    with pytest.raises(StreamError, match="malformed"):
        decode_chunk('{"choices": [')
    with pytest.raises(StreamError):
        decode_chunk('"just a string"')
