"""The servers bench_kv_disk.py restarts, and the streamed requests it times.

:class:`Localrun` is one real ``localrun serve`` on a LOCALRUN_HOME shared by the run and a KV
directory of the phase's own, configured only through the environment a user would set
(``LOCALRUN_CACHE__KV_DIR``, ``LOCALRUN_CACHE__KV_DISK_BYTES``, ``LOCALRUN_RUNTIME__KEEP_ALIVE_S``...),
stopped with SIGTERM as a service manager stops it. :class:`LlamaServer` is the anchor with
``--slot-save-path``. :func:`chat` streams one OpenAI chat request and keeps each token's arrival.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import free_port, greedy_chat_body, post_chat_stream, stop, wait_ready

ROOT = Path(__file__).resolve().parents[1]
MODEL = "gemma"
#: Servers started and not yet stopped: a part that fails leaves its server here, and the run's
#: end stops it (never an orphan holding a core of this shared machine).
RUNNING: list = []
_LOG_IDS = itertools.count()


def _terminate(server, wait_s: float) -> None:
    """SIGTERM the server's process (SIGKILL after ``wait_s``) and forget it."""
    stop(server.proc, wait_s)
    server.proc = None
    if server in RUNNING:
        RUNNING.remove(server)


@dataclass
class Localrun:
    home: Path
    kv_dir: Path
    threads: int
    ctx: int
    parallel: int = 1
    disk_bytes: int | None = None  # None: the default from free disk
    ram_bytes: int | None = None  # None: the default from free RAM
    keep_alive_s: float | None = None
    proc: subprocess.Popen | None = None
    url: str = ""
    logs: list[Path] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALRUN_")}
        env.update(
            LOCALRUN_HOME=str(self.home),
            PYTHONPATH=str(ROOT),
            LOCALRUN_RUNTIME__THREADS=str(self.threads),
            LOCALRUN_RUNTIME__CONTEXT_LENGTH=str(self.ctx),
            LOCALRUN_RUNTIME__PARALLEL=str(self.parallel),
            LOCALRUN_RUNTIME__SPECULATIVE="off",  # decode speed without drafting noise: both sides the same
            LOCALRUN_CACHE__KV_DIR=str(self.kv_dir),
            LOCALRUN_LOG_LEVEL="INFO",
            LOCALRUN_WORKER_LOG="INFO",  # the prompt cache's lines (what an eviction saved, and how long it took)
        )
        if self.disk_bytes is not None:
            env["LOCALRUN_CACHE__KV_DISK_BYTES"] = str(self.disk_bytes)
        if self.ram_bytes is not None:
            env["LOCALRUN_CACHE__KV_RAM_BYTES"] = str(self.ram_bytes)
        if self.keep_alive_s is not None:
            env["LOCALRUN_RUNTIME__KEEP_ALIVE_S"] = str(self.keep_alive_s)
        return env

    def import_model(self, model: Path) -> None:
        """``localrun import``, then ``localrun verify``: an imported file's record has no sha256
        until it is verified, and the disk tier keys its files by that sha256 (no sha256: no tier)."""
        for args in (["import", str(model), "--name", MODEL], ["verify", MODEL]):
            subprocess.run([sys.executable, "-m", "localrun", *args], env=self.env(), check=True, capture_output=True)

    def start(self) -> float:
        """Start and wait for /health; the seconds that took."""
        port = free_port()
        log = self.home / f"serve-{self.kv_dir.name}-{next(_LOG_IDS)}.log"
        self.logs.append(log)
        t0 = time.perf_counter()
        with open(log, "wb") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "localrun", "serve", "--no-default-model", "--port", str(port)],
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{port}"
        RUNNING.append(self)
        wait_ready(self.proc, f"{self.url}/health")
        return time.perf_counter() - t0

    def load(self) -> float:
        """Load the model (POST /admin/load) and say how long it took: TTFT is measured loaded."""
        import httpx

        t0 = time.perf_counter()
        httpx.post(f"{self.url}/admin/load", json={"model": MODEL}, timeout=600).raise_for_status()
        return time.perf_counter() - t0

    def stop(self) -> float:
        """SIGTERM, as systemd or Ctrl-C would, and wait: the seconds until it exited (its
        shutdown writes the slots' prefixes to disk)."""
        assert self.proc is not None
        t0 = time.perf_counter()
        _terminate(self, 300)
        return time.perf_counter() - t0

    def loaded(self) -> bool:
        import httpx

        return any(
            m.get("name", "").startswith(MODEL) for m in httpx.get(f"{self.url}/api/ps", timeout=30).json()["models"]
        )

    def count(self, messages: list[dict]) -> int:
        """The prompt's tokens: the chat template (/apply-template), then /tokenize. Not the
        count_tokens route: that one prefills the prompt (to leave it cached), so a "cold" request
        after it would not be cold."""
        import httpx

        body = {"model": MODEL, "messages": messages}
        r = httpx.post(f"{self.url}/apply-template", json=body, timeout=600)
        r.raise_for_status()
        body = {"model": MODEL, "content": r.json()["prompt"], "add_special": False}
        r = httpx.post(f"{self.url}/tokenize", json=body, timeout=600)
        r.raise_for_status()
        return len(r.json()["tokens"])

    def metrics_lines(self, *words: str) -> list[str]:
        """/metrics sample lines that name any of ``words`` (the disk tier's counters)."""
        import httpx

        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return [ln for ln in text.splitlines() if not ln.startswith("#") and any(w in ln for w in words)]


