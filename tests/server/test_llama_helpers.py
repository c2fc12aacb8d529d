"""The llama.cpp helpers on the low-level API directly: grammar-constrained sampling,
log-probabilities from the logits, and pooled embeddings — on the tiny random GGUF (fast)
and on Gemma 3 270M."""

from __future__ import annotations

import json

import numpy as np
import pytest

from localrun.chat.tools import HERMES, LLAMA3, forced_call
from localrun.errors import ContextOverflow, UnsupportedFeature
from localrun.types import ChatRequest, Plan, Sampling
from tests.conftest import needs_llama
from tests.support.clients import validate

pytestmark = [needs_llama, pytest.mark.llama]

GREEDY = Sampling(temperature=0)
BOUNDED = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer"},
        "pair": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
    },
    "required": ["ok", "color", "n", "pair"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


class Model:
    """One model and one context, driven the simplest way: a prompt, then one token a step."""

    def __init__(self, path, n_ctx: int = 512):
        from localrun.runtimes.llamacpp.context import llama_lib
        from localrun.runtimes.llamacpp.grammar import LogprobReader

        self.llama = llama = llama_lib()
        self.model = llama.llama_model_load_from_file(str(path).encode(), llama.llama_model_default_params())
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        cp = llama.llama_context_default_params()
        cp.n_ctx = cp.n_batch = n_ctx
        cp.n_threads = cp.n_threads_batch = 1  # no barrier to wait on when the shared box is busy
        self.ctx = llama.llama_init_from_model(self.model, cp)
        self.reader = LogprobReader(llama, self.ctx, self.n_vocab, self.piece)

    def piece(self, token: int) -> bytes:
        import ctypes

        buf = ctypes.create_string_buffer(256)
        n = self.llama.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
        return buf.raw[:n]

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (self.llama.llama_token * (len(data) + 8))()
        n = self.llama.llama_tokenize(self.vocab, data, len(data), buf, len(buf), True, True)
        return list(buf[:n])

    def _decode(self, tokens: list[int]) -> None:
        arr = (self.llama.llama_token * len(tokens))(*tokens)
        assert self.llama.llama_decode(self.ctx, self.llama.llama_batch_get_one(arr, len(tokens))) == 0

    def generate(
        self,
        prompt: str,
        gbnf: str | None,
        *,
        max_tokens: int,
        top_n: int = 0,
        sampling: Sampling = GREEDY,
        naive: bool = False,
    ):
        """(text, logprob entries, ended on end-of-generation). ``naive``: the grammar first
        in one C chain (llama.cpp masks every token), the reference the fast path must match."""
        from localrun.runtimes.llamacpp.decode import ChainSampler, build_sampler
        from localrun.runtimes.llamacpp.grammar import grammar_sampler, sequence_sampler

        llama = self.llama
        llama.llama_memory_clear(llama.llama_get_memory(self.ctx), True)
        self._decode(self.tokenize(prompt))
        inner = build_sampler(llama, sampling, self.n_vocab)
        if naive and gbnf:
            chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
            llama.llama_sampler_chain_add(chain, grammar_sampler(llama, self.vocab, gbnf))
            llama.llama_sampler_chain_add(chain, inner)
            sampler = ChainSampler(llama, chain)
        else:
            sampler = sequence_sampler(llama, self.vocab, inner, gbnf, sampling, self.n_vocab)
        out, entries, eog = b"", [], False
        try:
            for _ in range(max_tokens):
                token = sampler.sample(self.ctx, -1)
                entries.append(self.reader.read(-1, token, top_n))
                if llama.llama_vocab_is_eog(self.vocab, token):
                    eog = True
                    break
                out += self.piece(token)
                self._decode([token])
        finally:
            sampler.free()
        return out.decode("utf-8", errors="replace"), entries, eog

    def close(self):
        self.llama.llama_free(self.ctx)
        self.llama.llama_model_free(self.model)


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    m = Model(tiny_gguf)
    yield m
    m.close()


def test_gbnf_composition():
    from localrun.runtimes.llamacpp.grammar import forced_call_gbnf, gbnf_literal, json_schema_gbnf, request_grammar

    assert gbnf_literal('a"b\\c\n') == '"a\\"b\\\\c\\n"'
    assert "root ::= object" in json_schema_gbnf({})
    call = forced_call(ChatRequest(messages=(), tools=(WEATHER,), tool_choice="required"), HERMES)
    g = forced_call_gbnf(call)
    assert g.startswith('root ::= "<tool_call>\\n" call "\\n</tool_call>"') and '"\\"get_weather\\""' in g
    assert request_grammar(Sampling(), None) is None
    assert request_grammar(Sampling(grammar='root ::= "x"'), None) == 'root ::= "x"'
    with pytest.raises(UnsupportedFeature, match="both constrain"):
        request_grammar(Sampling(json_schema={}), call)
    with pytest.raises(UnsupportedFeature, match="response_format"):
        json_schema_gbnf({"$ref": "https://example.com/schema.json"})
    with pytest.raises(UnsupportedFeature, match="must be an object"):
        json_schema_gbnf(["not", "a", "schema"])


def test_bad_grammar_is_refused_not_crashed(tiny):
    from localrun.runtimes.llamacpp.grammar import grammar_sampler

    with pytest.raises(UnsupportedFeature, match="grammar"):
        grammar_sampler(tiny.llama, tiny.vocab, "root ::= (")


def test_schema_grammar_makes_even_random_weights_write_valid_json(tiny):
    from localrun.runtimes.llamacpp.grammar import json_schema_gbnf

    text, _, eog = tiny.generate("Give me JSON:", json_schema_gbnf(BOUNDED), max_tokens=120)
    assert eog, text  # the grammar completed, then only end-of-generation was allowed
    validate(json.loads(text), BOUNDED)
    text, _, eog = tiny.generate("hello", json_schema_gbnf({}), max_tokens=120)
    assert eog and isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=0),
        Sampling(temperature=0.9, seed=7),
        Sampling(temperature=1.3, seed=3, top_k=0),
        Sampling(temperature=0.7, seed=1, repeat_penalty=1.3),
    ],
)
def test_checking_the_pick_first_keeps_answers_valid_and_seeded(tiny, sampling):
    """Greedy: the very tokens that masking the whole vocabulary gives. Sampled: a rejected
    pick draws again, so the random stream differs from the naive chain's, but the answer
    is valid and the same for the same seed."""
    from localrun.runtimes.llamacpp.grammar import json_schema_gbnf

    gbnf = json_schema_gbnf(BOUNDED)
    fast = tiny.generate("Give me JSON:", gbnf, max_tokens=120, sampling=sampling)
    assert fast[2], fast[0]
    validate(json.loads(fast[0]), BOUNDED)
    if sampling.temperature == 0:
        assert tiny.generate("Give me JSON:", gbnf, max_tokens=120, sampling=sampling, naive=True)[0] == fast[0]
    else:
        assert tiny.generate("Give me JSON:", gbnf, max_tokens=120, sampling=sampling)[0] == fast[0]


