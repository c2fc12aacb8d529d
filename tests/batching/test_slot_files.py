"""The slot API on a real llama.cpp session (the tiny random GGUF): a slot file is what
``llama_state_seq_save_file`` writes, byte for byte, and llama.cpp's own loader reads it; an
action on a busy slot waits for it, and gives up with a 503 after WAIT_IDLE_S."""

from __future__ import annotations

import ctypes
import threading

import pytest

from localrun.errors import Overloaded
from localrun.runtimes.llamacpp import slot_api
from tests.batching.conftest import load, request, run
from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

PROMPT = "hello the time is now and the world is big " * 3


@pytest.fixture
def session(tiny_gguf):
    s = load(tiny_gguf, n_slots=2, slot_ctx=256)
    yield s
    s.close()


def test_a_slot_file_is_llama_cpps_own_format(session, tmp_path):
    import llama_cpp

    run(session, request(PROMPT, id_slot=1, max_tokens=4))
    out = session.serve_slot_action(1, "save", str(tmp_path), "ours.bin")
    tokens = session._sched.cache.slots[1].tokens
    arr = (llama_cpp.llama_token * len(tokens))(*tokens)
    native = session._sched.call(
        lambda: llama_cpp.llama_state_seq_save_file(
            session._ctx, str(tmp_path / "native.bin").encode(), 1, arr, len(tokens)
        )
    )
    assert native == out["n_written"]
    assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "native.bin").read_bytes()
    n = ctypes.c_size_t(0)
    buf = (llama_cpp.llama_token * 512)()
    read = session._sched.call(
        lambda: llama_cpp.llama_state_seq_load_file(
            session._ctx, str(tmp_path / "ours.bin").encode(), 0, buf, 512, ctypes.byref(n)
        )
    )
    assert read == out["n_written"] and list(buf[: n.value]) == list(tokens)


def test_llama_servers_packed_token_list_restores(session, tmp_path):
    run(session, request(PROMPT, id_slot=1, max_tokens=4))
    session.serve_slot_action(1, "save", str(tmp_path), "plain.bin")
    tokens, state = slot_api.unpack((tmp_path / "plain.bin").read_bytes(), "plain.bin")
    packed = [slot_api.TOKEN_NULL, 1, len(tokens), *tokens, 0]  # llama-server's server_tokens::serialize, no media
    (tmp_path / "packed.bin").write_bytes(slot_api.pack(packed, state))
    out = session.serve_slot_action(0, "restore", str(tmp_path), "packed.bin")
    assert out["n_restored"] == len(tokens) and session._sched.cache.slots[0].tokens == tokens
    with_media = [slot_api.TOKEN_NULL, 1, len(tokens), *tokens, 1, 0, 5]
    (tmp_path / "media.bin").write_bytes(slot_api.pack(with_media, state))
    with pytest.raises(slot_api.SlotError, match="image or audio"):
        session.serve_slot_action(0, "restore", str(tmp_path), "media.bin")


def _hold(session, seq: int, busy: bool) -> None:
    def flip():
        session._sched.cache.slots[seq].busy = busy

    session._sched.call(flip)


def test_an_action_on_a_busy_slot_waits_until_it_is_idle(session, tmp_path):
    run(session, request(PROMPT, id_slot=0, max_tokens=4))
    held = len(session._sched.cache.slots[0].tokens)
    _hold(session, 0, True)  # a request holds slot 0 (as the scheduler marks it)
    done = threading.Event()
    result = {}

    def save():
        result.update(session.serve_slot_action(0, "save", str(tmp_path), "busy.bin"))
        done.set()

    threading.Thread(target=save, daemon=True).start()
    assert not done.wait(0.5)  # still waiting for the slot
    assert not (tmp_path / "busy.bin").exists()
    _hold(session, 0, False)
    assert done.wait(30) and result["n_saved"] == held


def test_a_slot_that_stays_busy_is_a_503(session, tmp_path, monkeypatch):
    monkeypatch.setattr(slot_api, "WAIT_IDLE_S", 0.2)
    _hold(session, 1, True)
    with pytest.raises(Overloaded, match="slot 1 .* stayed busy"):
        session.serve_slot_action(1, "erase")
    _hold(session, 1, False)
    assert session.serve_slot_action(1, "erase")["n_erased"] == 0
