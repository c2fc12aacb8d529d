"""With no network at all (a namespace with only ``lo``), every command works or says
"offline" at once: no DNS wait, no connect retries (huggingface_hub's backoff logs
"Retrying in Ns" — its absence is the check; the time each command took is printed)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.mirror.hosts import home_env, start_serve
from tests.support.netns import no_network
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    from tests.factories import write_tiny_llama_gguf

    root = tmp_path_factory.mktemp("offline")
    tiny = write_tiny_llama_gguf(root / "src" / "tiny-llama.gguf")
    home = root / "box"
    subprocess.run(
        [sys.executable, "-m", "localrun", "import", str(tiny), "--name", "tiny"],
        env=home_env(home),
        check=True,
        capture_output=True,
        timeout=120,
    )
    with no_network() as prefix:
        if prefix is None:
            pytest.fail("network namespaces are not available here: the no-network checks cannot run (see the warning)")
        yield {"prefix": prefix, "home": home, "root": root}


def run_offline(site, *args, home=None, timeout=120):
    env = home_env(home or site["home"])
    t0 = time.monotonic()
    done = subprocess.run(
        [*site["prefix"], sys.executable, "-m", "localrun", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    print(f"offline: localrun {' '.join(args)[:60]} -> rc {done.returncode} in {time.monotonic() - t0:.2f} s")
    assert "Retrying" not in done.stderr and "Retry " not in done.stderr, done.stderr[-1500:]
    return done


@pytest.mark.parametrize(
    "args",
    [
        ["ls"],
        ["hw"],
        ["plan", "tiny"],
        ["verify"],
        ["ls", "--all"],
        ["run", "tiny", "Hello", "--raw", "--max-tokens", "3", "--threads", "1"],
    ],
)
def test_local_commands_work(offline, args):
    done = run_offline(offline, *args)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    "args", [["search", "qwen"], ["pull", "-y", "Qwen/Qwen2.5-0.5B-Instruct-GGUF"], ["pull", "-y", "org/repo:Q4_K_M"]]
)
def test_hub_commands_say_offline(offline, args):
    done = run_offline(offline, *args)
    assert done.returncode != 0 and "offline" in done.stderr and "HF_HUB_OFFLINE=1" in done.stderr.replace("\n", " ")


def test_hub_offline_mode_is_plain_too(offline):
    done = run_offline(offline, "search", "qwen")
    env_off = run_offline(offline, "pull", "--offline", "-y", "org/repo")
    assert "offline" in done.stderr and env_off.returncode != 0 and "offline" in env_off.stderr


def test_serve_starts_and_stops(offline):
    proc, seen = start_serve(offline["home"], free_port(), prefix=offline["prefix"])
    try:
        assert "serving on" in seen, seen[-2000:]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_bundle_import_on_a_box_with_no_network(offline, tmp_path):
    bundle = tmp_path / "tiny.bundle"
    export = subprocess.run(
        [sys.executable, "-m", "localrun", "bundle", "export", "tiny", "-o", str(bundle)],
        env=home_env(offline["home"]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert export.returncode == 0, export.stderr[-2000:]
    fresh = tmp_path / "fresh-box"
    done = run_offline(offline, "bundle", "import", str(bundle), home=fresh)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = run_offline(offline, "ls", home=fresh)
    assert "tiny" in listed.stdout


def test_tui_discover_says_offline_in_a_real_terminal(offline, tmp_path):
    """`localrun tui` in tmux with no network: Discover says offline and why, typing "qwen"
    searches (never quits), the empty result is explained, Ctrl+Q leaves."""
    import os
    import shlex
    import shutil

    from tests.tui.test_e2e_tmux import LOCALRUN, Tmux

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    env = {
        **home_env(offline["home"]),
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "LOCALRUN_RUNTIME__FORCE": "fake",
        "LOCALRUN_SERVER__PORT": str(free_port()),
    }
    inner = (
        "env -i "
        + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        + f" {shlex.quote(LOCALRUN)} tui --no-default-model"
    )
    tmux = Tmux(" ".join(shlex.quote(p) for p in offline["prefix"]) + " " + inner)
    try:
        tmux.wait("Library", "tiny")
        tmux.keys("2")
        tmux.wait("Offline", "could not be reached")
        tmux.type("qwen")
        tmux.keys("Enter")
        screen = tmux.wait("Nothing matches")
        assert "qwen" in screen and tmux.alive()
        tmux.keys("C-q")
        deadline = time.monotonic() + 20
        while tmux.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not tmux.alive(), "the TUI did not exit on Ctrl+Q"
    finally:
        tmux.kill()
