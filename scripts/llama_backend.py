#!/usr/bin/env python3
"""Which llama.cpp build this machine gets, and making the venv hold exactly that build.

`scripts/dev setup` runs ``llama_backend.py ensure`` with the venv's python before it installs
localrun, so pip finds llama-cpp-python already satisfied and never compiles a build of its own
choosing. Python rather than bash because the choice is a small decision table (force, Apple,
NVIDIA, AMD, Vulkan, CPU with or without AMX) plus a wheelhouse lookup, and each branch is tested
by running this file with ``nvidia-smi``/``nvcc``/``hipcc``/``glslc``/``uname`` stubbed on PATH
(tests/core/test_setup_backend.py). Standard library only: it runs before anything is installed.

The wheelhouse (``$XDG_CACHE_HOME/localrun/wheels/<version>-<key>/``) keeps one built wheel per
llama-cpp-python version, backend and architecture (``cuda-sm90``, ``cpu-noamx-<isa hash>``…):
pip's own cache keys a built wheel by its source, not by ``CMAKE_ARGS``, and would hand a CPU
wheel to a later CUDA install. Builds here always pass ``--no-cache-dir``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_INFO = ROOT / "runtimes" / "llamacpp" / "build_info.py"
BACKENDS = ("cpu", "cuda", "metal", "hip", "vulkan")
BASE_CMAKE = "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
DEFAULT_SPEC = "llama-cpp-python>=0.3.30,<0.4"
#: /proc/cpuinfo flag -> ggml CMake option, the order scripts/dev always used (the isa hash depends on it).
_ISA = (
    ("sse4_2", "SSE42"),
    ("avx", "AVX"),
    ("avx2", "AVX2"),
    ("fma", "FMA"),
    ("f16c", "F16C"),
    ("bmi2", "BMI2"),
    ("avx_vnni", "AVX_VNNI"),
    ("avx512f", "AVX512"),
    ("avx512vbmi", "AVX512_VBMI"),
    ("avx512_vnni", "AVX512_VNNI"),
    ("avx512_bf16", "AVX512_BF16"),
)
NO_AMX = "-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"


@dataclass
class Decision:
    backend: str  # what gets built: cpu, cuda, metal, hip, vulkan
    reason: str  # the one line set-up prints
    cmake_args: str  # the backend's own CMake options (BASE_CMAKE goes in front)
    key: str  # the wheelhouse key, without the version: cuda-sm90, cpu-noamx-<hash>…
    fix: str | None = None  # a GPU is here but its toolkit is not: what gives the GPU build
    noamx: bool = False  # the build must not contain AMX kernels

    def line(self) -> str:
        text = f"llama.cpp build: {self.backend.upper()} ({self.reason})"
        return text + (f"\n  fix: {self.fix}" if self.fix else "")


def _run(cmd: list[str]) -> str | None:
    """A tool's stdout, or None when it is missing or fails (no GPU, no driver)."""
    exe = shutil.which(cmd[0])
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _tool(name: str, *fallbacks: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    return next((f for f in fallbacks if f and Path(f).is_file() and os.access(f, os.X_OK)), None)


def cuda_archs() -> list[str]:
    """The compute capabilities of the cards present, as CMake wants them: 9.0 -> 90, deduplicated."""
    out = _run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]) or ""
    caps = {m.group(1) + m.group(2) for m in re.finditer(r"^\s*(\d+)\.(\d+)\s*$", out, re.MULTILINE)}
    return sorted(caps, key=int)


def nvidia_names() -> list[str]:
    out = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) or ""
    return [line.strip() for line in out.splitlines() if line.strip()]


def amd_targets() -> list[str]:
    out = _run(["amdgpu-arch"]) or _run(["rocminfo"]) or ""
    return sorted(set(re.findall(r"\bgfx[0-9a-f]+\b", out)))


def vulkan_loader() -> bool:
    out = _run(["ldconfig", "-p"])
    if out is not None:
        return "libvulkan.so" in out
    return any(Path(d, "libvulkan.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"))


def vulkan_gpu() -> bool | None:
    """Whether vulkaninfo lists a real GPU (not llvmpipe); None without vulkaninfo."""
    out = _run(["vulkaninfo", "--summary"])
    if out is None:
        return None
    return bool(re.search(r"PHYSICAL_DEVICE_TYPE_(DISCRETE|INTEGRATED|VIRTUAL)_GPU", out))


def cpuinfo_flags() -> set[str]:
    path = Path(os.environ.get("LOCALRUN_CPUINFO", "/proc/cpuinfo"))
    try:
        text = path.read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cpu_decision(system: str, machine: str, why: str) -> Decision:
    """The CPU build: native, except that an AMX CPU names its own extensions and leaves AMX out
    (llama.cpp's AMX kernels crash llama-cpp-python 0.3.36 on the first decode of a Q4_K model)."""
    flags = cpuinfo_flags() if (system, machine) == ("Linux", "x86_64") else set()
    if "amx_int8" in flags:
        args = NO_AMX + "".join(f" -DGGML_{opt}=ON" for flag, opt in _ISA if flag in flags)
        digest = hashlib.sha1(args.encode()).hexdigest()[:10]  # as scripts/dev always keyed it
        return Decision(
            "cpu", f"{why}; this CPU has AMX, built without its AMX kernels", args, f"cpu-noamx-{digest}", None, True
        )
    digest = hashlib.sha1(" ".join(sorted(flags)).encode()).hexdigest()[:10] if flags else machine
    return Decision("cpu", why, "", f"cpu-native-{digest}")


