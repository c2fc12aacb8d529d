"""GPU detection for :mod:`localrun.planning.hardware`: NVIDIA through NVML, AMD through sysfs.

Each detector reads injectable sources (an NVML module, a filesystem root, the
environment) so tests replay recorded outputs; each returns an empty tuple when the
vendor's stack is not there.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GIB = 1024**3


@dataclass(frozen=True)
class GpuInfo:
    vendor: str  # "nvidia" | "amd" | "intel"
    name: str
    vram_total: int
    vram_free: int
    driver: str | None = None
    cuda_version: str | None = None  # the driver's CUDA version, e.g. "12.4"
    compute_capability: str | None = None  # e.g. "8.9"
    index: int = 0
    integrated: bool = False  # shares system RAM (small VRAM carve-out): not worth offloading to


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _visible(env: Mapping[str, str], index: int, uuid: str | None) -> bool:
    """Honour CUDA_VISIBLE_DEVICES (indices or UUID prefixes), as CUDA itself would."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return True
    for item in (s.strip() for s in spec.split(",")):
        if item.isdigit() and int(item) == index:
            return True
        if item.startswith("GPU-") and uuid and uuid.startswith(item):
            return True
    return False


def detect_nvidia(nvml: Any, env: Mapping[str, str]) -> tuple[GpuInfo, ...]:
    """NVIDIA GPUs through NVML (``nvml``: pynvml or a stand-in; None imports pynvml).
    No driver or no nvidia-ml-py is the normal answer on most machines: no GPUs."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            log.debug("nvidia-ml-py is not installed: NVIDIA GPUs are not detected")
            return ()
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:  # no driver, no device: the normal answer on most machines
        log.debug("NVML unavailable: %s", exc)
        return ()
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = nvml.nvmlSystemGetCudaDriverVersion()
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle)) if hasattr(nvml, "nvmlDeviceGetUUID") else None
                if not _visible(env, index, uuid):
                    continue
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
                gpus.append(
                    GpuInfo(
                        vendor="nvidia",
                        name=_text(nvml.nvmlDeviceGetName(handle)),
                        vram_total=int(mem.total),
                        vram_free=int(mem.free),
                        driver=driver,
                        cuda_version=cuda_version,
                        compute_capability=f"{major}.{minor}",
                        index=index,
                    )
                )
            except nvml.NVMLError as exc:  # one broken device must not hide the others
                log.warning("NVIDIA GPU %d skipped: %s", index, exc)
        return tuple(gpus)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)


def detect_amd(root: Path) -> tuple[GpuInfo, ...]:
    """AMD GPUs (amdgpu) from sysfs under ``root``: VRAM total and used, the product name."""
    drm = root / "sys" / "class" / "drm"
    if not drm.is_dir():
        return ()
    gpus = []
    cards = sorted((p for p in drm.iterdir() if re.fullmatch(r"card\d+", p.name)), key=lambda p: int(p.name[4:]))
    for card in cards:
        dev = card / "device"
        if read_text(dev / "vendor") != "0x1002":
            continue
        total = read_int(dev / "mem_info_vram_total")
        if total is None:
            log.debug("%s: AMD device without mem_info_vram_total (not amdgpu?)", card)
            continue
        used = read_int(dev / "mem_info_vram_used") or 0
        gtt = read_int(dev / "mem_info_gtt_total") or 0
        name = read_text(dev / "product_name") or f"AMD GPU {read_text(dev / 'device') or '?'}"
        driver = (dev / "driver").resolve().name if (dev / "driver").exists() else None
        gpus.append(
            GpuInfo(
                vendor="amd",
                name=name,
                vram_total=total,
                vram_free=max(0, total - used),
                driver=driver,
                index=int(card.name[4:]),
                integrated=total < GIB and gtt > total,
            )
        )
    return tuple(gpus)


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip() or None
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 0)
    except (OSError, ValueError):
        return None
