"""llama-server's slot API through a real server on real llama.cpp (the tiny random GGUF), driven
with httpx as llama-server's own tests (tools/server/tests/unit/test_slot_save.py) drive it:
save, erase, restore (the next request reports the prefix cached), list, hostile file names,
bad ids and actions, and files that do not fit. A busy slot: tests/batching/test_slot_files.py
(a real request ends too fast on the tiny model to catch it busy every time)."""

from __future__ import annotations

import os

import httpx
import pytest

from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

PROMPT = "hello the time is now and the world is big " * 3
HOSTILE = [
    "../x.bin",
    "../../etc/passwd",
    "a/b.bin",
    "/abs.bin",
    "/tmp/abs.bin",
    "C:\\x.bin",
    "\\\\host\\share",
    "x\0y",
    "",
    ".",
    "..",
    "a..b",
    "n" * 256,
    "é" * 128,  # 256 bytes
    " lead",
    "trail ",
    "dot.",
    "a:b",
    "a*b",
    "new\nline",
    "slash\u2215lookalike",
]


@pytest.fixture(scope="module")
def slots_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slot-files") / "slots"


@pytest.fixture(scope="module")
def server(serve_module, tiny_gguf, slots_dir):
    return serve_module(
        tiny_gguf,
        plan={"n_threads": 1},
        env={"LOCALRUN_SERVER__SLOT_SAVE_PATH": str(slots_dir)},
        n_slots=2,
        slot_ctx=512,
    )


def post(server, path, body=None, **params):
    return httpx.post(server.url + path, json=body, params=params, timeout=120)


def complete(server, prompt=PROMPT, **extra):
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "cache_prompt": True, **extra}
    r = post(server, "/completion", body)
    assert r.status_code == 200, r.text
    return r.json()


def slots(server):
    r = httpx.get(server.url + "/slots", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_save_erase_restore_and_the_restored_prefix_is_reused(server, slots_dir):
    post(server, "/slots/0", action="erase")
    post(server, "/slots/1", action="erase")
    cold = complete(server, id_slot=1)
    assert cold["timings"]["cache_n"] == 0
    listed = slots(server)
    assert [s["id"] for s in listed] == [0, 1] and not any(s["is_processing"] for s in listed)
    held = listed[1]["n_prompt_tokens"]
    assert held == cold["tokens_evaluated"] + cold["tokens_predicted"] - 1 and listed[0]["n_prompt_tokens"] == 0

    saved = post(server, "/slots/1", {"filename": "one.bin"}, action="save")
    assert saved.status_code == 200, saved.text
    assert saved.json()["id_slot"] == 1 and saved.json()["filename"] == "one.bin"
    assert saved.json()["n_saved"] == held
    assert saved.json()["n_written"] == os.path.getsize(slots_dir / "one.bin") and "save_ms" in saved.json()["timings"]
    assert sorted(os.listdir(slots_dir)) == ["one.bin"]  # no temporary file left behind

    erased = post(server, "/slots/1", action="erase")
    assert erased.status_code == 200 and erased.json() == {"id_slot": 1, "n_erased": held}
    assert slots(server)[1]["n_prompt_tokens"] == 0
    again = complete(server, id_slot=1)  # erased: prefilled cold again
    assert again["timings"]["cache_n"] == 0 and again["content"] == cold["content"]
    post(server, "/slots/1", action="erase")

    restored = post(server, "/slots/0", {"filename": "one.bin"}, action="restore")
    assert restored.status_code == 200, restored.text
    assert restored.json()["n_restored"] == held and restored.json()["n_read"] == saved.json()["n_written"]
    assert slots(server)[0]["n_prompt_tokens"] == held
    warm = complete(server, id_slot=0)
    assert warm["timings"]["cache_n"] == warm["tokens_evaluated"] - 1  # all but the last prompt token
    assert warm["content"] == cold["content"]


def test_id_slot_puts_the_request_in_that_slot(server):
    post(server, "/slots/0", action="erase")
    post(server, "/slots/1", action="erase")
    complete(server, "zebra world " * 5, id_slot=0)
    listed = slots(server)
    assert listed[0]["n_prompt_tokens"] > 0 and listed[1]["n_prompt_tokens"] == 0
    moved = complete(server, "zebra world " * 5, id_slot=1)  # copied from slot 0 into slot 1
    assert moved["timings"]["cache_n"] > 0 and slots(server)[1]["n_prompt_tokens"] > 0
    r = post(server, "/completion", {"prompt": "hi", "n_predict": 1, "id_slot": 5})
    assert r.status_code == 400 and "slot 5 does not exist" in r.text
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1, "id_slot": 1})
    assert r.status_code == 200 and "x-localrun-ignored-fields" not in r.headers


