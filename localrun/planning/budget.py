"""The memory a plan may fill: free RAM, and the free memory of the GPUs the runtime's build can drive.

Split from :mod:`.planner` (which decides) because it is the one place that reads the machine's
GPUs against the runtime's backend: which GPUs count, the margin left on each, and the order
llama.cpp numbers them in (see :func:`localrun.planning.offload.gpu_devices`).
"""

from __future__ import annotations

from localrun.errors import ConfigError, RuntimeUnavailable
from localrun.planning.gpus import GpuInfo
from localrun.planning.hardware import MIB, HardwareProfile
from localrun.planning.offload import gpu_devices
from localrun.planning.placement import Budget
from localrun.runtimes.base import RuntimeStatus

#: Per GPU, kept free for the driver, the desktop and fragmentation. llama-server's --fit leaves 1 GiB
#: (common.h fit_params_target) beyond what it measures; localrun counts the CUDA context (320 MiB,
#: placement.GPU_CONTEXT) in the estimate itself, so 512 MiB more leaves about as much.
VRAM_MARGIN = 512 * MIB
#: Which GPUs each llama.cpp GPU backend can drive.
BACKEND_VENDORS = {"cuda": {"nvidia"}, "hip": {"amd"}, "vulkan": {"nvidia", "amd", "intel"}, "sycl": {"intel"}}
DEVICES = ("auto", "cpu", "gpu", "cuda", "metal", "hip", "vulkan", "sycl")
DEVICE_LABELS = {"cpu": "CPU", "cuda": "CUDA", "metal": "Metal", "hip": "ROCm/HIP", "vulkan": "Vulkan", "sycl": "SYCL"}


def hw_backend(hw: HardwareProfile) -> str:
    """The GPU backend a runtime that ships its own GPU libraries (Ollama, MLC) would use here."""
    if hw.apple:
        return "metal"
    vendors = {g.vendor for g in hw.gpus if not g.integrated}
    return "cuda" if "nvidia" in vendors else "hip" if "amd" in vendors else "vulkan" if vendors else "cpu"


def memory_budget(
    runtime: str,
    backend: str,
    status: RuntimeStatus,
    hw: HardwareProfile,
    asked_device: str | None,
    n_gpu_layers: int | None,
) -> tuple[Budget, str | None]:
    """The memory this plan may use, and why it runs on the CPU when it does.

    ``backend`` is the GPU backend ``runtime`` would use here, as its placement policy says
    (:meth:`localrun.planning.policies.PlacementPolicy.backend`); "cpu" for none.

    Raises:
        ConfigError: an unknown device name.
        RuntimeUnavailable: a GPU asked for that the runtime cannot use here.
    """
    device = (asked_device or "auto").lower().replace("rocm", "hip")
    if device not in DEVICES:
        raise ConfigError(f"unknown device {asked_device!r}", hint="use one of: " + ", ".join(DEVICES), param="device")
    cpu = Budget("cpu", hw.ram_available)
    if device == "cpu" or n_gpu_layers == 0:
        return cpu, "CPU requested"
    wants_gpu = device != "auto" or (n_gpu_layers or 0) != 0
    if backend == "cpu":
        return cpu, _why_cpu_only(runtime, status, hw, wants_gpu)
    if device not in ("auto", "gpu") and device != backend:
        raise RuntimeUnavailable(
            f"{runtime} here uses {backend.upper()}, not {device.upper()}", hint=status.fix, param="device"
        )
    if backend == "metal":
        if not hw.apple:
            return cpu, f"{runtime} is built for Metal but this is not an Apple Silicon Mac"
        gpu_budget = min(hw.apple.gpu_working_set_budget, hw.ram_available)
        return Budget("metal", hw.ram_available, gpu_budget, unified=True, label=f"Metal ({hw.apple.chip})"), None
    vendors = BACKEND_VENDORS.get(backend, {"nvidia", "amd", "intel"})
    gpus = [g for g in hw.gpus if g.vendor in vendors and not g.integrated]
    if not gpus:
        if wants_gpu:
            raise RuntimeUnavailable(f"{runtime} uses {backend.upper()} but no GPU for it was found", param="device")
        return cpu, f"{runtime} is built with {backend.upper()} but no GPU for it was found"
    return _gpus_budget(backend, status, hw, gpus), None


def _why_cpu_only(runtime: str, status: RuntimeStatus, hw: HardwareProfile, wants_gpu: bool) -> str:
    """Why a runtime whose build drives no GPU runs on the CPU (an error when a GPU was asked for)."""
    if wants_gpu:
        raise RuntimeUnavailable(
            f"{runtime} here cannot use a GPU: {status.reason or 'it is built for the CPU only'}",
            hint=status.fix,
            param="device",
        )
    if hw.gpus or hw.apple:
        gpu = hw.apple.chip if hw.apple else hw.gpus[0].name
        return f"{runtime} is built without GPU offload, so the {gpu} goes unused" + (
            f" (to use it: {status.fix})" if status.fix else ""
        )
    return "no GPU on this machine"


def _gpus_budget(backend: str, status: RuntimeStatus, hw: HardwareProfile, gpus: list[GpuInfo]) -> Budget:
    """The budget of the discrete GPUs ``backend`` drives, in llama.cpp's order, each less the margin."""
    devices = gpu_devices(status.details.get("devices"), gpus, VRAM_MARGIN)
    usable = sum(free for _, free in devices)
    distinct = list(dict.fromkeys(name for name, _ in devices))
    names = distinct[0] + f" ×{len(devices)}" if len(distinct) == 1 and len(devices) > 1 else " + ".join(distinct)
    return Budget(
        backend,
        hw.ram_available,
        usable,
        gpu_margin=VRAM_MARGIN * len(devices),
        label=f"{DEVICE_LABELS.get(backend, backend)} ({names})",
        gpu_free=tuple(free for _, free in devices) if len(devices) > 1 else (),
    )


def build_words(has: str, could: str) -> str:
    """The installed llama.cpp build's backend next to the one this machine could use, in words."""
    built, usable = DEVICE_LABELS.get(has, has), DEVICE_LABELS.get(could, could)
    if has == could:
        return f"llama.cpp built for {built}: the build this machine calls for"
    return f"llama.cpp built for {built}, but this machine could use {usable}"