def _cuda(nvcc: str | None, archs: list[str], names: list[str]) -> Decision:
    args = "-DGGML_CUDA=ON"
    if archs:
        args += " -DCMAKE_CUDA_ARCHITECTURES=" + ";".join(archs)
    if nvcc and not shutil.which("nvcc"):
        args += f" -DCMAKE_CUDA_COMPILER={nvcc}"
    key = "cuda-" + ("_".join(f"sm{a}" for a in archs) if archs else "all")
    what = ", ".join(dict.fromkeys(names)) or "no NVIDIA GPU visible"
    return Decision("cuda", f"{what}; nvcc {nvcc or '?'}; sm_{'/'.join(archs) or 'default list'}", args, key)


def _hip(targets: list[str]) -> Decision:
    args = "-DGGML_HIP=ON" + (" -DGPU_TARGETS=" + ";".join(targets) if targets else "")
    key = "hip-" + ("_".join(targets) if targets else "all")
    return Decision("hip", f"ROCm hipcc; targets {', '.join(targets) or 'all'}", args, key)


def _apple(machine: str) -> Decision:
    why = "Apple Silicon" if machine == "arm64" else "macOS: llama-cpp-python builds Metal on every Mac"
    return Decision("metal", why, "-DGGML_METAL=ON", f"metal-{machine}")


