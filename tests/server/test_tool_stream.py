"""Tool calls parsed while they are written (localrun/chat/tool_stream.py), through the stream
wrapper every text runtime uses (``with_tool_calls``): each family's answers fed at every split
point and token by token.

Before: the wrapper held everything after a call marker and the last chunk carried the calls
whole; no chunk carried a delta (``Chunk`` had no ``call_deltas``)."""

from __future__ import annotations

import json

import pytest

from localrun.chat.json_prefix import JsonScan
from localrun.chat.tools import with_tool_calls
from localrun.types import CallDelta, ChatRequest, Chunk, Message


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


REQ = ChatRequest(messages=(Message("user", "x"),), tools=(_tool("get_weather"), _tool("f")), tool_choice="auto")

#: (family, answer, number of calls, content left): the recorded shapes of each family.
ANSWERS = [
    (
        "hermes",
        'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "n": [1, -2.5e3, true, null]}}\n'
        '</tool_call>\n<tool_call>{"arguments": {"x": "a\\"b\\u00e9", "y": {}}, "name": "f"}</tool_call>',
        2,
        "Sure. ",
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}, '
        '{"name": "f", "arguments": {}}]',
        2,
        "",
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "f", "parameters": {"a": 1}}',
        2,
        "",
    ),
    ("llama3-bare", '{"name": "get_weather", "parameters": {"city": "Oslo", "when": "today"}}', 1, ""),
    (
        "json-list",
        '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "f", "arguments": {"q": 0}}]',
        2,
        "",
    ),
    ("json-fence", '```json\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n```', 1, ""),
    ("no-arguments", '<tool_call>{"name": "f"}</tool_call>', 1, ""),
]


def run(text: str, cuts: list[int], req: ChatRequest = REQ) -> list[Chunk]:
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    chunks = [Chunk(p) for p in pieces] + [Chunk("", finish_reason="stop")]
    return list(with_tool_calls(iter(chunks), req))


def streamed(out: list[Chunk]) -> dict[int, list[CallDelta]]:
    by_call: dict[int, list[CallDelta]] = {}
    for chunk in out:
        for d in chunk.call_deltas:
            by_call.setdefault(d.index, []).append(d)
    return by_call


def check(out: list[Chunk], n_calls: int, content: str) -> dict[int, list[CallDelta]]:
    final = out[-1]
    assert final.finish_reason == "tool_calls"
    assert "".join(c.text for c in out) == content
    assert len(final.tool_calls) == n_calls
    by_call = streamed(out)
    assert sorted(by_call) == list(range(n_calls))  # two calls: indexes 0 and 1
    for i, call in enumerate(final.tool_calls):
        deltas = by_call[i]
        assert (deltas[0].id, deltas[0].name) == (call["id"], call["function"]["name"])  # the first delta starts it
        assert [d.end for d in deltas].count(True) == 1 and deltas[-1].end
        args = call["function"]["arguments"]
        assert "".join(d.arguments for d in deltas) == args  # the pieces are the final string exactly
        json.loads(args)  # every accumulated piece is a prefix of it, so a prefix of valid JSON
    return by_call


@pytest.mark.parametrize(("family", "text", "n_calls", "content"), ANSWERS, ids=[a[0] for a in ANSWERS])
def test_every_split_point_streams_the_final_arguments(family, text, n_calls, content):
    for cut in range(1, len(text)):
        check(run(text, [cut]), n_calls, content)
    check(run(text, [5, 17, 40, 41, 42]), n_calls, content)


@pytest.mark.parametrize(("family", "text", "n_calls", "content"), ANSWERS, ids=[a[0] for a in ANSWERS])
def test_token_by_token_the_arguments_grow_before_the_call_ends(family, text, n_calls, content):
    out = run(text, list(range(1, len(text))))
    by_call = check(out, n_calls, content)
    args = out[-1].tool_calls[0]["function"]["arguments"]
    if len(args) > 2:
        assert len([d for d in by_call[0] if d.arguments]) > 2  # piece by piece, not whole at the end
    # the call started before the answer ended: its first delta is not on the last chunk
    assert not any(d.index == 0 and d.name for d in out[-1].call_deltas)


def test_the_final_arguments_are_the_models_own_text():
    """Not a re-dump: ``-2.5e3`` stays as written (json.dumps would write -2500.0)."""
    out = run(ANSWERS[0][1], [30])
    assert out[-1].tool_calls[0]["function"]["arguments"] == '{"city": "Oslo", "n": [1, -2.5e3, true, null]}'


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "not_a_tool", "arguments": {"a": 1}}',  # JSON with a name the request does not offer
        '<think>let me <tool_call>{"name": "f", "arguments": {}}</tool_call>',  # inside reasoning
        "Plain prose, no call at all.",
    ],
)
def test_what_is_not_a_call_streams_nothing(text):
    for cut in range(1, len(text)):
        out = run(text, [cut])
        assert not streamed(out)


def test_broken_json_stops_the_deltas_before_the_break():
    """A model without a grammar breaks its JSON mid-call: nothing past the last valid prefix goes out."""
    text = '<tool_call>{"name": "f", "arguments": {"a": 1,, "b": 2}}</tool_call>'
    out = run(text, list(range(1, len(text))))
    sent = "".join(d.arguments for d in streamed(out).get(0, []))
    assert sent == '{"a": 1,'  # the server refuses the unconfirmed call (server/tool_events.py)
    assert not out[-1].tool_calls  # the parse leaves it as content, as before


def test_a_partial_literal_or_escape_is_sent_as_a_prefix():
    text = '<tool_call>{"name": "f", "arguments": {"ok": true, "s": "\\u00e9"}}</tool_call>'
    cut = text.index("tr") + 2  # "tr" of true
    out = run(text, [cut])
    assert out[0].call_deltas[0].arguments == '{"ok": tr'
    cut = text.index("\\u00") + 4
    assert run(text, [cut])[0].call_deltas[0].arguments.endswith('"\\u00')


def test_chunks_carry_their_deltas_across_the_worker_pipe():
    chunk = Chunk("", call_deltas=(CallDelta(0, "call_1", "f", '{"a"'), CallDelta(1, arguments="1", end=True)))
    assert Chunk.from_dict(json.loads(json.dumps(chunk.to_dict()))) == chunk
    assert "call_deltas" not in Chunk("x").to_dict()


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('{"a": [1, 2.5e-3, "x\\n", {"b": null}]}', True),
        ("[]", True),
        ('{"a": 01}', False),
        ('{"a": 1,}', False),
        ('{"a" 1}', False),
        ("[tru]", False),
        ('"\\x"', False),
    ],
)
def test_the_prefix_checker_follows_json(text, ok):
    scan = JsonScan()
    for i, ch in enumerate(text):
        scan.push(ch, i)
        if scan.bad:
            break
    assert (scan.done and not scan.bad) is ok
    if ok:
        json.loads(text)
