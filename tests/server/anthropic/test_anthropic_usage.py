"""What llama.cpp's own server tests found on the Anthropic route, on real llama.cpp workers:
``message_start`` carries the prompt's real ``input_tokens`` (Claude Code tracks its context
window from it), and an assistant turn's ``thinking`` block before its ``tool_use`` stays in the
prompt, as ``reasoning_content`` for a template that renders it, and ``count_tokens`` counts it."""

from __future__ import annotations

import json

import httpx
import pytest

from localrun.server.anthropic.convert import core_messages
from localrun.server.anthropic.schemas import CountTokensRequest
from tests.conftest import needs_llama

#: A reasoning model's template in miniature (Qwen3's habit): an assistant turn renders its
#: ``reasoning_content`` inside <think> before its text and calls.
THINKING_TEMPLATE = (
    "{%- if tools %}<tools>{{ tools | length }}</tools>{% endif -%}"
    "{%- for m in messages -%}<|{{ m.role }}|>"
    "{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif -%}"
    "{{ m.content }}{%- for c in m.tool_calls or [] %}<call>{{ c.function.name }}</call>{% endfor -%}"
    "{%- endfor -%}{%- if add_generation_prompt %}<|assistant|>{% endif -%}"
)
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
THOUGHT = "The user wants the weather in Paris, so I should call get_weather with city Paris first."


def _loop(thinking: bool) -> list[dict]:
    blocks = [{"type": "thinking", "thinking": THOUGHT, "signature": ""}] if thinking else []
    blocks.append({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}})
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}]},
    ]


def test_a_thinking_block_becomes_the_turns_reasoning():
    body = CountTokensRequest.model_validate({"model": "m", "messages": _loop(True), "tools": [TOOL]})
    assistant = [m for m in core_messages(body) if m.role == "assistant"][0]
    assert assistant.reasoning == THOUGHT and assistant.tool_calls
    from localrun.chat.tools import prompt_messages
    from localrun.types import ChatRequest

    msgs, _ = prompt_messages(
        ChatRequest(messages=core_messages(body), tools=({"type": "function"},)), THINKING_TEMPLATE
    )
    assert [m.get("reasoning_content") for m in msgs if m["role"] == "assistant"] == [THOUGHT]


@pytest.fixture(scope="module")
def tiny_thinking(tmp_path_factory):
    from tests.factories import write_tiny_llama_gguf

    path = tmp_path_factory.mktemp("tiny-think") / "tiny-think.gguf"
    return write_tiny_llama_gguf(path, n_ctx_train=2048, chat_template=THINKING_TEMPLATE)


@pytest.fixture(scope="module")
def think_url(serve_module, tiny_thinking):
    return serve_module(tiny_thinking, name="think", n_threads=1).url + "/v1/messages"


def _count(url: str, thinking: bool) -> int:
    body = {"model": "think", "messages": _loop(thinking), "tools": [TOOL]}
    r = httpx.post(url + "/count_tokens", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"]


@needs_llama
@pytest.mark.llama
def test_count_tokens_counts_the_thinking_before_a_tool_use(think_url):
    assert _count(think_url, True) > _count(think_url, False) + 10  # the thought is dozens of byte-level tokens


@needs_llama
@pytest.mark.llama
def test_message_start_carries_the_prompts_input_tokens(think_url):
    prompt = _count(think_url, True)
    body = {"model": "think", "messages": _loop(True), "tools": [TOOL], "max_tokens": 3, "stream": True}
    with httpx.stream("POST", think_url, json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    start = events[0]
    assert start["type"] == "message_start"
    assert start["message"]["usage"]["input_tokens"] == prompt  # the prompt, known before the prefill
    final = next(e for e in events if e["type"] == "message_delta")["usage"]
    assert final["input_tokens"] + final["cache_read_input_tokens"] == prompt


def test_openai_reasoning_content_sent_back_reaches_the_template_too():
    from localrun.chat.tools import prompt_messages
    from localrun.server.openai.convert import core_messages as openai_messages
    from localrun.server.openai.schemas import ChatCompletionRequest
    from localrun.types import ChatRequest

    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "reasoning_content": THOUGHT, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
            ],
        }
    )
    msgs, _ = prompt_messages(
        ChatRequest(messages=openai_messages(body), tools=({"type": "function"},)), THINKING_TEMPLATE
    )
    assert [m.get("reasoning_content") for m in msgs if m["role"] == "assistant"] == [THOUGHT]
    gpt_oss_like = (
        THINKING_TEMPLATE + "{% for message in messages %}{{ message.thinking }}{% endfor %}"
    )  # gpt-oss reads message.thinking on a call turn
    msgs, _ = prompt_messages(ChatRequest(messages=openai_messages(body), tools=({"type": "function"},)), gpt_oss_like)
    assert msgs[1]["thinking"] == THOUGHT


def test_a_responses_reasoning_item_rides_with_its_call_turn():
    from localrun.server.responses.convert import conversation, parse_items

    items = parse_items(
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
        ]
    )
    turn = next(m for m in conversation(items, None) if m.role == "assistant")
    assert turn.reasoning == THOUGHT and turn.tool_calls
