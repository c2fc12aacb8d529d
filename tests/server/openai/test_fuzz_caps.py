"""Fuzz of the capability fields on a runtime that declares them all: never a 500.

Tool definitions, tool choices, tool calls in the history, response formats, Ollama
``format`` and logprob knobs get arbitrary values (and plausible ones with a part
replaced); the answer is a 200 or a JSON error below 500.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 30),
    st.text(max_size=12),
    st.sampled_from(
        [
            "function",
            "object",
            "string",
            "json",
            "json_schema",
            "json_object",
            "required",
            "auto",
            "none",
            "get_weather",
            "get_time",
            "tool",
            "assistant",
            "$ref",
            "#/$defs/x",
            "anyOf",
            "{}",
        ]
    ),
)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "function",
                    "name",
                    "parameters",
                    "properties",
                    "required",
                    "json_schema",
                    "schema",
                    "arguments",
                    "id",
                    "enum",
                    "items",
                    "$ref",
                    "$defs",
                    "anyOf",
                    "const",
                    "role",
                    "content",
                    "description",
                ]
            )
            | st.text(max_size=6),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=16,
)

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "call get_weather"}], "max_tokens": 8}
SEEDS = {
    "/v1/chat/completions": [
        {**CHAT, "tools": [TOOL]},
        {**CHAT, "tools": [TOOL], "tool_choice": "required"},
        {
            **CHAT,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        },
        {**CHAT, "logprobs": True, "top_logprobs": 2},
        {
            **CHAT,
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "r"},
            ],
        },
    ],
    "/v1/completions": [{"model": "tiny", "prompt": "x", "max_tokens": 4, "logprobs": 2}],
    "/api/chat": [
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "call get_weather"}],
            "tools": [TOOL],
            "stream": False,
        },
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "x"}],
            "format": {"type": "object"},
            "stream": False,
        },
        {
            "model": "tiny",
            "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}],
            "logprobs": True,
        },
    ],
    "/api/generate": [
        {"model": "tiny", "prompt": "x", "format": "json", "stream": False, "top_logprobs": 1, "logprobs": True}
    ],
}
#: OpenAI's legacy function calling, translated onto tools by the chat route.
FUNCTION = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
LEGACY = [
    {**CHAT, "functions": [FUNCTION]},
    {**CHAT, "functions": [FUNCTION, {"name": "get_time"}], "function_call": {"name": "get_time"}},
    {
        **CHAT,
        "stream": True,
        "functions": [FUNCTION],
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}},
            {"role": "function", "name": "get_weather", "content": "r"},
        ],
    },
]
CASES = {route: (route, seeds) for route, seeds in SEEDS.items()}
CASES["legacy functions"] = ("/v1/chat/completions", LEGACY)


def mutations(seeds: list[dict]):
    def replace_at(seed: dict, path: list, new):
        body = json.loads(json.dumps(seed))
        node = body
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = new
        return body

    def paths(node, prefix=()):
        if isinstance(node, dict):
            for k, v in node.items():
                yield (*prefix, k)
                yield from paths(v, (*prefix, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield (*prefix, i)
                yield from paths(v, (*prefix, i))

    choices = [(seed, list(p)) for seed in seeds for p in paths(seed) if p[0] != "model"]
    return st.one_of(
        st.sampled_from(seeds),
        st.builds(lambda sp, new: replace_at(sp[0], sp[1], new), st.sampled_from(choices), value),
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_capability_fields_never_500(caps_client, case):
    route, seeds = CASES[case]
    seen: set[int] = set()

    @settings(
        max_examples=120 if case == "legacy functions" else 80,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(body=mutations(seeds))
    def run(body: dict) -> None:
        r = caps_client.post(route, json=body)
        assert r.status_code < 500, (body, r.status_code, r.text[:400])
        if r.headers.get("content-type", "").startswith("application/json"):
            json.loads(r.text)
        seen.add(r.status_code)

    run()
    assert 200 in seen and 400 in seen
