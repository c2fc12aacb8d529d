"""A request that names no answer length: a model in completion mode (no chat template: a base
model never says it is done) stops at ``runtime.completion_max_tokens``, a chat model at the cap;
a length asked for is kept within the cap. The manager applies it, so every front end gets it."""

from __future__ import annotations

import asyncio

from localrun.manager import ModelManager
from localrun.settings import load_settings
from localrun.types import ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling


class _Store:
    def __init__(self, *records: ModelRecord) -> None:
        self.records = {r.name: r for r in records}

    def resolve(self, name: str) -> ModelRecord:
        return self.records[name]


BASE = ModelRecord(name="base", format=Format.GGUF, path="/m/base.gguf")
CHAT = ModelRecord(name="chat", format=Format.GGUF, path="/m/chat.gguf", metadata={"chat_template": "{{ x }}"})


def _manager(**runtime) -> ModelManager:
    settings = load_settings(runtime={"completion_max_tokens": 7, "max_tokens_cap": 50, **runtime})
    planner = lambda record: Plan(runtime="fake", n_ctx=4096, options={"fake_reply_words": 500})  # noqa: E731
    return ModelManager(settings, _Store(BASE, CHAT), planner=planner)


def _last(manager: ModelManager, name: str, req: ChatRequest | CompletionRequest):
    chunks = list(manager.stream(name, req))
    return chunks[-1]


def test_completion_mode_without_max_tokens_stops_at_the_small_default():
    m = _manager()
    try:
        end = _last(m, "base", CompletionRequest(prompt="The capital of France is", sampling=Sampling()))
        assert end.finish_reason == "length" and end.usage.completion_tokens == 7
        # a chat request to a base model rambles the same way: it is bounded too
        end = _last(m, "base", ChatRequest(messages=(Message("user", "hi"),), sampling=Sampling()))
        assert end.usage.completion_tokens == 7
    finally:
        m.shutdown()


def test_chat_model_keeps_the_cap_and_asked_lengths_are_kept_within_it():
    m = _manager()
    try:
        chat = ChatRequest(messages=(Message("user", "hi"),), sampling=Sampling())
        assert _last(m, "chat", chat).usage.completion_tokens == 50
        asked = CompletionRequest(prompt="x", sampling=Sampling(max_tokens=20))
        assert _last(m, "base", asked).usage.completion_tokens == 20  # --max-tokens changes it
        assert (
            _last(m, "base", CompletionRequest(prompt="x", sampling=Sampling(max_tokens=999))).usage.completion_tokens
            == 50
        )
    finally:
        m.shutdown()


def test_the_servers_path_is_bounded_the_same_way():
    m = _manager()

    async def go() -> int:
        stream = await m.aopen("base", CompletionRequest(prompt="x", sampling=Sampling()))
        last = None
        async for chunk in stream:
            last = chunk
        return last.usage.completion_tokens

    try:
        assert asyncio.run(go()) == 7
    finally:
        m.shutdown()
