"""MLX capabilities on the tiny random-weight model, on the CPU: tools into the prompt (a
template that reads ``tools``, the fallback block, mlx-lm's own renderer), tool calls parsed
off the answer, forced calls and JSON schemas refused, logprobs checked against the model's
own logits, token texts that concatenate to the answer for the three detokenizers mlx-lm
picks, the declared capabilities through a real worker and a real server."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from localrun.errors import UnsupportedFeature
from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling, fold
from tests.runtimes.conftest import needs_mlx

pytestmark = needs_mlx

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
HISTORY = (
    Message("user", "weather in Paris?"),
    Message("assistant", "", tool_calls=(CALL,)),
    Message("tool", "sunny", tool_call_id="call_1", name="get_weather"),
    Message("user", "and now?"),
)
TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>\n{% for t in tools %}TOOL {{ t['function']['name'] }}: "
    "{{ t['function']['description'] }}\n{% endfor %}</s>\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "CALL {{ c['function']['name'] }} {{ c['function']['arguments'] | tojson }}{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %}</s>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
GREEDY = Sampling(temperature=0.0, max_tokens=12)


def _load(path: Path, n_ctx: int = 2048):
    from localrun.runtimes.mlx import MlxRuntime

    return MlxRuntime().load(
        ModelRecord(name="tiny-mlx", format=Format.MLX, path=str(path)), Plan(runtime="mlx", n_ctx=n_ctx, n_batch=64)
    )


def _with_template(src: Path, dst: Path, template: str | None) -> Path:
    """A copy of the model whose chat template is ``template`` (None: no template at all)."""
    shutil.copytree(src, dst)
    tok_config = json.loads((dst / "tokenizer_config.json").read_text())
    tok_config.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(tok_config))
    if template is None:
        (dst / "chat_template.jinja").unlink()
    else:
        (dst / "chat_template.jinja").write_text(template)
    return dst


def _prompt_of(session, req: ChatRequest) -> str:
    """The text ``session.chat`` would feed the model (generation itself is skipped)."""
    seen: list[list[int]] = []

    def pieces(prompt, *args, **kwargs):
        seen.append(prompt)
        return iter(())

    session._pieces = pieces
    try:
        list(session.chat(req, Cancel()))
    finally:
        del session._pieces
    return session._tokenizer.decode(seen[0])


def _scripted(session, monkeypatch, *parts: str) -> None:
    """Make the session 'generate' ``parts`` (the last one ends the answer with "stop")."""
    from localrun.runtimes.pieces import Piece

    def pieces(prompt, s, max_tokens, cancel, track=None):
        for i, part in enumerate(parts):
            yield Piece(part, finish_reason="stop" if i == len(parts) - 1 else None)

    monkeypatch.setattr(session, "_pieces", pieces)


# --- tools into the prompt --------------------------------------------------------------


@pytest.fixture(scope="module")
def roomy_dir(tmp_path_factory) -> Path:
    """The tiny model with room for a tools block (several hundred of its character-level tokens)."""
    from tests.runtimes.mlx_model import write_tiny_mlx_model

    return write_tiny_mlx_model(tmp_path_factory.mktemp("roomy") / "tiny-mlx", max_position_embeddings=4096)


@pytest.fixture(scope="module")
def roomy_session(roomy_dir):
    session = _load(roomy_dir)
    yield session
    session.close()


@pytest.fixture(scope="module")
def tools_session(roomy_dir, tmp_path_factory):
    session = _load(_with_template(roomy_dir, tmp_path_factory.mktemp("tools") / "m", TOOLS_TEMPLATE))
    yield session
    session.close()


def test_a_template_that_reads_tools_gets_them_and_the_calls_in_history(tools_session):
    text = _prompt_of(tools_session, ChatRequest(messages=HISTORY, sampling=GREEDY, tools=(WEATHER, CLOCK)))
    assert "TOOL get_weather: Weather forecast for a city" in text and "TOOL get_time" in text
    assert 'CALL get_weather {"city": "Paris"}' in text  # arguments as an object, as HF templates expect
    assert "<|tool|>" in text and "sunny" in text
    assert "You can call these functions" not in text  # no fallback block next to the template's own


def test_tool_choice_none_keeps_tools_out_of_the_prompt(tools_session):
    text = _prompt_of(
        tools_session,
        ChatRequest(messages=(Message("user", "hi"),), sampling=GREEDY, tools=(WEATHER,), tool_choice="none"),
    )
    assert "TOOL" not in text and "get_weather" not in text


def test_a_template_without_tools_gets_the_fallback_block(roomy_session):
    text = _prompt_of(roomy_session, ChatRequest(messages=HISTORY, sampling=GREEDY, tools=(WEATHER,)))
    assert text.startswith("<s>") and "<|system|>" in text
    assert "You can call these functions" in text and '"name": "get_weather"' in text
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<tool_response" in text and "sunny" in text  # the result, as a user turn
    plain = _prompt_of(roomy_session, ChatRequest(messages=(Message("user", "hi"),), sampling=GREEDY))
    assert "You can call" not in plain and "<|system|>" not in plain


def test_a_model_without_template_gets_the_fallback_block_in_the_transcript(roomy_dir, tmp_path):
    session = _load(_with_template(roomy_dir, tmp_path / "m", None))
    text = _prompt_of(session, ChatRequest(messages=(Message("user", "hi"),), sampling=GREEDY, tools=(WEATHER,)))
    assert "System: You can call these functions" in text and '"name": "get_weather"' in text
    assert text.endswith("User: hi\nAssistant:")


def test_mlx_lms_own_renderer_gets_tools_and_tool_turns(roomy_dir, tmp_path):
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    session = _load(_with_template(roomy_dir, tmp_path / "m", None))
    calls = []

    def renderer(messages, **kwargs):  # a chat_template_type module's apply_chat_template
        calls.append((messages, kwargs))
        return "<s><|user|>\nrendered</s>\n<|assistant|>\n"

    session._tokenizer = TokenizerWrapper(session._tokenizer._tokenizer, chat_template=renderer)
    text = _prompt_of(session, ChatRequest(messages=HISTORY, sampling=GREEDY, tools=(WEATHER,)))
    assert "rendered" in text
    messages, kwargs = calls[-1]
    assert kwargs["tools"] == [WEATHER] and kwargs["add_generation_prompt"] is True
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[2]["tool_call_id"] == "call_1"
    _prompt_of(session, ChatRequest(messages=(Message("user", "hi"),), sampling=GREEDY))
    assert "tools" not in calls[-1][1] and calls[-1][0] == [{"role": "user", "content": "hi"}]


# --- tool calls out of the answer -------------------------------------------------------


def test_a_hermes_call_in_the_answer_becomes_tool_calls_on_the_last_chunk(tiny_mlx_dir, monkeypatch):
    session = _load(tiny_mlx_dir)
    _scripted(
        session,
        monkeypatch,
        "<tool_",
        'call>\n{"name": "get_weather", ',
        '"arguments": {"city": "Oslo"}}\n</tool_call>',
    )
    chunks = list(
        session.chat(
            ChatRequest(messages=(Message("user", "weather?"),), sampling=GREEDY, tools=(WEATHER, CLOCK)), Cancel()
        )
    )
    assert "".join(c.text for c in chunks) == ""  # the call is not content
    last = chunks[-1]
    assert last.finish_reason == "tool_calls"
    (call,) = last.tool_calls
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}


def test_a_call_to_a_function_not_offered_stays_content(tiny_mlx_dir, monkeypatch):
    session = _load(tiny_mlx_dir)
    answer = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    _scripted(session, monkeypatch, answer)
    chunks = list(
        session.chat(ChatRequest(messages=(Message("user", "x"),), sampling=GREEDY, tools=(WEATHER,)), Cancel())
    )
    assert "".join(c.text for c in chunks) == answer
    assert chunks[-1].finish_reason == "stop" and chunks[-1].tool_calls == ()


def test_without_tools_call_text_is_plain_content(tiny_mlx_dir, monkeypatch):
    session = _load(tiny_mlx_dir)
    answer = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    _scripted(session, monkeypatch, answer)
    chunks = list(session.chat(ChatRequest(messages=(Message("user", "x"),), sampling=GREEDY), Cancel()))
    assert "".join(c.text for c in chunks) == answer and chunks[-1].tool_calls == ()


def test_a_real_answer_with_tools_offered_generates_normally(roomy_session):
    req = ChatRequest(messages=(Message("user", "hello"),), sampling=GREEDY, tools=(WEATHER,))
    chunks = list(roomy_session.chat(req, Cancel()))
    text, finish, usage = fold(chunks)
    assert finish in ("stop", "length") and chunks[-1].tool_calls == ()
    assert text.strip() and usage.completion_tokens > 0
    bare = fold(roomy_session.chat(ChatRequest(messages=(Message("user", "hello"),), sampling=GREEDY), Cancel()))
    assert usage.prompt_tokens > bare[2].prompt_tokens + 50  # the tools block was in the prompt


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_choice_is_refused_before_any_chunk(tiny_mlx_session, choice):
    req = ChatRequest(messages=(Message("user", "weather?"),), sampling=GREEDY, tools=(WEATHER,), tool_choice=choice)
    with pytest.raises(UnsupportedFeature, match="cannot force a tool call") as info:
        tiny_mlx_session.chat(req, Cancel())
    assert info.value.param == "tool_choice" and "auto" in info.value.hint


def test_a_tool_choice_naming_a_function_not_offered_is_refused(tiny_mlx_session):
    req = ChatRequest(
        messages=(Message("user", "x"),),
        sampling=GREEDY,
        tools=(WEATHER,),
        tool_choice={"type": "function", "function": {"name": "nope"}},
    )
    with pytest.raises(UnsupportedFeature, match="not among") as info:
        tiny_mlx_session.chat(req, Cancel())
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize(
    "field,sampling",
    [
        ("response_format", Sampling(json_schema={"type": "object"})),
        ("grammar", Sampling(grammar='root ::= "a"')),
    ],
)
def test_json_schema_and_grammar_stay_unsupported(tiny_mlx_session, field, sampling):
    assert "json_schema" not in tiny_mlx_session.capabilities and "grammar" not in tiny_mlx_session.capabilities
    with pytest.raises(UnsupportedFeature, match="no grammar engine") as info:
        tiny_mlx_session.complete(CompletionRequest("hi", sampling), Cancel())
    assert info.value.param == field
    with pytest.raises(UnsupportedFeature):
        tiny_mlx_session.chat(ChatRequest(messages=(Message("user", "hi"),), sampling=sampling), Cancel())


# --- logprobs ---------------------------------------------------------------------------


def _entries(chunks) -> list[dict]:
    return [e for c in chunks for e in c.logprobs]


def _record_tokens(monkeypatch) -> list[int]:
    from localrun.runtimes import mlx_features

    seen: list[int] = []
    real = mlx_features.LogprobTrack.read

    def read(self, token, logprobs):
        seen.append(token)
        return real(self, token, logprobs)

    monkeypatch.setattr(mlx_features.LogprobTrack, "read", read)
    return seen


def test_logprobs_one_entry_per_token_that_concatenate_to_the_text(tiny_mlx_session):
    req = CompletionRequest("the quick", Sampling(temperature=0.0, max_tokens=16, logprobs=3))
    chunks = list(tiny_mlx_session.complete(req, Cancel()))
    text, finish, usage = fold(chunks)
    entries = _entries(chunks)
    assert finish == "length" and len(entries) == usage.completion_tokens == 16
    assert "".join(e["token"] for e in entries) == text and text
    for e in entries:
        assert bytes(e["bytes"]).decode() == e["token"]
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        values = [a["logprob"] for a in e["top_logprobs"]]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        top = e["top_logprobs"][0]  # greedy: the chosen token is the most likely one
        assert top["logprob"] == e["logprob"] and top["token"] == e["token"]
        assert set(top) == {"token", "logprob", "bytes"}


def test_logprobs_equal_the_log_softmax_of_the_models_logits(tiny_mlx_dir, monkeypatch):
    import mlx.core as mx

    session = _load(tiny_mlx_dir)
    tokens = _record_tokens(monkeypatch)
    req = CompletionRequest(
        "hello world", Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3, max_tokens=10, logprobs=2)
    )
    entries = _entries(session.complete(req, Cancel()))
    prompt = list(session._tokenizer.encode("hello world"))
    logits = session._model(mx.array([prompt + tokens]))[0].astype(mx.float32)
    logsm = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    assert len(entries) == len(tokens) == 10
    for i, (token, entry) in enumerate(zip(tokens, entries)):
        row = logsm[len(prompt) - 1 + i]
        assert entry["logprob"] == pytest.approx(row[token].item(), abs=1e-4)
        best = mx.argsort(-row)[:2].tolist()
        assert [a["logprob"] for a in entry["top_logprobs"]] == pytest.approx([row[t].item() for t in best], abs=1e-4)


def test_top_logprobs_over_the_whole_vocabulary_sum_to_one(tiny_mlx_session):
    vocab = tiny_mlx_session._model.lm_head.weight.shape[0]
    req = CompletionRequest("a small", Sampling(temperature=0.0, max_tokens=3, logprobs=vocab + 50))
    entries = _entries(tiny_mlx_session.complete(req, Cancel()))
    assert len(entries) == 3
    for e in entries:
        assert len(e["top_logprobs"]) == vocab
        assert math.fsum(math.exp(a["logprob"]) for a in e["top_logprobs"]) == pytest.approx(1.0, abs=1e-4)
        assert e["logprob"] in {a["logprob"] for a in e["top_logprobs"]}


def test_logprobs_zero_gives_the_chosen_token_only_and_off_gives_none(tiny_mlx_session):
    on = list(
        tiny_mlx_session.complete(
            CompletionRequest("hi", Sampling(temperature=0.0, max_tokens=5, logprobs=0)), Cancel()
        )
    )
    assert len(_entries(on)) == 5 and all(e["top_logprobs"] == [] for e in _entries(on))
    off = list(tiny_mlx_session.complete(CompletionRequest("hi", Sampling(temperature=0.0, max_tokens=5)), Cancel()))
    assert _entries(off) == [] and fold(off)[0] == fold(on)[0]


def test_chat_logprobs_and_a_stop_string_lose_no_entry(tiny_mlx_session):
    base = Sampling(temperature=0.0, max_tokens=20, logprobs=1)
    msgs = (Message("user", "hello"),)
    full = fold(tiny_mlx_session.chat(ChatRequest(messages=msgs, sampling=base), Cancel()))[0]
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = list(
        tiny_mlx_session.chat(
            ChatRequest(messages=msgs, sampling=Sampling(temperature=0.0, max_tokens=20, logprobs=1, stop=(stop,))),
            Cancel(),
        )
    )
    text, finish, _ = fold(cut)
    assert finish == "stop" and text == full[: full.index(stop)]
    joined = "".join(e["token"] for e in _entries(cut))
    assert joined.startswith(text) and stop in joined[len(text) - 1 :]  # the stop's tokens ride the last chunk


def test_spm_detokenizer_token_texts_concatenate_to_the_text(tiny_mlx_dir):
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer, TokenizerWrapper

    session = _load(tiny_mlx_dir)
    hf = session._tokenizer._tokenizer
    session._tokenizer = TokenizerWrapper(hf, SPMStreamingDetokenizer, eos_token_ids=[hf.eos_token_id])
    for seed in range(4):
        req = CompletionRequest(
            "the quick", Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed, max_tokens=24, logprobs=1)
        )
        chunks = list(session.complete(req, Cancel()))
        text = fold(chunks)[0]
        assert "".join(e["token"] for e in _entries(chunks)) == text and not text.startswith(" ")


@pytest.fixture(scope="module")
def byte_level_session(tmp_path_factory):
    from tests.runtimes.mlx_model import write_tiny_mlx_model

    session = _load(write_tiny_mlx_model(tmp_path_factory.mktemp("bpe") / "m", byte_level=True))
    yield session
    session.close()


def test_byte_level_tokens_report_their_raw_bytes(byte_level_session):
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

    assert isinstance(byte_level_session._tokenizer.detokenizer, BPEStreamingDetokenizer)
    partial = 0
    for seed in range(4):
        req = CompletionRequest(
            "café ☕", Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed, max_tokens=30, logprobs=2)
        )
        chunks = list(byte_level_session.complete(req, Cancel()))
        text, entries = fold(chunks)[0], _entries(chunks)
        assert len(entries) == 30
        assert bytes(b for e in entries for b in e["bytes"]).decode("utf-8", "replace") == text
        for e in entries:
            assert e["token"] == bytes(e["bytes"]).decode("utf-8", "replace")
            try:
                bytes(e["bytes"]).decode()
            except UnicodeDecodeError:
                partial += 1
    assert partial > 0  # some tokens are pieces of a character: their bytes, not the text, say what they are


# --- capabilities reach the worker host and the server ----------------------------------


def test_a_real_worker_declares_tools_and_logprobs_and_sends_entries(roomy_dir, tmp_path):
    from localrun.worker.host import WorkerHandle, iter_chunks

    record = ModelRecord(name="tiny-mlx", format=Format.MLX, path=str(roomy_dir))
    handle = WorkerHandle(record, Plan(runtime="mlx", n_ctx=2048), log_path=tmp_path / "w.log")
    try:
        assert handle.capabilities == frozenset({"tools", "logprobs"})
        req = ChatRequest(
            messages=(Message("user", "hi"),),
            sampling=Sampling(temperature=0.0, max_tokens=6, logprobs=2),
            tools=(WEATHER,),
        )
        chunks = list(iter_chunks(handle, req))
        entries = _entries(chunks)
        assert len(entries) == 6 and "".join(e["token"] for e in entries) == fold(chunks)[0]
        assert all(len(e["top_logprobs"]) == 2 for e in entries)
    finally:
        handle.close()


def test_through_a_real_server_with_the_openai_client(roomy_dir, serve):
    openai = pytest.importorskip("openai")
    server = serve(roomy_dir, "tiny-mlx", runtime="mlx")
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "hello"}]
    r = oai.chat.completions.create(
        model="tiny-mlx", messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3, tools=[WEATHER]
    )
    choice = r.choices[0]
    content = choice.logprobs.content
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    assert len(content) == r.usage.completion_tokens == 8
    assert "".join(t.token for t in content) == choice.message.content
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == t.logprob for t in content)
    streamed = [
        c
        for c in oai.chat.completions.create(
            model="tiny-mlx", messages=msgs, max_tokens=8, temperature=0, logprobs=True, tools=[WEATHER], stream=True
        )
        if c.choices
    ]
    assert [
        t.logprob for c in streamed if c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ] == pytest.approx([t.logprob for t in content], abs=1e-5)
    for kwargs, param in (
        ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            oai.chat.completions.create(model="tiny-mlx", messages=msgs, max_tokens=4, **kwargs)
        assert info.value.body["param"] == param, info.value.body


def test_the_token_that_ends_the_answer_has_no_entry(tiny_mlx_dir, monkeypatch):
    session = _load(tiny_mlx_dir)
    sampling = Sampling(temperature=0.0, max_tokens=6, logprobs=1)
    ids = _record_tokens(monkeypatch)
    first = _entries(session.complete(CompletionRequest("hello", sampling), Cancel()))
    assert len(first) == 6 and ids[2] not in ids[:2]
    # Make the third greedy token an end-of-generation token: the answer stops before it.
    session._tokenizer.eos_token_ids = {*session._tokenizer.eos_token_ids, ids[2]}
    chunks = list(session.complete(CompletionRequest("hello", sampling), Cancel()))
    assert chunks[-1].finish_reason == "stop"
    assert _entries(chunks) == first[:2]


@pytest.mark.parametrize("kind", ["naive", "spm", "bpe"])
def test_token_texts_match_mlx_lms_detokenizer_token_by_token(kind, tiny_mlx_dir, byte_level_session):
    """Texts with leading spaces, new lines and (byte-level) characters split across tokens:
    the cursor's pieces join to exactly what mlx-lm's streaming detokenizer writes."""
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer, TokenizerWrapper

    from localrun.runtimes.mlx_features import TokenText

    if kind == "bpe":
        tok = byte_level_session._tokenizer
        texts = [" café ☕ 日本", "  two spaces\n next line", "🙂🚀 x"]
    else:
        hf = _load(tiny_mlx_dir)._tokenizer._tokenizer
        tok = TokenizerWrapper(hf, SPMStreamingDetokenizer) if kind == "spm" else TokenizerWrapper(hf)
        texts = [
            "the quick brown",
            "line one\n second line\n\n third",
            "a , b ! end \n",
            "  two spaces",
            "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation . , ! ? so , this is a long line , over the window",
        ]
    table = TokenText(tok)
    assert (table.table is None) == (kind == "naive")
    for text in texts:
        ids = list(tok.encode(text, add_special_tokens=False))
        detok, written = tok.detokenizer, []
        for t in ids:  # as mlx_lm.stream_generate drives it
            detok.add_token(t)
            written.append(detok.last_segment)
        detok.finalize()
        written.append(detok.last_segment)
        cursor, pieces = table.cursor(), []
        for t in ids:
            pieces.append(cursor.bytes_of(t))
            cursor.advance(t, pieces[-1])
        assert b"".join(pieces).decode("utf-8", "replace") == "".join(written), (kind, text)
