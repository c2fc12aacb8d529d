"""A sliding-window model through a restart: Gemma 3 270M (real weights, a 512-token window and
no full-size SWA cache) answers a 4k-token prompt, the server stops (SIGTERM) and a new one on
the same cache folder answers the same prompt from disk with the cold tokens, and a prompt that
shares only its first part (a new session, the same system prompt) from a checkpoint's state.

The state a slot leaves with is its prompt and its answer; such a state restores only whole, so
without the states at its checkpoints (leaving.leaving_states) a repeat found nothing.
"""

from __future__ import annotations

import httpx
import pytest

from localrun.runtimes.llamacpp.cache.slots import MIN_CHUNK
from tests.conftest import needs_llama
from tests.support import servers

pytestmark = [needs_llama, pytest.mark.llama, pytest.mark.gemma, pytest.mark.slow]

OPTIONS = {"n_slots": 1, "slot_ctx": 6144, "exact_prefix": True, "kv_ram_bytes": 0}
WORDS = "the keeper climbs the stairs of the lighthouse every evening to light the lamp for the ships ".split()


def _prompt(n_words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] + ("." if i % 17 == 16 else "") for i in range(n_words))


def _complete(server, prompt: str) -> tuple[str, int, int]:
    body = {"model": "gemma", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return r.json()["choices"][0]["text"], usage["prompt_tokens"], cached


def test_a_sliding_window_prefix_survives_a_restart(tmp_path, gemma_gguf):
    servers.import_model(tmp_path, gemma_gguf, "gemma")
    prompt = _prompt(3300)
    other = prompt[: len(prompt) * 3 // 4] + " and then a storm came"  # parts after ~3k tokens

    def start():
        return servers.start(
            servers.gemma(servers.free_port(), home=tmp_path, plan={"n_threads": 2}, **OPTIONS), tmp_path / "server.log"
        )

    first = start()
    try:
        cold, n_prompt, cached = _complete(first, prompt)
    finally:
        first.stop()
    assert n_prompt > 3400 and cached == 0  # far past the 512-token window
    second = start()
    try:
        again, _, cached = _complete(second, prompt)
        _, n_other, other_cached = _complete(second, other)
    finally:
        second.stop()
    assert again == cold
    # The state left just below the prompt's end: the tokens a repeat evaluates again, one by
    # default, a shortest chunk (MIN_CHUNK) with exact_prefix, whose chunks all round alike.
    assert cached == n_prompt - MIN_CHUNK, f"{cached} of {n_prompt} prompt tokens came from disk"
    assert other_cached >= 2048, f"{other_cached} of {n_other}: the checkpoint at 2048 tokens was not there"
