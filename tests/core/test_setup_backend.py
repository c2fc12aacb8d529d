"""Set-up's choice of llama.cpp build (scripts/llama_backend.py) for each machine shape, with the
tools it asks (``uname``, ``nvidia-smi``, ``nvcc``, ``hipcc``, ``amdgpu-arch``, ``rocminfo``,
``glslc``, ``ldconfig``) stubbed as shell scripts in a temp dir that is the whole PATH; and the
wheelhouse rule that a build of another backend is swapped, never kept."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "llama_backend.py"
#: Every flag the AMX rule names, as this project's CI machine (Sapphire Rapids) reports them.
AMX_FLAGS = "fpu sse4_2 avx avx2 fma f16c bmi2 avx_vnni avx512f avx512vbmi avx512_vnni avx512_bf16 amx_tile amx_int8"
#: What scripts/dev's bash cpu_isa_args printed for those flags before this script took it over.
OLD_BASH_ISA = (
    "-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_SSE42=ON -DGGML_AVX=ON "
    "-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON "
    "-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
)


def _load():
    spec = importlib.util.spec_from_file_location("llama_backend", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("llama_backend", mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


lb = _load()


class Machine:
    """A PATH of stub tools and a cpuinfo file; ``detect()`` runs the script against them."""

    def __init__(self, tmp: Path, system="Linux", machine="x86_64", flags="fpu sse4_2 avx avx2 fma"):
        self.bin = tmp / "bin"
        self.bin.mkdir(parents=True)
        self.cpuinfo = tmp / "cpuinfo"
        self.cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        self.env = {"PATH": str(self.bin), "LOCALRUN_CPUINFO": str(self.cpuinfo), "HOME": str(tmp)}
        self.env["XDG_CACHE_HOME"] = str(tmp / "cache")
        self.env["CUDA_HOME"] = str(tmp / "no-cuda")
        self.tool("uname", f'case "$1" in -s) echo {system} ;; -m) echo {machine} ;; esac')

    def tool(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)

    def nvidia(self, caps=("9.0",), names=("NVIDIA H200",)):
        caps_out, names_out = "\\n".join(caps), "\\n".join(names)
        self.tool(
            "nvidia-smi", f'case "$1" in *compute_cap) printf "{caps_out}\\n" ;; *name) printf "{names_out}\\n" ;; esac'
        )

    def detect(self, **env) -> dict:
        out = subprocess.run(
            [sys.executable, str(SCRIPT), "detect"], env={**self.env, **env}, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


@pytest.fixture
def box(tmp_path):
    return Machine(tmp_path)


def test_a_bare_linux_box_gets_the_native_cpu_build(box):
    d = box.detect()
    assert d["backend"] == "cpu" and d["cmake_args"] == "" and d["fix"] is None
    assert d["cmake"] == lb.BASE_CMAKE and d["key"].startswith("cpu-native-")
    assert d["line"] == "llama.cpp build: CPU (no GPU toolkit found (nvcc, hipcc, glslc))"


def test_an_amx_cpu_keeps_the_old_rule_and_the_old_wheelhouse_key(tmp_path):
    """What scripts/dev did on this project's machine, byte for byte: the same CMake flags and the
    same wheelhouse key (sha1 of the flags, as `printf %s "$isa" | sha1sum | cut -c1-10`)."""
    d = Machine(tmp_path, flags=AMX_FLAGS).detect()
    assert d["cmake_args"] == OLD_BASH_ISA and d["noamx"] is True
    assert d["key"] == "cpu-noamx-" + hashlib.sha1(OLD_BASH_ISA.encode()).hexdigest()[:10]
    assert "built without its AMX kernels" in d["line"]


def test_nvidia_with_nvcc_builds_cuda_for_the_cards_present_only(box):
    box.nvidia(caps=("9.0", "9.0", "8.6"), names=("NVIDIA H200", "NVIDIA H200", "NVIDIA RTX A6000"))
    box.tool("nvcc", "echo 'Cuda compilation tools, release 13.0'")
    d = box.detect()
    assert d["backend"] == "cuda" and d["fix"] is None
    assert d["cmake_args"] == "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=86;90"
    assert d["key"] == "cuda-sm86_sm90"
    assert d["line"].startswith("llama.cpp build: CUDA (NVIDIA H200, NVIDIA RTX A6000; nvcc ")


def test_nvcc_outside_path_is_named_to_cmake(box, tmp_path):
    box.nvidia()
    cuda = tmp_path / "cuda" / "bin"
    cuda.mkdir(parents=True)
    (cuda / "nvcc").write_text("#!/bin/sh\n")
    (cuda / "nvcc").chmod(0o755)
    d = box.detect(CUDA_HOME=str(tmp_path / "cuda"))
    assert d["backend"] == "cuda" and f"-DCMAKE_CUDA_COMPILER={cuda / 'nvcc'}" in d["cmake_args"]


def test_an_nvidia_gpu_without_its_toolkit_gets_cpu_and_the_fix(box):
    box.nvidia(caps=("8.9",), names=("NVIDIA GeForce RTX 4090",))
    d = box.detect()
    assert d["backend"] == "cpu" and "NVIDIA GeForce RTX 4090 but no CUDA toolkit (nvcc)" in d["line"]
    assert 'CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=89"' in d["fix"]
    assert "nvcc is on PATH" in d["fix"] and "scripts/dev setup" in d["fix"]
    assert "\n  fix: " in d["line"]


def test_rocm_with_hipcc_builds_hip_for_its_targets(box):
    box.tool("hipcc", "true")
    box.tool("amdgpu-arch", "echo gfx1100; echo gfx1100")
    d = box.detect()
    assert (d["backend"], d["cmake_args"], d["key"]) == ("hip", "-DGGML_HIP=ON -DGPU_TARGETS=gfx1100", "hip-gfx1100")


def test_an_amd_gpu_without_hipcc_gets_cpu_and_the_fix(box):
    box.tool("rocminfo", "echo '  Name: gfx90a'")
    d = box.detect()
    assert d["backend"] == "cpu" and "no ROCm hipcc" in d["line"]
    assert 'CMAKE_ARGS="-DGGML_HIP=ON -DGPU_TARGETS=gfx90a"' in d["fix"]


def test_a_vulkan_sdk_with_its_loader_builds_vulkan(box):
    box.tool("glslc", "true")
    box.tool("ldconfig", "echo '\tlibvulkan.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libvulkan.so.1'")
    d = box.detect()
    assert (d["backend"], d["cmake_args"], d["key"]) == ("vulkan", "-DGGML_VULKAN=ON", "vulkan")


def test_glslc_without_the_loader_or_without_a_gpu_stays_cpu(box):
    box.tool("glslc", "true")
    box.tool("ldconfig", "echo '\tlibc.so.6'")
    assert box.detect()["backend"] == "cpu"
    box.tool("ldconfig", "echo '\tlibvulkan.so.1'")
    box.tool("vulkaninfo", "echo 'deviceType = PHYSICAL_DEVICE_TYPE_CPU'")  # llvmpipe only
    assert box.detect()["backend"] == "cpu"


def test_nvidia_without_nvcc_but_with_vulkan_takes_vulkan_and_names_the_cuda_fix(box):
    box.nvidia()
    box.tool("glslc", "true")
    box.tool("ldconfig", "echo '\tlibvulkan.so.1'")
    d = box.detect()
    assert d["backend"] == "vulkan" and "CMAKE_CUDA_ARCHITECTURES=90" in d["fix"]


@pytest.mark.parametrize("machine,why", [("arm64", "Apple Silicon"), ("x86_64", "every Mac")])
def test_macos_builds_metal(tmp_path, machine, why):
    d = Machine(tmp_path, system="Darwin", machine=machine).detect()
    assert d["backend"] == "metal" and d["key"] == f"metal-{machine}" and why in d["line"]


def test_the_environment_forces_a_backend(box):
    box.nvidia()
    box.tool("nvcc", "true")
    assert box.detect(LOCALRUN_LLAMA_BACKEND="cpu")["backend"] == "cpu"
    forced = box.detect(LOCALRUN_LLAMA_BACKEND="vulkan")
    assert forced["backend"] == "vulkan" and "forced by LOCALRUN_LLAMA_BACKEND" in forced["line"]
    bare = Machine(box.bin.parent / "bare").detect(LOCALRUN_LLAMA_BACKEND="CUDA")
    assert bare["backend"] == "cuda" and bare["key"] == "cuda-all" and bare["cmake_args"] == "-DGGML_CUDA=ON"
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "detect"],
        env={**box.env, "LOCALRUN_LLAMA_BACKEND": "opencl"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "use one of cpu, cuda, metal, hip, vulkan" in bad.stderr


# --- the wheelhouse: the right wheel, never a stale one -------------------------------------------


def _wheel(folder: Path, version="0.3.36") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"llama_cpp_python-{version}-py3-none-linux_x86_64.whl"
    path.write_bytes(folder.name.encode())
    return path


CUDA = lb.Decision("cuda", "H200", "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90", "cuda-sm90")
CPU = lb.Decision("cpu", "none", "", "cpu-native-abc")
NOAMX = lb.Decision("cpu", "amx", lb.NO_AMX, "cpu-noamx-123", noamx=True)
HAVE_CPU = {"installed": True, "version": "0.3.36", "backend": "cpu", "amx": False}
HAVE_CUDA = {"installed": True, "version": "0.3.36", "backend": "cuda", "amx": False}


def test_a_stale_cpu_build_is_rebuilt_when_cuda_is_wanted(tmp_path):
    _wheel(tmp_path / "0.3.36-cpu-native-abc")  # the CPU wheel in the wheelhouse is not a candidate
    assert lb.plan(CUDA, HAVE_CPU, tmp_path) == ("build", None, "0.3.36")


def test_a_kept_cuda_wheel_is_installed_over_a_cpu_build(tmp_path):
    kept = _wheel(tmp_path / "0.3.36-cuda-sm90")
    _wheel(tmp_path / "0.3.36-cuda-sm86")  # another card's build is not this one
    assert lb.plan(CUDA, HAVE_CPU, tmp_path) == ("install", kept, None)


def test_the_reverse_a_cuda_build_where_cpu_is_wanted(tmp_path):
    assert lb.plan(CPU, HAVE_CUDA, tmp_path) == ("build", None, "0.3.36")
    kept = _wheel(tmp_path / "0.3.36-cpu-native-abc")
    assert lb.plan(CPU, HAVE_CUDA, tmp_path) == ("install", kept, None)


def test_the_right_build_is_kept_and_an_amx_one_is_not(tmp_path):
    assert lb.plan(CUDA, HAVE_CUDA, tmp_path)[0] == "keep"
    assert lb.plan(NOAMX, HAVE_CPU, tmp_path)[0] == "keep"
    assert lb.plan(NOAMX, {**HAVE_CPU, "amx": True}, tmp_path) == ("build", None, "0.3.36")


def test_nothing_installed_takes_the_newest_kept_wheel_or_builds(tmp_path):
    assert lb.plan(CUDA, {"installed": False}, tmp_path) == ("build", None, None)
    _wheel(tmp_path / "0.3.9-cuda-sm90", "0.3.9")
    newest = _wheel(tmp_path / "0.3.36-cuda-sm90")
    assert lb.plan(CUDA, {"installed": False}, tmp_path) == ("install", newest, None)


def test_the_older_wheelhouse_layout_is_copied_forward_not_moved(tmp_path):
    old = _wheel(tmp_path / "cpu-noamx-123")
    action, wheel, _ = lb.plan(NOAMX, {**HAVE_CPU, "amx": True}, tmp_path)
    assert action == "install" and wheel == tmp_path / "0.3.36-cpu-noamx-123" / old.name
    assert old.exists() and wheel.read_bytes() == old.read_bytes()


def _fake_venv_python(tmp_path: Path, report: dict) -> Path:
    """A "python" that answers build_info.py with ``report`` (and would run pip in a real run)."""
    exe = tmp_path / "venv-python"
    exe.write_text(f"#!/bin/sh\necho '{json.dumps(report)}'\n")
    exe.chmod(0o755)
    return exe


def _dry_ensure(box, venv_python) -> subprocess.CompletedProcess:
    """``llama_backend.py ensure --dry-run`` for ``venv_python`` in the box: what it would run."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "ensure", "--venv-python", str(venv_python), "--dry-run"],
        env=box.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ensure_builds_cuda_with_no_pip_cache_into_the_wheelhouse(box, tmp_path):
    box.nvidia()
    box.tool("nvcc", "true")
    py = _fake_venv_python(tmp_path, HAVE_CPU)
    out = _dry_ensure(box, py)
    assert out.returncode == 0, out.stderr
    assert "llama.cpp build: CUDA (NVIDIA H200" in out.stderr
    assert "the installed llama.cpp build is CPU; this machine gets CUDA" in out.stderr
    assert "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90'" in out.stdout
    assert "pip wheel -q --no-cache-dir --no-deps" in out.stdout and "llama-cpp-python==0.3.36" in out.stdout
    py = _fake_venv_python(tmp_path, HAVE_CUDA)
    kept = _dry_ensure(box, py)
    assert kept.returncode == 0 and kept.stdout == "", kept.stdout


