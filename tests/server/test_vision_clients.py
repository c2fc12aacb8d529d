"""Images and audio through the official clients against a real server: Gemma 3 270M + the tiny
fixture projector (and, for audio, the tiny audio projector) on llama.cpp.

Each client sends media in its own shape: ``openai`` (``image_url`` data URL, ``input_audio``),
``anthropic`` (an ``image`` block, and one inside a ``tool_result`` as Claude Code returns
screenshots), ``ollama`` (``images=``), the openai Responses client (``input_image``), and curl on
llama-server's ``/completion`` with ``multimodal_data``; streamed and not. The model's answers are
noise (random projector weights), so what is asserted is what is real: a 200 with text, the image's
tokens in the usage, and the prefix cache: turn 2 with the same image reports its tokens cached, a
different image does not.
"""

from __future__ import annotations

import json
import subprocess

import openai
import pytest

from tests.conftest import needs_llama
from tests.support.clients import anthropic_client, client_for
from tests.support.vision_serve import MODEL, b64, good_image, start_vision_server

pytestmark = [needs_llama, pytest.mark.llama, pytest.mark.gemma, pytest.mark.slow]

vision = pytest.importorskip("tests.support.vision")
PER_IMAGE = vision.TINY.tokens_per_image
RED, BLUE, GREEN = (good_image("PNG", (40, 40), seed=s) for s in (1, 2, 3))


@pytest.fixture(scope="module")
def server(tmp_path_factory, gemma_gguf):
    srv = start_vision_server(tmp_path_factory.mktemp("clients-home"), gemma_gguf, vision.vision_projector(vision.TINY))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def audio_server(tmp_path_factory, gemma_gguf):
    srv = start_vision_server(
        tmp_path_factory.mktemp("audio-home"), gemma_gguf, vision.audio_projector(vision.TINY_AUDIO)
    )
    yield srv
    srv.stop()


def _url(png: bytes) -> str:
    return "data:image/png;base64," + b64(png)


def _image_message(text: str, png: bytes) -> dict:
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": _url(png)}}],
    }


def _text_tokens(oai, text: str) -> int:
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=1)
    return r.usage.prompt_tokens


# openai


def test_openai_image_url_counts_the_image(server):
    oai = client_for(server, timeout=120)
    r = oai.chat.completions.create(
        model=MODEL, messages=[_image_message("What is it?", RED)], max_tokens=3, temperature=0
    )
    assert isinstance(r.choices[0].message.content, str)
    assert r.usage.prompt_tokens >= _text_tokens(oai, "What is it?") + PER_IMAGE


def test_openai_image_url_streamed(server):
    oai = client_for(server, timeout=120)
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=[_image_message("Name it.", BLUE)],
        max_tokens=3,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) is not None
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens >= _text_tokens(oai, "Name it.") + PER_IMAGE


def test_openai_input_audio(audio_server):
    oai = client_for(audio_server, timeout=900)  # Whisper pads every clip to 30 s: 750 tokens to prefill
    clip = b64(vision.wav_bytes(1.0))
    content = [
        {"type": "text", "text": "What do you hear?"},
        {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}},
    ]
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=3)
    assert isinstance(r.choices[0].message.content, str)
    assert r.usage.prompt_tokens > _text_tokens(oai, "What do you hear?") + 10


def test_openai_input_audio_to_a_vision_only_projector_is_a_400(server):
    oai = client_for(server)
    content = [{"type": "input_audio", "input_audio": {"data": b64(vision.wav_bytes(0.5)), "format": "wav"}}]
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2)
    assert "audio" in str(err.value).lower()


# prefix cache


def _cached(r) -> int:
    details = r.usage.prompt_tokens_details
    return (details.cached_tokens or 0) if details else 0


def test_turn_two_with_the_same_image_reports_it_cached_a_different_one_does_not(server):
    oai = client_for(server, timeout=120)
    first = [_image_message("Turn one about the picture, please.", GREEN)]
    one = oai.chat.completions.create(model=MODEL, messages=first, max_tokens=2, temperature=0)
    reply = {"role": "assistant", "content": one.choices[0].message.content or "ok"}
    two = oai.chat.completions.create(
        model=MODEL, messages=[*first, reply, {"role": "user", "content": "And?"}], max_tokens=2
    )
    assert _cached(two) >= one.usage.prompt_tokens - 2  # everything up to the end of turn one's prompt
    assert _cached(two) >= PER_IMAGE
    swapped = [_image_message("Turn one about the picture, please.", RED), reply, {"role": "user", "content": "And?"}]
    other = oai.chat.completions.create(model=MODEL, messages=swapped, max_tokens=2)
    assert other.usage.prompt_tokens == two.usage.prompt_tokens  # the same shape...
    assert _cached(other) + PER_IMAGE <= _cached(two)  # ...but the cache stops where the image differs


