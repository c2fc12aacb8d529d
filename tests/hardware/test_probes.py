"""Runtime probes: every case a machine can be in, replayed with fake modules and transports.

Each runtime probes itself (``Runtime.probe`` with keyword-only test hooks); planning's
``probe_runtimes`` is one loop over the registry."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import httpx
import pytest

from localrun.planning.facts import probe_runtimes, status_cells
from localrun.runtimes.llamacpp.probe import llama_backend
from localrun.runtimes.llamacpp.session import LlamaCppRuntime
from localrun.runtimes.mlc import MlcRuntime
from localrun.runtimes.mlx import MlxRuntime
from localrun.runtimes.ollama import OllamaRuntime
from localrun.runtimes.ollama_client import ollama_base_url
from localrun.runtimes.vllm import VllmRuntime
from tests.conftest import needs_llama
from tests.hardware.helpers import profile

CPU_INFO = b"CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | OPENMP = 1 | REPACK = 1 | "
CUDA_INFO = CPU_INFO + b"CUDA : ARCHS = 890 | FORCE_MMQ = 0 | PEER_MAX_BATCH_SIZE = 128 | "
METAL_INFO = b"Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | "
ROCM_INFO = CPU_INFO + b"ROCm : NO_VMM = 1 | PEER_MAX_BATCH_SIZE = 128 | "


def importer(modules: dict):
    """An import_module that serves fakes, and fails like Python for names it does not know."""

    def import_module(name):
        if name in modules:
            value = modules[name]
            if isinstance(value, BaseException):
                raise value
            return value
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    return import_module


def probe_llamacpp(hw, **hooks):
    return LlamaCppRuntime().probe(hw, **hooks)


def probe_mlx(hw, **hooks):
    return MlxRuntime().probe(hw, **hooks)


def probe_ollama(*, env, transport=None):
    return OllamaRuntime(transport=transport).probe(None, env=env)


def probe_mlc(**hooks):
    return MlcRuntime().probe(None, env={}, **hooks)


def fake_llama(info: bytes, offload: bool, version: str = "0.3.36"):
    return SimpleNamespace(
        __version__=version, llama_supports_gpu_offload=lambda: offload, llama_print_system_info=lambda: info
    )


def test_llama_cpp_not_installed_says_so_and_how_to_get_a_cuda_build():
    status = probe_llamacpp(profile("rtx4090_desktop"), import_module=importer({}))
    assert not status.available
    assert status.reason == "llama-cpp-python is not installed"
    assert 'CMAKE_ARGS="-DGGML_CUDA=on"' in status.fix and "llama-cpp-python" in status.fix


@pytest.mark.parametrize(
    "name, flag", [("amd_gpu_box", "-DGGML_HIP=on"), ("cpu_laptop_8gb", None), ("m2_mac_16gb", None)]
)
def test_the_fix_fits_the_machine(name, flag):
    status = probe_llamacpp(profile(name), import_module=importer({}))
    if flag:
        assert flag in status.fix
    else:
        assert "CMAKE_ARGS" not in status.fix and "localrun[llama]" in status.fix


def test_llama_cpp_whose_dependency_is_missing_names_the_real_problem():
    err = ModuleNotFoundError("No module named 'numpy'", name="numpy")
    status = probe_llamacpp(profile("cpu_laptop_8gb"), import_module=importer({"llama_cpp": err}))
    assert not status.available and "numpy" in status.reason and "not installed" not in status.reason


def test_llama_cpp_native_library_that_fails_to_load():
    err = OSError("libcudart.so.12: cannot open shared object file")
    status = probe_llamacpp(profile("rtx4090_desktop"), import_module=importer({"llama_cpp": err}))
    assert not status.available and "libcudart" in status.reason and status.fix


@pytest.mark.parametrize(
    "info, offload, backend",
    [
        (CPU_INFO, False, "cpu"),
        (CUDA_INFO, True, "cuda"),
        (METAL_INFO, True, "metal"),
        (ROCM_INFO, True, "hip"),
        (CPU_INFO + b"Vulkan : ", True, "vulkan"),
        (CPU_INFO, True, "gpu"),
    ],
)
def test_backend_is_read_from_system_info(info, offload, backend):
    assert llama_backend(info.decode(), offload) == backend


def test_cuda_build_on_an_nvidia_box_is_ready():
    status = probe_llamacpp(
        profile("rtx4090_desktop"), import_module=importer({"llama_cpp": fake_llama(CUDA_INFO, True)})
    )
    assert status.available and status.version == "0.3.36"
    assert status.devices == ("cpu", "cuda") and status.details["backend"] == "cuda"
    assert status.reason is None and status.fix is None


def test_cpu_only_build_on_a_gpu_box_runs_but_says_what_it_misses():
    status = probe_llamacpp(
        profile("rtx4090_desktop"), import_module=importer({"llama_cpp": fake_llama(CPU_INFO, False)})
    )
    assert status.available and status.devices == ("cpu",)
    assert "without GPU offload" in status.reason and "CUDA" in status.reason
    assert "-DGGML_CUDA=on" in status.fix


def test_cpu_only_build_on_a_cpu_box_has_nothing_to_fix():
    status = probe_llamacpp(
        profile("cpu_laptop_8gb"), import_module=importer({"llama_cpp": fake_llama(CPU_INFO, False)})
    )
    assert status.available and status.reason is None and status.fix is None


@needs_llama
def test_the_installed_llama_cpp_is_probed_for_real():
    import llama_cpp

    status = probe_llamacpp(profile("cpu_laptop_8gb"))
    assert status.available and status.version == llama_cpp.__version__
    info = llama_cpp.llama_print_system_info().decode()
    assert status.details["gpu_offload"] == bool(llama_cpp.llama_supports_gpu_offload())
    assert status.details["backend"] == llama_backend(info, status.details["gpu_offload"])


def test_mlx_missing():
    status = probe_mlx(profile("m2_mac_16gb"), import_module=importer({}))
    assert not status.available and status.reason == "mlx is not installed" and "localrun[mlx]" in status.fix


def test_mlx_without_mlx_lm():
    mx = SimpleNamespace(default_device=lambda: "Device(gpu, 0)")
    status = probe_mlx(profile("m2_mac_16gb"), import_module=importer({"mlx.core": mx}), find_spec=lambda n: None)
    assert not status.available and "mlx-lm" in status.reason


@pytest.mark.parametrize(
    "name, device, expected",
    [
        ("m2_mac_16gb", "Device(gpu, 0)", ("metal",)),
        ("cpu_laptop_8gb", "Device(cpu, 0)", ("cpu",)),
        ("rtx4090_desktop", "Device(gpu, 0)", ("cuda",)),
    ],
)
def test_mlx_device(name, device, expected):
    mx = SimpleNamespace(default_device=lambda: device)
    status = probe_mlx(
        profile(name), import_module=importer({"mlx.core": mx}), find_spec=lambda n: object() if n == "mlx_lm" else None
    )
    assert status.available and status.devices == expected
    assert (status.reason is None) == (expected != ("cpu",))


def ollama_transport(handler):
    return httpx.MockTransport(handler)


def test_ollama_up_reports_its_version():
    seen = []

    def handler(request):
        seen.append(str(request.url))
        return httpx.Response(200, json={"version": "0.12.3"})

    status = probe_ollama(env={}, transport=ollama_transport(handler))
    assert status.available and status.version == "0.12.3"
    assert seen == ["http://127.0.0.1:11434/api/version", "http://127.0.0.1:11434/api/tags"]


def test_ollama_down_says_to_start_it():
    def handler(request):
        raise httpx.ConnectError("connection refused", request=request)

    status = probe_ollama(env={"OLLAMA_HOST": "127.0.0.1:12345"}, transport=ollama_transport(handler))
    assert not status.available and "127.0.0.1:12345" in status.reason and status.fix == "ollama serve"


def test_something_else_on_the_ollama_port():
    status = probe_ollama(env={}, transport=ollama_transport(lambda r: httpx.Response(404, text="nope")))
    assert not status.available and "404" in status.reason


def test_ollama_answer_that_is_not_json():
    status = probe_ollama(env={}, transport=ollama_transport(lambda r: httpx.Response(200, text="<html>")))
    assert not status.available and "not JSON" in status.reason


def test_ollama_probe_gives_up_quickly_on_a_silent_server():
    import socket
    import time

    with socket.socket() as server:  # accepts the connection (backlog) but never answers
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        start = time.monotonic()
        status = probe_ollama(env={"OLLAMA_HOST": f"127.0.0.1:{port}"})
        assert time.monotonic() - start < 3
    assert not status.available and "ReadTimeout" in status.reason


@pytest.mark.parametrize(
    "host, url",
    [
        (None, "http://127.0.0.1:11434"),
        ("", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("0.0.0.0:9999", "http://127.0.0.1:9999"),
        ("localhost", "http://localhost:11434"),
        ("https://ollama.lan:443/", "https://ollama.lan:443"),
        ("http://[::1]:11434", "http://[::1]:11434"),
        ("box.local:8000", "http://box.local:8000"),
    ],
)
def test_ollama_host_is_read_like_ollama_reads_it(host, url, monkeypatch):
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    assert (ollama_base_url() if host is None else ollama_base_url(host)) == url


def test_mlc_installed_as_python_package():
    status = probe_mlc(find_spec=lambda name: object() if name == "mlc_llm" else None, which=lambda n: None)
    assert status.available and status.details["via"] == "python"


def test_mlc_cli_only():
    status = probe_mlc(find_spec=lambda name: None, which=lambda n: "/opt/mlc/bin/mlc_llm" if n == "mlc_llm" else None)
    assert status.available and status.details["path"] == "/opt/mlc/bin/mlc_llm"


def test_mlc_missing_points_at_its_own_wheel_index():
    status = probe_mlc(find_spec=lambda name: None, which=lambda n: None)
    assert not status.available and "mlc.ai/wheels" in status.fix


class Hooked:
    """A runtime whose probe gets a test's hooks: ``probe_runtimes`` calls ``probe(hw)`` alone."""

    def __init__(self, runtime, **hooks):
        self.runtime, self.hooks = runtime, hooks

    def probe(self, hw):
        return self.runtime.probe(hw, **self.hooks)


