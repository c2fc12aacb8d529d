"""Reasoning budgets on a real llama.cpp worker: the tiny random GGUF with a template whose
generation prompt opens ``<think>`` (DeepSeek-R1 style). Random weights never write
``</think>``, so without a budget everything is reasoning; with one, the server closes the
block at the budget and the model's answer follows from the continued prompt."""

from __future__ import annotations

import pytest

from tests.conftest import needs_llama
from tests.server.test_reasoning import OPEN_TEMPLATE
from tests.support.clients import anthropic_client

pytestmark = [needs_llama, pytest.mark.llama]
anthropic = pytest.importorskip("anthropic")

USER = [{"role": "user", "content": "hello"}]
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def open_think_gguf(tmp_path_factory):
    from tests.factories import write_tiny_llama_gguf

    return write_tiny_llama_gguf(
        tmp_path_factory.mktemp("r1-open") / "tiny-r1-open.gguf", chat_template=OPEN_TEMPLATE, n_ctx_train=1024
    )


def test_budget_closes_the_reasoning_and_the_answer_follows(serve, open_think_gguf):
    server = serve(open_think_gguf, "r1", runtime="", plan={"n_threads": 1, "n_ctx": 1024}, n_slots=1, slot_ctx=1024)
    with anthropic_client(server, timeout=300) as claude:
        free = claude.messages.create(model="r1", max_tokens=24, messages=USER, **GREEDY)
        assert [b.type for b in free.content] == [
            "thinking"
        ] and free.stop_reason == "max_tokens"  # never closes by itself
        budget = claude.messages.create(
            model="r1", max_tokens=24, messages=USER, thinking={"type": "enabled", "budget_tokens": 6}, **GREEDY
        )
        kinds = [b.type for b in budget.content]
        assert kinds == ["thinking", "text"], budget.content
        # greedy: the budgeted reasoning is the start of the free one, cut at the budget
        assert free.content[0].thinking.startswith(budget.content[0].thinking.rstrip())
        assert len(budget.content[0].thinking) < len(free.content[0].thinking)
        assert budget.usage.output_tokens <= 24 + 2
        off = claude.messages.create(model="r1", max_tokens=8, messages=USER, thinking={"type": "disabled"}, **GREEDY)
        assert [b.type for b in off.content] == ["text"] and off.content[0].text
        # the continuation reused the prompt and the reasoning from the prefix cache
        assert budget.usage.cache_read_input_tokens > 0
