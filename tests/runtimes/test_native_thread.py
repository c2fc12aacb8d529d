"""Every native compute of a llama.cpp worker runs on its scheduler thread (see
runtimes/llamacpp/calls.py: a second computing thread brings a second OpenMP team that
slows generation), embeddings asked for from request threads included."""

from __future__ import annotations

import threading

import pytest

from localrun.errors import RuntimeUnavailable
from localrun.runtimes import get_runtime
from localrun.types import Cancel, CompletionRequest, Format, ModelRecord, Plan, Sampling
from tests.conftest import needs_llama
from tests.factories import DEFAULT_TINY_TEMPLATE

pytestmark = [needs_llama, pytest.mark.llama]


def _load(path):
    record = ModelRecord(
        name="tiny", format=Format.GGUF, path=str(path), metadata={"tokenizer.chat_template": DEFAULT_TINY_TEMPLATE}
    )
    return get_runtime("llama.cpp").load(
        record, Plan(runtime="llama.cpp", n_ctx=256, n_threads=1, options={"embedding": True, "speculative": "off"})
    )


def _generate(session, n=40) -> str:
    req = CompletionRequest(prompt="hello there", sampling=Sampling(temperature=0.0, max_tokens=n))
    return "".join(c.text for c in session.complete(req, Cancel()))


@pytest.fixture
def session(tiny_gguf):
    s = _load(tiny_gguf)
    yield s
    s.close()


def test_embeddings_from_request_threads_decode_on_the_scheduler_thread(session, monkeypatch):
    alone = _generate(session)
    expected = session.embed(["the quick fox"])[0]
    llama = session._llama
    threads: list[str] = []
    real = llama.llama_decode

    def recording(ctx, batch):
        threads.append(threading.current_thread().name)
        return real(ctx, batch)

    monkeypatch.setattr(llama, "llama_decode", recording)
    vectors: list[list[float]] = []
    errors: list[BaseException] = []

    def embed_many():
        try:
            for _ in range(5):
                vectors.append(session.embed(["the quick fox"])[0])
        except BaseException as exc:  # noqa: BLE001 - the assertion below names it
            errors.append(exc)

    askers = [threading.Thread(target=embed_many, name=f"request-{i}") for i in range(3)]
    for t in askers:
        t.start()
    beside = _generate(session)  # generation runs while the embeddings are asked for
    for t in askers:
        t.join(60)
    assert not errors, errors
    assert len(vectors) == 15 and all(v == expected for v in vectors)
    assert beside == alone  # interleaved embedding passes leave the generation untouched
    assert threads.count("llama-scheduler") >= 15 + 40 and set(threads) == {"llama-scheduler"}, sorted(set(threads))


def test_a_call_returns_its_result_raises_its_error_and_is_refused_once_closed(tiny_gguf):
    s = _load(tiny_gguf)
    sched = s._sched
    assert sched.call(lambda: threading.current_thread().name) == "llama-scheduler"
    with pytest.raises(ZeroDivisionError):
        sched.call(lambda: 1 / 0)
    assert sched.call(lambda: 7) == 7  # an error in one call leaves the scheduler running
    s.close()
    with pytest.raises(RuntimeUnavailable, match="not running"):
        sched.call(lambda: 1)
