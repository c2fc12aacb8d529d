"""The Anthropic Messages API through the official ``anthropic`` SDK against a real server
process on the fake runtime (shape, events, errors), plus the in-process cases that need to
look inside (disconnects, pings). The llama.cpp path is in test_anthropic_llama.py."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.support.clients import WEATHER, anthropic_client
from tests.support.servers import free_port, health, wait_until

anthropic = pytest.importorskip("anthropic")

USER = [{"role": "user", "content": "hello there"}]
#: Greedy answers. The 2026 SDK no longer has sampling parameters (new Claude models dropped
#: them); the API still takes them, so they go in the body.
T0 = {"extra_body": {"temperature": 0}}


def sse_events(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event, checking the name matches the data's type."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"], block
        out.append((lines["event"], data))
    return out


def test_create_answers_a_message_with_usage(claude):
    m = claude.messages.create(model="tiny", max_tokens=64, messages=USER, **T0)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == "tiny"
    assert [b.type for b in m.content] == ["text"] and m.content[0].text.startswith("You said: hello there.")
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    again = claude.messages.create(model="tiny", max_tokens=64, messages=USER, **T0)
    # the same prompt again: most of it from the prefix cache, Anthropic's split of the count
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == m.usage.input_tokens


def test_what_claude_code_sends_is_accepted(claude):
    """System blocks with cache_control and a billing line, a system turn inside messages,
    adaptive thinking, context_management, output_config.effort, metadata, beta headers."""
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=cli; cch=1a2b3;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": "tokens left: 1000"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Hello."},
            ],
        },
        {"role": "user", "content": "and now?"},
    ]
    m = claude.beta.messages.create(
        model="tiny",
        max_tokens=32000,
        system=system,
        messages=messages,
        thinking={"type": "adaptive"},
        metadata={"user_id": "u1"},
        betas=["interleaved-thinking-2025-05-14"],
        extra_body={
            "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            "output_config": {"effort": "high"},
            "temperature": 0,
        },
    )
    assert m.content[0].text.startswith("You said: and now?.")


def test_stream_sends_anthropic_event_sequence(fake_server):
    body = {"model": "tiny", "max_tokens": 64, "temperature": 0, "messages": USER, "stream": True}
    r = httpx.post(
        f"{fake_server.url}/v1/messages?beta=true", json=body, headers={"anthropic-version": "2023-06-01"}, timeout=30
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "content_block_start"] and names[-2:] == ["message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"} and names[-3] == "content_block_stop"
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and "input_tokens" in start["usage"]
    assert events[1][1]["content_block"] == {"type": "text", "text": ""}
    assert all(d["delta"]["type"] == "text_delta" and d["index"] == 0 for n, d in events if n == "content_block_delta")
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0 and delta["usage"]["input_tokens"] > 0


def test_sdk_stream_equals_the_whole_message(claude):
    whole = claude.messages.create(model="tiny", max_tokens=64, messages=USER, **T0)
    with claude.messages.stream(model="tiny", max_tokens=64, messages=USER, **T0) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == whole.usage.output_tokens


def test_tool_use_round_trip(claude):
    ask = [{"role": "user", "content": "call get_weather please"}]
    m = claude.messages.create(model="tiny", max_tokens=64, tools=[WEATHER], messages=ask)
    assert m.stop_reason == "tool_use"
    call = next(b for b in m.content if b.type == "tool_use")
    assert call.name == "get_weather" and call.id.startswith("toolu_") and set(call.input) == {"city", "days"}
    with claude.messages.stream(model="tiny", max_tokens=64, tools=[WEATHER], messages=ask) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content if b.type == "tool_use"] == ["tool_use"]
    assert next(b for b in streamed.content if b.type == "tool_use").input == call.input
    history = ask + [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"},
                {"type": "text", "text": "thanks, summarise"},
            ],
        },
    ]
    done = claude.messages.create(model="tiny", max_tokens=64, tools=[WEATHER], messages=history)
    assert done.stop_reason == "end_turn" and done.content[0].text.startswith("You said: thanks, summarise.")
    errored = history[:2] + [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "is_error": True,
                    "content": [{"type": "text", "text": "no network"}],
                }
            ],
        }
    ]
    assert claude.messages.create(model="tiny", max_tokens=8, tools=[WEATHER], messages=errored).content


def test_forced_tool_and_disable_parallel(claude):
    clock = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
    m = claude.messages.create(
        model="tiny",
        max_tokens=64,
        tools=[WEATHER, clock],
        messages=USER,
        tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
    )
    calls = [b for b in m.content if b.type == "tool_use"]
    assert [c.name for c in calls] == ["get_time"] and m.stop_reason == "tool_use"
    with pytest.raises(anthropic.BadRequestError, match="not among 'tools'"):
        claude.messages.create(
            model="tiny", max_tokens=8, tools=[WEATHER], messages=USER, tool_choice={"type": "tool", "name": "nope"}
        )


def test_count_tokens_is_the_requests_prompt(claude):
    system = "Be brief."
    counted = claude.messages.count_tokens(model="tiny", system=system, messages=USER, tools=[WEATHER])
    m = claude.messages.create(model="tiny", max_tokens=4, system=system, messages=USER, tools=[WEATHER])
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens > 10
    assert claude.messages.count_tokens(model="tiny", messages=USER).input_tokens < counted.input_tokens


def test_stop_sequences_end_the_answer_and_are_named(claude):
    m = claude.messages.create(model="tiny", max_tokens=64, messages=USER, stop_sequences=["zzz", "there"], **T0)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "there"
    assert m.content[0].text == "You said: hello "
    with claude.messages.stream(model="tiny", max_tokens=64, messages=USER, stop_sequences=["there"], **T0) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.content[0].text == "You said: hello "


def test_max_tokens_is_the_stop_reason_when_cut(claude):
    m = claude.messages.create(model="tiny", max_tokens=3, messages=USER)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_errors_have_anthropic_shape_and_exception_types(claude, fake_server):
    with pytest.raises(anthropic.NotFoundError) as nf:
        claude.messages.create(model="no-such-model", max_tokens=8, messages=USER)
    assert nf.value.body["error"]["type"] == "not_found_error" and nf.value.body["type"] == "error"
    with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > \d+ maximum"):
        claude.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "word " * 3000}])
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        claude.messages.create(model="tiny", max_tokens=0, messages=USER)
    with pytest.raises(anthropic.BadRequestError, match="web_search_20250305"):
        claude.messages.create(
            model="tiny", max_tokens=8, messages=USER, tools=[{"type": "web_search_20250305", "name": "web_search"}]
        )
    with pytest.raises(anthropic.BadRequestError, match="prefilled"):
        claude.messages.create(model="tiny", max_tokens=8, messages=USER + [{"role": "assistant", "content": "Sure"}])
    r = httpx.post(f"{fake_server.url}/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_a_field_the_runtime_cannot_honour_is_a_400_naming_it(serve, tiny_gguf):
    server = serve(tiny_gguf, "tiny", fake_capabilities=[])
    with anthropic_client(server) as client:
        with pytest.raises(anthropic.BadRequestError, match="'tools' is not supported by the fake runtime"):
            client.messages.create(model="tiny", max_tokens=8, messages=USER, tools=[WEATHER])
        with pytest.raises(anthropic.BadRequestError, match="output_config.format"):
            client.messages.create(
                model="tiny",
                max_tokens=8,
                messages=USER,
                extra_body={"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            )
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
        with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\].content\[0\]"):
            client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": [image]}])


def test_structured_output_by_output_config(claude):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    m = claude.messages.create(
        model="tiny",
        max_tokens=64,
        messages=USER,
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}},
    )
    assert json.loads(m.content[0].text) == {"ok": True}


def test_api_key_as_x_api_key_or_bearer(tiny_gguf, spawn_server):  # noqa: F811
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    ModelStore(Settings()).import_path(tiny_gguf, name="tiny")
    port = free_port()
    server = spawn_server(
        ["tests.support.launch", "--port", str(port), "--api-key", "s3cret-key"],
        port=port,
        env={"LOCALRUN_RUNTIME__FORCE": "fake"},
    )
    with anthropic_client(server, api_key="s3cret-key") as by_header:  # the SDK sends x-api-key
        assert by_header.messages.create(model="tiny", max_tokens=4, messages=USER).content
    with anthropic_client(server, api_key=None, auth_token="s3cret-key") as by_bearer:  # Authorization: Bearer
        assert by_bearer.messages.create(model="tiny", max_tokens=4, messages=USER).content
    with anthropic_client(server, api_key="wrong") as wrong:
        with pytest.raises(anthropic.AuthenticationError) as err:
            wrong.messages.create(model="tiny", max_tokens=4, messages=USER)
    assert err.value.body["error"]["type"] == "authentication_error"


def test_a_full_queue_is_overloaded_529(build_stack, live_factory):  # noqa: F811
    stack = build_stack(options={"fake_delay_s": 0.02, "fake_reply_words": 2000}, queue_size=1)
    live = live_factory(stack)
    body = {"model": "tiny", "max_tokens": 4000, "messages": USER, "stream": True}
    with httpx.stream("POST", f"{live.url}/v1/messages", json=body, timeout=30) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: a dropped iterator closes the response
        assert next(lines)
        with anthropic.Anthropic(base_url=live.url, api_key="x", max_retries=0) as client:
            with pytest.raises(anthropic.OverloadedError) as err:
                client.messages.create(model="tiny", max_tokens=4, messages=USER)
    assert err.value.status_code == 529 and err.value.body["error"]["type"] == "overloaded_error"
    assert err.value.response.headers.get("retry-after") == "1"


def test_pings_while_the_first_token_is_late(build_stack, live_factory, monkeypatch):  # noqa: F811
    from localrun.server.anthropic import routes as anthropic_api

    monkeypatch.setattr(anthropic_api, "PING_AFTER_S", 0.05)
    monkeypatch.setattr(anthropic_api, "PING_EVERY_S", 0.1)
    stack = build_stack(options={"fake_delay_s": 0.6, "fake_reply_words": 1})
    live = live_factory(stack)
    body = {"model": "tiny", "max_tokens": 3, "messages": USER, "stream": True}
    r = httpx.post(f"{live.url}/v1/messages", json=body, timeout=30)
    names = [name for name, _ in sse_events(r.text)]
    assert names[0] == "message_start" and names[1] == "ping" and names.count("ping") >= 2
    assert "content_block_start" in names and names[-1] == "message_stop"
    assert names.index("content_block_start") > max(i for i, n in enumerate(names) if n == "ping")


def _in_flight(stack) -> int:
    from tests.support.stacks import in_flight_by_model

    return sum(in_flight_by_model(stack.manager).values())


@pytest.mark.parametrize("pings", [False, True])
def test_disconnect_mid_stream_stops_the_generation(build_stack, live_factory, monkeypatch, pings):  # noqa: F811
    from localrun.server.anthropic import routes as anthropic_api

    if pings:  # the client leaves while the stream is still waiting for the first chunk
        monkeypatch.setattr(anthropic_api, "PING_AFTER_S", 0.01)
        monkeypatch.setattr(anthropic_api, "PING_EVERY_S", 0.05)
    stack = build_stack(options={"fake_delay_s": 0.5 if pings else 0.02, "fake_reply_words": 2000})
    live = live_factory(stack)
    body = {"model": "tiny", "max_tokens": 4000, "messages": USER, "stream": True}
    with httpx.stream("POST", f"{live.url}/v1/messages", json=body, timeout=10) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert any(next(lines) for _ in range(3))
        assert _in_flight(stack) == 1
    assert wait_until(lambda: _in_flight(stack) == 0, 1.5)
    assert wait_until(lambda: health(live.url)["queue_depth"] == 0, 1.0)


def test_disconnect_before_a_whole_answer_stops_it(build_stack, live_factory):  # noqa: F811
    stack = build_stack(options={"fake_delay_s": 0.05, "fake_reply_words": 2000})
    live = live_factory(stack)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{live.url}/v1/messages",
            json={"model": "tiny", "max_tokens": 4000, "messages": USER},
            timeout=httpx.Timeout(5, read=0.5),
        )
    assert wait_until(lambda: _in_flight(stack) == 0, 1.0)


def test_concurrent_streams_each_get_their_own_answer(claude):
    results: dict[int, str] = {}

    def one(i: int) -> None:
        with claude.messages.stream(
            model="tiny", max_tokens=32, messages=[{"role": "user", "content": f"number {i}"}], **T0
        ) as s:
            results[i] = s.get_final_message().content[0].text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2, 3]
    assert all(results[i].startswith(f"You said: number {i}.") for i in results)
