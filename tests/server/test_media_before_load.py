"""An image or audio clip sent to a model with no projector is a 400 saying how to add one, on every
API family's route, before the model is loaded: no worker started, nothing resident (issue 33)."""

from __future__ import annotations

import pytest

from tests.server.media_samples import b64, data_url, png, wav
from tests.support.capabilities import ALL
from tests.support.stacks import fake_planner

PIC = png()
OPENAI_IMAGE = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": data_url(PIC)}}]
OPENAI_AUDIO = [
    {"type": "text", "text": "what is it?"},
    {"type": "input_audio", "input_audio": {"data": b64(wav()), "format": "wav"}},
]
ANTHROPIC_IMAGE = [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PIC)}},
    {"type": "text", "text": "what is it?"},
]
REQUESTS = {
    "openai chat image": ("/v1/chat/completions", {"messages": [{"role": "user", "content": OPENAI_IMAGE}]}),
    "openai chat audio": ("/v1/chat/completions", {"messages": [{"role": "user", "content": OPENAI_AUDIO}]}),
    "openai chat stream": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": OPENAI_IMAGE}], "stream": True},
    ),
    "ollama chat": (
        "/api/chat",
        {"messages": [{"role": "user", "content": "what is it?", "images": [b64(PIC)]}], "stream": False},
    ),
    "ollama chat num_ctx": (
        "/api/chat",
        {
            "messages": [{"role": "user", "content": "what is it?", "images": [b64(PIC)]}],
            "stream": False,
            "options": {"num_ctx": 512},
        },
    ),
    "ollama generate": ("/api/generate", {"prompt": "what is it?", "images": [b64(PIC)], "stream": False}),
    "ollama generate num_ctx": (
        "/api/generate",
        {"prompt": "what is it?", "images": [b64(PIC)], "stream": False, "options": {"num_ctx": 512}},
    ),
    "anthropic stream": (
        "/v1/messages",
        {"max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": ANTHROPIC_IMAGE}]},
    ),
    "anthropic": ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": ANTHROPIC_IMAGE}]}),
    "responses": (
        "/v1/responses",
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is it?"},
                        {"type": "input_image", "image_url": data_url(PIC)},
                    ],
                }
            ]
        },
    ),
    "responses stream": (
        "/v1/responses",
        {"stream": True, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": data_url(PIC)}]}]},
    ),
    "llama-server completion": (
        "/completion",
        {"prompt": {"prompt_string": "<__media__> what is it?", "multimodal_data": [b64(PIC)]}, "n_predict": 4},
    ),
}


@pytest.fixture
def text_only(build_stack):
    """A text-only model ("tiny": no projector, no vision or audio) and a count of its loads."""
    from fastapi.testclient import TestClient

    from localrun.server.app import create_app

    stack = build_stack(planner=fake_planner(fake_capabilities=list(ALL)))
    starts: list[str] = []
    real = stack.manager.start_handle
    stack.manager.start_handle = lambda record, plan: starts.append(record.name) or real(record, plan)
    with TestClient(
        create_app(stack.settings, stack.manager), base_url="http://localhost", raise_server_exceptions=False
    ) as client:
        yield client, stack.manager, starts


@pytest.mark.parametrize("case", list(REQUESTS))
def test_media_to_a_text_only_model_is_refused_before_it_loads(text_only, case):
    client, manager, starts = text_only
    route, body = REQUESTS[case]
    r = client.post(route, json={"model": "tiny", **body})
    assert r.status_code == 400, r.text
    assert "--mmproj" in r.text or "projector" in r.text, r.text
    assert starts == [] and not manager.is_loaded("tiny"), f"{case}: the model was loaded to refuse it"
