"""A raw prompt whose tail changes, through a restart, on a hybrid model (the tiny LFM2 fixture of
tests/support/hybrid.py: short convolutions beside attention).

A recurrent state cannot be cut back, so the only states a slot can leave are those taken as its
prompt was evaluated (checkpoints.py): the prompt's tail, its last part, the 2,048-token marks.
Two requests that share a document and part where a word follows it (no break to find) used to
come back after a restart only to the mark below the document's end. Now the second one's prefill
stops where it parted from the first (the next request is likely to part there too), a
checkpoint is taken there, and the slot leaves a state at that point on disk: the request after the
restart restores all the document, and answers as a cold run does.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import needs_llama
from tests.support import servers

pytestmark = [needs_llama, pytest.mark.llama]

OPTIONS = {"n_slots": 1, "slot_ctx": 4096, "kv_ram_bytes": 0}
PLAN = {"n_threads": 2}
WORDS = "hello world the time is hot and all of you can use it for what they said".split()


def _document(n_words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


def _complete(server, prompt: str) -> tuple[str, int, int]:
    body = {"model": "lfm2", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return r.json()["choices"][0]["text"], usage["prompt_tokens"], cached


def _tokens(server, text: str) -> int:
    r = httpx.post(f"{server.url}/tokenize", json={"content": text, "add_special": True}, timeout=60)
    return len(r.json()["tokens"])


def test_a_hybrid_raw_prompt_with_another_tail_restores_where_it_parted_after_a_restart(tmp_path):
    from tests.support import hybrid

    servers.import_model(tmp_path, hybrid.lfm2_path(), "lfm2")
    doc = _document(1000)  # one token a word, no break to find (no paragraph, line or sentence)
    tails = [" " + " ".join(WORDS[i:] + WORDS[:i]) for i in (3, 7, 11)]  # each parts at the document's end

    def start(log):
        spec = servers.llama_tiny(servers.free_port(), home=tmp_path, plan=PLAN, **OPTIONS)
        return servers.start(spec, tmp_path / log)

    first = start("first.log")
    try:
        n_doc = _tokens(first, doc)
        cold, _, cold_cached = _complete(first, doc + tails[0])  # nothing cached yet: a cold run
        _complete(first, doc + tails[1])  # the slot is reused in place: the cold one's state is gone
        _complete(first, doc + tails[2])
    finally:
        first.stop()
    assert cold_cached == 0 and n_doc > 900
    second = start("second.log")
    try:
        text, n, cached = _complete(second, doc + tails[0])
    finally:
        second.stop()
    # before: 0 (the states left were the tail's, inside the changed tail, and no 2,048-token mark)
    assert cached == n_doc, f"{cached} of {n} restored; the document is {n_doc}"
    assert text == cold, (text, cold)  # greedy: the restored state is what a cold prefill leaves
