"""The field policy (server/fields.py) and honest usage, on the fake runtime through the app:
unknown fields ignored and named, strict mode, llama.cpp/vLLM extensions accepted, the 400s
that name a field the runtime cannot honour, and embedding usage that counts tokens."""

from __future__ import annotations

import pytest

from tests.support.clients import chat

HEADER = "x-localrun-ignored-fields"


def test_unknown_fields_are_ignored_named_in_the_header_and_logged(app_client, caplog):
    client = app_client()
    with caplog.at_level("INFO", logger="localrun.server.fields"):
        r = chat(client, id_slot=0, timings_per_token=True, frobnicate={"a": 1})
    assert r.status_code == 200, r.text
    # id_slot is known but only llama.cpp has slots: on the fake runtime it is named as ignored, after the unknown ones
    assert r.headers[HEADER] == "timings_per_token, frobnicate, id_slot"
    assert r.json()["choices"][0]["message"]["content"].startswith("You said: hello there.")
    assert "frobnicate" in caplog.text and "ignored" in caplog.text
    assert HEADER not in chat(client).headers  # a clean request carries no header


def test_the_header_is_sanitised_and_bounded(app_client):
    client = app_client()
    body = {f"x{i}\r\nSet-Cookie: a": i for i in range(100)}
    r = chat(client, **body)
    assert r.status_code == 200
    value = r.headers[HEADER]
    assert "\r" not in value and "\n" not in value and value.count(", ") == 31  # 32 names listed


def test_strict_fields_restores_the_400(app_client):
    client = app_client(strict_fields=True)
    r = chat(client, frobnicate=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
    assert "strict_fields" in r.json()["error"]["message"] + str(r.json()["error"].get("hint", ""))
    assert chat(client, n_predict=4, cache_prompt=True).status_code == 200  # known fields still pass


def test_nested_objects_stay_strict(app_client):
    r = chat(app_client(), messages=[{"role": "user", "content": "x", "frobnicate": 1}])
    assert r.status_code == 400 and "frobnicate" in r.json()["error"]["message"]


def test_admin_routes_stay_strict(app_client):
    r = app_client().post("/admin/load", json={"model": "tiny", "path": "/etc/passwd"})
    assert r.status_code == 400 and "path" in r.json()["error"]["message"]


def test_llama_cpp_client_fields_get_an_answer(app_client):
    """What llama.cpp's clients always send: cache_prompt, n_predict, plus an unknown field."""
    client = app_client()
    r = chat(client, max_tokens=None, n_predict=3, cache_prompt=True, id_slot=-1, timings_per_token=True)
    assert r.status_code == 200, r.text
    # id_slot -1 ("any slot") holds on every runtime; timings_per_token is unknown
    assert r.json()["usage"]["completion_tokens"] == 3 and r.headers[HEADER] == "timings_per_token"
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "a b c", "n_predict": 2, "cache_prompt": False})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert chat(client, max_tokens=None, n_predict=-1).status_code == 200  # -1: up to the server's cap


@pytest.mark.parametrize(
    "field, value, capability",
    [
        ("logit_bias", {"5": 10}, "logit_bias"),
        ("frequency_penalty", 0.5, None),
        ("presence_penalty", 0.5, None),
        ("grammar", 'root ::= "a"', None),
        ("ignore_eos", True, None),
        ("min_tokens", 3, None),
        ("typical_p", 0.5, None),
        ("json_schema", {"type": "object"}, None),
        ("chat_template_kwargs", {"enable_thinking": False}, None),
        ("continue_final_message", True, None),
        ("add_generation_prompt", False, None),
        ("n", 2, None),
    ],
)
def test_known_fields_the_runtime_cannot_honour_are_400s_naming_them(app_client, field, value, capability):
    r = chat(app_client(capabilities=["embeddings"]), **{field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and "fake runtime" in err["message"]


def test_a_token_prompt_400_says_to_send_text_not_to_remove_the_field(app_client):
    r = app_client(capabilities=[]).post("/v1/completions", json={"model": "tiny", "prompt": [1, 2, 3]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "prompt" and "remove" not in str(err)
    assert "as text" in str(err)


def test_suffix_without_fim_says_why(app_client):
    r = app_client(capabilities=[]).post("/v1/completions", json={"model": "tiny", "prompt": "def f(", "suffix": "):"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "suffix" and "fill-in-the-middle" in str(err)


def test_bad_logit_bias_keys_and_bounds(app_client):
    client = app_client(capabilities=["logit_bias"])
    r = chat(client, logit_bias={"hello": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
    r = chat(client, logit_bias={"5": 101})
    assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"]


def test_conflicting_constraints_are_400s(app_client):
    client = app_client(capabilities=["json_schema", "grammar"])
    r = chat(client, json_schema={"type": "object"}, response_format={"type": "json_object"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "json_schema"
    r = chat(client, json_schema={"type": "object"}, grammar='root ::= "a"')
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"


def test_embedding_usage_counts_every_input(app_client):
    """Honest usage: the fake runtime's tokens are words, so the count is known exactly."""
    client = app_client()
    r = client.post("/v1/embeddings", json={"model": "tiny", "input": ["one two three", "four five"]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    one = client.post("/v1/embeddings", json={"model": "tiny", "input": "alpha beta"}).json()["usage"]
    assert one["prompt_tokens"] == 2
    r = client.post("/api/embed", json={"model": "tiny", "input": ["one two three", "four five"]})
    assert r.status_code == 200 and r.json()["prompt_eval_count"] == 5
    assert client.post("/api/embed", json={"model": "tiny", "input": "a b c d"}).json()["prompt_eval_count"] == 4


def test_n_choices_on_a_runtime_that_declares_n(app_client):
    """The server's shaping of several choices (the fake runtime answers them in turn)."""
    client = app_client()
    r = chat(client, n=3, temperature=1.0, seed=7)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["message"]["content"] for c in choices}) == 3  # seed + i: three different answers
    assert r.json()["usage"]["completion_tokens"] == 24 and r.json()["system_fingerprint"].startswith("fp_")
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 4,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: {")]
    import json

    events = [json.loads(line[6:]) for line in lines]
    finishes = [(c["index"], c["finish_reason"]) for e in events for c in e["choices"] if c["finish_reason"]]
    assert sorted(finishes) == [(0, "length"), (1, "length")]
    assert events[-1]["usage"]["completion_tokens"] == 8


def test_n_with_tools_is_a_400(app_client):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = chat(app_client(), n=2, tools=[tool])
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_best_of_rules(app_client):
    client = app_client()
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "n": 3, "best_of": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "best_of": 2, "stream": True})
    assert r.status_code == 400 and "stream" in r.json()["error"]["message"]
    r = client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "x", "best_of": 3, "max_tokens": 3, "temperature": 1}
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1 and r.json()["choices"][0]["logprobs"] is None
    assert r.json()["usage"]["completion_tokens"] == 9  # every candidate counts, as OpenAI counts them


def test_echo_prepends_the_prompt(app_client):
    client = app_client()
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "one two", "echo": True, "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("one two ...")
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "one two", "echo": True, "logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
