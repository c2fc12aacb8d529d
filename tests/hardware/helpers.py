"""Builders for the hardware and planner tests: profiles from JSON, records from plain dicts,
runtime statuses as the probes would report them, and a fake pynvml module."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from localrun.planning.hardware import HardwareProfile
from localrun.runtimes.base import RuntimeStatus
from localrun.types import FileEntry, Format, ModelRecord

DATA = Path(__file__).parent / "data"
PROFILES = ("m2_mac_16gb", "rtx4090_desktop", "cpu_laptop_8gb", "amd_gpu_box")


def profile(name: str) -> HardwareProfile:
    return HardwareProfile.from_json((DATA / "profiles" / f"{name}.json").read_text())


# GGUF metadata as modelstore.gguf_meta's GGUFInfo.as_dict() gives it (a subset of keys;
# numbers from the published files). key_length/value_length are left out on purpose for the
# llama models: the planner must fall back to embedding_length / head_count.
LLAMA_8B = {
    "architecture": "llama",
    "context_length": 131072,
    "block_count": 32,
    "embedding_length": 4096,
    "feed_forward_length": 14336,
    "head_count": 32,
    "head_count_kv": 8,
    "vocab_size": 128256,
    "quant": "Q4_K_M",
    "n_params": 8030261248,
    "size_bytes": 4920739232,
}
LLAMA_70B = {
    "architecture": "llama",
    "context_length": 131072,
    "block_count": 80,
    "embedding_length": 8192,
    "feed_forward_length": 28672,
    "head_count": 64,
    "head_count_kv": 8,
    "vocab_size": 128256,
    "quant": "Q4_K_M",
    "n_params": 70553706496,
    "size_bytes": 42520413856,
}
LLAMA_405B = {
    "architecture": "llama",
    "context_length": 131072,
    "block_count": 126,
    "embedding_length": 16384,
    "feed_forward_length": 53248,
    "head_count": 128,
    "head_count_kv": 8,
    "vocab_size": 128256,
    "quant": "Q4_K_M",
    "n_params": 405853388800,
    "size_bytes": 243055889408,
}
QWEN_05B = {
    "architecture": "qwen2",
    "context_length": 32768,
    "block_count": 24,
    "embedding_length": 896,
    "feed_forward_length": 4864,
    "head_count": 14,
    "head_count_kv": 2,
    "key_length": 64,
    "value_length": 64,
    "vocab_size": 151936,
    "quant": "Q4_K_M",
    "n_params": 494032768,
    "size_bytes": 397808192,
}


def record(meta: dict[str, Any], *, name: str = "model", fmt: Format = Format.GGUF, shards: int = 1) -> ModelRecord:
    """A record whose files add up to ``meta['size_bytes']`` (split over ``shards`` files)."""
    size = int(meta.get("size_bytes") or 0)
    parts = [size // shards] * shards
    parts[-1] += size - sum(parts)
    files = tuple(FileEntry(f"/models/{name}-{i + 1:05d}-of-{shards:05d}.gguf", s) for i, s in enumerate(parts))
    return ModelRecord(name=name, format=fmt, path=files[0].path, files=files, metadata=dict(meta))


def llama_status(backend: str | None) -> RuntimeStatus:
    """What the llama.cpp probe reports for a build with ``backend``; ``None``: not installed."""
    if backend is None:
        return RuntimeStatus(
            "llama.cpp", False, reason="llama-cpp-python is not installed", fix="pip install 'localrun[llama]'"
        )
    devices = ("cpu",) if backend == "cpu" else ("cpu", backend)
    return RuntimeStatus(
        "llama.cpp",
        True,
        version="0.3.36",
        devices=devices,
        details={"backend": backend, "gpu_offload": backend != "cpu"},
    )


def statuses(
    llama: str | None = "cpu", *, ollama: bool = False, mlx: str | None = None, mlc: bool = False
) -> dict[str, RuntimeStatus]:
    return {
        "llama.cpp": llama_status(llama),
        "mlx": RuntimeStatus("mlx", True, version="0.32.2", devices=(mlx,))
        if mlx
        else RuntimeStatus("mlx", False, reason="mlx is not installed", fix="pip install 'localrun[mlx]'"),
        "ollama": RuntimeStatus(
            "ollama", True, version="0.12.3", devices=("ollama",), details={"url": "http://127.0.0.1:11434"}
        )
        if ollama
        else RuntimeStatus(
            "ollama", False, reason="no Ollama server at http://127.0.0.1:11434 (ConnectError)", fix="ollama serve"
        ),
        "mlc": RuntimeStatus("mlc", True, devices=("auto",))
        if mlc
        else RuntimeStatus(
            "mlc", False, reason="MLC LLM is not installed", fix="pip install --pre -U -f https://mlc.ai/wheels mlc-llm"
        ),
    }


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's own name
    pass


def fake_nvml(
    devices: list[dict],
    *,
    driver: str = "550.54.14",
    cuda: int = 12040,
    init_error: Exception | None = None,
    broken: set[int] = frozenset(),
) -> SimpleNamespace:
    """A pynvml stand-in answering like nvidia-ml-py 12 does; ``broken`` devices raise on memory info."""
    calls: list[str] = []

    def init():
        calls.append("init")
        if init_error is not None:
            raise init_error

    def memory(handle):
        if handle in broken:
            raise NVMLError("GPU is lost")
        d = devices[handle]
        return SimpleNamespace(total=d["total"], free=d["free"], used=d["total"] - d["free"])

    return SimpleNamespace(
        NVMLError=NVMLError,
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: driver,
        nvmlSystemGetCudaDriverVersion=lambda: cuda,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: devices[h]["name"],
        nvmlDeviceGetUUID=lambda h: devices[h]["uuid"],
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetCudaComputeCapability=lambda h: devices[h]["cc"],
    )


def sysctl_runner(answers: dict[str, str]):
    """A command runner replaying recorded sysctl answers; unknown keys fail like sysctl does."""
    import subprocess

    seen: list[list[str]] = []

    def run(argv):
        seen.append(list(argv))
        if argv[:2] == ["sysctl", "-n"] and argv[2] in answers:
            return answers[argv[2]] + "\n"
        if argv[:1] == ["sysctl"] and len(argv) == 2 and argv[1] in answers:
            return answers[argv[1]]
        raise subprocess.CalledProcessError(1, argv, stderr=f"sysctl: unknown oid '{argv[-1]}'")

    run.seen = seen
    return run


def load_json(name: str) -> dict:
    return json.loads((DATA / name).read_text())
