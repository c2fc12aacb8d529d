"""The official ``openai``, ``anthropic`` and ``ollama`` clients sending images (and audio) in their
own shapes to a real server process on the fake runtime, which names the media it received: one
case each, streamed where the client streams, and one refusal each in the client's error type."""

from __future__ import annotations

import anthropic
import ollama
import openai
import pytest

from tests.server.media_samples import MEDIA_CAPS, b64, data_url, note, png, wav
from tests.support import servers


@pytest.fixture(scope="module")
def media_server(tmp_path_factory, tiny_gguf):
    server = servers.start_in_home(
        tmp_path_factory.mktemp("media-home"), tiny_gguf, "tiny", fake_capabilities=list(MEDIA_CAPS)
    )
    yield server
    server.stop()


def test_openai_client_image_and_audio_streamed(media_server):
    pic, clip = png(), wav()
    content = [
        {"type": "text", "text": "what is in these"},
        {"type": "image_url", "image_url": {"url": data_url(pic), "detail": "auto"}},
        {"type": "input_audio", "input_audio": {"data": b64(clip), "format": "wav"}},
    ]
    with openai.OpenAI(base_url=f"{media_server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": content}], max_tokens=40, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert note(("image/png", pic), ("audio/wav", clip)) in text
        bad = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": bad}])
        assert info.value.body["code"] == "invalid_media" and info.value.body["param"] == "messages[0].content[0]"


def test_openai_responses_client_input_image(media_server):
    pic = png((3, 3))
    with openai.OpenAI(base_url=f"{media_server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        r = client.responses.create(
            model="tiny",
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": data_url(pic), "detail": "low"}]}],
            max_output_tokens=40,
        )
    assert note(("image/png", pic)) in r.output_text


def test_anthropic_client_image_in_a_tool_result(media_server):
    shot = png((8, 5))
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(shot)}}
    messages = [
        {"role": "user", "content": "screenshot please"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}]},
    ]
    tools = [{"name": "shot", "input_schema": {"type": "object", "properties": {}}}]
    client = anthropic.Anthropic(base_url=media_server.url, api_key="x", max_retries=0, timeout=30)
    with client.messages.stream(model="tiny", max_tokens=40, messages=messages, tools=tools) as stream:
        text = "".join(stream.text_stream)
    assert note(("image/png", shot)) in text
    image["source"]["data"] = b64(b"<html>not a picture</html>")
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[0\] is not an image"):
        client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": [image]}])


def test_ollama_client_images(media_server):
    pic = png()
    client = ollama.Client(host=media_server.url, timeout=30)
    r = client.chat(model="tiny", messages=[{"role": "user", "content": "describe", "images": [pic]}])
    assert note(("image/png", pic)) in r.message.content
    g = client.generate(model="tiny", prompt="describe", images=[pic])
    assert note(("image/png", pic)) in g.response
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="tiny", messages=[{"role": "user", "content": "x", "images": [b"not an image"]}])
    assert info.value.status_code == 400 and "messages[0].images[0]" in info.value.error
