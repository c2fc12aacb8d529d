"""The Anthropic Messages API on real llama.cpp workers, through the official SDK: SmolLM2
135M Instruct (the default chat model: a real chat template) and the tiny random GGUF
(a forced tool call, valid by grammar even from random weights)."""

from __future__ import annotations

import pytest

from tests.conftest import needs_llama
from tests.support.clients import WEATHER, anthropic_client

pytestmark = [needs_llama, pytest.mark.llama]
anthropic = pytest.importorskip("anthropic")

GREEDY = {"extra_body": {"temperature": 0}}
ONE_THREAD = {"n_threads": 1}


def slots(n_ctx: int) -> dict:
    """One slot of ``n_ctx`` tokens (the planner's own slots hold the model's whole context)."""
    return {"n_slots": 1, "slot_ctx": n_ctx}


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory):
    """The tiny random llama with room for a tool listing (its byte-level vocabulary makes it long)."""
    from tests.factories import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny-long") / "tiny-long.gguf", n_ctx_train=4096)


def test_smollm2_messages_stream_count_and_prefix_cache(serve, smollm2_path):
    server = serve(smollm2_path, "smol", runtime="", plan={**ONE_THREAD, "n_ctx": 1024}, **slots(1024))
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cch=0a1b2;"},
        {"type": "text", "text": "You are a helpful assistant.", "cache_control": {"type": "ephemeral"}},
    ]
    ask = [{"role": "user", "content": "What is 2 + 2?"}]
    with anthropic_client(server, timeout=300) as client:
        counted = client.messages.count_tokens(model="smol", system=system, messages=ask).input_tokens
        m = client.messages.create(model="smol", max_tokens=12, system=system, messages=ask, **GREEDY)
        assert m.content[0].type == "text" and m.content[0].text.strip()
        assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 12
        # count_tokens ran this very prompt: its prefill is in the cache for the request that followed
        assert m.usage.input_tokens + m.usage.cache_read_input_tokens == counted
        assert m.usage.cache_read_input_tokens >= counted - 16
        # the next request's billing hash differs: rewritten, the whole prompt is still cached
        system2 = [{**system[0], "text": "x-anthropic-billing-header: cc_version=2.1.197; cch=ffe91;"}, system[1]]
        with client.messages.stream(model="smol", max_tokens=12, system=system2, messages=ask, **GREEDY) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text == m.content[0].text  # greedy: the streamed answer is the created one
        assert final.usage.cache_read_input_tokens >= counted - 16
        with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 1023 maximum"):
            client.messages.create(model="smol", max_tokens=4, messages=[{"role": "user", "content": "hello " * 1500}])


def test_smollm2_claude_code_shaped_turns(serve, smollm2_path):
    """A system turn inside messages, thinking history, adaptive thinking, a tool result: served, and in order."""
    server = serve(smollm2_path, "smol", runtime="", plan={**ONE_THREAD, "n_ctx": 2048}, **slots(2048))
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 1}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "system", "content": "Be brief."},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "I should call the tool.", "signature": ""}, call],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]},
    ]
    with anthropic_client(server, timeout=300) as client:
        m = client.messages.create(
            model="smol",
            max_tokens=10,
            messages=messages,
            tools=[WEATHER],
            thinking={"type": "adaptive"},
            **GREEDY,
        )
        assert m.content and m.stop_reason in ("end_turn", "max_tokens", "tool_use")


#: Bounded arguments: random weights stay inside an enum, where a free string could run past max_tokens.
BOUNDED_WEATHER = {
    "name": "get_weather",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}


def test_tiny_forced_tool_call_is_valid_by_grammar(serve, tiny_long):
    server = serve(tiny_long, "tiny", runtime="", plan={**ONE_THREAD, "n_ctx": 2048}, **slots(2048))
    with anthropic_client(server, timeout=300) as client:
        m = client.messages.create(
            model="tiny",
            max_tokens=120,
            tools=[BOUNDED_WEATHER],
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "weather?"}],
        )
        calls = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and calls and calls[0].name == "get_weather"
        assert calls[0].input["city"] in ("Paris", "Oslo", "Lima") and isinstance(calls[0].input["days"], int)
        with client.messages.stream(
            model="tiny",
            max_tokens=120,
            tools=[BOUNDED_WEATHER],
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "weather?"}],
        ) as s:
            final = s.get_final_message()
        assert [b.name for b in final.content if b.type == "tool_use"] == ["get_weather"]
