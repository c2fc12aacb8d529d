"""Call or reply (localrun/chat/tool_reply.py): the prompt for templates without tool syntax and
the unwrapping of the answer's JSON: the reply streams as content as it is generated, a call
becomes a tool call, and no JSON of the wrapper reaches the client."""

from __future__ import annotations

import json

import pytest

from localrun.chat import tool_reply
from localrun.chat.tool_reply_decode import ReplyUnwrapper
from localrun.types import ChatRequest, Chunk, Message, Sampling, Usage

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
HERMES = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
TRICKY = 'He said "hi" \\ back\n\ttab, é, 漢字, 😀 and 𝄞, </tool_call> {"response": 1}'


ASK = (Message("user", "Weather in Paris?"),)


def req(choice="auto", parallel=None, messages=ASK, **kw) -> ChatRequest:
    return ChatRequest(messages=messages, tools=(WEATHER,), tool_choice=choice, parallel_tool_calls=parallel, **kw)


def chunks(pieces, finish="stop"):
    for p in pieces[:-1]:
        yield Chunk(text=p, logprobs=({"token": p},))
    yield Chunk(text=pieces[-1], finish_reason=finish, usage=Usage(1, len(pieces)), logprobs=({"token": pieces[-1]},))


def run(pieces, finish="stop", r=None, reasoning=None):
    out = list(tool_reply.with_reply(chunks(pieces, finish), r or req(), reasoning))
    return "".join(c.text for c in out), out[-1]


@pytest.mark.parametrize("ascii_only", [True, False], ids=["escaped", "utf8"])
def test_the_reply_is_content_whatever_the_pieces_at_every_boundary(ascii_only):
    text = json.dumps({"response": TRICKY}, ensure_ascii=ascii_only)
    assert "\\ud83d\\ude00" in text or not ascii_only  # a surrogate pair, split below at every point
    for i in range(len(text) + 1):
        for k in range(i, len(text) + 1, 7):
            content, last = run([text[:i], text[i:k], text[k:]])
            assert content == TRICKY, (i, k)
            assert last.finish_reason == "stop" and not last.tool_calls


def test_the_reply_streams_as_it_is_generated():
    text = json.dumps({"response": "Hello there, friend"})
    out = list(tool_reply.with_reply(chunks([text[i : i + 3] for i in range(0, len(text), 3)]), req()))
    shown = [c.text for c in out if c.text]
    assert len(shown) > 3 and shown[0] == "H"  # from the first character on, not at the end
    assert not any("{" in s or '"' in s for s in shown)
    assert sum(len(c.logprobs) for c in out) == len(range(0, len(text), 3))  # held logprobs travel on


def test_a_call_becomes_a_tool_call_and_finishes_tool_calls():
    text = json.dumps({"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}})
    content, last = run([text[:5], text[5:20], text[20:]])
    assert content == ""
    assert last.finish_reason == "tool_calls"
    (call,) = last.tool_calls
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert call["id"].startswith("call_")


def test_parallel_calls_come_as_a_list():
    text = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": c}} for c in ("Paris", "Oslo")]})
    content, last = run([text], r=req(parallel=True))
    assert content == "" and last.finish_reason == "tool_calls"
    assert [json.loads(c["function"]["arguments"])["city"] for c in last.tool_calls] == ["Paris", "Oslo"]


def test_a_length_cut_in_the_reply_keeps_the_content_so_far():
    text = '{"response": "The weather in Par'
    content, last = run([text[:10], text[10:]], finish="length")
    assert content == "The weather in Par"
    assert last.finish_reason == "length" and not last.tool_calls
    # cut inside an escape: the half-written escape is dropped, nothing raw is shown
    content, last = run(['{"response": "caf\\u00'], finish="length")
    assert content == "caf" and last.finish_reason == "length"


def test_a_length_cut_in_a_call_shows_no_json():
    content, last = run(['{"tool_call": {"name": "get_weather", "argum'], finish="length")
    assert content == "" and last.finish_reason == "length" and not last.tool_calls


def test_an_answer_that_is_not_the_wrapper_is_kept_whole():
    content, last = run(["Just ", "text {with braces}"])
    assert content == "Just text {with braces}" and not last.tool_calls
    content, last = run(['{"other": 1}'])
    assert content == '{"other": 1}'


def test_lone_surrogates_become_replacement_characters():
    u = ReplyUnwrapper()
    assert u.feed('{"response": "a\\ud83d') == "a"  # held: its low half may come next
    assert u.feed('b\\ude00c"}') == "\ufffdb\ufffdc"


def test_reasoning_passes_through_before_the_wrapper():
    text = "<think>Paris? {json}</think>\n" + json.dumps({"response": "Sunny."})
    for i in range(len(text) + 1):
        content, _ = run([text[:i], text[i:]], reasoning="optional")
        assert content == "<think>Paris? {json}</think>Sunny.", i
    call = json.dumps({"tool_call": {"name": "get_weather", "arguments": {"city": "X"}}})
    content, last = run(["hm</th", "ink>" + call], reasoning="open")
    assert content == "hm</think>" and last.finish_reason == "tool_calls"


def test_prompt_says_the_shapes_and_writes_history_in_the_wrappers_form():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = (
        Message("system", "Be brief."),
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "sunny", tool_call_id="call_1", name="get_weather"),
    )
    msgs, variables = tool_reply.prompt_messages(req(messages=history))
    assert variables == {}
    system = msgs[0]["content"]
    assert system.startswith("Be brief.") and '"get_weather"' in system and "Weather in a city" in system
    assert '{"tool_call": {"name": <function name>' in system and '{"response": "' in system
    assert json.loads(msgs[2]["content"]) == {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert msgs[3] == {"role": "user", "content": '<tool_response name="get_weather">\nsunny\n</tool_response>'}
    assert "tool_calls" in tool_reply.system_block(req(parallel=True))
    forced = tool_reply.system_block(req(choice="required"))
    assert '"response"' not in forced and "Call a function" in forced


def test_applies_only_to_templates_without_tool_syntax_and_free_answers():
    assert tool_reply.applies(req(), None)
    assert tool_reply.applies(req(choice="required"), "{{ messages }}")
    assert not tool_reply.applies(req(), None, "tagged")
    assert not tool_reply.applies(req(), HERMES)
    history_calls = (
        "{% for m in messages %}{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{% endfor %}"
    )
    assert not tool_reply.applies(req(), history_calls)  # it shows its model's calls: the tags stay
    assert not tool_reply.applies(req(choice="none"), None)
    assert not tool_reply.applies(req(sampling=Sampling(json_schema={"type": "object"})), None)


def test_each_choice_is_unwrapped_on_its_own():
    call = json.dumps({"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}})
    mixed = [
        Chunk(text='{"response": "Hel', index=0),
        Chunk(text=call[:9], index=1),
        Chunk(text='lo"}', index=0, finish_reason="stop"),
        Chunk(text=call[9:], index=1, finish_reason="stop"),
    ]
    out = list(tool_reply.with_reply(iter(mixed), req()))
    assert "".join(c.text for c in out if c.index == 0) == "Hello"
    assert [c.finish_reason for c in out if c.finish_reason] == ["stop", "tool_calls"]
    assert "".join(c.text for c in out if c.index == 1) == ""
