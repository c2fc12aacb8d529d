"""OpenAI's ``n`` inside the llama.cpp session: one prefill (the other choices copy the first
one's prompt from its slot), greedy choices equal to the lone answer, each choice its own
final chunk with the usage on the last, and a cancel that ends them all."""

from __future__ import annotations

import pytest

from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

LONG = "hello world the quick fox " * 12


@pytest.fixture(scope="module")
def session(tiny_fim):
    from localrun.runtimes.llamacpp.session import LlamaCppSession
    from localrun.types import Format, ModelRecord, Plan

    record = ModelRecord(name="tiny", format=Format.GGUF, path=str(tiny_fim))
    s = LlamaCppSession.open(
        record, Plan(runtime="llama.cpp", n_ctx=1024, n_threads=1, options={"n_slots": 4, "slot_ctx": 256})
    )
    yield s
    s.close()


def run(session, prompt: str, **sampling):
    from localrun.types import Cancel, CompletionRequest, Sampling

    return list(session.complete(CompletionRequest(prompt=prompt, sampling=Sampling(**sampling)), Cancel()))


def test_n_prefills_once_and_greedy_choices_equal_the_lone_answer(session):
    alone = "".join(c.text for c in run(session, "once " + LONG, temperature=0, max_tokens=6))
    before = session._sched.cache.stats().copied
    chunks = run(session, "twice " + LONG, temperature=0, max_tokens=6, n=3)
    assert session._sched.cache.stats().copied - before == 2  # choices 1 and 2 copied choice 0's prompt
    texts = {i: "".join(c.text for c in chunks if c.index == i) for i in range(3)}
    finals = [c for c in chunks if c.finish_reason]
    assert sorted(c.index for c in finals) == [0, 1, 2] and all(c.finish_reason == "length" for c in finals)
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    usage = chunks[-1].usage
    assert usage.completion_tokens == 18 and usage.prompt_tokens == len(
        session.tokenize("twice " + LONG, add_special=True)
    )
    same = "".join(c.text for c in run(session, "once " + LONG, temperature=0, max_tokens=6, n=3) if c.index == 2)
    assert same == alone and len(set(texts.values())) == 1


def test_seeded_choices_differ_and_repeat(session):
    def answers():
        chunks = run(session, "x", temperature=1.0, seed=42, max_tokens=8, n=3)
        return tuple("".join(c.text for c in chunks if c.index == i) for i in range(3))

    first = answers()
    assert len(set(first)) > 1 and answers() == first


def test_a_cancel_ends_every_choice(session):
    from localrun.types import Cancel, CompletionRequest, Sampling

    cancel = Cancel()
    stream = session.complete(
        CompletionRequest(prompt=LONG, sampling=Sampling(n=3, max_tokens=200, temperature=1.0)), cancel
    )
    seen = []
    for chunk in stream:
        seen.append(chunk)
        if len(seen) == 3:
            cancel.set()
        if chunk.finish_reason:
            break
    assert seen[-1].finish_reason == "cancelled" and len(seen) < 100
    assert (
        run(session, "after", max_tokens=2, temperature=0)[-1].usage.completion_tokens == 2
    )  # the slots are free again
    assert session._sched.running() == 0
