"""``runtime.force_temperature``: every route samples at the server's temperature, whatever the
request asks. Agents send their own (Claude Code 1), so a test or an eval that needs the same
answer every run cannot get it from the client; the fake runtime answers a cycle at 0 and random
words otherwise, so a request whose temperature got through would differ from run to run."""

from __future__ import annotations

import pytest

from tests.support.fixtures import _test_client

USER = [{"role": "user", "content": "hi"}]
HOT = 1.5

ROUTES = {
    "/v1/chat/completions": (
        {"messages": USER, "temperature": HOT, "max_tokens": 12},
        lambda d: d["choices"][0]["message"]["content"],
    ),
    "/v1/completions": ({"prompt": "once", "temperature": HOT, "max_tokens": 12}, lambda d: d["choices"][0]["text"]),
    "/v1/responses": (
        {"input": "hi", "temperature": HOT, "max_output_tokens": 12},
        lambda d: "".join(
            c["text"] for o in d["output"] for c in o.get("content", ()) if c.get("type") == "output_text"
        ),
    ),
    "/v1/messages": ({"messages": USER, "temperature": 1.0, "max_tokens": 12}, lambda d: d["content"][0]["text"]),
    "/api/chat": (
        {"messages": USER, "stream": False, "options": {"temperature": HOT, "num_predict": 12}},
        lambda d: d["message"]["content"],
    ),
    "/api/generate": (
        {"prompt": "once", "stream": False, "options": {"temperature": HOT, "num_predict": 12}},
        lambda d: d["response"],
    ),
    "/completion": ({"prompt": "once", "temperature": HOT, "n_predict": 12}, lambda d: d["content"]),
}


def _client(build_stack, **runtime):
    return _test_client(build_stack(options={"fake_reply_words": 200}, runtime=runtime))


def _answer(client, path: str, **changes) -> str:
    body, text = ROUTES[path]
    r = client.post(path, json={"model": "tiny", **body, **changes})
    assert r.status_code == 200, r.text
    answer = text(r.json())
    assert answer, r.text
    return answer


def test_without_it_a_hot_request_samples(build_stack):
    with _client(build_stack) as client:
        answers = {_answer(client, "/v1/chat/completions") for _ in range(3)}
    assert len(answers) > 1  # the control: the fake runtime does honour a request's temperature


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_every_route_answers_at_the_forced_temperature(build_stack, path):
    with _client(build_stack, force_temperature=0) as client:
        hot = [_answer(client, path) for _ in range(3)]
        greedy = _answer(
            client,
            path,
            **(
                {"options": {**ROUTES[path][0]["options"], "temperature": 0}}
                if path.startswith("/api/")
                else {"temperature": 0}
            ),
        )
    assert hot == [greedy] * 3


def test_the_cli_path_is_forced_too(build_stack):
    from localrun.types import ChatRequest, Message, Sampling

    stack = build_stack(runtime={"force_temperature": 0})
    req = ChatRequest(messages=(Message(role="user", content="hi"),), sampling=Sampling(temperature=HOT, max_tokens=12))
    answers = {"".join(c.text for c in stack.manager.stream("tiny", req)) for _ in range(3)}
    assert len(answers) == 1
