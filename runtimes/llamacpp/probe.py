"""Can llama.cpp run here, on which backend, and what would fix it.

The probe imports ``llama_cpp`` (no backend init, no log hook: the parent process only
asks, the worker loads) and reads which GPU backend the build has from
``llama_print_system_info()``. It compares that with the GPU the machine has, so a
CPU-only wheel on a CUDA box says so and names the ``CMAKE_ARGS`` rebuild that fixes it.
``hw`` is a :class:`~localrun.planning.hardware.HardwareProfile` (read by attribute only:
runtimes sit below planning); without one nothing is known of the GPUs.

It also asks llama.cpp which devices it sees, with their free memory (``ggml_backend_dev_*``,
:mod:`.overrides`), in a child process: reading a GPU's memory creates a CUDA context, which
would hold VRAM in the server for its whole life. That list is what the planner splits layers by,
and where it disagrees with the hardware (a CUDA build that sees no CUDA device) the status says so.
"""

from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from localrun.runtimes.base import RuntimeStatus

if TYPE_CHECKING:
    from localrun.planning.hardware import HardwareProfile  # read by attribute only: typed, never imported

Importer = Callable[[str], ModuleType]
DeviceLister = Callable[[], "list[dict[str, Any]] | None"]

log = logging.getLogger(__name__)
#: Seconds the device-listing child may take: importing llama_cpp and initialising every GPU.
DEVICES_TIMEOUT_S = 60

NAME = "llama.cpp"
INSTALL_FIX = "pip install 'localrun[llama]'"
LLAMA_PIP = "pip install --force-reinstall --no-cache-dir 'llama-cpp-python>=0.3.30,<0.4'"
#: How to build llama-cpp-python for the GPU a machine has (CMAKE_ARGS per backend).
LLAMA_CMAKE = {
    "cuda": "-DGGML_CUDA=on",
    "metal": "-DGGML_METAL=on",
    "hip": "-DGGML_HIP=on",
    "vulkan": "-DGGML_VULKAN=on",
}
#: Markers of each GPU backend in ``llama_print_system_info()``, checked in this order.
_BACKEND_MARKERS = (
    ("cuda", ("CUDA",)),
    ("metal", ("Metal", "MTL")),
    ("hip", ("ROCm", "HIP")),
    ("vulkan", ("Vulkan",)),
    ("sycl", ("SYCL",)),
)


def wanted_gpu_backend(hw: HardwareProfile | None) -> str | None:
    """The llama.cpp GPU backend this machine's hardware calls for, if any."""
    if hw is None:
        return None
    if hw.apple:
        return "metal"
    vendors = {g.vendor for g in hw.gpus if not g.integrated}
    return "cuda" if "nvidia" in vendors else "hip" if "amd" in vendors else "vulkan" if vendors else None


def llama_fix(hw: HardwareProfile | None) -> str:
    """The install command that gives this machine the llama.cpp build it deserves."""
    backend = wanted_gpu_backend(hw)
    if backend in (None, "metal"):  # Metal is the default build on Apple Silicon
        return INSTALL_FIX
    return f'CMAKE_ARGS="{LLAMA_CMAKE[backend]}" {LLAMA_PIP}'


def llama_backend(system_info: str, gpu_offload: bool) -> str:
    """Which GPU backend a llama.cpp build has, read from its system-info text."""
    if gpu_offload:
        for backend, markers in _BACKEND_MARKERS:
            if any(m in system_info for m in markers):
                return backend
        return "gpu"  # offload compiled in, backend not named in the text
    return "cpu"


def build_backend(llama_cpp: Any) -> tuple[str, str, bool]:
    """(backend, system info, GPU offload) of the installed build, read from ``llama_print_system_info()``.

    One small function on purpose: set-up's build module (gpu-build) may replace it with its own reader."""
    gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
    info = llama_cpp.llama_print_system_info()
    info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    return llama_backend(info, gpu_offload), info, gpu_offload


def list_devices(timeout: float = DEVICES_TIMEOUT_S) -> list[dict[str, Any]] | None:
    """llama.cpp's device list, asked in a child process; None when the child fails (logged)."""
    argv = [sys.executable, "-m", "localrun.runtimes.llamacpp.overrides"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)
        devices = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        detail = getattr(exc, "stderr", None) or ""
        log.warning("could not list llama.cpp's devices: %s %s", exc, detail.strip()[-400:])
        return None
    return devices if isinstance(devices, list) else None


def _cpu_devices(llama_cpp: Any) -> list[dict[str, Any]] | None:
    from localrun.runtimes.llamacpp.overrides import read_devices

    try:
        return read_devices(llama_cpp)
    except Exception as exc:  # noqa: BLE001 - an odd build's missing symbol must not fail the probe
        log.warning("could not list llama.cpp's devices: %s", exc)
        return None


def probe_llamacpp(
    hw: HardwareProfile | None, *, import_module: Importer | None = None, devices: DeviceLister | None = None
) -> RuntimeStatus:
    """The status :meth:`LlamaCppRuntime.probe` reports; ``import_module`` and ``devices`` replay a machine
    in tests (with a stand-in module and no lister, no device list is asked for)."""
    replayed = import_module is not None
    import_module = import_module or importlib.import_module
    try:
        llama_cpp = import_module("llama_cpp")
    except ImportError as exc:
        missing = getattr(exc, "name", None) == "llama_cpp"
        reason: str | None = (
            "llama-cpp-python is not installed" if missing else f"llama-cpp-python fails to import: {exc}"
        )
        return RuntimeStatus(NAME, False, reason=reason, fix=llama_fix(hw))
    except OSError as exc:  # the bundled libllama fails to load (wrong CUDA runtime, missing libgomp…)
        return RuntimeStatus(
            NAME, False, reason=f"llama-cpp-python's native library fails to load: {exc}", fix=llama_fix(hw)
        )
    backend, info, gpu_offload = build_backend(llama_cpp)
    details = {
        "backend": backend,
        "gpu_offload": gpu_offload,
        "system_info": info.strip(),
        "wanted_backend": wanted_gpu_backend(hw) or "cpu",
    }
    if devices is None:  # a CPU build's list needs no GPU initialised: read it here, cheaply
        devices = (lambda: None) if replayed else list_devices if backend != "cpu" else lambda: _cpu_devices(llama_cpp)
    seen = devices()
    if seen is not None:
        details["devices"] = seen
    wanted = wanted_gpu_backend(hw)
    reason = fix = None
    if backend == "cpu" and wanted:
        reason = f"built without GPU offload although this machine could use {wanted.upper()}: it runs on the CPU"
        fix = llama_fix(hw)
    elif backend != "cpu" and seen is not None and not any(d.get("type") in ("gpu", "igpu") for d in seen):
        reason = f"built for {backend.upper()} but llama.cpp sees no GPU (driver or runtime missing?): it runs on CPU"
        fix = llama_fix(hw) if wanted else None
    return RuntimeStatus(
        NAME,
        True,
        version=getattr(llama_cpp, "__version__", None),
        devices=("cpu",) if backend == "cpu" else ("cpu", backend),
        reason=reason,
        fix=fix,
        details=details,
    )