def detect() -> Decision:
    """The build for this machine, from what is on PATH; LOCALRUN_LLAMA_BACKEND forces one."""
    system = (_run(["uname", "-s"]) or "").strip()
    machine = (_run(["uname", "-m"]) or "").strip()
    nvcc = _tool("nvcc", os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
    hipcc = _tool("hipcc", "/opt/rocm/bin/hipcc")
    forced = os.environ.get("LOCALRUN_LLAMA_BACKEND", "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise SystemExit(f"LOCALRUN_LLAMA_BACKEND={forced}: use one of {', '.join(BACKENDS)}")
        d = {
            "cpu": lambda: cpu_decision(system, machine, "LOCALRUN_LLAMA_BACKEND=cpu"),
            "cuda": lambda: _cuda(nvcc, cuda_archs(), nvidia_names()),
            "metal": lambda: _apple(machine),
            "hip": lambda: _hip(amd_targets()),
            "vulkan": lambda: Decision("vulkan", "Vulkan", "-DGGML_VULKAN=ON", "vulkan"),
        }[forced]()
        d.reason = f"forced by LOCALRUN_LLAMA_BACKEND; {d.reason}" if forced != "cpu" else d.reason
        return d
    if system == "Darwin":
        return _apple(machine)
    archs, amd = cuda_archs(), amd_targets()
    vulkan = shutil.which("glslc") is not None and vulkan_loader() and vulkan_gpu() is not False
    missing: list[tuple[str, str]] = []  # (what is missing, the fix)
    if archs:
        if nvcc:
            return _cuda(nvcc, archs, nvidia_names())
        gpu = ", ".join(dict.fromkeys(nvidia_names())) or "an NVIDIA GPU"
        missing.append(
            (
                f"{gpu} but no CUDA toolkit (nvcc)",
                "install the CUDA toolkit so that nvcc is on PATH (https://developer.nvidia.com/cuda-downloads), "
                "then run scripts/dev setup again; it builds with "
                f'CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES={";".join(archs)}"',
            )
        )
    if amd or _run(["rocm-smi"]) is not None:
        if hipcc:
            return _hip(amd)
        missing.append(
            (
                "an AMD GPU but no ROCm hipcc",
                "install ROCm's HIP SDK (hipcc), then run scripts/dev setup again; it builds with "
                f'CMAKE_ARGS="-DGGML_HIP=ON{" -DGPU_TARGETS=" + ";".join(amd) if amd else ""}"',
            )
        )
    if vulkan:
        why = "Vulkan SDK (glslc and the loader)"
        d = Decision("vulkan", why + (f"; {missing[0][0]}" if missing else ""), "-DGGML_VULKAN=ON", "vulkan")
        d.fix = missing[0][1] if missing else None
        return d
    if missing:
        d = cpu_decision(system, machine, missing[0][0])
        d.fix = missing[0][1]
        return d
    return cpu_decision(system, machine, "no GPU toolkit found (nvcc, hipcc, glslc)")


# --- the wheelhouse -------------------------------------------------------------------------------


def wheelhouse_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localrun" / "wheels"


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", v))


def find_wheel(root: Path, key: str, version: str | None) -> Path | None:
    """The kept wheel for ``key`` (``version``, else the newest), also in scripts/dev's older
    layout ``wheels/<key>/`` (copied forward, never moved: other checkouts may still read it)."""
    found: dict[str, Path] = {}
    for wheel in root.glob(f"*-{key}/llama_cpp_python-*.whl"):
        if wheel.parent.name.endswith(f"-{key}"):
            found.setdefault(wheel.name.split("-")[1], wheel)
    for wheel in (root / key).glob("llama_cpp_python-*.whl"):
        v = wheel.name.split("-")[1]
        if v not in found:
            target = root / f"{v}-{key}" / wheel.name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copy2(wheel, target)
            found[v] = target
    if version is not None:
        return found.get(version)
    return found[max(found, key=_version_key)] if found else None


def installed(venv_python: str) -> dict:
    """What the venv holds now, from runtimes/llamacpp/build_info.py run by its python."""
    # Absolute, not resolved (the venv's python is a symlink out of the venv); run from / so that
    # a checkout in the cwd cannot shadow the installed llama_cpp.
    probe = (
        "import importlib.util, json, sys; "
        "spec = importlib.util.spec_from_file_location('build_info', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "print(json.dumps(m.describe_installed()))"
    )
    cmd = [os.path.abspath(venv_python), "-c", probe, str(BUILD_INFO)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {"installed": False}


def plan(decision: Decision, have: dict, root: Path) -> tuple[str, Path | None, str | None]:
    """("keep"|"install"|"build", the wheel to install, the version to build)."""
    if have.get("installed") and have.get("backend") == decision.backend and not (decision.noamx and have.get("amx")):
        return "keep", None, None
    version = have.get("version") if have.get("installed") else None
    wheel = find_wheel(root, decision.key, version)
    if wheel is not None:
        return "install", wheel, None
    return "build", None, version


def _spec() -> str:
    try:
        import tomllib

        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        return next(r for r in extras["llama"] if r.startswith("llama-cpp-python"))
    except (ImportError, OSError, KeyError, StopIteration):
        return DEFAULT_SPEC


def ensure(venv_python: str, dry_run: bool = False) -> int:
    decision = detect()
    print(decision.line(), file=sys.stderr)
    root = wheelhouse_root()
    have = installed(venv_python)
    action, wheel, version = plan(decision, have, root)
    pip = [venv_python, "-m", "pip"]
    if action == "keep":
        return 0
    if have.get("installed"):
        print(
            f"note: the installed llama.cpp build is {str(have.get('backend')).upper()}"
            f"{' with AMX kernels' if have.get('amx') else ''}; this machine gets {decision.backend.upper()}",
            file=sys.stderr,
        )
    if action == "install":
        return _install(pip, wheel, dry_run)
    cmake = " ".join(filter(None, [os.environ.get("CMAKE_ARGS") or BASE_CMAKE, decision.cmake_args]))
    env = {**os.environ, "CMAKE_ARGS": cmake}
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    req = f"llama-cpp-python=={version}" if version else _spec()
    print(f"building llama-cpp-python ({req}) for {decision.backend.upper()}: CMAKE_ARGS={cmake}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="localrun-llama-") as tmp:
        rc = _do([*pip, "wheel", "-q", "--no-cache-dir", "--no-deps", "-w", tmp, req], dry_run, env)
        if rc or dry_run:
            return rc
        built = next(Path(tmp).glob("llama_cpp_python-*.whl"))
        folder = root / f"{built.name.split('-')[1]}-{decision.key}"
        folder.mkdir(parents=True, exist_ok=True)
        kept = folder / built.name
        shutil.move(str(built), kept)
    rc = _install(pip, kept, dry_run)
    now = installed(venv_python)
    if rc == 0 and now.get("backend") != decision.backend:
        print(f"error: the build says it is {now.get('backend')}, not {decision.backend}", file=sys.stderr)
        return 1
    return rc


def _install(pip: list[str], wheel: Path, dry_run: bool) -> int:
    """Put ``wheel`` in the venv in place of whatever llama-cpp-python it holds, then its own
    dependencies (numpy, typing-extensions, jinja2, diskcache): the forced reinstall takes no
    dependencies (it would reinstall numpy every time), and on a fresh venv without them
    ``import llama_cpp`` fails, so the build's check read "None" and set-up stopped."""
    rc = _do([*pip, "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], dry_run)
    return rc or _do([*pip, "install", "-q", str(wheel)], dry_run)


def _do(cmd: list[str], dry_run: bool, env: dict | None = None) -> int:
    if dry_run:
        prefix = f"CMAKE_ARGS={env['CMAKE_ARGS']!r} " if env else ""
        print("would run: " + prefix + " ".join(cmd))
        return 0
    return subprocess.run(cmd, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("detect", help="print the decision as JSON")
    e = sub.add_parser("ensure", help="make the venv hold this machine's build")
    e.add_argument("--venv-python", default=sys.executable)
    e.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "detect":
        d = detect()
        print(json.dumps({**asdict(d), "line": d.line(), "cmake": " ".join(filter(None, [BASE_CMAKE, d.cmake_args]))}))
        return 0
    return ensure(args.venv_python, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
