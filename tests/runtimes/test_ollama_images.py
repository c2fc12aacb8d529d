"""The Ollama runtime passes images (and audio) to Ollama in its own shape (issue 19): base64 in a
message's ``images`` on /api/chat and in /api/generate's, each marker turned into the tag Ollama
places media by; the session declares ``vision`` / ``audio`` only when Ollama's /api/show lists
them, and refuses media for a model that lacks them before anything is sent."""

from __future__ import annotations

import base64

import ollama
import pytest

from localrun.errors import UnsupportedFeature
from localrun.runtimes.ollama import OllamaRuntime
from localrun.types import (
    AUDIO,
    MEDIA_MARKER,
    VISION,
    Cancel,
    ChatRequest,
    CompletionRequest,
    Format,
    Media,
    Message,
    ModelRecord,
    Plan,
    Sampling,
)
from tests.runtimes.fake_ollama import FakeModel, FakeOllama

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "


@pytest.fixture
def server():
    models = [
        FakeModel("llama3.2:latest"),
        FakeModel("gemma3:4b", capabilities=("completion", "vision")),
        FakeModel("gemma3n:e4b", capabilities=("completion", "vision", "audio")),
    ]
    with FakeOllama(models) as srv:
        yield srv
    assert srv.state.errors == []


def _load(server, name: str):
    record = ModelRecord(name=name, format=Format.GGUF, path="", metadata={"ollama_name": name})
    return OllamaRuntime(host=server.url).load(record, Plan(runtime="ollama", n_ctx=512))


def _last(server, path: str) -> dict:
    return [body for p, body in server.state.requests if p == path][-1]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_capabilities_follow_what_ollama_lists(server):
    assert not {VISION, AUDIO} & _load(server, "llama3.2:latest").capabilities
    assert VISION in _load(server, "gemma3:4b").capabilities
    assert AUDIO not in _load(server, "gemma3:4b").capabilities
    assert {VISION, AUDIO} <= _load(server, "gemma3n:e4b").capabilities


def test_chat_images_go_base64_with_ollamas_img_tags(server):
    session = _load(server, "gemma3:4b")
    other = b"\xff\xd8\xff\xe0 jpeg"
    req = ChatRequest(
        messages=(
            Message(
                "user", f"compare {MEDIA_MARKER} and {MEDIA_MARKER}", media=(Media("image", PNG), Media("image", other))
            ),
            Message("assistant", "they differ"),
            Message("user", "why?"),
        ),
        sampling=Sampling(max_tokens=3),
    )
    list(session.chat(req, Cancel()))
    messages = _last(server, "/api/chat")["messages"]
    assert messages[0] == {"role": "user", "content": "compare [img] and [img]", "images": [_b64(PNG), _b64(other)]}
    assert "images" not in messages[1] and "images" not in messages[2]
    # The official client takes the same shape (its Image type validates base64 strings).
    answer = ollama.Client(host=server.url).chat(model="gemma3:4b", messages=messages, options={"num_predict": 2})
    assert answer.message.content


def test_raw_completion_places_each_item_by_its_index(server):
    session = _load(server, "gemma3n:e4b")
    req = CompletionRequest(
        prompt=f"{MEDIA_MARKER}\nTranscribe, then describe {MEDIA_MARKER}:",
        sampling=Sampling(max_tokens=2),
        media=(Media("audio", WAV, "audio/wav"), Media("image", PNG, "image/png")),
    )
    list(session.complete(req, Cancel()))
    body = _last(server, "/api/generate")
    assert body["raw"] is True
    assert body["prompt"] == "[img-0]\nTranscribe, then describe [img-1]:"
    assert body["images"] == [_b64(WAV), _b64(PNG)]  # Ollama tells a clip from a picture by its bytes


def test_text_requests_carry_no_images_field(server):
    session = _load(server, "gemma3:4b")
    list(session.complete(CompletionRequest("once upon", Sampling(max_tokens=2)), Cancel()))
    assert "images" not in _last(server, "/api/generate")
    list(session.chat(ChatRequest((Message("user", "hi"),), Sampling(max_tokens=2)), Cancel()))
    assert "images" not in _last(server, "/api/chat")["messages"][0]


@pytest.mark.parametrize(
    ("model", "media", "needed"),
    [("llama3.2:latest", Media("image", PNG), "vision"), ("gemma3:4b", Media("audio", WAV), "audio")],
)
def test_media_a_model_lacks_are_refused_before_sending(server, model, media, needed):
    session = _load(server, model)
    sent = len(server.state.requests)
    req = ChatRequest((Message("user", MEDIA_MARKER + "what is this?", media=(media,)),), Sampling(max_tokens=2))
    with pytest.raises(UnsupportedFeature, match=needed) as info:
        session.chat(req, Cancel())
    assert info.value.param == "images"
    with pytest.raises(UnsupportedFeature, match=needed):
        session.complete(CompletionRequest(MEDIA_MARKER, Sampling(max_tokens=2), media=(media,)), Cancel())
    assert len(server.state.requests) == sent