# anthropic


def _image_block(png: bytes) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png)}}


def _input(usage) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_anthropic_image_block(server):
    client = anthropic_client(server, timeout=120)
    text = [{"type": "text", "text": "Describe the picture."}]
    r = client.messages.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": [_image_block(RED), *text]}]
    )
    plain = client.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": text}])
    assert r.content and r.content[0].type == "text"
    assert _input(r.usage) >= _input(plain.usage) + PER_IMAGE


def test_anthropic_image_block_streamed(server):
    client = anthropic_client(server, timeout=120)
    content = [_image_block(BLUE), {"type": "text", "text": "Streamed picture."}]
    with client.messages.stream(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": content}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert isinstance(text, str)
    assert _input(final.usage) > PER_IMAGE


SCREENSHOT_TOOL = {
    "name": "screenshot",
    "description": "Take a screenshot",
    "input_schema": {"type": "object", "properties": {}},
}


def _tool_turn(result_content: list) -> list:
    return [
        {"role": "user", "content": "Take a screenshot and tell me what you see."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result_content}]},
    ]


def test_anthropic_image_inside_a_tool_result(server):
    client = anthropic_client(server, timeout=120)
    shot = [_image_block(GREEN), {"type": "text", "text": "the screen"}]
    r = client.messages.create(model=MODEL, max_tokens=3, tools=[SCREENSHOT_TOOL], messages=_tool_turn(shot))
    plain = client.messages.create(
        model=MODEL,
        max_tokens=1,
        tools=[SCREENSHOT_TOOL],
        messages=_tool_turn([{"type": "text", "text": "the screen"}]),
    )
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert _input(r.usage) >= _input(plain.usage) + PER_IMAGE


# ollama


def test_ollama_images_on_chat_and_generate(server):
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=server.url, timeout=120)
    chat = client.chat(
        model=MODEL, messages=[{"role": "user", "content": "What is it?", "images": [RED]}], options={"num_predict": 3}
    )
    plain = client.chat(model=MODEL, messages=[{"role": "user", "content": "What is it?"}], options={"num_predict": 1})
    assert isinstance(chat.message.content, str)
    assert chat.prompt_eval_count >= plain.prompt_eval_count + PER_IMAGE
    gen = client.generate(model=MODEL, prompt="What is it?", images=[BLUE], options={"num_predict": 3})
    assert isinstance(gen.response, str) and gen.prompt_eval_count > PER_IMAGE


def test_ollama_images_streamed(server):
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=server.url, timeout=120)
    parts = list(
        client.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "Stream it.", "images": [GREEN]}],
            stream=True,
            options={"num_predict": 3},
        )
    )
    assert parts[-1].done and parts[-1].prompt_eval_count > PER_IMAGE


# the Responses client


def test_responses_input_image(server):
    oai = client_for(server, timeout=120)
    content = [{"type": "input_text", "text": "What is in it?"}, {"type": "input_image", "image_url": _url(RED)}]
    r = oai.responses.create(
        model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=3, store=False
    )
    assert isinstance(r.output_text, str)
    plain = oai.responses.create(model=MODEL, input="What is in it?", max_output_tokens=1, store=False)
    assert r.usage.input_tokens >= plain.usage.input_tokens + PER_IMAGE


def test_responses_input_image_streamed(server):
    oai = client_for(server, timeout=120)
    content = [{"type": "input_text", "text": "Streamed."}, {"type": "input_image", "image_url": _url(BLUE)}]
    events = list(
        oai.responses.create(
            model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=3, store=False, stream=True
        )
    )
    done = [e for e in events if e.type in ("response.completed", "response.incomplete")]  # max_output_tokens
    assert done and done[0].response.usage.input_tokens > PER_IMAGE


# curl on llama-server's /completion


def _curl(server, body: dict) -> str:
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-N",
            "--max-time",
            "120",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(body),
            f"{server.url}/completion",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


@pytest.mark.parametrize("stream", [False, True])
def test_curl_completion_with_multimodal_data(server, stream):
    prompt = {"prompt_string": "Look: <__media__>\nIt is", "multimodal_data": [b64(GREEN)]}
    out = _curl(server, {"prompt": prompt, "n_predict": 3, "temperature": 0, "stream": stream})
    if stream:
        events = [
            json.loads(line[5:])
            for line in out.splitlines()
            if line.startswith("data:") and line[5:].strip() != "[DONE]"
        ]
        assert events and events[-1]["stop"] is True
        final = events[-1]
    else:
        final = json.loads(out)
        assert isinstance(final["content"], str)
    assert final["tokens_evaluated"] > PER_IMAGE
