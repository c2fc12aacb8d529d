"""Can llama.cpp run here, on which backend, and what would fix it.

The probe imports ``llama_cpp`` (no backend init, no log hook: the parent process only
asks, the worker loads) and reads which GPU backend the build has from
``llama_print_system_info()``. It compares that with the GPU the machine has, so a
CPU-only wheel on a CUDA box says so and names the ``CMAKE_ARGS`` rebuild that fixes it.
``hw`` is a :class:`~localrun.planning.hardware.HardwareProfile` (read by attribute only:
runtimes sit below planning); without one nothing is known of the GPUs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from localrun.runtimes.base import RuntimeStatus

Importer = Callable[[str], ModuleType]

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


def wanted_gpu_backend(hw) -> str | None:
    """The llama.cpp GPU backend this machine's hardware calls for, if any."""
    if hw is None:
        return None
    if hw.apple:
        return "metal"
    vendors = {g.vendor for g in hw.gpus if not g.integrated}
    return "cuda" if "nvidia" in vendors else "hip" if "amd" in vendors else "vulkan" if vendors else None


def llama_fix(hw) -> str:
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


def probe_llamacpp(hw, *, import_module: Importer | None = None) -> RuntimeStatus:
    """The status :meth:`LlamaCppRuntime.probe` reports; ``import_module`` replays a machine in tests."""
    import_module = import_module or importlib.import_module
    try:
        llama_cpp = import_module("llama_cpp")
    except ImportError as exc:
        missing = getattr(exc, "name", None) == "llama_cpp"
        reason = "llama-cpp-python is not installed" if missing else f"llama-cpp-python fails to import: {exc}"
        return RuntimeStatus(NAME, False, reason=reason, fix=llama_fix(hw))
    except OSError as exc:  # the bundled libllama fails to load (wrong CUDA runtime, missing libgomp…)
        return RuntimeStatus(
            NAME, False, reason=f"llama-cpp-python's native library fails to load: {exc}", fix=llama_fix(hw)
        )
    gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
    info = llama_cpp.llama_print_system_info()
    info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    backend = llama_backend(info, gpu_offload)
    details = {"backend": backend, "gpu_offload": gpu_offload, "system_info": info.strip()}
    devices = ("cpu",) if backend == "cpu" else ("cpu", backend)
    wanted = wanted_gpu_backend(hw)
    reason = fix = None
    if backend == "cpu" and wanted:
        reason = f"built without GPU offload although this machine could use {wanted.upper()}: it runs on the CPU"
        fix = llama_fix(hw)
    return RuntimeStatus(
        NAME,
        True,
        version=getattr(llama_cpp, "__version__", None),
        devices=devices,
        reason=reason,
        fix=fix,
        details=details,
    )
