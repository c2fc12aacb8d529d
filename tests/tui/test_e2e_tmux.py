"""End to end in a real terminal: `localrun tui` in tmux, driven by keys, read back with
capture-pane. Load → chat → an `openai` client answered by the embedded server meanwhile →
the request in the server log → unload → pull from the fake hub → quit (the port is free).
The fake runtime keeps it fast; everything else is the real thing."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.hub import repos
from tests.hub.conftest import fake_hub  # noqa: F401 - the fixture
from tests.support.servers import free_port

TMUX = shutil.which("tmux")
pytestmark = [
    pytest.mark.skipif(TMUX is None, reason="tmux is not installed"),
    pytest.mark.timeout(180),
    pytest.mark.slow,
]
LOCALRUN = str(Path(sys.executable).with_name("localrun"))


class Tmux:
    """One detached tmux session on a private server socket."""

    def __init__(self, command: str, *, width: int = 120, height: int = 36) -> None:
        self.socket = f"lr-{uuid.uuid4().hex[:8]}"
        self.name = "tui"
        self._run("new-session", "-d", "-x", str(width), "-y", str(height), "-s", self.name, command)

    def _run(self, *args: str) -> str:
        return subprocess.run([TMUX, "-L", self.socket, *args], check=True, capture_output=True, text=True).stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        self._run("send-keys", "-t", self.name, *(["-l"] if literal else []), *keys)

    def type(self, text: str) -> None:
        self.keys(text, literal=True)

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-t", self.name)

    def alive(self) -> bool:
        return (
            subprocess.run([TMUX, "-L", self.socket, "has-session", "-t", self.name], capture_output=True).returncode
            == 0
        )

    def wait(self, *texts: str, absent: tuple[str, ...] = (), timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen() if self.alive() else ""
            if all(t in screen for t in texts) and not any(t in screen for t in absent):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"screen never showed {texts}:\n{screen}")
            time.sleep(0.2)

    def kill(self) -> None:
        subprocess.run([TMUX, "-L", self.socket, "kill-server"], capture_output=True)


def _openai_chat(port: int, prompt: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}])
    return reply.choices[0].message.content


def test_tui_in_tmux_load_chat_serve_unload_pull(tmp_path, tiny_gguf, fake_hub, _isolated_home):  # noqa: F811
    from localrun.modelstore.store import ModelStore
    from localrun.settings import load_settings

    ModelStore(load_settings()).import_path(tiny_gguf, name="tiny")
    port = free_port()
    env = {
        "LOCALRUN_HOME": str(_isolated_home),
        "LOCALRUN_RUNTIME__FORCE": "fake",
        "LOCALRUN_SERVER__PORT": str(port),
        "HF_HOME": os.environ["HF_HOME"],
        "HF_ENDPOINT": fake_hub.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "OLLAMA_HOST": "http://127.0.0.1:9",
        "TERM": "xterm-256color",
        "COLORTERM": "truecolor",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(tmp_path)),
    }
    command = (
        "env -i "
        + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        + f" {shlex.quote(LOCALRUN)} tui --no-default-model"
    )
    tmux = Tmux(command)
    try:
        # the verdict column fills in once the planner answers, after the first paint
        tmux.wait("Library", "tiny", f"http://127.0.0.1:{port}", "key: off", "● fits")

        tmux.keys("l")
        tmux.wait("1 loaded", "Loaded tiny")

        tmux.keys("5")
        tmux.wait("ask something")
        tmux.type("hello from tmux")
        tmux.keys("Enter")
        screen = tmux.wait("You said: hello from tmux", "tok/s", absent=("esc stop",))  # the answer is complete

        # a local app, meanwhile, through the embedded server and the same loaded model
        assert _openai_chat(port, "hello from openai").startswith("You said: hello from openai")

        tmux.keys("Escape")
        time.sleep(0.4)  # a lone Esc, not the start of an Alt+4 sequence
        tmux.keys("4")
        screen = tmux.wait("Listening", "/v1/chat/completions", "TUI chat")
        assert "200" in screen and " tiny " in screen

        tmux.keys("1")
        tmux.wait("l Load")
        tmux.keys("u")
        tmux.wait("0 loaded", "Unloaded tiny")

        tmux.keys("2")
        tmux.wait("Search", f"hub: {fake_hub.url}")
        tmux.keys("/")
        tmux.type("Tiny-GGUF")
        tmux.keys("Enter")
        tmux.wait(repos.GGUF_REPO, "Q4_K_M", "Q8_0", "● fits")
        tmux.keys("f")
        tmux.keys("p")
        tmux.wait("Pull finished", "done")
        tmux.keys("1")
        tmux.wait("testorg/tiny-gguf:q4_k_m")

        tmux.keys("q")
        deadline = time.monotonic() + 20
        while tmux.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not tmux.alive(), "the TUI did not exit on q"
        with socket.socket() as s:  # the embedded server let go of the port
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    finally:
        tmux.kill()
