"""Two hosts on one machine (see :mod:`tests.mirror.netns`): host A runs ``localrun mirror``
on its veth address with its own LOCALRUN_HOME and a key; host B, which has no route but
to A, uses only HF_ENDPOINT (and HF_TOKEN) — the real huggingface_hub, ``localrun pull``
then ``run``, a pull killed with SIGKILL half-way and resumed, eight pulls of one file."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import pytest

from tests.hub import repos
from tests.mirror.hosts import TINY_REPO, fill_store, home_env, start_mirror
from tests.support.netns import two_hosts
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(300)

KEY = "netns-mirror-key"
BIG_REPO = "local/big"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Host A (filled store + a 48 MiB model, mirror listening on its veth address) and B's prefix."""
    from tests.factories import write_tiny_llama_gguf
    from tests.hub.fakehub import FakeHub
    from tests.hub.repos import populate

    root = tmp_path_factory.mktemp("netns")
    home_a = root / "host-a"
    tiny = write_tiny_llama_gguf(root / "src" / "tiny-llama.gguf")
    hub = populate(FakeHub()).start()
    try:
        fill_store(home_a, hub.url, tiny)
    finally:
        hub.stop()
    big = root / "src" / "big-Q8_0.gguf"
    big.write_bytes(repos.make_gguf(quant="Q8_0", payload=48 << 20, seed=21))
    subprocess.run(
        [sys.executable, "-m", "localrun", "import", str(big), "--name", "big"],
        env=home_env(home_a),
        check=True,
        capture_output=True,
        timeout=120,
    )
    with two_hosts() as hosts:
        port = free_port()
        mp = start_mirror(home_a, host=hosts.a_ip, port=port, key=KEY, prefix=hosts.a_prefix or None)
        url = f"http://{hosts.a_ip}:{port}"
        if hosts.a_prefix:
            _wait_from_b(hosts, url, mp)
        yield {"hosts": hosts, "url": url, "mirror": mp, "tiny": tiny, "big": big, "root": root}
        mp.stop()


