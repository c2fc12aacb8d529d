"""The llama.cpp probe reports the devices llama.cpp itself sees, and says when they disagree with
the machine; ``localrun hw`` and the TUI print the build's backend beside the machine's."""

from __future__ import annotations

from types import SimpleNamespace

from localrun.planning.facts import backend_lines
from localrun.runtimes.llamacpp.probe import probe_llamacpp
from tests.hardware.helpers import profile

CUDA_INFO = b"CUDA : ARCHS = 890 | USE_GRAPHS = 1 | CPU : AVX2 = 1 |"
H200 = {"name": "CUDA0", "description": "NVIDIA H200", "type": "gpu", "free": 140 * 1024**3, "total": 143 * 1024**3}
CPU = {"name": "CPU", "description": "Test CPU", "type": "cpu", "free": 60 * 1024**3, "total": 64 * 1024**3}


def fake_llama(info: bytes, offload: bool):
    return SimpleNamespace(
        __version__="0.3.36", llama_supports_gpu_offload=lambda: offload, llama_print_system_info=lambda: info
    )


def probe(hw, devices, info=CUDA_INFO, offload=True):
    return probe_llamacpp(hw, import_module=lambda name: fake_llama(info, offload), devices=lambda: devices)


def test_the_devices_llama_cpp_sees_are_in_the_status_and_printed():
    st = probe(profile("rtx4090_desktop"), [H200, CPU])
    assert st.available and st.reason is None and st.details["devices"] == [H200, CPU]
    lines = backend_lines({"llama.cpp": st})
    assert lines[0] == "build     llama.cpp built for CUDA: the build this machine calls for"
    assert "device    CUDA0: NVIDIA H200 (gpu, 140.0 GiB free of 143.0 GiB)" in lines
    assert "device    CPU: Test CPU (cpu, the RAM above)" in lines  # `hw` shows one RAM figure, not two


def test_a_cuda_build_that_sees_no_gpu_says_so():
    st = probe(profile("rtx4090_desktop"), [CPU])
    assert st.available and "built for CUDA but llama.cpp sees no GPU" in st.reason


def test_a_cpu_build_on_a_gpu_machine_names_the_rebuild_beside_the_backend():
    st = probe(profile("rtx4090_desktop"), [CPU], info=b"CPU : AVX2 = 1 |", offload=False)
    line = backend_lines({"llama.cpp": st})[0]
    assert line.startswith("build     llama.cpp built for CPU, but this machine could use CUDA (rebuild: CMAKE_ARGS=")


def test_a_failed_device_listing_leaves_the_status_as_it_was():
    st = probe(profile("rtx4090_desktop"), None)
    assert st.available and "devices" not in st.details and st.reason is None


def test_the_tui_hardware_view_shows_the_build_line():
    from localrun.tui.hardware_view import profile_lines

    st = probe(profile("rtx4090_desktop"), [H200, CPU])
    lines = profile_lines(profile("rtx4090_desktop"), {"llama.cpp": st})
    assert any(line.startswith("build     llama.cpp built for CUDA") for line in lines)
    assert profile_lines(profile("rtx4090_desktop")) == profile_lines(profile("rtx4090_desktop"), {})
