"""Reasoning models: the channel split (think tags, gpt-oss harmony) on any chunking, and on
every API through the official clients against a real server: OpenAI ``reasoning_content`` /
``reasoning``, Ollama ``thinking``, Anthropic thinking blocks; budgets from each API's words
closing the reasoning (``think: false`` none at all); the capability rule for runtimes that
cannot continue a turn. The fake runtime plays a reasoning model (``fake_think_words``)
behind a tiny GGUF whose template has a reasoning channel; the llama.cpp path is in
test_reasoning_llama.py."""

from __future__ import annotations

import dataclasses
import json
import random

import httpx
import ollama
import openai
import pytest

from localrun.chat.reasoning import ANSWER, HARMONY, REASONING, THINK, ReasoningSplitter, detect_format
from localrun.server.reasoning import effort_budget
from tests.support.clients import anthropic_client

anthropic = pytest.importorskip("anthropic")

#: Qwen3-like: ChatML, earlier reasoning dropped from assistant turns, the model opens <think> itself.
THINK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{{ message['content'].split('</think>')[-1] }}{% else %}{{ "
    "message['content'] }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: DeepSeek-R1-like: the generation prompt opens the reasoning block.
OPEN_TEMPLATE = THINK_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>\n{% endif %}"
)
THINK_WORDS = 12  # the fake model's reasoning: the first 12 filler words
USER = [{"role": "user", "content": "hello"}]


def split_text(fmt, text: str) -> tuple[str, str]:
    """(reasoning, answer) of a whole output, fed in one piece."""
    if fmt is None:
        return "", text
    splitter = ReasoningSplitter(fmt)
    parts = splitter.feed(text) + splitter.flush()
    return "".join(t for c, t in parts if c == REASONING), "".join(t for c, t in parts if c == ANSWER)


def chunked(fmt, text: str, seed: int) -> tuple[str, str]:
    rng, splitter, parts, i = random.Random(seed), ReasoningSplitter(fmt), [], 0
    while i < len(text):
        k = rng.randint(1, 5)
        parts += splitter.feed(text[i : i + k])
        i += k
    parts += splitter.flush()
    return "".join(t for c, t in parts if c == REASONING), "".join(t for c, t in parts if c == ANSWER)


@pytest.mark.parametrize("seed", range(8))
def test_think_tags_split_on_any_chunking(seed):
    text = "<think>\nFirst, 2 < 3 and </thin is not a tag.</think>\n\nIt is 4. A later <think> is plain text."
    assert chunked(THINK, text, seed) == (
        "First, 2 < 3 and </thin is not a tag.",
        "It is 4. A later <think> is plain text.",
    )
    opened = dataclasses.replace(THINK, open_at_start=True)
    assert chunked(opened, "so 4</think>\n4", seed) == ("so 4", "4")
    harmony = (
        "<|channel|>analysis<|message|>User wants 2+2.<|end|><|start|>assistant<|channel|>final<|message|>"
        "**4**<|return|>"
    )
    assert chunked(HARMONY, harmony, seed) == ("User wants 2+2.", "**4**")


@pytest.mark.parametrize("seed", range(4))
def test_the_chunk_stream_splits_the_same_for_every_front_end(seed):
    """split_chunks (the CLI's and the TUI's form) on core Chunks cut anywhere; the last chunk flushes."""
    from localrun.chat.reasoning import split_chunks
    from localrun.types import Chunk

    text, rng, pieces, i = "<think>\nstep 1 <thin</think>\n\nIt is 4.", random.Random(seed), [], 0
    while i < len(text):
        k = rng.randint(1, 4)
        pieces.append(Chunk(text=text[i : i + k]))
        i += k
    pieces[-1] = dataclasses.replace(pieces[-1], finish_reason="stop")
    out = list(split_chunks(iter(pieces), THINK))
    assert "".join(c.reasoning for c in out) == "step 1 <thin" and "".join(c.text for c in out) == "It is 4."
    assert out[-1].finish_reason == "stop" and len(out) == len(pieces)
    assert list(split_chunks(iter(pieces), None)) == pieces
    assert list(split_chunks(iter([Chunk(reasoning="r", text="a")]), THINK)) == [Chunk(reasoning="r", text="a")]


def test_no_reasoning_is_all_answer_and_formats_come_from_the_template():
    assert split_text(THINK, "plain answer, no tags") == ("", "plain answer, no tags")
    assert split_text(None, "<think>x</think>y") == ("", "<think>x</think>y")
    assert detect_format(THINK_TEMPLATE).name == "think" and not detect_format(THINK_TEMPLATE).open_at_start
    assert detect_format(OPEN_TEMPLATE).open_at_start
    assert detect_format("{{ '<|start|>assistant<|channel|>final<|message|>' }}") is HARMONY
    assert detect_format("{{ messages[0]['content'] }}") is None and detect_format(None) is None
    assert effort_budget("low") < effort_budget("medium") < effort_budget("high") and effort_budget("max") is None
    with pytest.raises(ValueError, match="minimal"):
        effort_budget("extreme")


@pytest.fixture
def reasoning_gguf(tmp_path_factory):
    from tests.factories import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("r1") / "tiny-r1.gguf", chat_template=THINK_TEMPLATE)


