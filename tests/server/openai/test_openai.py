"""The official ``openai`` client against a live server on the fake runtime."""

from __future__ import annotations

import base64

import openai
import pytest

from tests.support.servers import wait_until


@pytest.fixture
def oai(live):
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=20) as client:
        yield client


def test_models_list_has_context_length(oai):
    models = oai.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert models[0].model_extra["context_length"] == 256  # the tiny GGUF's trained context
    assert oai.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="nope"):
        oai.models.retrieve("nope")


def test_chat_non_streaming_with_usage(oai):
    r = oai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello there"}], max_tokens=6, temperature=0
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content.startswith("You said: hello there.")
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 6
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert r.model == "tiny" and r.id.startswith("chatcmpl-")


def test_chat_streaming_joins_to_the_non_streamed_answer(oai):
    messages = [{"role": "user", "content": "count with me"}]
    whole = (
        oai.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
        .choices[0]
        .message.content
    )
    stream = oai.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 12
    # the same prompt again reuses the prefix: the fake reports it as cached tokens
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_stream_without_include_usage_has_no_usage_chunk(oai):
    chunks = list(
        oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True
        )
    )
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_completions_streaming_and_not(oai):
    r = oai.completions.create(model="tiny", prompt="one two three four", max_tokens=5, temperature=0)
    assert r.choices[0].text.startswith(" ... one two three four.")
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    parts = list(
        oai.completions.create(model="tiny", prompt="one two three four", max_tokens=5, temperature=0, stream=True)
    )
    assert "".join(p.choices[0].text for p in parts) == r.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"


def test_stop_strings_and_seed(oai):
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "seeded"}], max_tokens=20, temperature=0.9)
    a = oai.chat.completions.create(seed=1234, **kwargs).choices[0].message.content
    b = oai.chat.completions.create(seed=1234, **kwargs).choices[0].message.content
    assert a == b
    stopped = oai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "abc"}], stop=["said"], max_tokens=20
    )
    assert stopped.choices[0].message.content == "You "
    assert stopped.choices[0].finish_reason == "stop"
    single = oai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "abc"}], stop="abc", max_tokens=20
    )
    assert single.choices[0].message.content == "You said: "


def test_max_tokens_is_capped_by_settings(build_stack, live_factory):
    live = live_factory(build_stack(runtime={"max_tokens_cap": 4}))
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as client:
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "long"}], max_completion_tokens=1000
        )
        assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "long"}])
        assert r.usage.completion_tokens == 4


def test_unknown_model_is_404_naming_it(oai):
    with pytest.raises(openai.NotFoundError) as info:
        oai.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert "no-such-model" in info.value.message
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="no-such-model", prompt="x", stream=True)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
    ],
)
def test_fields_the_runtime_cannot_honour_are_400_naming_field_and_runtime(oai, kwargs, field):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], **kwargs)
    assert field in info.value.message and "fake" in info.value.message
    assert info.value.body["param"] == field


def test_image_content_is_refused_by_name(oai):
    content = [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[1\]"):
        oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}])


def test_text_content_parts_are_joined(oai):
    content = [{"type": "text", "text": "part one"}, {"type": "text", "text": " part two"}]
    r = oai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], max_tokens=8, temperature=0
    )
    assert r.choices[0].message.content.startswith("You said: part one part two.")


def test_unknown_field_is_ignored_and_named_bad_numbers_are_400(oai):
    raw = oai.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], extra_body={"frobnicate": 1}, max_tokens=4
    )
    assert raw.headers["x-localrun-ignored-fields"] == "frobnicate" and raw.parse().choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="temperature"):
        oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=7)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=-5)


def test_embeddings_float_and_default_base64(oai):
    floats = oai.embeddings.create(model="tiny", input=["alpha", "beta", "alpha"], encoding_format="float")
    vectors = [d.embedding for d in floats.data]
    assert len(vectors) == 3 and vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert abs(sum(v * v for v in vectors[0]) - 1.0) < 1e-6
    # the client asks for base64 by default and decodes it itself
    default = oai.embeddings.create(model="tiny", input="alpha")
    assert default.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="nope", input="x")


def test_embeddings_base64_wire_format(live):
    import httpx
    import numpy as np

    r = httpx.post(f"{live.url}/v1/embeddings", json={"model": "tiny", "input": "alpha", "encoding_format": "base64"})
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").shape == (16,)


def test_model_loads_on_first_use_and_is_reported(oai, live):
    assert live.stack.manager.loaded() == []
    oai.completions.create(model="tiny", prompt="x", max_tokens=1)
    assert wait_until(lambda: [m["name"] for m in live.stack.manager.loaded()] == ["tiny"], 2)
    models = oai.models.list().data
    assert models[0].model_extra["loaded"] is True and models[0].model_extra["loaded_context_length"] == 2048


@pytest.mark.parametrize("stream", [False, True])
def test_context_overflow_is_a_400_even_when_streaming(oai, stream):
    """The first chunk is read before the response starts, so a runtime's refusal keeps its status."""
    long = " ".join(["word"] * 3000)  # the fake runtime's context is 2048 tokens here
    with pytest.raises(openai.BadRequestError) as info:
        r = oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}], stream=stream)
        list(r) if stream else None
    assert info.value.body["code"] == "context_length_exceeded" and "2048" in info.value.message
