"""OpenAI's parameters and llama.cpp's/vLLM's extensions on a real ``localrun serve`` running
llama.cpp (the tiny random GGUF with FIM tokens), through the official ``openai`` client
where it has the parameter and raw HTTP otherwise."""

from __future__ import annotations

import collections

import httpx
import ollama
import openai
import pytest

from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

#: A template that reads chat_template_kwargs' enable_thinking, as Qwen3's does.
THINKING_TEMPLATE = (
    "{% if enable_thinking is defined and not enable_thinking %}NOTHINK\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LONG = "hello world the quick fox " * 12  # past the prefix cache's copy threshold


@pytest.fixture(scope="module")
def tiny(serve_module, tiny_fim):
    return serve_module(
        tiny_fim, plan={"n_threads": 1}, n_slots=4, slot_ctx=256, pooling="mean", chat_template=THINKING_TEMPLATE
    )


def tokens_of(server, text: str, add_special: bool = False) -> list[int]:
    return httpx.post(f"{server.url}/tokenize", json={"content": text, "add_special": add_special}).json()["tokens"]


def complete(oai, **kwargs):
    kwargs.setdefault("max_tokens", 8)
    kwargs.setdefault("temperature", 0)
    return oai.completions.create(model="tiny", **kwargs)


def test_n_gives_n_choices_streamed_and_not(tiny):
    with openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        r = oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": LONG}], n=3, temperature=1.0, seed=11, max_tokens=6
        )
        assert [c.index for c in r.choices] == [0, 1, 2]
        assert len({c.message.content for c in r.choices}) > 1  # seed + i per choice
        assert 3 <= r.usage.completion_tokens <= 18 and r.system_fingerprint.startswith("fp_")
        chunks = list(oai.completions.create(model="tiny", prompt=LONG, n=2, max_tokens=4, temperature=0, stream=True))
        texts = collections.defaultdict(str)
        finishes = {}
        for c in chunks:
            for ch in c.choices:
                texts[ch.index] += ch.text
                if ch.finish_reason:
                    finishes[ch.index] = ch.finish_reason
        assert finishes == {0: "length", 1: "length"} and texts[0] == texts[1]  # greedy: the same answer twice


def test_logit_bias_forces_and_bans(tiny):
    hello, world = tokens_of(tiny, "hello world")
    with openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        forced = complete(oai, prompt="the", max_tokens=4, logit_bias={str(world): 100})
        assert forced.choices[0].text == " world" * 4
        both = complete(oai, prompt="the", max_tokens=4, logit_bias={str(world): -100, str(hello): 100})
        assert both.choices[0].text == " hello" * 4
        plain = complete(oai, prompt="the", max_tokens=6)
        first = tokens_of(tiny, plain.choices[0].text)[:1]
        with pytest.raises(openai.BadRequestError, match="vocabulary"):
            complete(oai, prompt="the", logit_bias={"999999": 5})
    assert first  # the unbiased answer tokenizes


def test_penalties_change_repetition_measurably(tiny):
    with openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:

        def distinct(**kwargs) -> int:
            r = oai.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=32,
                temperature=0,
                logprobs=True,
                **kwargs,
            )
            return len({t.token for t in r.choices[0].logprobs.content})

        plain = distinct()
        assert distinct(frequency_penalty=2.0) > plain
        assert distinct(presence_penalty=2.0) > plain


def test_token_prompts_equal_their_text_and_echo(tiny):
    with openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        text = complete(oai, prompt="hello world the")
        ids = tokens_of(tiny, "hello world the", add_special=True)
        by_ids = complete(oai, prompt=ids)
        assert by_ids.choices[0].text == text.choices[0].text and by_ids.usage.prompt_tokens == text.usage.prompt_tokens
        assert complete(oai, prompt=[ids]).choices[0].text == text.choices[0].text
        echoed = complete(oai, prompt="hello world the", echo=True)
        assert echoed.choices[0].text == "hello world the" + text.choices[0].text
        echo_ids = complete(oai, prompt=ids[1:], echo=True)  # without the BOS: its text is the prompt's
        assert echo_ids.choices[0].text.startswith(" hello world the")