def test_probe_runtimes_covers_every_listed_runtime_and_survives_a_broken_probe():
    def handler(request):
        raise httpx.ConnectError("refused", request=request)

    def import_module(name):
        if name == "llama_cpp":
            return SimpleNamespace(llama_supports_gpu_offload=lambda: 1 / 0)  # a probe bug, not an ImportError
        raise ModuleNotFoundError(name=name)

    none = {"find_spec": lambda n: None}
    runtimes = {
        "llama.cpp": Hooked(LlamaCppRuntime(), import_module=import_module),
        "mlx": Hooked(MlxRuntime(), import_module=import_module, **none),
        "ollama": Hooked(OllamaRuntime(transport=ollama_transport(handler)), env={}),
        "mlc": Hooked(MlcRuntime(), env={}, which=lambda n: None, **none),
        "vllm": Hooked(VllmRuntime(), env={}),
    }
    statuses = probe_runtimes(profile("cpu_laptop_8gb"), runtimes=runtimes)
    assert list(statuses) == ["llama.cpp", "mlx", "ollama", "mlc", "vllm"]
    assert all(s.name == n for n, s in statuses.items())
    assert not statuses["llama.cpp"].available and "probe failed" in statuses["llama.cpp"].reason
    assert not any(s.available for s in statuses.values())
    assert any("ollama serve" in status_cells(s)[2] for s in statuses.values())


