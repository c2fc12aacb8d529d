"""What this machine has: CPU, RAM, GPUs and Apple unified memory, as plain data.

The data (:class:`HardwareProfile`) is separate from its detection
(:func:`detect_hardware`) so the planner and its tests work from JSON profiles of a Mac,
an RTX desktop or a CPU-only laptop. Detection is a handful of small detectors; each
catches and logs its own failures, because a broken ``nvidia-smi`` or an odd sysfs must
never stop localrun from running on the CPU. Every source a detector reads is injectable
(``root`` for /proc and /sys, ``run`` for sysctl, ``nvml`` for a pynvml-like module,
``vm`` for a psutil-like module) so tests replay recorded outputs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import platform
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localrun.planning.gpus import GIB, GpuInfo, detect_amd, detect_nvidia, read_int

if TYPE_CHECKING:
    from rich.text import Text

log = logging.getLogger(__name__)

MIB = 1024**2

#: x86 /proc/cpuinfo flags that matter to llama.cpp's CPU kernels, reported as is.
_X86_FLAGS = frozenset(
    "sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx_vnni amx_tile amx_int8".split()
)
#: arm64 /proc/cpuinfo features, renamed to the names llama.cpp prints.
_ARM_FEATURES = {"asimd": "neon", "asimddp": "dotprod", "asimdhp": "fp16", "sve": "sve", "sve2": "sve2", "i8mm": "i8mm"}
#: macOS ``sysctl hw.optional`` names, renamed the same way.
_MAC_FEATURES = {
    "hw.optional.arm64": "neon",
    "hw.optional.arm.FEAT_DotProd": "dotprod",
    "hw.optional.arm.FEAT_FP16": "fp16",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.avx1_0": "avx",
    "hw.optional.avx2_0": "avx2",
    "hw.optional.fma": "fma",
    "hw.optional.f16c": "f16c",
    "hw.optional.avx512f": "avx512f",
}
#: Below this much unified memory macOS lets the GPU wire about 2/3 of it, above about 3/4
#: (observed recommendedMaxWorkingSetSize: 16 GB → 10.67 GB, 128 GB → 96 GB).
APPLE_BUDGET_THRESHOLD = 36 * GIB


@dataclass(frozen=True)
class AppleInfo:
    chip: str
    unified_memory: int
    gpu_working_set_budget: int  # what Metal lets the GPU keep resident


@dataclass(frozen=True)
class HardwareProfile:
    os: str  # "linux" | "darwin" | "windows"
    arch: str  # "x86_64" | "arm64"
    cpu_model: str
    physical_cores: int
    logical_cores: int
    cpu_flags: tuple[str, ...] = ()
    ram_total: int = 0
    ram_available: int = 0
    gpus: tuple[GpuInfo, ...] = ()
    apple: AppleInfo | None = None
    notes: tuple[str, ...] = ()  # detectors that failed, in words

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HardwareProfile:
        d = dict(d)
        d["cpu_flags"] = tuple(d.get("cpu_flags") or ())
        d["gpus"] = tuple(GpuInfo(**g) for g in d.get("gpus") or ())
        d["apple"] = AppleInfo(**d["apple"]) if d.get("apple") else None
        d["notes"] = tuple(d.get("notes") or ())
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> HardwareProfile:
        return cls.from_dict(json.loads(text))


Runner = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str]) -> str:
    """Run a short system command and return its stdout; raises OSError/SubprocessError."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=3, check=True).stdout


@dataclass(frozen=True)
class _Sources:
    root: Path
    run: Runner
    nvml: Any
    vm: Any
    system: str
    machine: str
    env: Mapping[str, str]


