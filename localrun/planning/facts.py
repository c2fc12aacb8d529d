"""Can each runtime run here, and if not, why and what would fix it.

One probe per runtime, each catching its own failures and turning them into a
:class:`RuntimeStatus` with a ``reason`` in words and a ``fix`` command: a missing
extra, a llama.cpp built without the GPU this machine has, an Ollama server that is not
running. The planner reads these statuses; ``localrun hw`` and the TUI print them.
Probes import their libraries inside the function and take the importer, environment
and HTTP transport as arguments so tests can replay every case.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from localrun.errors import LocalrunError
from localrun.planning.hardware import HardwareProfile
from localrun.runtimes.base import RuntimeStatus

log = logging.getLogger(__name__)

Importer = Callable[[str], ModuleType]

OLLAMA_TIMEOUT_S = 0.5
LLAMA_PIP = "pip install --force-reinstall --no-cache-dir 'llama-cpp-python>=0.3.30,<0.4'"
#: How to build llama-cpp-python for the GPU a machine has (CMAKE_ARGS per backend).
LLAMA_CMAKE = {"cuda": "-DGGML_CUDA=on", "metal": "-DGGML_METAL=on", "hip": "-DGGML_HIP=on", "vulkan": "-DGGML_VULKAN=on"}
MLC_FIX = "pip install --pre -U -f https://mlc.ai/wheels mlc-llm-nightly-cpu mlc-ai-nightly-cpu"

#: Markers of each GPU backend in ``llama_print_system_info()``, checked in this order.
_BACKEND_MARKERS = (("cuda", ("CUDA",)), ("metal", ("Metal", "MTL")), ("hip", ("ROCm", "HIP")),
                    ("vulkan", ("Vulkan",)), ("sycl", ("SYCL",)))


def probe_runtimes(
    hw: HardwareProfile,
    *,
    settings: Any = None,
    import_module: Importer = importlib.import_module,
    env: Mapping[str, str] | None = None,
    transport: Any = None,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
    which: Callable[[str], str | None] = shutil.which,
) -> dict[str, RuntimeStatus]:
    """Probe llama.cpp, MLX, Ollama and MLC. Never raises; a failed probe is an unavailable status.

    ``settings`` is accepted so callers hand over what they have; no probe needs it yet.
    """
    env = os.environ if env is None else env
    probes: dict[str, Callable[[], RuntimeStatus]] = {
        "llama.cpp": lambda: probe_llamacpp(hw, import_module=import_module),
        "mlx": lambda: probe_mlx(hw, import_module=import_module, find_spec=find_spec),
        "ollama": lambda: probe_ollama(env=env, transport=transport),
        "mlc": lambda: probe_mlc(find_spec=find_spec, which=which),
        "vllm": lambda: _probe_vllm(hw),
    }
    statuses = {}
    for name, probe in probes.items():
        try:
            statuses[name] = probe()
        except Exception as exc:  # a probe's own bug must not hide the other runtimes
            log.warning("probing %s failed: %s", name, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            statuses[name] = RuntimeStatus(name, False, reason=f"probe failed: {exc}")
    return statuses


def _wanted_gpu_backend(hw: HardwareProfile) -> str | None:
    """The llama.cpp GPU backend this machine's hardware calls for, if any."""
    if hw.apple:
        return "metal"
    vendors = {g.vendor for g in hw.gpus if not g.integrated}
    return "cuda" if "nvidia" in vendors else "hip" if "amd" in vendors else "vulkan" if vendors else None


def llama_fix(hw: HardwareProfile) -> str:
    """The install command that gives this machine the llama.cpp build it deserves."""
    backend = _wanted_gpu_backend(hw)
    if backend in (None, "metal"):  # Metal is the default build on Apple Silicon
        return "pip install 'localrun[llama]'"
    return f'CMAKE_ARGS="{LLAMA_CMAKE[backend]}" {LLAMA_PIP}'


def llama_backend(system_info: str, gpu_offload: bool) -> str:
    """Which GPU backend a llama.cpp build has, read from its system-info text."""
    if gpu_offload:
        for backend, markers in _BACKEND_MARKERS:
            if any(m in system_info for m in markers):
                return backend
        return "gpu"  # offload compiled in, backend not named in the text
    return "cpu"


def probe_llamacpp(hw: HardwareProfile, *, import_module: Importer = importlib.import_module) -> RuntimeStatus:
    name = "llama.cpp"
    try:
        llama_cpp = import_module("llama_cpp")
    except ImportError as exc:
        missing = getattr(exc, "name", None) == "llama_cpp"
        reason = "llama-cpp-python is not installed" if missing else f"llama-cpp-python fails to import: {exc}"
        return RuntimeStatus(name, False, reason=reason, fix=llama_fix(hw))
    except OSError as exc:  # the bundled libllama fails to load (wrong CUDA runtime, missing libgomp…)
        return RuntimeStatus(name, False, reason=f"llama-cpp-python's native library fails to load: {exc}", fix=llama_fix(hw))
    version = getattr(llama_cpp, "__version__", None)
    gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
    info = llama_cpp.llama_print_system_info()
    info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    backend = llama_backend(info, gpu_offload)
    details = {"backend": backend, "gpu_offload": gpu_offload, "system_info": info.strip()}
    devices = ("cpu",) if backend == "cpu" else ("cpu", backend)
    wanted = _wanted_gpu_backend(hw)
    reason = fix = None
    if backend == "cpu" and wanted:
        reason = f"built without GPU offload although this machine could use {wanted.upper()}: it runs on the CPU"
        fix = llama_fix(hw)
    return RuntimeStatus(name, True, version=version, devices=devices, reason=reason, fix=fix, details=details)


