"""Images and audio in the Anthropic, Responses and Ollama shapes, through the in-process app on the
fake runtime, whose answer names each media item that reached it (type and size, in prompt order)."""

from __future__ import annotations

import json

import pytest

from tests.server.media_samples import MEDIA_CAPS, b64, data_url, image, note, png, wav


@pytest.fixture
def media_client(app_client):
    return app_client(MEDIA_CAPS)


# --- Anthropic ------------------------------------------------------------------------------------


def _messages(client, content, **extra):
    body = {"model": "tiny", "max_tokens": 40, "messages": [{"role": "user", "content": content}]}
    return client.post("/v1/messages", json={**body, **extra})


def _anthropic_text(r) -> str:
    assert r.status_code == 200, r.text
    return "".join(b.get("text", "") for b in r.json()["content"])


def _image_block(data: bytes, mime: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": b64(data)}}


def test_anthropic_image_blocks_in_order(media_client):
    a, b = png(), image("GIF")
    content = [_image_block(a), {"type": "text", "text": "and"}, _image_block(b, "image/gif")]
    text = _anthropic_text(_messages(media_client, content))
    assert note(("image/png", a), ("image/gif", b)) in text
    assert "<__media__>\n\nand\n\n<__media__>" in text


def test_anthropic_image_inside_a_tool_result(media_client):
    """Claude Code returns a screenshot as an image block in the tool_result's content."""
    shot = png((16, 9))
    messages = [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "here it is"}, _image_block(shot)],
                },
                {"type": "text", "text": "what do you see"},
            ],
        },
    ]
    tools = [{"name": "shot", "input_schema": {"type": "object", "properties": {}}}]
    r = media_client.post(
        "/v1/messages", json={"model": "tiny", "max_tokens": 40, "messages": messages, "tools": tools}
    )
    assert note(("image/png", shot)) in _anthropic_text(r)


def test_anthropic_streamed(media_client):
    pic = png()
    r = _messages(media_client, [_image_block(pic), {"type": "text", "text": "hi"}], stream=True)
    assert r.status_code == 200
    deltas = [
        json.loads(line[6:])["delta"].get("text", "")
        for line in r.text.splitlines()
        if line.startswith("data: ") and '"content_block_delta"' in line
    ]
    assert note(("image/png", pic)) in "".join(deltas)


def test_anthropic_count_tokens_counts_the_image(media_client):
    text = {"type": "text", "text": "x"}
    body = {"model": "tiny", "messages": [{"role": "user", "content": [_image_block(png()), text]}]}
    with_image = media_client.post("/v1/messages/count_tokens", json=body)
    body["messages"][0]["content"] = [text]
    without = media_client.post("/v1/messages/count_tokens", json=body)
    assert with_image.status_code == 200 and without.status_code == 200
    assert with_image.json()["input_tokens"] > without.json()["input_tokens"]  # the fake counts a marker as one


def test_anthropic_media_type_must_agree_in_kind_and_errors_are_anthropic_shaped(media_client):
    r = _messages(media_client, [_image_block(wav(), "image/png")])
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0]" in body["error"]["message"] and "audio" in body["error"]["message"]


def test_anthropic_files_and_documents_are_refused_by_name(media_client):
    r = _messages(media_client, [{"type": "image", "source": {"type": "file", "file_id": "file_abc"}}])
    assert r.status_code == 400 and "Files API" in r.json()["error"]["message"]
    doc = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}}
    r = _messages(media_client, [doc, {"type": "text", "text": "summarise"}])
    assert r.status_code == 400 and "messages[0].content[0]" in r.json()["error"]["message"]


def test_anthropic_image_to_a_model_without_vision(app_client):
    r = _messages(app_client(("tools",)), [_image_block(png()), {"type": "text", "text": "x"}])
    assert r.status_code == 400 and "--mmproj" in r.json()["error"]["message"]


# --- Responses ------------------------------------------------------------------------------------


def _respond(client, content, **extra):
    body = {"model": "tiny", "max_output_tokens": 40, "input": [{"role": "user", "content": content}]}
    return client.post("/v1/responses", json={**body, **extra})


def _output_text(r) -> str:
    assert r.status_code == 200, r.text
    return "".join(
        part.get("text", "") for item in r.json()["output"] if item["type"] == "message" for part in item["content"]
    )


def test_responses_input_image(media_client):
    pic = png()
    content = [
        {"type": "input_text", "text": "describe"},
        {"type": "input_image", "image_url": data_url(pic), "detail": "low"},
    ]
    assert note(("image/png", pic)) in _output_text(_respond(media_client, content))


