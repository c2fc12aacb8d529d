"""The framing of localrun's pipes (localrun/frames.py) and what crosses the worker's: a
request's media as raw payloads, once, and a chunk at the cost it always had."""

from __future__ import annotations

import io
import json

import pytest

from localrun.frames import MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES, FrameWriter, read_frame
from localrun.settings import ServerSettings
from localrun.types import ChatRequest, CompletionRequest, Format, Media, Message, ModelRecord, Plan, Sampling
from localrun.worker.host import WorkerHandle, iter_chunks
from localrun.worker.ops import from_frame, to_frame

#: What a media request's frame may add to its media's bytes: the word, the JSON, the sizes.
HEADER_ROOM = 4096


def _roundtrip(header, payloads=(), **bound):
    buf = io.BytesIO()
    writer = FrameWriter(buf)
    writer.send(header, payloads)
    assert writer.bytes_written == len(buf.getvalue())
    buf.seek(0)
    return read_frame(buf, **bound), buf


def test_a_frame_without_payloads_is_the_word_and_the_json():
    """A chunk costs what it cost before payloads existed: 4 bytes and its JSON."""
    chunk = {"ev": "chunk", "id": 7, "c": {"text": "héllo"}}
    frame, buf = _roundtrip(chunk)
    body = json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode()
    assert buf.getvalue() == len(body).to_bytes(4, "big") + body
    assert frame == (chunk, ())


def test_payloads_cross_as_themselves():
    parts = (b"\x00\xff" * 10, b"", b"png bytes")
    frame, buf = _roundtrip({"op": "x"}, parts)
    assert frame == ({"op": "x"}, parts)
    assert read_frame(buf) is None  # the end of the stream
    blob = buf.getvalue()
    assert parts[0] in blob and b"AP8A" not in blob  # raw, not base64


def test_a_cut_frame_reads_as_the_end():
    buf = io.BytesIO()
    FrameWriter(buf).send({"op": "x"}, [b"a" * 100])
    assert read_frame(io.BytesIO(buf.getvalue()[:-1])) is None


def test_lengths_over_their_bound_are_refused_before_anything_is_read():
    with pytest.raises(ValueError, match="exceeds"):
        read_frame(io.BytesIO((MAX_HEADER_BYTES + 1).to_bytes(4, "big")))
    hostile = (2 | 1 << 31).to_bytes(4, "big") + b"{}" + (1).to_bytes(4, "big") + (1 << 60).to_bytes(8, "big")
    with pytest.raises(ValueError, match="exceed"):
        read_frame(io.BytesIO(hostile))
    with pytest.raises(ValueError, match="exceed"):
        _roundtrip({"op": "x"}, [b"12345"], max_payload_bytes=4)
    buf = io.BytesIO()
    with pytest.raises(ValueError, match="exceed"):  # the writer refuses too: nothing is written
        FrameWriter(buf, max_payload_bytes=4).send({"op": "x"}, [b"12345"])
    assert buf.getvalue() == b""


def test_media_cross_the_pipe_as_payloads_and_come_back_equal():
    pic, clip = Media("image", b"\x89PNG fake", "image/png"), Media("audio", b"RIFF", None)
    chat = ChatRequest(
        (Message("user", "<__media__> and <__media__>", media=(pic, clip)), Message("assistant", "ok")),
        Sampling(max_tokens=3),
    )
    header, payloads = to_frame(chat)
    assert payloads == [pic.data, clip.data] and "RIFF" not in json.dumps(header)
    assert from_frame(header, payloads) == chat
    prompt = CompletionRequest("<__media__>", media=(pic,))
    header, payloads = to_frame(prompt)
    assert payloads == [pic.data] and from_frame(header, payloads) == prompt


def test_the_media_ceiling_is_what_the_pipe_carries():
    """``server.max_media_total_bytes`` may rise to the payload bound, and no further."""
    ceiling = next(m.le for m in ServerSettings.model_fields["max_media_total_bytes"].metadata if hasattr(m, "le"))
    assert ceiling == MAX_PAYLOAD_BYTES


def test_media_of_the_largest_allowed_size_cross_the_worker_pipe_once(tmp_path):
    """The largest sum of media a request may carry reaches the worker with one copy of its
    bytes on the pipe (base64 would add a third), and arrives whole."""
    ceiling = MAX_PAYLOAD_BYTES
    half = ceiling // 2
    media = (Media("image", b"\x01" * half, "image/png"), Media("image", b"\x02" * (ceiling - half), "image/png"))
    chat = ChatRequest((Message("user", "look <__media__><__media__>", media=media),), Sampling(max_tokens=40))
    record = ModelRecord(name="m", format=Format.GGUF, path="/nonexistent")
    plan = Plan(runtime="fake", n_ctx=256, n_threads=2, options={"fake_capabilities": ["vision"]})
    handle = WorkerHandle(record, plan, log_path=tmp_path / "worker.log", load_timeout_s=60)
    try:
        before = handle.bytes_sent
        text = "".join(c.text for c in iter_chunks(handle, chat))
        sent = handle.bytes_sent - before
        assert ceiling <= sent <= ceiling + HEADER_ROOM
        assert f"image/png {half}B, image/png {ceiling - half}B" in text
    finally:
        handle.close()