@dataclass
class LlamaServer:
    binary: str
    model: Path
    threads: int
    ctx: int
    slot_dir: Path
    proc: subprocess.Popen | None = None
    url: str = ""

    def start(self) -> float:
        port = free_port()
        args = [self.binary, "-m", str(self.model), "--port", str(port), "-c", str(self.ctx), "-np", "1"]
        args += ["-t", str(self.threads), "-tb", str(self.threads), "--alias", MODEL, "--no-webui"]
        # --swa-full: the whole sliding-window cache, as localrun keeps it, so a restored slot is
        # reusable (with the window-only cache a restored Gemma 3 slot is re-prefilled whole);
        # --cache-ram 0: no host-RAM prompt cache, which a restart loses anyway.
        # --no-repack: weights as loaded, as localrun loads them (repack off, use_extra_bufts=False);
        # it also keeps ggml's AMX kernels off, which die with SIGILL/SIGSEGV on a VM that lists AMX
        # but does not grant its tile state.
        args += ["--slot-save-path", str(self.slot_dir), "--swa-full", "--cache-ram", "0", "--no-repack"]
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        RUNNING.append(self)
        wait_ready(self.proc, f"{self.url}/health")
        return time.perf_counter() - t0

    def stop(self) -> None:
        assert self.proc is not None
        _terminate(self, 60)

    def slot(self, action: str, filename: str) -> tuple[float, dict]:
        """POST /slots/0?action=save|restore: (client-side seconds, its answer)."""
        import httpx

        t0 = time.perf_counter()
        r = httpx.post(f"{self.url}/slots/0", params={"action": action}, json={"filename": filename}, timeout=600)
        r.raise_for_status()
        return time.perf_counter() - t0, r.json()


def chat(url: str, messages: list[dict], max_tokens: int, *, model: str = MODEL, started=None) -> dict:
    """One streamed greedy chat: send time, each content chunk's arrival, the text, usage, and
    llama-server's ``timings`` when it sends them. ``ignore_eos`` so every run decodes its tokens;
    ``started`` (a threading.Event) is set at the first token."""

    body = greedy_chat_body(model, messages, max_tokens, ignore_eos=True)
    return post_chat_stream(url, body, timeout=1800, on_piece=started.set if started is not None else None)


def ttft(result: dict) -> float:
    return (result["times"][0] if result["times"] else time.perf_counter()) - result["sent"]


def cached(result: dict) -> int:
    """usage's cached_tokens (OpenAI), or llama-server's ``timings.cache_n``."""
    details = (result["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
    return int(details if details is not None else result["timings"].get("cache_n") or 0)


def settle(path: Path, *, quiet_s: float = 1.5, timeout: float = 60.0) -> float:
    """Seconds until ``path`` stops changing (size and file count the same for ``quiet_s``): a
    state written at shutdown or unload may land after the server says it is done."""
    t0 = time.perf_counter()
    last, since = None, t0
    while time.perf_counter() - t0 < timeout:
        files = [f for f in path.rglob("*") if f.is_file()] if path.exists() else []
        now = (len(files), sum(f.stat().st_size for f in files if f.exists()))
        if now != last:
            last, since = now, time.perf_counter()
        elif time.perf_counter() - since >= quiet_s:
            return since - t0
        time.sleep(0.1)
    return time.perf_counter() - t0


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def complete(url: str, prompt: str, n_predict: int, *, started=None) -> dict:
    """One streamed raw completion (``/completion``, no chat template, so no template stop
    string ends it early) that decodes exactly ``n_predict`` tokens: the decoding streams."""
    import httpx

    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "stream": True, "ignore_eos": True}
    sent = time.perf_counter()
    times: list[float] = []
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event.get("content"):
                times.append(time.perf_counter())
                if started is not None:
                    started.set()
    return {"sent": sent, "times": times}


def messages(url: str, body: dict) -> tuple[float, dict]:
    """(TTFT to the first content delta, or to the end when none came; the final usage) of one
    streamed Anthropic /v1/messages request; a refusal raises with the server's words."""
    import httpx

    sent = time.perf_counter()
    first, usage = None, {}
    with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event.get("type") == "content_block_delta":
                first = first or time.perf_counter()
            elif event.get("type") == "message_delta":
                usage = event.get("usage") or usage
    return (first or time.perf_counter()) - sent, usage