@pytest.fixture
def r1(serve, reasoning_gguf):  # noqa: F811 - the imported fixture
    return serve(
        reasoning_gguf,
        "r1",
        fake_capabilities=["tools", "reasoning_budget"],
        fake_think_words=THINK_WORDS,
        fake_reply_words=3,
    )


FILLER = "the quick brown fox jumps over a lazy dog while seven small".split()


def test_openai_chat_carries_both_fields_streamed_and_not(r1):
    with openai.OpenAI(base_url=f"{r1.url}/v1", api_key="x", max_retries=0) as oai:
        r = oai.chat.completions.create(model="r1", messages=USER, max_tokens=64, temperature=0)
        msg = r.choices[0].message
        assert msg.content.startswith("You said: hello.") and "<think>" not in msg.content
        extra = msg.model_extra
        assert extra["reasoning_content"] == extra["reasoning"] == " ".join(FILLER[:THINK_WORDS]) + " "
        deltas = [
            c.choices[0].delta
            for c in oai.chat.completions.create(model="r1", messages=USER, max_tokens=64, temperature=0, stream=True)
            if c.choices
        ]
        thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
        assert thought == extra["reasoning_content"]
        assert "".join(d.content or "" for d in deltas) == msg.content
        # history in either field is accepted
        history = USER + [
            {"role": "assistant", "content": msg.content, "reasoning_content": "x", "reasoning": "x"},
            {"role": "user", "content": "again"},
        ]
        assert oai.chat.completions.create(model="r1", messages=history, max_tokens=40).choices[0].message.content
        low = oai.chat.completions.create(model="r1", messages=USER, max_tokens=64, reasoning_effort="minimal")
        assert low.choices[0].message.content.startswith("You said: hello.")
        with pytest.raises(openai.BadRequestError, match="unknown effort 'extreme'"):
            oai.chat.completions.create(model="r1", messages=USER, max_tokens=8, reasoning_effort="extreme")


def test_openai_reasoning_field_setting_picks_one(serve, reasoning_gguf, monkeypatch):  # noqa: F811
    monkeypatch.setenv("LOCALRUN_SERVER__REASONING_FIELD", "reasoning")
    server = serve(reasoning_gguf, "r1", fake_think_words=4, fake_reply_words=1)
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json={"model": "r1", "messages": USER, "max_tokens": 32}, timeout=30
    )
    msg = r.json()["choices"][0]["message"]
    assert msg["reasoning"] == "the quick brown fox " and "reasoning_content" not in msg


