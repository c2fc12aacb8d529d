"""Fuzz of what issue 14 added — OpenAI's n/logit_bias/penalties/token prompts/echo/best_of/
suffix, the llama.cpp and vLLM extensions, and llama-server's routes — never a 500.

Two targets: the app in-process on the fake runtime (fast, many examples: the server's own
parsing and shaping), and a real server on llama.cpp with the tiny FIM model and an 8-token
cap (fewer examples: token ids, biases and sizes reach native code there). Every number and
array has a bound, so a value out of it is a 400 naming the field, never a crash; after the
llama.cpp fuzz the same server still answers.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import needs_llama
from tests.server.openai.test_fuzz_caps import mutations

BIG = st.one_of(
    st.integers(-(2**63), 2**64),
    st.sampled_from([-1, 0, 1, 2, 127, 128, 129, 413, 414, 416, 417, 10**6, 2**31]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.none(),
    st.booleans(),
)
MSG = [{"role": "user", "content": "hello"}]
JSON = {"content-type": "application/json"}  # bodies are sent as json.dumps writes them: NaN and Infinity too
CHAT = {"model": "tiny", "messages": MSG, "max_tokens": 4}
SEEDS = {
    "/v1/chat/completions": [
        {**CHAT, "n": 2, "logit_bias": {"297": 100, "5": -100}, "frequency_penalty": 1.0, "presence_penalty": -1.0},
        {
            **CHAT,
            "n_predict": 3,
            "cache_prompt": True,
            "id_slot": 0,
            "typical_p": 0.5,
            "repetition_penalty": 1.2,
            "min_tokens": 2,
            "ignore_eos": True,
            "seed": 3,
        },
        {**CHAT, "grammar": 'root ::= "a" | "b"', "chat_template_kwargs": {"enable_thinking": False}},
        {**CHAT, "json_schema": {"type": "object"}, "add_generation_prompt": False},
        {
            **CHAT,
            "messages": [*MSG, {"role": "assistant", "content": "the"}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ],
    "/v1/completions": [
        {"model": "tiny", "prompt": [1, 292, 297], "max_tokens": 3, "echo": True},
        {"model": "tiny", "prompt": [[1, 292]], "n": 2, "best_of": 3, "max_tokens": 2, "temperature": 1},
        {"model": "tiny", "prompt": "def f(", "suffix": "):", "max_tokens": 3},
        {"model": "tiny", "prompt": "x", "logit_bias": {"2": 100}, "min_tokens": 2, "logprobs": 1},
    ],
    "/v1/embeddings": [{"model": "tiny", "input": [[1, 292], [297]]}, {"model": "tiny", "input": ["a", "b"]}],
    "/completion": [
        {"prompt": "hello", "n_predict": 3, "n_probs": 2, "logit_bias": [[297, 1.5], [5, False]], "stream": False},
        {"prompt": [1, 292], "n_predict": 2, "grammar": 'root ::= "x"', "typical_p": 0.9, "stop": ["a"]},
    ],
    "/infill": [
        {
            "input_prefix": "def f(",
            "input_suffix": "):",
            "input_extra": [{"filename": "a.py", "text": "x"}],
            "prompt": "a",
            "n_predict": 3,
        }
    ],
    "/tokenize": [{"content": "hello world", "add_special": True, "with_pieces": True}],
    "/detokenize": [{"tokens": [1, 292, 297, 300]}],
    "/apply-template": [{"messages": MSG, "chat_template_kwargs": {"x": 1}, "add_generation_prompt": False}],
    "/rerank": [
        {"query": "hello", "documents": ["a", "b"], "top_n": 1, "return_documents": True},
        {"query": "q", "texts": ["a"]},
    ],
    "/embeddings": [{"content": "hello"}, {"content": [[1, 292], "hi"]}],
}
NUMERIC = st.builds(
    lambda seed, key, v: {**seed, key: v},
    st.sampled_from([s for ss in SEEDS.values() for s in ss]),
    st.sampled_from(
        [
            "n",
            "best_of",
            "max_tokens",
            "n_predict",
            "min_tokens",
            "top_n",
            "n_probs",
            "typical_p",
            "frequency_penalty",
            "presence_penalty",
            "logprobs",
            "seed",
            "temperature",
        ]
    ),
    BIG,
)


def bodies(route: str):
    """Mutations of the route's seeds, and any seed's body with a number field set to an extreme."""
    return st.one_of(mutations(SEEDS[route]), NUMERIC)


@pytest.fixture
def fake_client(build_stack):
    from fastapi.testclient import TestClient

    from localrun.server.app import create_app
    from tests.support.stacks import fake_planner

    stack = build_stack(
        planner=fake_planner(fake_capabilities=["tools", "json_schema", "logprobs", "embeddings", "n"]),
        runtime={"max_tokens_cap": 8},
    )
    with TestClient(
        create_app(stack.settings, stack.manager), base_url="http://localhost", raise_server_exceptions=False
    ) as c:
        yield c


@pytest.mark.parametrize("route", sorted(SEEDS))
def test_new_fields_and_routes_never_500_on_the_fake_runtime(fake_client, route):
    seen: set[int] = set()

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(body=bodies(route))
    def run(body: dict) -> None:
        r = fake_client.post(route, content=json.dumps(body), headers=JSON)
        assert r.status_code < 500, (body, r.status_code, r.text[:400])
        json.loads(r.text) if r.headers.get("content-type", "").startswith("application/json") else None
        seen.add(r.status_code)

    run()
    assert 400 in seen


@pytest.fixture(scope="module")
def llama_server(serve_module, tiny_fim):
    return serve_module(
        tiny_fim,
        plan={"n_threads": 1},
        n_slots=2,
        slot_ctx=256,
        env={"LOCALRUN_RUNTIME__MAX_TOKENS_CAP": "8"},
        pooling="mean",
    )


@needs_llama
@pytest.mark.llama
@pytest.mark.parametrize("route", sorted(SEEDS))
def test_new_fields_and_routes_never_500_on_llama_cpp(llama_server, route):
    seen: set[int] = set()
    with httpx.Client(base_url=llama_server.url, timeout=60) as http:

        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(body=bodies(route))
        def run(body: dict) -> None:
            r = http.post(route, content=json.dumps(body), headers=JSON)
            assert r.status_code < 500, (body, r.status_code, r.text[:400])
            seen.add(r.status_code)

        run()
        assert 400 in seen
        # the worker is still there (this model has no rank head: /rerank stays a 400)
        assert http.post(route, json=SEEDS[route][0]).status_code == (400 if route == "/rerank" else 200)
