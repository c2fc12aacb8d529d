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

        tmux.keys("F4")  # in Chat a typed 4 is text; F1–F5 switch from anywhere
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


def test_typing_into_chat_after_esc_and_after_a_stray_key_arrives(tmp_path, tiny_gguf, _isolated_home):
    """The keys a person types reach the prompt: after a lone Esc (the focus had left the
    prompt), after an Esc that runs into the next key (an Alt sequence to the terminal), and
    after a stray key emptied the max field (once, every send was refused)."""
    from localrun.modelstore.store import ModelStore
    from localrun.settings import load_settings

    ModelStore(load_settings()).import_path(tiny_gguf, name="tiny")
    env = {
        "LOCALRUN_HOME": str(_isolated_home),
        "LOCALRUN_RUNTIME__FORCE": "fake",
        "HF_HOME": os.environ["HF_HOME"],
        "HF_HUB_OFFLINE": "1",
        "OLLAMA_HOST": "http://127.0.0.1:9",
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(tmp_path)),
    }
    command = (
        "env -i "
        + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        + f" {shlex.quote(LOCALRUN)} tui --no-serve --no-default-model"
    )
    tmux = Tmux(command, width=80, height=24)
    try:
        tmux.wait("Library", "tiny")
        tmux.keys("F5")
        tmux.wait("ask something", "F1 Library")
        tmux.type("hel")
        tmux.keys("Escape")
        time.sleep(0.4)  # a lone Esc: the focus goes to the transcript
        tmux.type("lo 2 q")  # before: "lo" was dropped, "2" switched to Discover and "q" quit
        tmux.keys("Enter")
        tmux.wait("You said: hello 2 q", absent=("esc stop",))

        tmux.keys("Escape", "a")  # Esc running into a key: the terminal sends Alt+a
        tmux.type("gain")
        tmux.keys("Enter")
        tmux.wait("You said: again", absent=("esc stop",))

        tmux.keys("BTab", "BTab")  # back from the prompt, past the transcript, to the max field
        tmux.keys("BSpace", "BSpace", "BSpace", "x")  # a stray key or four: empty, then a letter
        tmux.wait("max tokens takes a whole number")
        tmux.keys("Tab")  # leaving the field puts the last good value back, and says so
        tmux.wait("kept 512")
        tmux.type("third")  # from the transcript, the keys go to the prompt
        tmux.keys("Enter")
        screen = tmux.wait("You said: third", absent=("esc stop",))
        assert "max 512" in screen and tmux.alive()
    finally:
        tmux.kill()
