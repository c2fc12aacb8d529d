"""A raw prompt whose tail changes, through a restart, on a sliding-window model (Gemma 3 270M).

A saved state of such a model restores only whole, so a slot leaves states at chosen points (its
tail, where a chat's last user message begins, 2,048-token marks). A raw ``/v1/completions``
prompt has no messages: a document with a question after it used to come back only to the
2,048-token mark below the document's end. Now it also leaves a state where its last part
begins (paragraph, line, sentence) and where it parted from the cached prompt it shared most
with (two requests with one document seen before the restart).
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import needs_llama
from tests.support import servers

pytestmark = [needs_llama, pytest.mark.llama, pytest.mark.gemma, pytest.mark.slow]

OPTIONS = {"n_slots": 1, "slot_ctx": 4096, "kv_ram_bytes": 0}
WORDS = "the keeper climbs the stairs of the lighthouse every evening to light the lamp for the ships ".split()


def _document(n_words: int, start: int) -> str:
    return " ".join(WORDS[(i + start) % len(WORDS)] + ("," if i % 17 == 16 else "") for i in range(n_words))


def _complete(server, prompt: str) -> tuple[int, int]:
    body = {"model": "gemma", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def _tokens(server, text: str) -> int:
    r = httpx.post(f"{server.url}/tokenize", json={"content": text, "add_special": True}, timeout=60)
    return len(r.json()["tokens"])


def test_a_raw_prompt_with_another_tail_restores_all_it_shares_after_a_restart(tmp_path, gemma_gguf):
    servers.import_model(tmp_path, gemma_gguf, "gemma")
    # a question on its own line after a document (no sentence ends inside it: commas only)
    doc = _document(2300, 0)
    asked = doc + "\n\nQuestion: who climbs the stairs?\nAnswer:"
    # another document whose two requests part where a word follows it (no break to find)
    other = _document(2300, 5)

    def start():
        return servers.start(
            servers.gemma(servers.free_port(), home=tmp_path, plan={"n_threads": 2}, **OPTIONS), tmp_path / "server.log"
        )

    first = start()
    try:
        n_doc, n_other = _tokens(first, doc), _tokens(first, other)
        _complete(first, asked)
        _complete(first, other + " lamp keeper")
        _complete(first, other + " ships tonight")  # parts from the last one at the document's end
    finally:
        first.stop()
    assert n_doc > 2200 and n_other > 2200  # past the 2,048-token mark, far past the 512-token window
    second = start()
    try:
        n1, cached1 = _complete(second, doc + "\n\nQuestion: what does the lamp light?\nAnswer:")
        n2, cached2 = _complete(second, other + " stairs every evening")
    finally:
        second.stop()
    # the paragraph's start, less a few tokens of margin (turns.MARGIN) and the repeat's tail
    assert cached1 >= n_doc - 8, f"{cached1} of {n1} restored; the document is {n_doc}"
    assert cached2 >= n_other - 8, f"{cached2} of {n2} restored; the document is {n_other}"