def test_ollama_thinking_and_think_levels(r1):
    client = ollama.Client(host=r1.url)
    r = client.chat(model="r1", messages=USER, think=True)
    assert r.message.thinking == " ".join(FILLER[:THINK_WORDS]) + " " and r.message.content.startswith(
        "You said: hello."
    )
    parts = list(client.chat(model="r1", messages=USER, think="low", stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == r.message.thinking
    assert "".join(p.message.content or "" for p in parts).startswith("You said: hello.")
    off = client.chat(model="r1", messages=USER, think=False)
    assert not off.message.thinking and off.message.content.startswith("You said: hello.")
    gen = client.generate(model="r1", prompt="hello", think=True)
    assert gen.thinking and gen.response.startswith("You said: hello.")
    history = USER + [
        {"role": "assistant", "content": "hi", "thinking": "earlier"},
        {"role": "user", "content": "more"},
    ]
    assert client.chat(model="r1", messages=history).message.content


def test_anthropic_thinking_blocks_and_budget(r1):
    with anthropic_client(r1) as claude:
        m = claude.messages.create(model="r1", max_tokens=64, messages=USER, thinking={"type": "adaptive"})
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == " ".join(FILLER[:THINK_WORDS]) + " " and m.content[0].signature == ""
        budget = claude.messages.create(
            model="r1", max_tokens=64, messages=USER, thinking={"type": "enabled", "budget_tokens": 5}
        )
        assert budget.content[0].thinking.split() == FILLER[:5]  # closed at the budget
        assert budget.content[1].text.startswith("You said: hello.")  # and the answer follows
        with claude.messages.stream(
            model="r1", max_tokens=64, messages=USER, thinking={"type": "enabled", "budget_tokens": 3}
        ) as s:
            final = s.get_final_message()
        assert final.content[0].thinking.split() == FILLER[:3] and final.content[1].text.startswith("You said: hello.")
        off = claude.messages.create(model="r1", max_tokens=64, messages=USER, thinking={"type": "disabled"})
        assert [b.type for b in off.content] == ["text"]
        effort = claude.messages.create(model="r1", max_tokens=64, messages=USER, output_config={"effort": "low"})
        assert effort.content[0].type == "thinking"  # 1024 tokens is more than it thinks
        # thinking blocks sent back are accepted
        again = claude.messages.create(
            model="r1",
            max_tokens=40,
            messages=USER
            + [
                {"role": "assistant", "content": [b.model_dump() for b in m.content]},
                {"role": "user", "content": "more"},
            ],
        )
        assert again.content


def test_anthropic_stream_closes_thinking_with_a_signature_before_text(r1):
    body = {"model": "r1", "max_tokens": 64, "messages": USER, "stream": True}
    text = httpx.post(f"{r1.url}/v1/messages", json=body, timeout=30).text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    kinds = [(e["type"], (e.get("delta") or e.get("content_block") or {}).get("type")) for e in events]
    first_text = kinds.index(("content_block_start", "text"))
    assert kinds[1] == ("content_block_start", "thinking")
    assert kinds[first_text - 2 : first_text] == [
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
    ]


def test_a_budget_on_a_runtime_that_cannot_continue_is_a_400(serve, reasoning_gguf):  # noqa: F811
    server = serve(reasoning_gguf, "r1", fake_capabilities=[], fake_think_words=4)
    with anthropic_client(server) as claude:
        with pytest.raises(
            anthropic.BadRequestError, match="'thinking.budget_tokens' is not supported by the fake runtime"
        ):
            claude.messages.create(
                model="r1", max_tokens=64, messages=USER, thinking={"type": "enabled", "budget_tokens": 2}
            )
        assert claude.messages.create(model="r1", max_tokens=64, messages=USER).content[0].type == "thinking"
    r = httpx.post(
        f"{server.url}/api/chat", json={"model": "r1", "messages": USER, "think": False, "stream": False}, timeout=30
    )
    assert r.status_code == 400 and "'think'" in r.json()["error"]


def test_think_on_a_model_without_reasoning_is_a_400(serve, tiny_gguf):  # noqa: F811
    server = serve(tiny_gguf, "tiny")
    r = httpx.post(
        f"{server.url}/api/chat", json={"model": "tiny", "messages": USER, "think": True, "stream": False}, timeout=30
    )
    assert r.status_code == 400 and "does not support thinking" in r.json()["error"]
    r = httpx.post(f"{server.url}/api/chat", json={"model": "tiny", "messages": USER, "stream": False}, timeout=30)
    assert r.status_code == 200 and "thinking" not in r.json()["message"]
