"""Capabilities end to end on real llama.cpp workers, through the official clients: the
tiny random GGUF (the grammar makes even random weights answer validly) and Gemma 3 270M.

Each test starts a server process whose planner picks llama.cpp, so generation runs in a
worker subprocess exactly as under ``localrun serve``.
"""

from __future__ import annotations

import json

import ollama
import openai
import pytest

from tests.conftest import needs_llama
from tests.support.clients import validate

pytestmark = [needs_llama, pytest.mark.llama]

BOUNDED = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer"}},
    "required": ["ok", "color", "n"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]},
    },
}
ONE_THREAD = {"n_threads": 1}


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory):
    """The tiny random llama with room for a tool listing: its byte-level vocabulary makes
    the fallback tools block several hundred tokens, past the default 256."""
    from tests.factories import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny-long") / "tiny-long.gguf", n_ctx_train=4096)


def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=180)


def ask(oai, name, text, **kwargs):
    kwargs.setdefault("max_tokens", 120)
    kwargs.setdefault("temperature", 0)
    return oai.chat.completions.create(model=name, messages=[{"role": "user", "content": text}], **kwargs)


def check_structured(oai, name: str) -> None:
    """json_schema, json_object, a forced tool call (named and required, streamed and not)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": BOUNDED, "strict": True}}
    r = ask(oai, name, "Describe a colour as JSON.", response_format=fmt)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    validate(json.loads(r.choices[0].message.content), BOUNDED)
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in ask(oai, name, "Describe a colour as JSON.", response_format=fmt, stream=True)
        if c.choices
    )
    assert streamed == r.choices[0].message.content  # greedy: the same answer

    named = ask(
        oai,
        name,
        "What is the weather in Paris for 3 days?",
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])

    chunks = list(ask(oai, name, "What time is it?", tools=[WEATHER, CLOCK], tool_choice="required", stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or ())]
    # one call (index 0), its arguments streamed in pieces that add up to valid JSON
    assert {d.index for d in deltas} == {0} and deltas[0].function.name in ("get_weather", "get_time")
    arguments = "".join(d.function.arguments or "" for d in deltas)
    fn = next(t for t in (WEATHER, CLOCK) if t["function"]["name"] == deltas[0].function.name)
    validate(json.loads(arguments), fn["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # the call and its result go back through the template; the model answers in words
    history = [
        {"role": "user", "content": "What is the weather in Paris for 3 days?"},
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    after = oai.chat.completions.create(
        model=name, messages=history, tools=[WEATHER], tool_choice="none", max_tokens=8, temperature=0
    )
    assert after.choices[0].message.tool_calls is None and after.usage.prompt_tokens > 20


def check_logprobs(oai, name: str) -> None:
    r = ask(oai, name, "Say something.", logprobs=True, top_logprobs=3, max_tokens=6)
    content = r.choices[0].logprobs.content
    assert 0 < len(content) <= r.usage.completion_tokens
    for t in content:
        tops = [a.logprob for a in t.top_logprobs]
        assert t.logprob <= 0 and len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert tops[0] == pytest.approx(t.logprob, abs=1e-4)  # greedy picks the most likely token
    chunks = list(ask(oai, name, "Say something.", logprobs=True, top_logprobs=3, max_tokens=6, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in content]
    legacy = oai.completions.create(
        model=name, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2
    )
    lp = legacy.choices[0].logprobs
    assert len(lp.token_logprobs) == legacy.usage.completion_tokens and all(v <= 0 for v in lp.token_logprobs)
    assert all(1 <= len(d) <= 2 for d in lp.top_logprobs)


def test_tiny_gguf_structured_output_tools_logprobs(serve, tiny_long):
    server = serve(tiny_long, "tiny", runtime="", plan=ONE_THREAD)
    with client(server) as oai:
        check_structured(oai, "tiny")
        check_logprobs(oai, "tiny")
        obj = ask(oai, "tiny", "anything", response_format={"type": "json_object"}, max_tokens=200)
        if obj.choices[0].finish_reason == "stop":  # random weights may fill a string past any budget
            assert isinstance(json.loads(obj.choices[0].message.content), dict)
        else:
            assert obj.choices[0].message.content.lstrip().startswith("{")
        with pytest.raises(openai.BadRequestError, match="embeddings") as info:
            oai.embeddings.create(model="tiny", input="x")
        assert "llama.cpp" in info.value.message
        with pytest.raises(openai.BadRequestError, match="both constrain"):
            ask(oai, "tiny", "x", tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    oll = ollama.Client(host=server.url, timeout=180)
    r = oll.chat(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        format=BOUNDED,
        options={"temperature": 0, "num_predict": 120},
    )
    validate(json.loads(r.message.content), BOUNDED)
    lp = oll.generate(
        model="tiny", prompt="hello", logprobs=True, top_logprobs=2, options={"temperature": 0, "num_predict": 3}
    )
    assert len(lp.logprobs) == 3 and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in lp.logprobs)


def test_tiny_gguf_embeddings_when_the_plan_asks(serve, tiny_gguf):
    server = serve(tiny_gguf, "tiny", runtime="", plan=ONE_THREAD, embedding=True)
    with client(server) as oai:
        data = oai.embeddings.create(model="tiny", input=["hello world", "the quick fox", "hello world"]).data
        assert [len(d.embedding) for d in data] == [64, 64, 64]
        assert data[0].embedding == data[2].embedding != data[1].embedding
        assert abs(sum(v * v for v in data[1].embedding) - 1) < 1e-5
        again = oai.embeddings.create(model="tiny", input="hello world").data[0].embedding
        assert again == data[0].embedding
        assert ask(oai, "tiny", "hi", max_tokens=3).usage.completion_tokens > 0  # chat still works beside it
    r = ollama.Client(host=server.url).embed(model="tiny", input=["hello world"])
    assert len(r.embeddings[0]) == 64 and r.embeddings[0] == pytest.approx(data[0].embedding, abs=1e-6)


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_structured_output_tools_logprobs_embeddings(serve, gemma_gguf):
    server = serve(gemma_gguf, "gemma", runtime="", embedding=True)
    with client(server) as oai:
        check_structured(oai, "gemma")
        check_logprobs(oai, "gemma")
        person = {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        }
        r = ask(
            oai,
            "gemma",
            "Alice is 30 years old. Give her name and age as JSON.",
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": person}},
            max_tokens=60,
        )
        got = json.loads(r.choices[0].message.content)
        validate(got, person)
        assert got["age"] == 30 and "Alice" in got["name"]
        vecs = [
            d.embedding
            for d in oai.embeddings.create(
                model="gemma",
                input=["a cat sat on the mat", "a kitten sat on the rug", "quarterly tax filing deadline"],
            ).data
        ]
        assert [len(v) for v in vecs] == [640] * 3
        dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
        assert dot(vecs[0], vecs[1]) > dot(vecs[0], vecs[2])
        assert vecs[0] == oai.embeddings.create(model="gemma", input="a cat sat on the mat").data[0].embedding


def test_tiny_gguf_constrained_sequences_batched_together_answer_as_alone(serve, tiny_long):
    """Grammar and logprob samplers are per sequence: several requests decoded in one batch
    (json_schema, a forced call, logprobs, plain) each get what they get alone."""
    from concurrent.futures import ThreadPoolExecutor

    server = serve(tiny_long, "tiny", runtime="", plan=ONE_THREAD, n_slots=4, slot_ctx=1024)
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": BOUNDED}}
    asks = [
        ("Describe a colour as JSON.", {"response_format": fmt, "logprobs": True, "top_logprobs": 2}),
        ("What is the weather in Oslo?", {"tools": [WEATHER], "tool_choice": "required"}),
        ("Say something.", {"logprobs": True, "top_logprobs": 1, "max_tokens": 12}),
        ("anything else", {"max_tokens": 12}),
    ]

    def run(item):
        text, kwargs = item
        r = ask(oai, "tiny", text, **kwargs).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in r.message.tool_calls or ()]
        lps = [
            (t.token, round(t.logprob, 3), [a.token for a in t.top_logprobs])
            for t in (r.logprobs.content if r.logprobs else ())
        ]
        return r.message.content, calls, lps, r.finish_reason

    with client(server) as oai:
        alone = [run(item) for item in asks]
        with ThreadPoolExecutor(len(asks)) as pool:
            together = list(pool.map(run, asks * 2))
    assert together == alone * 2
    validate(json.loads(alone[0][0]), BOUNDED)
    assert alone[1][1][0][0] == "get_weather" and alone[1][3] == "tool_calls"
    assert len(alone[0][2]) > 5 and len(alone[2][2]) == 12