def probe_mlx(hw: HardwareProfile, *, import_module: Importer = importlib.import_module,
              find_spec: Callable[[str], Any] = importlib.util.find_spec) -> RuntimeStatus:
    """mlx.core is imported for its device; mlx-lm is only looked up (importing it pulls in transformers)."""
    name, fix = "mlx", "pip install 'localrun[mlx]'"
    try:
        mx = import_module("mlx.core")
    except ImportError:
        return RuntimeStatus(name, False, reason="mlx is not installed", fix=fix)
    if find_spec("mlx_lm") is None:
        return RuntimeStatus(name, False, reason="mlx is installed but mlx-lm is not", fix=fix)
    device = str(mx.default_device())  # "Device(gpu, 0)" / "Device(cpu, 0)"
    on_gpu = "gpu" in device
    kind = "metal" if hw.apple else "cuda" if on_gpu else "cpu"
    reason = None if on_gpu else "no GPU for MLX here: it runs on the CPU, slower than llama.cpp"
    return RuntimeStatus(name, True, version=_dist_version("mlx-lm"), devices=(kind,), reason=reason,
                         details={"device": device, "mlx_version": _dist_version("mlx")})


def ollama_base_url(env: Mapping[str, str]) -> str:
    """``OLLAMA_HOST`` as Ollama reads it; one parser, the Ollama runtime's, serves both."""
    from localrun.runtimes.ollama import ollama_base_url as parse

    return parse(env.get("OLLAMA_HOST") or "")


def probe_ollama(*, env: Mapping[str, str] | None = None, transport: Any = None) -> RuntimeStatus:
    import httpx

    name = "ollama"
    try:
        url = ollama_base_url(os.environ if env is None else env)
    except LocalrunError as exc:
        return RuntimeStatus(name, False, reason=exc.message, fix=exc.hint)
    try:
        with httpx.Client(base_url=url, timeout=OLLAMA_TIMEOUT_S, transport=transport) as client:
            response = client.get("/api/version")
            response.raise_for_status()
            version = response.json().get("version")
    except httpx.HTTPStatusError as exc:
        return RuntimeStatus(name, False, reason=f"{url} answered {exc.response.status_code}: not an Ollama server?",
                             fix="check OLLAMA_HOST", details={"url": url})
    except httpx.HTTPError as exc:
        return RuntimeStatus(name, False, reason=f"no Ollama server at {url} ({type(exc).__name__})",
                             fix="ollama serve", details={"url": url})
    except ValueError as exc:
        return RuntimeStatus(name, False, reason=f"{url}/api/version is not JSON: {exc}",
                             fix="check OLLAMA_HOST", details={"url": url})
    return RuntimeStatus(name, True, version=version, devices=("ollama",), details={"url": url})


def _probe_vllm(hw: HardwareProfile) -> RuntimeStatus:
    from localrun.runtimes.vllm import VllmRuntime

    return VllmRuntime().probe(hw)


def probe_mlc(*, find_spec: Callable[[str], Any] = importlib.util.find_spec,
              which: Callable[[str], str | None] = shutil.which) -> RuntimeStatus:
    """Installed is enough here: importing mlc_llm pulls in TVM, which is slow and may need a toolchain."""
    name = "mlc"
    try:
        spec = find_spec("mlc_llm")
    except (ImportError, ValueError) as exc:
        log.debug("looking for mlc_llm: %s", exc)
        spec = None
    if spec is not None:
        return RuntimeStatus(name, True, version=_mlc_version(), devices=("auto",), details={"via": "python"})
    cli = which("mlc_llm")
    if cli:
        return RuntimeStatus(name, True, version=_mlc_version(), devices=("auto",), details={"via": "cli", "path": cli})
    return RuntimeStatus(name, False, reason="MLC LLM is not installed (it ships from mlc.ai's wheel index, not PyPI)",
                         fix=MLC_FIX)


def _mlc_version() -> str | None:
    for dist in ("mlc-llm", "mlc-llm-nightly-cpu", "mlc-llm-nightly", "mlc-llm-cpu"):
        if (v := _dist_version(dist)) is not None:
            return v
    return None


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def render_statuses(statuses: Mapping[str, RuntimeStatus]) -> list[str]:
    """Plain lines for ``localrun hw``: one per runtime, its fix on the next."""
    lines = []
    for status in statuses.values():
        mark = "ok " if status.available else "-- "
        head = f"{mark}{status.name:<10} {status.version or ''}".rstrip()
        if status.available and status.devices:
            head += f"  [{', '.join(status.devices)}]"
        if status.reason:
            head += f"  {status.reason}"
        lines.append(head)
        if status.fix:
            lines.append(f"    fix: {status.fix}")
    return lines
