"""Ollama's num_ctx on real llama.cpp: a model loaded at 512 tokens is reloaded by the real planner with
a larger context, and a prompt that overflowed the small one is answered (the fake runtime proves the
scheduling of reloads in tests/server/test_ctx.py; this proves a reloaded llama.cpp worker really holds more)."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import needs_llama
from tests.factories import write_tiny_llama_gguf

pytestmark = [needs_llama, pytest.mark.llama]


@pytest.fixture
def llama_stack(tmp_path, live_factory):
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.planning.planner import PlanOverrides
    from tests.support.stacks import Stack, make_settings

    settings = make_settings(runtime={"threads": 1, "parallel": 1})
    store = ModelStore(settings)
    store.import_path(write_tiny_llama_gguf(tmp_path / "long.gguf", n_ctx_train=65536), name="long")
    manager = ModelManager(settings, store, overrides=PlanOverrides(n_ctx=512, runtime="llama.cpp"))
    stack = Stack(settings, store, manager)
    try:
        yield stack, live_factory(stack).url
    finally:
        manager.shutdown()


def test_num_ctx_reloads_a_real_llama_cpp_model_with_more_context(llama_stack):
    stack, url = llama_stack
    text = " ".join(["token"] * 500)  # about 2,000 tokens of the tiny vocabulary: over 512, under 4,096

    def chat(**options):
        body = {"model": "long", "stream": False, "messages": [{"role": "user", "content": text}]}
        return httpx.post(f"{url}/api/chat", json={**body, "options": {"num_predict": 2, **options}}, timeout=120)

    small = chat()
    assert small.status_code == 400 and "--ctx 4096" in small.json()["error"], small.text
    grown = chat(num_ctx=3000)
    assert grown.status_code == 200, grown.text
    assert grown.json()["prompt_eval_count"] > 512
    assert [m["n_ctx"] for m in stack.manager.loaded()] == [4096]
    ps = httpx.get(f"{url}/api/ps", timeout=10).json()["models"]
    assert ps[0]["context_length"] == 4096
