"""A silent network: endpoints that accept TCP and never answer, or answer and then stop.

Each case must end within its deadline in an error that names the endpoint and says what
to check, never hang (before the deadlines, ``localrun pull`` against a silent listener
printed nothing for minutes: huggingface_hub's client has no timeout and its paginated
calls retry a timeout five times). The CLI cases run the real ``localrun`` as a subprocess.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from localrun.errors import DownloadFailed
from localrun.modelstore.pull import pull
from localrun.modelstore.store import ModelStore
from tests.hub import repos
from tests.support.launch import launch_env

MID = "testorg/Mid-GGUF"
MID_FILE = "Mid-Q4_K_M.gguf"
#: What a test waits for a child at most: far above the deadlines set here (1–2 s plus a
#: Python start), far below "hangs" (the old behaviour never ended).
CHILD_LIMIT_S = 60


class SilentListener:
    """A real TCP listener on 127.0.0.1 that accepts every connection and never says a word.

    ``answer`` (bytes) is sent once per connection after the request arrives — e.g. response
    headers that promise a body which then never comes.
    """

    def __init__(self, answer: bytes = b"") -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.conns: list[socket.socket] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.answer:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(self.answer)
                except OSError:
                    pass  # the client gave up first: that is what is tested

    def close(self) -> None:
        self.stopping = True
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def silent():
    listener = SilentListener()
    yield listener
    listener.close()


def _cli(home: Path, endpoint: str, *args: str, **env_extra: str) -> tuple[subprocess.CompletedProcess, float]:
    env = launch_env(
        home,
        clean=True,
        HF_ENDPOINT=endpoint,
        LOCALRUN_HUB__CONNECT_TIMEOUT_S="2",
        LOCALRUN_HUB__FIRST_BYTE_TIMEOUT_S="1.5",
        LOCALRUN_HUB__STALL_TIMEOUT_S="1.5",
        **env_extra,
    )
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "localrun", *args],
        capture_output=True,
        text=True,
        timeout=CHILD_LIMIT_S,
        env=env,
    )
    return proc, time.monotonic() - began


def _assert_names_the_endpoint(text: str, endpoint: str, what: str) -> None:
    flat = " ".join(text.split())
    assert endpoint in flat, flat
    assert what in flat, flat
    assert "HF_ENDPOINT" in flat and "--offline" in flat, flat
    assert "hub." in flat and "_timeout_s in config.toml" in flat, flat  # which setting moves the deadline


def test_pull_from_a_silent_endpoint_fails_within_the_deadline(silent, tmp_path):
    proc, took = _cli(tmp_path / "home", silent.url, "pull", "org/Some-GGUF", "--yes")
    assert proc.returncode != 0
    _assert_names_the_endpoint(proc.stderr, silent.url, "sent no answer within 1.5 s")
    assert took < CHILD_LIMIT_S  # subprocess.run raised TimeoutExpired before the deadline existed


def test_search_on_a_silent_endpoint_fails_within_the_deadline(silent, tmp_path):
    proc, _ = _cli(tmp_path / "home", silent.url, "search", "qwen")
    assert proc.returncode != 0
    _assert_names_the_endpoint(proc.stderr, silent.url, "sent no answer within 1.5 s")


def test_a_download_whose_headers_come_but_no_body_fails_at_once(fake_hub, store, monkeypatch):
    """The listing works; the file's server sends 200 and a Content-Length, then nothing."""
    from localrun.settings import load_settings

    headers_only = SilentListener(b"HTTP/1.1 200 OK\r\nContent-Length: 6291456\r\nETag: x\r\n\r\n")
    try:
        fake_hub.add_repo(MID, {MID_FILE: repos.make_gguf(payload=1024, seed=8)})
        fake_hub.faults.redirect_to = headers_only.url
        monkeypatch.setenv("LOCALRUN_HUB__STALL_TIMEOUT_S", "1")
        with pytest.raises(DownloadFailed) as err:
            pull(ModelStore(load_settings()), MID)
        _assert_names_the_endpoint(str(err.value), headers_only.url, "stopped sending mid-way within 1 s")
        assert len(headers_only.conns) == 1  # silence with nothing gained is not asked again
    finally:
        headers_only.close()


def test_cli_pull_whose_file_server_stalls_after_the_headers_fails_naming_it(fake_hub, tmp_path):
    headers_only = SilentListener(b"HTTP/1.1 200 OK\r\nContent-Length: 6291456\r\nETag: x\r\n\r\n")
    try:
        fake_hub.add_repo(MID, {MID_FILE: repos.make_gguf(payload=1024, seed=8)})
        fake_hub.faults.redirect_to = headers_only.url
        proc, _ = _cli(tmp_path / "home", fake_hub.url, "pull", MID, "--yes")
        assert proc.returncode != 0
        _assert_names_the_endpoint(proc.stderr, headers_only.url, "stopped sending mid-way within 1.5 s")
    finally:
        headers_only.close()