def _wait_from_b(hosts, url, mp, timeout=60.0):
    probe = (
        "import httpx,sys\ntry:\n r=httpx.get(sys.argv[1]+'/',headers={'Authorization':'Bearer "
        "'+sys.argv[2]},timeout=2)\n"
        " sys.exit(0 if r.status_code==200 else 1)\nexcept Exception:\n sys.exit(1)"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mp.proc.poll() is not None:
            raise RuntimeError(f"mirror on A exited: {mp.log_text()[-2000:]}")
        if subprocess.run([*hosts.b_prefix, sys.executable, "-c", probe, url, KEY], timeout=30).returncode == 0:
            return
        time.sleep(0.3)
    raise RuntimeError(f"mirror on A never answered B: {mp.log_text()[-2000:]}")


def on_b(site, home, *args, timeout=180, popen=False):
    env = {**home_env(home), "HF_ENDPOINT": site["url"], "HF_TOKEN": KEY}
    cmd = [*site["hosts"].b_prefix, sys.executable, *args]
    if popen:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_b_is_isolated_from_everything_but_a(site):
    hosts = site["hosts"]
    if not hosts.isolated:
        pytest.fail("network namespaces were not available: this run used the loopback fallback (see the warning)")
    routes = subprocess.run([*hosts.b_prefix, "ip", "route"], capture_output=True, text=True, timeout=10).stdout
    assert "default" not in routes and hosts.b_ip in routes


def test_huggingface_hub_on_b(site, tmp_path):
    done = on_b(site, tmp_path / "b", "-m", "tests.mirror.client_b", "hf", repos.GGUF_REPO, repos.MLX_REPO, TINY_REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)["repos"]
    assert seen[repos.GGUF_REPO]["files"] == {
        "Tiny-Q4_K_M.gguf": hashlib.sha256(repos.gguf_repo_files()["Tiny-Q4_K_M.gguf"]).hexdigest()
    }
    assert seen[TINY_REPO]["files"] == {"tiny-llama.gguf": _sha(site["tiny"])}
    mlx = {p: hashlib.sha256(d).hexdigest() for p, d in repos.mlx_repo_files().items()}
    assert seen[repos.MLX_REPO]["files"] == {p: mlx[p] for p in seen[repos.MLX_REPO]["files"]}


def test_localrun_pull_then_run_on_b(site, tmp_path):
    home = tmp_path / "b"
    done = on_b(site, home, "-m", "localrun", "pull", "-y", TINY_REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = json.loads(on_b(site, home, "-m", "localrun", "ls", "--json").stdout)
    (model,) = [m for m in listed if m["name"].startswith(TINY_REPO + ":")]
    assert model["source"] == "hub" and _sha(model["path"]) == _sha(site["tiny"])
    search = on_b(site, home, "-m", "localrun", "search", "tiny")
    assert search.returncode == 0 and TINY_REPO in search.stdout and repos.GGUF_REPO in search.stdout
    plan = on_b(site, home, "-m", "localrun", "plan", model["name"], "--json")
    assert plan.returncode == 0 and json.loads(plan.stdout)["model"] == model["name"], plan.stderr[-2000:]
    run = on_b(
        site, home, "-m", "localrun", "run", model["name"], "Hello", "--raw", "--max-tokens", "4", "--threads", "1"
    )
    assert run.returncode == 0 and "tokens" in run.stderr, run.stderr[-2000:]


def _blob(home, repo: str):
    return home / "hf" / "hub" / ("models--" + repo.replace("/", "--")) / "blobs"


def test_pull_killed_halfway_resumes_to_the_right_sha256(site, tmp_path):
    hosts, home, size = site["hosts"], tmp_path / "b", site["big"].stat().st_size
    if not hosts.throttle_b("40mbit"):
        pytest.skip("loopback fallback: no veth to pace, so 'half-way' cannot be caught (see the namespace warning)")
    try:
        proc = on_b(site, home, "-m", "localrun", "pull", "-y", BIG_REPO, popen=True)
        deadline, partial = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(_blob(home, BIG_REPO).glob("*.incomplete")) if _blob(home, BIG_REPO).is_dir() else []
            if found and found[0].stat().st_size > size // 3:
                partial = found[0]
                break
            time.sleep(0.05)
        assert partial is not None, "the pull never got a third of the way"
        proc.kill()  # SIGKILL: no cleanup of any kind
        proc.wait(timeout=30)
        kept = partial.stat().st_size
        assert 0 < kept < size
    finally:
        hosts.unthrottle_b()
    rx = hosts.b_rx_bytes()
    done = on_b(site, home, "-m", "localrun", "pull", "-y", BIG_REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    fetched = hosts.b_rx_bytes() - rx
    assert fetched < size - kept + (4 << 20), (fetched, size, kept)  # resumed, not restarted
    blobs = [p for p in _blob(home, BIG_REPO).iterdir() if not p.name.endswith(".incomplete")]
    assert [p.name for p in blobs] == [_sha(site["big"])] and _sha(blobs[0]) == blobs[0].name


def test_eight_concurrent_pulls_of_one_file(site, tmp_path):
    hosts, home, size = site["hosts"], tmp_path / "b", site["big"].stat().st_size
    rx = hosts.b_rx_bytes()
    procs = [on_b(site, home, "-m", "localrun", "pull", "-y", BIG_REPO, popen=True) for _ in range(8)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [o[1][-500:] for o in outs]
    fetched = hosts.b_rx_bytes() - rx
    if hosts.isolated:
        assert fetched < 1.5 * size, (fetched, size)  # one copy came over the wire, not eight
    blobs = sorted(p.name for p in _blob(home, BIG_REPO).iterdir())
    assert blobs == [_sha(site["big"])]