def detect_hardware(
    *,
    root: Path | str = "/",
    run: Runner | None = None,
    nvml: Any = None,
    vm: Any = None,
    system: str | None = None,
    machine: str | None = None,
    env: Mapping[str, str] | None = None,
) -> HardwareProfile:
    """Detect this machine. Never raises: a failing detector becomes a line in ``notes``.

    Args:
        root: prefix for /proc and /sys (a fake tree in tests).
        run: runs a command (``sysctl``) and returns stdout; default :func:`run_command`.
        nvml: a pynvml-like module; default ``import pynvml`` (absent is a normal answer).
        vm: a psutil-like module; default ``psutil``.
        system, machine: ``platform.system()`` / ``platform.machine()`` overrides.
        env: environment (``CUDA_VISIBLE_DEVICES``); default ``os.environ``.
    """
    src = _Sources(
        root=Path(root),
        run=run or run_command,
        nvml=nvml,
        vm=vm,
        system=(system or platform.system()).lower(),
        machine=(machine or platform.machine()).lower(),
        env=os.environ if env is None else env,
    )
    notes: list[str] = []

    def attempt(label: str, detector: Callable[[_Sources], Any], default: Any) -> Any:
        try:
            return detector(src)
        except Exception as exc:  # a detector's bug or an odd machine must not stop detection
            log.warning("hardware detection: %s failed: %s", label, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            notes.append(f"{label} detection failed: {exc}")
            return default

    arch = attempt("architecture", _detect_arch, src.machine)
    cpu_model, flags = attempt("CPU", _detect_cpu, ("unknown CPU", ()))
    physical, logical, total, available = attempt("memory and cores", _detect_memory_and_cores, (1, 1, 0, 0))
    apple = attempt("Apple Silicon", _detect_apple, None)
    gpus = attempt("NVIDIA GPU", lambda s: detect_nvidia(s.nvml, s.env), ()) + attempt(
        "AMD GPU", lambda s: detect_amd(s.root), ()
    )
    return HardwareProfile(
        os=src.system,
        arch=arch,
        cpu_model=cpu_model,
        physical_cores=physical,
        logical_cores=logical,
        cpu_flags=tuple(flags),
        ram_total=total,
        ram_available=available,
        gpus=tuple(gpus),
        apple=apple,
        notes=tuple(notes),
    )


def _sysctl(src: _Sources, name: str) -> str | None:
    """One sysctl value, or None where the key does not exist on this machine."""
    try:
        return src.run(["sysctl", "-n", name]).strip() or None
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("sysctl %s: %s", name, exc)
        return None


def _detect_arch(src: _Sources) -> str:
    arch = {"amd64": "x86_64", "aarch64": "arm64"}.get(src.machine, src.machine)
    if src.system == "darwin" and arch == "x86_64" and _sysctl(src, "sysctl.proc_translated") == "1":
        return "arm64"  # a Python under Rosetta on Apple Silicon
    return arch


def _detect_cpu(src: _Sources) -> tuple[str, tuple[str, ...]]:
    if src.system == "darwin":
        model = _sysctl(src, "machdep.cpu.brand_string") or platform.processor() or "unknown CPU"
        try:
            listing = src.run(["sysctl", "hw.optional"])
        except (OSError, subprocess.SubprocessError) as exc:
            log.debug("sysctl hw.optional: %s", exc)
            listing = ""
        flags = set()
        for line in listing.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in _MAC_FEATURES and value.strip() == "1":
                flags.add(_MAC_FEATURES[key.strip()])
        return model, tuple(sorted(flags))
    cpuinfo = src.root / "proc" / "cpuinfo"
    if cpuinfo.is_file():
        return _parse_cpuinfo(cpuinfo.read_text(errors="replace"))
    return platform.processor() or src.machine or "unknown CPU", ()


def _parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """Model and the flags that matter from the first processor block of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    model = fields.get("model name") or fields.get("hardware") or fields.get("cpu model") or "unknown CPU"
    flags = set(fields.get("flags", "").split()) & _X86_FLAGS
    flags |= {_ARM_FEATURES[f] for f in fields.get("features", "").split() if f in _ARM_FEATURES}
    return model, tuple(sorted(flags))


def _detect_memory_and_cores(src: _Sources) -> tuple[int, int, int, int]:
    vm = src.vm
    if vm is None:
        import psutil as vm
    mem = vm.virtual_memory()
    total, available = int(mem.total), int(mem.available)
    logical = int(vm.cpu_count() or 1)
    physical = int(vm.cpu_count(logical=False) or logical)
    # In a container the cgroup limits are what this process may really use.
    limit = read_int(src.root / "sys" / "fs" / "cgroup" / "memory.max")
    if limit is not None and limit < total:
        used = read_int(src.root / "sys" / "fs" / "cgroup" / "memory.current") or 0
        total, available = limit, max(0, min(available, limit - used))
    cpus = _cgroup_cpus(src.root / "sys" / "fs" / "cgroup" / "cpu.max")
    if cpus is not None:
        logical, physical = min(logical, cpus), min(physical, cpus)
    return physical, logical, total, available


def _cgroup_cpus(path: Path) -> int | None:
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def apple_gpu_budget(unified_memory: int, wired_limit_mb: int | None = None) -> int:
    """Metal's GPU working-set budget: the user's ``iogpu.wired_limit_mb`` if set, else macOS's default share."""
    if wired_limit_mb:
        return wired_limit_mb * MIB
    share = 2 / 3 if unified_memory < APPLE_BUDGET_THRESHOLD else 3 / 4
    return int(unified_memory * share)


def _detect_apple(src: _Sources) -> AppleInfo | None:
    if src.system != "darwin":
        return None
    if _sysctl(src, "hw.optional.arm64") != "1":
        return None  # an Intel Mac: no unified memory for a GPU
    memsize = int(_sysctl(src, "hw.memsize") or 0)
    chip = _sysctl(src, "machdep.cpu.brand_string") or "Apple Silicon"
    wired = _sysctl(src, "iogpu.wired_limit_mb")
    return AppleInfo(
        chip=chip, unified_memory=memsize, gpu_working_set_budget=apple_gpu_budget(memsize, int(wired or 0))
    )


def human_bytes(n: int | float | None) -> str:
    """Binary units, the ones ``plan`` and ``hw`` give memory in, so a model's size and the RAM it
    needs read alike in the CLI, the TUI and the page: ``93.8 MiB``, ``241 MiB``, ``4.1 GiB``."""
    if n is None:
        return "—"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{size:.0f} B"
            return f"{size:.0f} {unit}" if abs(size) >= 100 and unit in ("KiB", "MiB") else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - the loop always returns


def fmt_bytes(n: int | float) -> str:
    """Bytes in the unit people read: ``23.5 GiB``, ``512 MiB``."""
    if abs(n) >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.0f} MiB"


