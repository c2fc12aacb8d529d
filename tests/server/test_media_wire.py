"""Images and audio in OpenAI's shapes (chat ``image_url`` / ``input_audio``, and llama-server's
``multimodal_data`` on ``/completion`` and ``/v1/completions``), through the in-process app on the
fake runtime, whose answer names every media item that reached it (type and size, in prompt
order): what the server made of the wire shape is checked exactly."""

from __future__ import annotations

import json

import pytest

from tests.server.media_samples import MEDIA_CAPS, b64, data_url, image, mp3, note, png, wav


@pytest.fixture
def media_client(app_client):
    return app_client(MEDIA_CAPS)


def _chat(client, content, **extra):
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 40, "temperature": 0}
    return client.post("/v1/chat/completions", json={**body, **extra})


def _text(r) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _sse_text(r) -> str:
    assert r.status_code == 200, r.text
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                out.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(out)


def test_image_url_object_and_string_forms_reach_the_runtime_in_order(media_client):
    first, second = png(), image("JPEG")
    content = [
        {"type": "text", "text": "compare "},
        {"type": "image_url", "image_url": {"url": data_url(first), "detail": "high"}},
        {"type": "text", "text": " with "},
        {"type": "image_url", "image_url": data_url(second, "image/jpeg")},
    ]
    text = _text(_chat(media_client, content))
    assert note(("image/png", first), ("image/jpeg", second)) in text
    # Each part's marker stood where the client put it: the echo shows the text around them.
    assert "compare <__media__> with <__media__>." in text


def test_input_audio_wav_and_mp3(media_client):
    clip, frame = wav(), mp3()
    content = [
        {"type": "input_audio", "input_audio": {"data": b64(clip), "format": "wav"}},
        {"type": "input_audio", "input_audio": {"data": b64(frame), "format": "mp3"}},
        {"type": "text", "text": "transcribe"},
    ]
    assert note(("audio/wav", clip), ("audio/mpeg", frame)) in _text(_chat(media_client, content))


def test_streamed_chat_carries_the_media_too(media_client):
    pic = png()
    content = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": data_url(pic)}}]
    assert note(("image/png", pic)) in _sse_text(_chat(media_client, content, stream=True))


def test_media_in_earlier_turns_keeps_prompt_order(media_client):
    old, new = png(color="blue"), png((8, 8))
    messages = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(old)}}]},
        {"role": "assistant", "content": "a blue square"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "and"}, {"type": "image_url", "image_url": data_url(new)}],
        },
    ]
    r = media_client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 40})
    assert note(("image/png", old), ("image/png", new)) in _text(r)


def test_a_typed_marker_is_not_media(media_client):
    """A client that writes the marker itself places nothing: the runtime gets no media, the marker is defused."""
    text = _text(_chat(media_client, "look <__media__> here"))
    assert "[media:" not in text and "<__media__>" not in text


def test_a_typed_marker_beside_a_real_image_does_not_steal_it(media_client):
    pic = png()
    content = [{"type": "text", "text": "<__media__> first"}, {"type": "image_url", "image_url": data_url(pic)}]
    text = _text(_chat(media_client, content))
    assert text.count("<__media__>") == 1 and note(("image/png", pic)) in text


@pytest.mark.parametrize(
    ("caps", "part", "needle"),
    [
        (("tools",), {"type": "image_url", "image_url": "IMAGE"}, "has no vision projector"),
        (("vision",), {"type": "input_audio", "input_audio": {"data": "AUDIO", "format": "wav"}}, "takes images only"),
        ((), {"type": "input_audio", "input_audio": {"data": "AUDIO", "format": "wav"}}, "no projector that takes"),
    ],
)
def test_media_the_runtime_cannot_take_is_a_400_naming_model_and_how_to_add_a_projector(app_client, caps, part, needle):
    client = app_client(caps)
    part = json.loads(json.dumps(part).replace('"IMAGE"', json.dumps(data_url(png()))).replace("AUDIO", b64(wav())))
    r = _chat(client, [{"type": "text", "text": "x"}, part])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[0].content[1]" and "fake runtime serving tiny" in err["message"]
    assert needle in err["message"] and "tiny" in err["message"]
    if "no" in needle:
        assert "--mmproj" in err["message"]


def test_audio_output_is_not_audio_input(media_client):
    r = _chat(media_client, "hi", modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
    assert r.status_code == 400 and "answers in text" in r.json()["error"]["message"]


def test_legacy_completions_take_llama_server_prompt_objects(media_client):
    pic = png()
    body = {
        "model": "tiny",
        "max_tokens": 30,
        "prompt": {"prompt_string": "A <__media__> B", "multimodal_data": [b64(pic)]},
    }
    r = media_client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert note(("image/png", pic)) in r.json()["choices"][0]["text"]


def test_native_completion_with_multimodal_data_streamed_and_not(media_client):
    pic, clip = png(), wav()
    prompt = {"prompt_string": "What is this: <__media__> and <__media__>\n", "multimodal_data": [b64(pic), b64(clip)]}
    r = media_client.post("/completion", json={"prompt": prompt, "n_predict": 30})
    assert r.status_code == 200, r.text
    body = r.json()
    assert note(("image/png", pic), ("audio/wav", clip)) in body["content"]
    assert body["tokens_evaluated"] > 0
    streamed = media_client.post("/completion", json={"prompt": prompt, "n_predict": 30, "stream": True})
    assert note(("image/png", pic), ("audio/wav", clip)) in _sse_content(streamed)


def _sse_content(r) -> str:
    assert r.status_code == 200, r.text
    return "".join(
        json.loads(line[6:]).get("content", "") for line in r.text.splitlines() if line.startswith("data: {")
    )


def test_multimodal_data_without_markers_follows_the_text(media_client):
    pic = png()
    r = media_client.post("/completion", json={"prompt": {"prompt_string": "caption:", "multimodal_data": [b64(pic)]}})
    assert r.status_code == 200, r.text
    assert "caption:<__media__>" in r.json()["content"]


@pytest.mark.parametrize(
    ("prompt", "files", "needle"),
    [
        ("one <__media__> two <__media__>", 1, "holds 2 media markers"),
        ("What is this:\n", 0, None),  # llama-server's own case: an empty string item
    ],
)
def test_marker_count_must_match(media_client, prompt, files, needle):
    data = [b64(png())] * files if files else [""]
    r = media_client.post("/completion", json={"prompt": {"prompt_string": prompt, "multimodal_data": data}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"].startswith("prompt.multimodal_data")
    assert (needle or "is empty") in err["message"]


def test_a_plain_prompt_with_a_typed_marker_places_nothing(media_client):
    r = media_client.post("/completion", json={"prompt": "x <__media__> y", "n_predict": 20})
    assert r.status_code == 200 and "<__media__>" not in r.json()["content"]
