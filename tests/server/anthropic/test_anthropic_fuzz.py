"""Hypothesis fuzz of the Anthropic routes through the in-process app: never a 500, every
error in Anthropic's shape. Bodies: arbitrary JSON, Anthropic field names with arbitrary
values, valid requests with one field replaced, and messages built from block shapes
(tool_use, tool_result, thinking, images, unknown blocks) with arbitrary members."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.test_fuzz import json_leaf

BASE = {
    "/v1/messages": {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages/count_tokens": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
}
FIELDS = sorted(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "thinking",
        "output_config",
        "stream",
        "mcp_servers",
        "service_tier",
        "context_management",
        "role",
        "content",
        "type",
        "text",
        "id",
        "name",
        "input",
        "tool_use_id",
        "is_error",
        "signature",
        "source",
        "input_schema",
        "budget_tokens",
        "effort",
        "format",
        "schema",
        "disable_parallel_tool_use",
        "cache_control",
    }
)
BLOCK_TYPES = [
    "text",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "image",
    "document",
    "server_tool_use",
    "web_search_tool_result",
    "bogus",
]

json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)
block = st.builds(
    lambda kind, extra: {"type": kind, **extra},
    st.sampled_from(BLOCK_TYPES),
    st.dictionaries(st.sampled_from(FIELDS), json_value, max_size=4),
)
turn = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["user", "assistant", "system", "tool"]),
    st.one_of(st.text(max_size=20), st.lists(block, max_size=3)),
)


def bodies(route: str):
    base = BASE[route]
    return st.one_of(
        st.just(base),
        json_value,
        st.dictionaries(st.sampled_from(FIELDS), json_value, max_size=6),
        st.builds(lambda key, value: {**base, key: value}, st.sampled_from(FIELDS), json_value),
        st.builds(
            lambda msgs, stream: {**base, "messages": msgs, "stream": stream},
            st.lists(turn, min_size=1, max_size=4),
            st.booleans(),
        ),
    ).map(lambda v: json.dumps(v).encode()) | st.binary(max_size=64)


@pytest.mark.parametrize("route", sorted(BASE))
def test_fuzzed_anthropic_bodies_never_500(anthropic_app, route):
    seen: set[int] = set()

    @settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(body=bodies(route))
    def run(body: bytes) -> None:
        r = anthropic_app.post(route, content=body, headers={"content-type": "application/json"})
        assert r.status_code < 500, (r.status_code, r.text[:500])
        if r.status_code >= 400:
            err = r.json()
            assert err["type"] == "error" and err["error"]["type"] and err["error"]["message"], err
        seen.add(r.status_code)

    run()
    assert 400 in seen and 200 in seen  # both the refusals and the working path were reached
    assert anthropic_app.post(route, json=BASE[route]).status_code == 200