def test_best_of_keeps_the_likeliest_and_counts_every_candidate(tiny):
    with openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        r = complete(oai, prompt=LONG, best_of=3, n=1, temperature=1.0, seed=3, max_tokens=5)
        assert len(r.choices) == 1 and r.choices[0].logprobs is None
        assert r.usage.completion_tokens > 5  # three candidates were generated


def test_suffix_fills_in_the_middle(tiny):
    with openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        r = complete(oai, prompt="hello", suffix="world", max_tokens=3)
        n_prefix, n_suffix = len(tokens_of(tiny, "hello")), len(tokens_of(tiny, "world"))
        assert (
            r.usage.prompt_tokens == 1 + 1 + n_prefix + 1 + n_suffix + 1
        )  # BOS, FIM_PRE, prefix, FIM_SUF, suffix, FIM_MID
        assert r.usage.completion_tokens == 3


def test_eog_controls_min_tokens_and_ignore_eos(tiny):
    """With the end token forced (+100), an answer ends at once; min_tokens and ignore_eos hold it off."""
    eos = {"2": 100}
    with openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        assert complete(oai, prompt="the", logit_bias=eos).usage.completion_tokens == 0
        assert complete(oai, prompt="the", logit_bias=eos, extra_body={"min_tokens": 3}).usage.completion_tokens == 3
        r = complete(oai, prompt="the", logit_bias=eos, max_tokens=5, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"


def test_template_fields_reach_the_template(tiny):
    msgs = [{"role": "user", "content": "hi"}]
    r = httpx.post(
        f"{tiny.url}/apply-template", json={"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}}
    )
    assert r.status_code == 200 and r.json()["prompt"].startswith("NOTHINK\n<|im_start|>user")
    plain = httpx.post(f"{tiny.url}/apply-template", json={"messages": msgs, "add_generation_prompt": False}).json()[
        "prompt"
    ]
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"
    with openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:

        def prompt_tokens(messages, **extra) -> int:
            return oai.chat.completions.create(
                model="tiny", messages=messages, max_tokens=1, temperature=0, extra_body=extra
            ).usage.prompt_tokens

        base = prompt_tokens(msgs)
        assert prompt_tokens(msgs, chat_template_kwargs={"enable_thinking": False}) > base
        assert prompt_tokens(msgs, add_generation_prompt=False) < base
        story = [*msgs, {"role": "assistant", "content": "the quick"}]
        cut = prompt_tokens(story, continue_final_message=True, add_generation_prompt=False)
        assert cut == len(
            tokens_of(tiny, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nthe quick", add_special=True)
        )


def test_a_llama_cpp_client_body_gets_an_answer_and_the_header(tiny):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "cache_prompt": True,
        "n_predict": 3,
        "id_slot": -1,
        "timings_per_token": False,
        "repetition_penalty": 1.1,
        "typical_p": 0.9,
        "temperature": 0.5,
    }
    r = httpx.post(f"{tiny.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    # id_slot is honoured on llama.cpp (-1: any slot, tests/server/test_slots_api.py pins one)
    assert r.headers["x-localrun-ignored-fields"] == "timings_per_token"
    assert r.json()["usage"]["completion_tokens"] == 3


def test_embedding_usage_counts_the_tokens(tiny):
    texts = ["hello world", "the quick fox jumps"]
    expected = sum(len(tokens_of(tiny, t, add_special=True)) for t in texts)
    with openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        r = oai.embeddings.create(model="tiny", input=texts)
        assert r.usage.prompt_tokens == expected > 0 and r.usage.total_tokens == expected
        ids = [tokens_of(tiny, t, add_special=True) for t in texts]
        by_ids = oai.embeddings.create(model="tiny", input=ids)
        assert [d.embedding for d in by_ids.data] == [d.embedding for d in r.data]
        with pytest.raises(openai.BadRequestError, match="vocabulary"):
            oai.embeddings.create(model="tiny", input=[[1, 10**6]])
    e = ollama.Client(host=tiny.url, timeout=120).embed(model="tiny", input=texts)
    assert e.prompt_eval_count == expected
