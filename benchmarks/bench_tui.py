"""How fast `localrun tui` paints, and how fast it answers a key while a model generates.

    python benchmarks/bench_tui.py [--runs 5] [--keys 20]

Both numbers come from a real pseudo-terminal, as a person would see them:

* first paint — from spawning ``localrun tui`` to the first frame that shows the tab row
  (target ≤ 1 s), and to the library's first row of data;
* keystroke → repaint — while the chat streams an answer (the fake runtime at about 200
  tokens/s, through the same ModelManager), a character is typed into the prompt and
  the time until it is drawn is measured (target ≤ 100 ms).

The TUI runs in a throwaway LOCALRUN_HOME with the tiny test GGUF imported and the fake
runtime forced, so nothing here needs a real model or the network.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port  # noqa: E402

COLS, ROWS = 120, 36
PAINT_TARGET_S = 1.0
KEY_TARGET_S = 0.100
#: Typed during generation. The fake runtime's words are lower case, and the whole prompt
#: typed so far is what is looked for, so an escape sequence cannot pass for it.
MARKERS = "QWERTYUIOPASDFGHLZXCVBNM"


class Terminal:
    """A child process on a pty, its output collected by a reader thread with timestamps."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True
        )
        os.close(slave)
        self._chunks: list[tuple[float, bytes]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.5)
                if not ready:
                    if self.proc.poll() is not None:
                        return
                    continue
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self._chunks.append((time.perf_counter(), data))

    def wait_for(self, text: str, *, after: float = 0.0, timeout: float = 30.0) -> float:
        """The time the output (after ``after``) first contained ``text``."""
        needle = text.encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                chunks = [(t, d) for t, d in self._chunks if t >= after]
            seen = b""
            for t, d in chunks:
                seen = (seen + d)[-(len(needle) + 65536) :]
                if needle in seen:
                    return t
            time.sleep(0.002)
        raise TimeoutError(f"{text!r} never appeared on the terminal")

    def send(self, data: str) -> float:
        t = time.perf_counter()
        os.write(self.master, data.encode())
        return t

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send("\x11")  # ctrl+q
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        os.close(self.master)


def prepare_home() -> tuple[str, dict[str, str]]:
    """A throwaway LOCALRUN_HOME with the tiny GGUF imported; the env a child needs."""
    home = tempfile.mkdtemp(prefix="lr-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCALRUN_", "HF_"))}
    env.update(
        LOCALRUN_HOME=home,
        LOCALRUN_RUNTIME__FORCE="fake",
        HF_HOME=f"{home}/hf",
        HF_HUB_OFFLINE="1",
        TERM="xterm-256color",
        COLORTERM="truecolor",
        PYTHONPATH=str(ROOT),
        OLLAMA_HOST="http://127.0.0.1:9",
    )
    code = (
        "from pathlib import Path; from tests.factories import write_tiny_llama_gguf as w;"
        "from localrun.settings import load_settings; from localrun.modelstore.store import ModelStore;"
        f"ModelStore(load_settings()).import_path(w(Path({home!r}) / 'tiny.gguf'), name='tiny')"
    )
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True)
    return home, env


def bench_first_paint(env: dict[str, str], runs: int) -> tuple[list[float], list[float]]:
    frames, rows = [], []
    for _ in range(runs):
        run_env = dict(env, LOCALRUN_SERVER__PORT=str(free_port()))
        term = Terminal([sys.executable, "-m", "localrun", "tui", "--no-default-model"], run_env)
        try:
            frames.append(term.wait_for("Library") - term.started)
            rows.append(term.wait_for("fits") - term.started)
        finally:
            term.close()
    return frames, rows


def child_main(port: int) -> None:
    """The TUI with a fake runtime slowed to ~200 tokens/s and a long answer (run on the pty)."""
    import dataclasses

    from localrun.manager import ModelManager
    from localrun.planning.facts import default_plan
    from localrun.settings import load_settings
    from localrun.tui import make_app

    settings = load_settings(server={"port": port})

    def slow(record):
        plan = default_plan(record, settings)
        return dataclasses.replace(plan, options={**plan.options, "fake_delay_s": 0.005, "fake_reply_words": 20000})

    from localrun.modelstore.store import ModelStore

    store = ModelStore(settings)
    manager = ModelManager(settings, store, planner=slow)
    app = make_app(settings, store=store, manager=manager)
    try:
        app.run()
    finally:
        manager.shutdown()


def bench_keys(env: dict[str, str], keys: int) -> list[float]:
    run_env = dict(env, LOCALRUN_SERVER__PORT=str(free_port()))
    port = run_env["LOCALRUN_SERVER__PORT"]
    term = Terminal([sys.executable, str(Path(__file__).resolve()), "--child", port], run_env)
    try:
        term.wait_for("fits")
        t = term.send("5")
        term.wait_for("ask something", after=t)
        t = term.send("go\r")
        term.wait_for("tok/s", after=t)  # the answer is streaming
        time.sleep(0.5)
        latencies, typed = [], ""
        for i in range(keys):
            marker = MARKERS[i % len(MARKERS)]
            typed += marker
            t = term.send(marker)
            latencies.append(term.wait_for(typed, after=t, timeout=10) - t)
            time.sleep(0.05)
        t = term.send("\x1b")  # stop the answer
        return latencies
    finally:
        term.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="first-paint runs")
    parser.add_argument("--keys", type=int, default=20, help="keystrokes measured during generation (≤ 24)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
        return
    _home, env = prepare_home()
    frames, rows = bench_first_paint(env, args.runs)
    med = statistics.median(frames)
    print(
        f"first paint (tab row)     median {med * 1000:6.0f} ms  min {min(frames) * 1000:6.0f}  max "
        f"{max(frames) * 1000:6.0f}"
        f"  target ≤ {PAINT_TARGET_S * 1000:.0f} ms  {'OK' if med <= PAINT_TARGET_S else 'SLOW'}"
    )
    print(f"first row of data         median {statistics.median(rows) * 1000:6.0f} ms  (library with plans)")
    lat = bench_keys(env, args.keys)
    p50, p95 = statistics.median(lat), sorted(lat)[max(0, int(len(lat) * 0.95) - 1)]
    print(
        f"keystroke → repaint       median {p50 * 1000:6.1f} ms  p95 {p95 * 1000:6.1f}  max {max(lat) * 1000:6.1f}"
        f"  (while streaming ~200 tok/s)  target ≤ {KEY_TARGET_S * 1000:.0f} ms  "
        f"{'OK' if p95 <= KEY_TARGET_S else 'SLOW'}"
    )


if __name__ == "__main__":
    main()