def test_responses_image_in_a_function_output_and_stored_history(media_client):
    """Codex returns a viewed image as an input_image in a function_call_output; a stored response's
    input (the image) is replayed for ``previous_response_id``."""
    shot = png((5, 5))
    first = _respond(media_client, [{"type": "input_image", "image_url": data_url(shot)}])
    assert note(("image/png", shot)) in _output_text(first)
    again = media_client.post(
        "/v1/responses",
        json={
            "model": "tiny",
            "previous_response_id": first.json()["id"],
            "input": "and now?",
            "max_output_tokens": 60,
        },
    )
    assert note(("image/png", shot)) in _output_text(again)
    items = [
        {"type": "function_call", "call_id": "c1", "name": "view", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_image", "image_url": data_url(shot)}],
        },
    ]
    tools = [{"type": "function", "name": "view", "parameters": {"type": "object", "properties": {}}}]
    r = media_client.post(
        "/v1/responses", json={"model": "tiny", "input": items, "tools": tools, "max_output_tokens": 40}
    )
    assert note(("image/png", shot)) in _output_text(r)


def test_responses_streamed(media_client):
    pic = png()
    r = _respond(media_client, [{"type": "input_image", "image_url": data_url(pic)}], stream=True)
    assert r.status_code == 200
    deltas = [
        json.loads(line[6:]).get("delta", "")
        for line in r.text.splitlines()
        if line.startswith("data: ") and "output_text.delta" in line
    ]
    assert note(("image/png", pic)) in "".join(deltas)


def test_responses_bad_image_names_the_item(media_client):
    r = _respond(media_client, [{"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": "data:,x"}])
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "input[0].content[1]" and "base64" in err["message"]


# --- Ollama ---------------------------------------------------------------------------------------


def _ollama_chat(client, message, **extra):
    return client.post("/api/chat", json={"model": "tiny", "messages": [message], "stream": False, **extra})


def test_ollama_chat_images_go_before_the_text_or_at_img_tags(media_client):
    a, b = png(), image("JPEG")
    r = _ollama_chat(media_client, {"role": "user", "content": "look", "images": [b64(a), b64(b)]})
    assert r.status_code == 200, r.text
    text = r.json()["message"]["content"]
    assert note(("image/png", a), ("image/jpeg", b)) in text and "<__media__><__media__>look" in text
    # The first image takes the [img] tag; the second finds none left and goes first (Ollama's rule),
    # so the runtime sees b then a.
    r = _ollama_chat(media_client, {"role": "user", "content": "x [img] y", "images": [b64(a), b64(b)]})
    text = r.json()["message"]["content"]
    assert "<__media__>x <__media__> y" in text and note(("image/jpeg", b), ("image/png", a)) in text


def test_ollama_images_may_hold_audio(media_client):
    clip = wav()
    r = _ollama_chat(media_client, {"role": "user", "content": "listen", "images": [b64(clip)]})
    assert r.status_code == 200 and note(("audio/wav", clip)) in r.json()["message"]["content"]


def test_ollama_generate_with_images_streamed_and_not(media_client):
    pic = png()
    body = {"model": "tiny", "prompt": "what is it", "images": [b64(pic)], "stream": False}
    r = media_client.post("/api/generate", json=body)
    assert r.status_code == 200, r.text
    assert note(("image/png", pic)) in r.json()["response"] and "context" not in r.json()
    streamed = media_client.post("/api/generate", json={**body, "stream": True})
    text = "".join(json.loads(line).get("response", "") for line in streamed.text.splitlines() if line.strip())
    assert note(("image/png", pic)) in text
    raw = media_client.post("/api/generate", json={**body, "raw": True})
    assert raw.status_code == 200 and note(("image/png", pic)) in raw.json()["response"]


def test_ollama_errors_are_ollama_shaped(media_client, app_client):
    r = _ollama_chat(media_client, {"role": "user", "content": "x", "images": ["not base64!"]})
    assert r.status_code == 400 and "messages[0].images[0]" in r.json()["error"]
    r = media_client.post("/api/generate", json={"model": "tiny", "prompt": "x", "images": [b64(b"hello world")]})
    assert r.status_code == 400 and "images[0]" in r.json()["error"]
    r = _ollama_chat(app_client(("tools",)), {"role": "user", "content": "x", "images": [b64(png())]})
    assert r.status_code == 400 and "--mmproj" in r.json()["error"]