def test_a_kept_wheel_is_installed_with_its_dependencies(box, tmp_path):
    """The forced reinstall takes no dependencies; a second, plain install of the same wheel
    brings numpy, typing-extensions and the rest, which a fresh venv lacks (without them the
    build's own check could not import llama_cpp, and a first set-up stopped there)."""
    key = box.detect()["key"]
    wheel = _wheel(tmp_path / "cache" / "localrun" / "wheels" / f"0.3.36-{key}")
    py = _fake_venv_python(tmp_path, {"installed": False})
    out = _dry_ensure(box, py)
    assert out.returncode == 0, out.stderr
    runs = [line for line in out.stdout.splitlines() if line.startswith("would run:")]
    assert runs == [
        f"would run: {py} -m pip install -q --no-deps --force-reinstall {wheel}",
        f"would run: {py} -m pip install -q {wheel}",
    ]


def test_setup_asks_the_script_before_pip_installs_localrun():
    text = (ROOT / "scripts" / "dev").read_text()
    setup = text[text.index("setup() {") :].split("\n}\n")[0]
    assert setup.index("scripts/llama_backend.py ensure") < setup.index('pip install -q -e ".[llama')


def test_this_machine_keeps_what_it_has():
    """On the machine running the tests the installed build is the one set-up would choose (the
    CI machine: CPU without AMX), so `scripts/dev setup` builds nothing."""
    pytest.importorskip("llama_cpp")
    env = {k: v for k, v in os.environ.items() if k != "LOCALRUN_LLAMA_BACKEND"}
    # a relative --venv-python, as scripts/dev passes .venv/bin/python (once read from / by mistake)
    venv_python = os.path.relpath(sys.executable, ROOT)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "ensure", "--venv-python", venv_python, "--dry-run"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if not out.stderr.startswith("llama.cpp build: CPU"):
        pytest.skip("a GPU machine: its build is checked by scripts/gpu-check")
    assert out.returncode == 0 and out.stdout == "", (out.stdout, out.stderr)