def test_forced_call_grammar_gives_a_parsable_call(tiny):
    from localrun.chat.tools import parse_tool_calls
    from localrun.runtimes.llamacpp.grammar import forced_call_gbnf

    for style in (HERMES, LLAMA3):
        call = forced_call(
            ChatRequest(
                messages=(), tools=(WEATHER,), tool_choice={"type": "function", "function": {"name": "get_weather"}}
            ),
            style,
        )
        text, _, eog = tiny.generate("weather?", forced_call_gbnf(call), max_tokens=150)
        assert eog, text
        content, calls = parse_tool_calls(text, ["get_weather"])
        assert content == "" and calls[0]["function"]["name"] == "get_weather"
        validate(json.loads(calls[0]["function"]["arguments"]), WEATHER["function"]["parameters"])


def test_logprobs_match_a_numpy_log_softmax_of_the_logits(tiny):
    text, entries, _ = tiny.generate("hello world", None, max_tokens=5, top_n=4)
    assert len(entries) == 5
    for e in entries:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 4
        tops = [a["logprob"] for a in e["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and tops[0] == pytest.approx(e["logprob"])  # greedy picks the best
        assert bytes(e["bytes"]) == tiny.piece(tiny.tokenize(e["token"])[-1]) or e["bytes"]
    # the reader at the current position against an independent computation
    lp = tiny.reader.log_softmax(-1)
    ptr = tiny.llama.llama_get_logits_ith(tiny.ctx, -1)
    logits = np.array(ptr[: tiny.n_vocab], dtype=np.float64)
    ref = logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
    assert np.allclose(lp, ref) and np.exp(lp).sum() == pytest.approx(1.0)
    assert tiny.reader.read(-1, 5, 0)["top_logprobs"] == []


def _embedder(m: Model, **options):
    from localrun.runtimes.llamacpp.embed import Embedder

    return Embedder(
        m.llama, m.model, Plan(runtime="llama.cpp", n_ctx=64, n_threads=1, options=options), tokenize=m.tokenize
    )


def test_embeddings_on_a_decoder_with_forced_mean_pooling(tiny):
    from localrun.runtimes.llamacpp.embed import embeddings_wanted, model_pooling

    assert model_pooling(tiny.llama, tiny.model) is None
    assert not embeddings_wanted(tiny.llama, tiny.model, Plan(runtime="llama.cpp"))
    assert embeddings_wanted(tiny.llama, tiny.model, Plan(runtime="llama.cpp", options={"embedding": True}))
    emb = _embedder(tiny)
    try:
        a, b, a2 = emb.embed(["hello world", "the quick fox", "hello world"])
        assert len(a) == 64 == emb.n_embd and a == a2 and a != b
        assert np.linalg.norm(a) == pytest.approx(1.0) and np.linalg.norm(b) == pytest.approx(1.0)
        assert emb.embed(["hello world"])[0] == a  # no state carried between calls
        with pytest.raises(ContextOverflow, match="input\\[1\\]"):
            emb.embed(["ok", "word " * 100])
    finally:
        emb.close()


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_grammar_logprobs_and_embeddings(gemma_gguf):
    from localrun.chat.tools import parse_tool_calls
    from localrun.runtimes.llamacpp.grammar import forced_call_gbnf, json_schema_gbnf

    m = Model(gemma_gguf)
    try:
        text, entries, eog = m.generate(
            "A JSON object describing a colour:\n", json_schema_gbnf(BOUNDED), max_tokens=60, top_n=2
        )
        assert eog, text
        assert (
            m.generate("A JSON object describing a colour:\n", json_schema_gbnf(BOUNDED), max_tokens=60, naive=True)[0]
            == text
        )
        validate(json.loads(text), BOUNDED)
        assert all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 2 for e in entries)
        call = forced_call(ChatRequest(messages=(), tools=(WEATHER,), tool_choice="required"), HERMES)
        text, _, eog = m.generate(
            "What is the weather in Paris for the next 3 days?\n", forced_call_gbnf(call), max_tokens=60
        )
        _, calls = parse_tool_calls(text, ["get_weather"])
        assert eog and json.loads(calls[0]["function"]["arguments"])["city"] in ("Paris", "Oslo")
        emb = _embedder(m)
        try:
            cat, kitten, tax = emb.embed(
                ["a cat sat on the mat", "a kitten sat on the rug", "quarterly tax filing deadline"]
            )
            assert len(cat) == 640
            assert np.dot(cat, kitten) > np.dot(cat, tax)  # a sanity check of meaning, not just shape
        finally:
            emb.close()
    finally:
        m.close()