def test_probe_runtimes_asks_the_registry_and_leaves_the_fake_out(monkeypatch):
    """The one loop: every listed runtime of the registry, in its order; the list ``localrun hw`` shows."""
    from localrun.planning import facts
    from localrun.runtimes import REGISTRY

    asked = []

    class Stub:
        def __init__(self, name):
            self.name = name

        def probe(self, hw):
            asked.append(self.name)
            return facts.RuntimeStatus(self.name, True)

    monkeypatch.setattr(facts, "get_runtime", Stub)
    statuses = probe_runtimes(profile("cpu_laptop_8gb"))
    assert list(statuses) == asked == ["llama.cpp", "mlx", "ollama", "mlc", "vllm"]
    assert "fake" in REGISTRY and "fake" not in statuses


def test_vllm_without_cuda_and_with_a_cpu_build():
    env = {"LOCALRUN_VLLM_PYTHON": __import__("sys").executable}
    status = VllmRuntime().probe(profile("cpu_laptop_8gb"), env=env)
    assert not status.available and "CUDA" in status.reason
    status = VllmRuntime().probe(profile("cpu_laptop_8gb"), env={**env, "LOCALRUN_VLLM_DEVICE": "cpu"})
    assert status.available and status.devices == ("cpu",)
    status = VllmRuntime().probe(profile("rtx4090_desktop"), env=env)
    assert status.available and status.devices == ("cuda:0",)


def test_probes_do_not_import_heavy_libraries_at_module_import():
    import subprocess
    import sys

    code = (
        "import sys, localrun.planning.facts, localrun.planning.planner, localrun.planning.hardware; "
        "print(sorted(m for m in ('llama_cpp', 'mlx', 'pynvml', 'textual', 'fastapi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert importlib.import_module("localrun.planning.facts")  # and it imports in this process too


def test_the_installed_mlx_is_probed_for_real():
    mx = pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    status = probe_mlx(profile("cpu_laptop_8gb"))
    assert status.available and status.details["device"] == str(mx.default_device())
