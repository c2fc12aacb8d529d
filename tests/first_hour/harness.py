"""The first hour, scripted: the README's first commands typed into a real terminal (tmux) from a
fresh ``LOCALRUN_HOME``, each timed for its first visible output and for its end.

Not a test module: ``test_first_hour.py`` drives it, and ``python -m tests.first_hour.harness
[LOCALRUN]`` prints the timings table for any localrun (another checkout's, for a before/after).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

TMUX = shutil.which("tmux")
DONE = "__first_hour_exit="


@dataclass(frozen=True)
class Timing:
    """One command: when its first visible output came, when it ended (None: it did not), its screen."""

    command: str
    first_output_s: float | None
    total_s: float | None
    exit_code: int | None
    screen: str


class Terminal:
    """One shell in a detached tmux session on a private server socket, at 120×40."""

    def __init__(self, env: dict[str, str], cwd: Path, *, width: int = 120, height: int = 40) -> None:
        assert TMUX is not None, "tmux is not installed"
        self.socket = f"lr-fh-{uuid.uuid4().hex[:8]}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        shell = f"env {exports} bash --norc --noprofile"
        # A newcomer's folder, not a checkout: a worker started with `python -m` there imports no one's tree.
        self._tmux("new-session", "-d", "-x", str(width), "-y", str(height), "-s", "fh", "-c", str(cwd), shell)
        self._tmux("send-keys", "-t", "fh", "PS1='$ '; clear", "Enter")
        time.sleep(0.3)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            [TMUX or "tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True
        ).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", "fh")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "fh", *keys)

    def clear(self) -> None:
        self.keys("clear", "Enter")
        time.sleep(0.2)
        self._tmux("clear-history", "-t", "fh")

    def _frames(self, command: str) -> Iterator[tuple[float, str, list[str]]]:
        """Type ``command`` (then an exit marker), and yield (seconds since, screen, its lines other
        than the prompt) every 50 ms."""
        self.clear()
        self.keys(f"{command}; echo {DONE}$?", "Enter")
        t0 = time.monotonic()
        while True:
            time.sleep(0.05)
            screen = self.screen()
            body = [ln for ln in screen.splitlines() if ln.strip() and not ln.startswith("$ ")]
            yield time.monotonic() - t0, screen, body

    def _timed_out(self, command: str, first: float | None) -> Timing:
        self.keys("C-c")
        time.sleep(1)
        return Timing(command, first, None, None, self.screen())

    def run(self, command: str, *, timeout: float, interrupt_after: float | None = None) -> Timing:
        """Type ``command``, then watch: the first line other than the prompt is its first output;
        the exit marker its end. ``interrupt_after``: press Ctrl-C that long after the first output
        (for a server), and time its end from there."""
        first = None
        interrupted = False
        for now, screen, body in self._frames(command):
            if first is None and body:
                first = now
            for line in body:
                if line.startswith(DONE):
                    return Timing(command, first, now, int(line[len(DONE) :].strip() or -1), screen)
            if interrupt_after is not None and first is not None and not interrupted and now > first + interrupt_after:
                self.keys("C-c")
                interrupted = True
            if now > timeout:
                return self._timed_out(command, first)
        raise AssertionError("unreachable")

    def serve(self, command: str, ready: str, client: Callable[[], str], *, timeout: float) -> Timing:
        """Start a server with ``command``; once ``ready`` shows, run ``client`` (it returns the text
        the server's log must show for it), then Ctrl-C: the server must end by itself."""
        first = None
        expect = None
        stopped = False
        for now, screen, body in self._frames(command):
            if first is None and body:
                first = now
            done = [ln for ln in body if ln.startswith(DONE)]
            if done:
                code = int(done[0][len(DONE) :].strip() or -1)
                return Timing(command, first, now, code if expect is not None else -1, screen)
            if expect is None and ready in screen:
                expect = client()
            if expect is not None and not stopped and expect in screen:
                self.keys("C-c")
                stopped = True
            if now > timeout:
                return self._timed_out(command, first)
        raise AssertionError("unreachable")

    def kill(self) -> None:
        subprocess.run([TMUX or "tmux", "-L", self.socket, "kill-server"], capture_output=True)


def fresh_env(home: Path, localrun: str) -> dict[str, str]:
    """A newcomer's environment: a fresh home, nothing configured, llama.cpp on 2 threads."""
    bin_dir = str(Path(localrun).parent)
    keep = {k: os.environ[k] for k in ("HOME", "LANG", "LC_ALL", "XDG_CACHE_HOME", "TERM") if k in os.environ}
    return {
        **keep,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "LOCALRUN_HOME": str(home),
        "HF_HOME": str(home / "hf"),
        "OLLAMA_MODELS": str(home / "ollama-models"),
        "HF_HUB_OFFLINE": "1",
        "LOCALRUN_RUNTIME__THREADS": "2",
        "TERM": "xterm-256color",
    }


FAST = [
    "localrun ls",
    'localrun run smollm2-135m-instruct "Why is the sky blue?"',  # as the README has it
    "localrun ls",
    "localrun plan smollm2-135m-instruct",
    "localrun hw",
]
SLOW = ['localrun run gemma3-270m "The capital of France is"']


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ask(port: int) -> str:
    """One chat request to the server, as the README's Python example sends it; the log text it must leave."""
    import httpx

    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    status = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120).status_code
    return f'"POST /v1/chat/completions" {status}'


def first_hour(localrun: str, commands: list[str], *, timeout: float = 120.0, serve: bool = True) -> list[Timing]:
    """Each command in a fresh home's terminal, then (``serve``) ``localrun serve`` answering one
    request, its log line awaited, stopped with Ctrl-C, then ``localrun ps``."""
    with tempfile.TemporaryDirectory(prefix="lr-first-hour-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        term = Terminal(fresh_env(home, localrun), cwd=Path(tmp))
        try:
            timings = [term.run(c, timeout=timeout) for c in commands]
            if serve:
                port = _free_port()
                ready = f"127.0.0.1:{port}"
                timings.append(term.serve(f"localrun serve --port {port}", ready, lambda: _ask(port), timeout=timeout))
            return timings
        finally:
            term.kill()


def table(timings: list[Timing]) -> str:
    def s(v: float | None) -> str:
        return "never" if v is None else f"{v:.2f} s"

    rows = ["| command | first output | total | exit |", "|---|---|---|---|"]
    rows += [f"| `{t.command}` | {s(t.first_output_s)} | {s(t.total_s)} | {t.exit_code} |" for t in timings]
    return "\n".join(rows)


if __name__ == "__main__":
    exe = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else str(Path(sys.executable).with_name("localrun"))
    which = sys.argv[2] if len(sys.argv) > 2 else "fast"
    cmds = FAST + (SLOW if which == "all" else [])
    results = first_hour(exe, cmds, timeout=float(os.environ.get("FIRST_HOUR_TIMEOUT", "240")))
    print(table(results))
    if os.environ.get("FIRST_HOUR_SCREENS"):
        for t in results:
            print(f"\n--- {t.command}\n{t.screen}")