@pytest.mark.parametrize("action", ["save", "restore"])
def test_hostile_file_names_are_refused_and_nothing_is_written_outside(server, slots_dir, action):
    outside = slots_dir.parent / "outside.bin"
    outside.write_bytes(b"keep me")
    planted = slots_dir / "planted"
    slots_dir.mkdir(parents=True, exist_ok=True)
    if not planted.is_symlink():
        planted.symlink_to(outside)
    before = sorted(os.listdir(slots_dir.parent)), sorted(os.listdir(slots_dir))
    for name in [*HOSTILE, "planted"]:
        r = post(server, "/slots/0", {"filename": name}, action=action)
        assert r.status_code == 400, (name, r.text)
        message = r.json()["error"]["message"]
        assert "invalid slot file name" in message or "missing required field" in message, (name, message)
    assert outside.read_bytes() == b"keep me"
    assert (sorted(os.listdir(slots_dir.parent)), sorted(os.listdir(slots_dir))) == before


def test_bad_ids_actions_and_files_are_400s_and_leave_the_slot_empty(server, slots_dir):
    assert post(server, "/slots/7", action="erase").status_code == 400
    assert post(server, "/slots/-1", action="erase").status_code == 400
    assert post(server, "/slots/abc", action="erase").status_code == 400
    r = post(server, "/slots/0", {"filename": "x.bin"}, action="frobnicate")
    assert r.status_code == 400 and "invalid slot action" in r.text
    assert post(server, "/slots/0", {"filename": "x.bin"}).status_code == 400  # no action
    r = post(server, "/slots/0", {"filename": "missing.bin"}, action="restore")
    assert r.status_code == 400 and "no slot file named 'missing.bin'" in r.text

    from localrun.runtimes.llamacpp.slot_api import pack

    slots_dir.mkdir(parents=True, exist_ok=True)
    (slots_dir / "garbage.bin").write_bytes(b"not a slot file at all")
    (slots_dir / "too-long.bin").write_bytes(pack([1] * 600, b""))  # more than the 512-token slot
    (slots_dir / "alien.bin").write_bytes(pack([1, 2, 10**6], b""))  # a token outside the vocabulary
    (slots_dir / "short.bin").write_bytes(pack([1, 2, 3], b"")[:-4])
    (slots_dir / "no-state.bin").write_bytes(pack([1, 2, 3], b"\x00" * 16))
    complete(server, id_slot=0)
    for name, words in [
        ("garbage.bin", "not a llama.cpp slot file"),
        ("too-long.bin", "more than a slot's context"),
        ("alien.bin", "outside"),
        ("short.bin", "cut short"),
        ("no-state.bin", "refused the state"),
    ]:
        r = post(server, "/slots/0", {"filename": name}, action="restore")
        assert r.status_code == 400 and words in r.json()["error"]["message"], (name, r.text)
    assert slots(server)[0]["n_prompt_tokens"] == 0  # the last failure left it empty
    assert complete(server, id_slot=0)["timings"]["cache_n"] == 0  # and usable


def test_a_fifo_a_folder_and_a_sparse_giant_are_refused_without_blocking_or_reading(server, slots_dir):
    """Before, a FIFO blocked the restore for good (held the request and the slot) and a slot file
    was read whole, whatever its size: a sparse 64 GB file would have been read into memory."""
    import time

    slots_dir.mkdir(parents=True, exist_ok=True)
    os.mkfifo(slots_dir / "pipe.bin")
    (slots_dir / "folder.bin").mkdir()
    with open(slots_dir / "giant.bin", "wb") as f:
        f.truncate(64 << 30)  # sparse: 64 GB claimed, nothing on disk
    for name, words in [("pipe.bin", "FIFO"), ("folder.bin", "directory"), ("giant.bin", "more than the")]:
        started = time.monotonic()
        r = httpx.post(server.url + "/slots/0", json={"filename": name}, params={"action": "restore"}, timeout=20)
        assert r.status_code == 400 and words in r.json()["error"]["message"], (name, r.text)
        assert time.monotonic() - started < 10, name
