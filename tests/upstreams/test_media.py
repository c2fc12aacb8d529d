"""Upstreams that can see say so, and get images in OpenAI's shape (issue 19).

A routed model declares ``vision`` / ``audio`` only when every upstream serving it says so in its
/v1/models entry (llama-server's ``models[].capabilities: ["completion", "multimodal"]``,
localrun's ``capabilities`` and ``modalities``); an entry that says nothing (vLLM's, SGLang's)
declares no media, so the server's 400 rule answers. Media reach the upstream as content parts
where the markers were: ``image_url`` with a ``data:`` URL, ``input_audio`` base64. A recorded
engine server (tests/upstreams/replay.py) shows what was sent."""

from __future__ import annotations

import base64
import json

import pytest

from localrun.errors import UnsupportedFeature
from localrun.runtimes.openai_compat.kinds import entry_media
from localrun.types import AUDIO, MEDIA_MARKER, VISION, Cancel, ChatRequest, CompletionRequest, Media, Message, Sampling
from tests.upstreams.replay import Reply, recorded

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(24))
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the id of the recorded SGLang stream


def _engine(replays, models: dict):
    return replays(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=json.dumps(models).encode()),
            "POST /v1/chat/completions": Reply(body=recorded("sglang/chat_stream.sse"), sse=True),
        }
    )


def _session(front, name: str = MODEL):
    return front.stack.manager.load(name).handle


def _posted(up) -> dict:
    return [r for r in up.requests if r["method"] == "POST"][-1]["body"]


def test_llama_server_multimodal_models_list_declares_vision(replays, front_factory):
    up = _engine(
        replays,
        {
            "object": "list",
            "models": [{"name": MODEL, "model": MODEL, "capabilities": ["completion", "multimodal"]}],
            "data": [{"id": MODEL, "object": "model", "owned_by": "llamacpp"}],
        },
    )
    front = front_factory([{"name": "ls", "url": up.url, "kind": "llama-server"}])
    caps = _session(front).capabilities
    assert VISION in caps and AUDIO not in caps


def test_an_entry_that_says_nothing_declares_no_media(replays, front_factory):
    up = _engine(replays, json.loads(recorded("sglang/models.json")))
    front = front_factory([{"name": "sg", "url": up.url, "kind": "sglang"}])
    assert not {VISION, AUDIO} & _session(front).capabilities


def test_images_and_audio_go_as_content_parts_where_the_markers_were(replays, front_factory):
    entry = {"id": MODEL, "object": "model", "capabilities": ["completion", "vision", "audio", "multimodal"]}
    up = _engine(replays, {"object": "list", "data": [entry]})
    front = front_factory([{"name": "box", "url": up.url, "kind": "localrun"}])
    session = _session(front)
    assert {VISION, AUDIO} <= session.capabilities
    media = (Media("image", PNG, "image/png"), Media("audio", WAV, "audio/wav"), Media("image", b"\xff\xd8\xff"))
    req = ChatRequest(
        messages=(
            Message("system", "be brief"),
            Message("user", f"look {MEDIA_MARKER} listen {MEDIA_MARKER} and{MEDIA_MARKER}", media=media),
        ),
        sampling=Sampling(max_tokens=8),
    )
    text = "".join(c.text for c in front.stack.manager.stream(MODEL, req, Cancel()))
    assert text.startswith("The capital")
    messages = _posted(up)["messages"]
    assert messages[0] == {"role": "system", "content": "be brief"}  # text-only turns stay plain strings
    b64 = base64.b64encode
    assert messages[1]["content"] == [
        {"type": "text", "text": "look "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(PNG).decode()}},
        {"type": "text", "text": " listen "},
        {"type": "input_audio", "input_audio": {"data": b64(WAV).decode(), "format": "wav"}},
        {"type": "text", "text": " and"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(b"\xff\xd8\xff").decode()}},
    ]


def test_a_completion_with_media_is_refused_not_sent(replays, front_factory):
    entry = {"id": MODEL, "object": "model", "modalities": {"vision": True, "audio": False}}
    up = _engine(replays, {"object": "list", "data": [entry]})
    front = front_factory([{"name": "box", "url": up.url, "kind": "localrun"}])
    req = CompletionRequest(MEDIA_MARKER + "describe", Sampling(max_tokens=2), media=(Media("image", PNG),))
    with pytest.raises(UnsupportedFeature, match="completions API has no field"):
        list(front.stack.manager.stream(MODEL, req, Cancel()))
    assert not [r for r in up.requests if r["method"] == "POST"]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"id": "m"}, set()),
        ({"id": "m", "capabilities": ["completion", "multimodal"]}, {VISION}),
        ({"id": "m", "capabilities": ["completion", "vision", "audio"]}, {VISION, AUDIO}),
        ({"id": "m", "modalities": {"vision": False, "audio": True}}, {AUDIO}),
        ({"id": "m", "architecture": {"input_modalities": ["text", "image"]}}, {VISION}),
        ({"id": "m", "type": "vlm"}, {VISION}),
        ({"id": "m", "capabilities": "vision"}, set()),  # not a list: nothing assumed
        (None, set()),
    ],
)
def test_entry_media_reads_each_engines_words(entry, expected):
    assert entry_media(entry) == expected


def test_show_and_models_list_say_what_a_routed_model_takes(replays, front_factory):
    import httpx

    entry = {"id": MODEL, "object": "model", "capabilities": ["completion", "vision", "multimodal"]}
    up = _engine(replays, {"object": "list", "data": [entry, {"id": "plain", "object": "model"}]})
    front = front_factory([{"name": "box", "url": up.url, "kind": "localrun"}])
    shown = httpx.post(front.url + "/api/show", json={"model": MODEL}, timeout=10).json()
    assert shown["capabilities"] == ["completion", "vision"]
    plain = httpx.post(front.url + "/api/show", json={"model": "plain"}, timeout=10).json()
    assert plain["capabilities"] == ["completion"]
