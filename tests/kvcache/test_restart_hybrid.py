"""A raw prompt whose tail changes, through a restart, on a hybrid model (the tiny LFM2 fixture of
tests/support/hybrid.py: short convolutions beside attention).

A recurrent state cannot be cut back, so the only states a slot can leave are those taken as its
prompt was evaluated (checkpoints.py): the prompt's tail, its last part, the 2,048-token marks.
Two requests that share a document and part where a word follows it (no break to find) used to
come back after a restart only to a mark below the document's end (none here: 0 tokens). Now the
second one's prefill stops where it parted from the first (the next request is likely to part
there too), a checkpoint is taken there, and the slot leaves a state at that point on disk: the
request after the restart restores all the document, and answers as a cold run did.

The runtime is loaded in this process (a restart: it persists at close and starts warm at load),
not behind a server: two server starts would cost more than the test (tests/kvcache/
test_restart_raw.py is the HTTP one, on Gemma).
"""

from __future__ import annotations

import pytest

from tests.batching.conftest import load, request, run
from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

WORDS = "hello world the time is hot and all of you can use it for what they said".split()


def test_a_hybrid_raw_prompt_with_another_tail_restores_where_it_parted_after_a_restart(tmp_path):
    from tests.support import hybrid

    doc = " ".join(WORDS[i % len(WORDS)] for i in range(1000))  # no paragraph, line or sentence break
    tails = [" " + " ".join(WORDS[i:] + WORDS[:i]) for i in (3, 7, 11)]  # each parts at the document's end

    def start():
        return load(hybrid.lfm2_path(), n_slots=1, slot_ctx=2048, kv_ram_bytes=0, kv_dir=str(tmp_path / "kv"))

    first = start()
    try:
        n_doc = len(first.tokenize(doc, add_special=True))
        cold = run(first, request(doc + tails[0], max_tokens=8))  # nothing cached yet: a cold run
        run(first, request(doc + tails[1], max_tokens=8))  # the slot is reused in place: the cold one's state goes
        run(first, request(doc + tails[2], max_tokens=8))
    finally:
        first.close()  # persists what the slot leaves
    assert cold.usage.cached_tokens == 0 and n_doc > 900
    second = start()
    try:
        again = run(second, request(doc + tails[0], max_tokens=8))
    finally:
        second.close()
    # before: 0 (the states left were the tail's, inside the changed tail, and no 2,048-token mark)
    got = again.usage.cached_tokens
    assert got == n_doc, f"{got} of {again.usage.prompt_tokens} restored; the document is {n_doc}"
    assert again.text == cold.text  # greedy: the restored state is what a cold prefill leaves
