"""Real Ollama clients against a live localrun (fake runtime, every capability): ``llm`` with
llm-ollama and langchain-ollama, each used as its README shows, each failing on the defects
issue 21 found (one empty digest for every model, capabilities always ``completion``, strict
options, ``dimensions`` refused)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.capabilities import ALL
from tests.support.stacks import fake_planner

llm = pytest.importorskip("llm")
llm_ollama_registry = pytest.importorskip("llm_ollama.registry")
langchain_ollama = pytest.importorskip("langchain_ollama")

TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def server(build_stack, live_factory, tiny_fim, tmp_path, monkeypatch):
    """tiny, tiny-mean (one file, mean pooling), tiny-tools (a template that takes tools), fim (another file)."""
    stack = build_stack(planner=fake_planner(fake_capabilities=list(ALL)))
    base = stack.store.resolve("tiny")
    for name, meta in (
        ("tiny-mean", {"localrun.pooling": "mean"}),
        ("tiny-tools", {"localrun.chat_template": TOOLS_TEMPLATE}),
    ):
        stack.store.register(dataclasses.replace(base, name=name, metadata={**base.metadata, **meta}))
    stack.store.import_path(tiny_fim, name="fim")
    live = live_factory(stack)
    monkeypatch.setenv("OLLAMA_HOST", live.url)
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "llm"))
    llm_ollama_registry.cache.set_dir(tmp_path / "llm-ollama-cache")  # it caches capabilities by digest
    return live


def _loaded(live) -> list[str]:
    return [m["name"] for m in live.stack.manager.loaded()]


def test_llm_ollama_sees_each_model_and_chats_with_the_one_named(server):
    models = {name: (aliases, caps) for name, aliases, caps in llm_ollama_registry._distinct_models()}
    assert set(models) == {"tiny:latest", "tiny-mean:latest", "tiny-tools:latest", "fim:latest"}
    assert models["tiny:latest"][0] == ("tiny",)  # the bare name is its alias
    response = llm.get_model("ollama/tiny-mean").prompt("hello", stream=False)
    assert response.text().startswith("You said: hello")
    assert _loaded(server) == ["tiny-mean"]  # not another model behind a shared digest


def test_llm_ollama_registers_the_embedding_model(server):
    names = {m.model_id for m in llm.get_embedding_models()}
    assert "ollama/tiny-mean:latest" in names and "ollama/tiny:latest" not in names
    vector = llm.get_embedding_model("ollama/tiny-mean").embed("hello")
    assert len(vector) == 16


def test_llm_ollama_uses_tools_where_the_template_takes_them(server):
    def add_numbers(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    model = llm.get_model("ollama/tiny-tools")
    assert model.supports_tools and not llm.get_model("ollama/tiny").supports_tools
    response = model.prompt("call add_numbers", tools=[add_numbers], stream=False)
    calls = response.tool_calls()
    assert [c.name for c in calls] == ["add_numbers"]


def test_langchain_ollama_chat_with_options_and_tools(server):
    from langchain_core.tools import tool

    @tool
    def lookup(city: str) -> str:
        """Look up the weather of a city."""
        return city

    chat = langchain_ollama.ChatOllama(
        model="tiny-tools",
        base_url=server.url,
        validate_model_on_init=True,
        num_predict=8,
        num_thread=2,
        num_gpu=0,
        repeat_last_n=32,
        mirostat=0,
        tfs_z=1.0,
    )
    answer = chat.invoke("hello")
    assert answer.content.startswith("You said: hello")
    called = chat.bind_tools([lookup]).invoke("call lookup")
    assert [c["name"] for c in called.tool_calls] == ["lookup"]


def test_langchain_ollama_embeddings_with_dimensions(server):
    embeddings = langchain_ollama.OllamaEmbeddings(model="tiny-mean:latest", base_url=server.url, dimensions=4)
    vectors = embeddings.embed_documents(["a", "b"])
    assert [len(v) for v in vectors] == [4, 4]