def test_a_download_that_stalls_mid_body_is_cut_and_resumed(fake_hub, store, monkeypatch):
    """The server goes silent half-way (and would stay so for minutes): the stall deadline
    cuts it, the retry asks for the rest with Range, and the file verifies."""
    import hashlib

    from localrun.settings import load_settings

    fake_hub.add_repo(MID, {MID_FILE: repos.make_gguf(payload=6 * 1024 * 1024, seed=8)})
    data = fake_hub.file(MID, MID_FILE).data
    hold = threading.Event()
    fake_hub.faults.drop_at, fake_hub.faults.hold = len(data) // 2, hold
    monkeypatch.setenv("LOCALRUN_HUB__STALL_TIMEOUT_S", "1")
    try:
        began = time.monotonic()
        record = pull(ModelStore(load_settings()), MID)
        took = time.monotonic() - began
    finally:
        hold.set()
    assert hashlib.sha256(Path(record.path).read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    gets = [r for r in fake_hub.requests if r.method == "GET" and "/resolve/" in r.path]
    assert [g.range for g in gets] == [None, f"bytes={len(data) // 2}-"]
    # The held connection would stay silent until the test ends; without the 1 s stall deadline
    # the old fixed 30 s read timeout was the first thing to cut it.
    assert took < 20


def test_deadlines_are_settings_with_defaults():
    from localrun.settings import Settings

    hub = Settings().hub
    assert (hub.connect_timeout_s, hub.first_byte_timeout_s, hub.stall_timeout_s) == (10.0, 30.0, 60.0)


def test_a_download_that_drip_feeds_is_cut_by_the_rate_floor_and_resumed(fake_hub, store, hf_cache, monkeypatch):
    """Half the file, then a byte every 0.3 s: inside the 1 s stall deadline, which restarts with
    every byte, so the download was never cut (the fake hub gives up after 30 s; a real one never
    does). The rate floor cuts it within its window, keeps the bytes, and the next pull resumes."""
    import hashlib

    from localrun.settings import load_settings

    fake_hub.add_repo(MID, {MID_FILE: repos.make_gguf(payload=2 * 1024 * 1024, seed=9)})
    data = fake_hub.file(MID, MID_FILE).data
    fake_hub.faults.drip_at = len(data) // 2
    monkeypatch.setenv("LOCALRUN_HUB__STALL_TIMEOUT_S", "1")
    monkeypatch.setenv("LOCALRUN_HUB__MIN_DOWNLOAD_RATE", "1000")
    monkeypatch.setenv("LOCALRUN_HUB__DOWNLOAD_RATE_WINDOW_S", "1.5")
    began = time.monotonic()
    with pytest.raises(DownloadFailed) as err:
        pull(ModelStore(load_settings()), MID)
    took = time.monotonic() - began
    assert took < 10, f"the drip was cut after {took:.1f} s"
    text = " ".join(str(err.value).split()) + " " + (err.value.hint or "")
    assert "under the floor of 1,000 bytes/s" in text and fake_hub.url in text, text
    assert "hub.min_download_rate" in text and "LOCALRUN_HUB__MIN_DOWNLOAD_RATE" in text, text
    kept = [p.stat().st_size for p in hf_cache.rglob("*.incomplete")]
    assert kept and kept[0] >= len(data) // 2, kept  # the bytes that came are kept for the resume

    record = pull(ModelStore(load_settings()), MID)  # the drip is disarmed: the rest comes at once
    assert hashlib.sha256(Path(record.path).read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    gets = [r for r in fake_hub.requests if r.method == "GET" and "/resolve/" in r.path]
    assert [g.range for g in gets] == [None, f"bytes={kept[0]}-"]


def test_cli_pull_from_a_drip_feeding_hub_exits_naming_the_setting(fake_hub, tmp_path):
    fake_hub.add_repo(MID, {MID_FILE: repos.make_gguf(payload=1024 * 1024, seed=10)})
    fake_hub.faults.drip_at = 4096
    proc, took = _cli(
        tmp_path / "home",
        fake_hub.url,
        "pull",
        MID,
        "--yes",
        LOCALRUN_HUB__MIN_DOWNLOAD_RATE="1000",
        LOCALRUN_HUB__DOWNLOAD_RATE_WINDOW_S="1",
    )
    flat = " ".join(proc.stderr.split())
    assert proc.returncode != 0 and "Traceback" not in flat, flat[-2000:]
    assert "under the floor of 1,000 bytes/s" in flat and "hub.min_download_rate" in flat, flat[-2000:]
    assert took < 20


def test_the_rate_floor_defaults_spare_a_slow_real_link():
    """1 KiB/s over 2 minutes: a 50 KB/s intranet link carrying a 20 GB file is 50 times above it."""
    from localrun.settings import Settings

    hub = Settings().hub
    assert (hub.min_download_rate, hub.download_rate_window_s) == (1024, 120.0)
    assert 50_000 > 10 * hub.min_download_rate


def test_the_rate_floor_cuts_only_a_link_below_it():
    """Simulated clock: 50 KB/s for a 20 GB file at the defaults never trips, nor does a link just
    above the floor; a drip trips within one window."""
    from localrun.modelstore.hub_http import Deadlines, RateFloor

    def first_trip(rate: float, seconds: float, step: float = 1.0) -> float | None:
        floor, t, got = RateFloor(Deadlines(), 0.0, 0), 0.0, 0
        while t < seconds:
            t += step
            got = int(rate * t)
            if floor.too_slow(t, got) is not None:
                return t
        return None

    assert first_trip(50_000, 20e9 / 50_000, step=10.0) is None  # 400,000 s of a slow intranet link
    assert first_trip(1100, 3600) is None
    assert first_trip(0.5, 3600, step=2.0) == 120.0  # a byte every two seconds: cut after the window