def render_hardware(profile: HardwareProfile) -> Text:
    """A rich ``Text`` for ``localrun hw`` (plain text: no markup is read from GPU names)."""
    from rich.text import Text

    return Text("\n".join(hardware_lines(profile)))


def hardware_lines(profile: HardwareProfile) -> list[str]:
    """Plain lines for ``localrun hw`` and the TUI's hardware screen."""
    p = profile
    lines = [
        f"OS/arch   {p.os} {p.arch}",
        f"CPU       {p.cpu_model} — {p.physical_cores} physical / {p.logical_cores} logical cores",
        f"CPU flags {', '.join(p.cpu_flags) or 'none detected'}",
        f"RAM       {fmt_bytes(p.ram_available)} available of {fmt_bytes(p.ram_total)}",
    ]
    if p.apple:
        a = p.apple
        lines.append(
            f"Apple     {a.chip}: {fmt_bytes(a.unified_memory)} unified, GPU budget "
            f"{fmt_bytes(a.gpu_working_set_budget)}"
        )
    for g in p.gpus:
        extra = [
            x
            for x in (
                f"driver {g.driver}" if g.driver else None,
                f"CUDA {g.cuda_version}" if g.cuda_version else None,
                f"compute {g.compute_capability}" if g.compute_capability else None,
                "integrated" if g.integrated else None,
            )
            if x
        ]
        lines.append(
            f"GPU {g.index}     {g.vendor} {g.name}: {fmt_bytes(g.vram_free)} free of {fmt_bytes(g.vram_total)}"
            + (f" ({', '.join(extra)})" if extra else "")
        )
    if not p.gpus and not p.apple:
        lines.append("GPU       none detected")
    lines.extend(f"note      {n}" for n in p.notes)
    return lines
