"""The same parameters on Gemma 3 270M, where the text is real: n choices, a banned and a
forced token, penalties against repetition, token prompts, and embeddings from a
generative model through a pooling override."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama, pytest.mark.gemma, pytest.mark.slow]


@pytest.fixture(scope="module")
def gemma(serve_module, gemma_gguf):
    server = serve_module(gemma_gguf, "gemma", plan={"n_threads": 2}, pooling="mean", n_slots=4, slot_ctx=1024)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300) as oai:
        yield server, oai


def ids(server, text: str, add_special: bool = False) -> list[int]:
    return httpx.post(f"{server.url}/tokenize", json={"content": text, "add_special": add_special}, timeout=60).json()[
        "tokens"
    ]


def test_n_three_choices(gemma):
    _, oai = gemma
    r = oai.chat.completions.create(
        model="gemma",
        messages=[{"role": "user", "content": "Name a fruit."}],
        n=3,
        max_tokens=8,
        temperature=1.0,
        seed=2,
    )
    assert [c.index for c in r.choices] == [0, 1, 2] and all(c.message.content for c in r.choices)
    assert r.usage.prompt_tokens > 5  # the prompt is counted once, not three times


def test_logit_bias_bans_and_forces_a_word(gemma):
    server, oai = gemma

    def answer(max_tokens: int = 12, **kwargs) -> str:
        r = oai.chat.completions.create(
            model="gemma",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=max_tokens,
            temperature=0,
            **kwargs,
        )
        return r.choices[0].message.content

    assert "Paris" in answer()
    banned = {str(t): -100 for word in (" Paris", "Paris") for t in ids(server, word)}
    assert "Paris" not in answer(logit_bias=banned)
    (lyon,) = ids(server, " Lyon")[-1:]
    assert answer(2, logit_bias={str(lyon): 100}).startswith(" Lyon")


def test_penalties_reduce_repetition(gemma):
    _, oai = gemma
    prompt = "apple apple apple apple apple apple apple apple"

    def distinct(**kwargs) -> int:
        r = oai.completions.create(model="gemma", prompt=prompt, max_tokens=24, temperature=0, logprobs=0, **kwargs)
        return len(set(r.choices[0].logprobs.tokens))

    plain = distinct()
    assert distinct(frequency_penalty=1.5) > plain
    assert distinct(presence_penalty=1.5) > plain


def test_token_prompt_equals_text(gemma):
    server, oai = gemma
    text = oai.completions.create(model="gemma", prompt="Once upon a time", max_tokens=8, temperature=0)
    by_ids = oai.completions.create(
        model="gemma", prompt=ids(server, "Once upon a time", add_special=True), max_tokens=8, temperature=0
    )
    assert by_ids.choices[0].text == text.choices[0].text and by_ids.usage.prompt_tokens == text.usage.prompt_tokens


def test_gemma_embeds_through_a_pooling_override(gemma):
    server, oai = gemma
    texts = ["a cat sat on the mat", "a kitten sat on the rug", "quarterly tax filing deadline"]
    r = oai.embeddings.create(model="gemma", input=texts)
    vecs = [d.embedding for d in r.data]
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    assert [len(v) for v in vecs] == [640] * 3 and dot(vecs[0], vecs[1]) > dot(vecs[0], vecs[2])
    assert r.usage.prompt_tokens == sum(len(ids(server, t, add_special=True)) for t in texts)
    assert httpx.get(f"{server.url}/props", timeout=60).json()["pooling"] == "mean"
