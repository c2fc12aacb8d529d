"""Hardware detection: each detector driven by recorded outputs, and detection surviving a broken one."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

from localrun.planning.hardware import (
    GIB,
    MIB,
    GpuInfo,
    HardwareProfile,
    apple_gpu_budget,
    detect_hardware,
    hardware_lines,
    render_hardware,
)
from tests.hardware.helpers import (
    DATA,
    PROFILES,
    NVMLError_LibraryNotFound,
    fake_nvml,
    load_json,
    profile,
    sysctl_runner,
)


def fake_vm(total=16 * GIB, available=12 * GIB, logical=8, physical=4):
    return SimpleNamespace(
        virtual_memory=lambda: SimpleNamespace(total=total, available=available),
        cpu_count=lambda logical_=True, **kw: physical if kw.get("logical") is False else logical,
    )


def linux(tmp_path, **kw):
    """Detect a Linux box whose /proc and /sys live under tmp_path."""
    kw.setdefault("vm", fake_vm())
    kw.setdefault("nvml", fake_nvml([]))
    return detect_hardware(root=tmp_path, system="Linux", machine="x86_64", env=kw.pop("env", {}), **kw)


def write_tree(root, files: dict[str, str]):
    for rel, content in files.items():
        if rel.startswith("_"):
            continue
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


@pytest.mark.parametrize("name", PROFILES)
def test_profiles_round_trip_through_json(name):
    hw = profile(name)
    again = HardwareProfile.from_json(hw.to_json())
    assert again == hw
    assert all(isinstance(g, GpuInfo) for g in again.gpus)
    assert isinstance(again.cpu_flags, tuple)


def test_cpu_flags_and_model_from_a_recorded_x86_cpuinfo(tmp_path):
    text = (DATA / "cpuinfo_x86_epyc.txt").read_text()
    write_tree(tmp_path, {"proc/cpuinfo": text})
    hw = linux(tmp_path)
    flags_line = next(line for line in text.splitlines() if line.startswith("flags"))
    raw = set(flags_line.split(":", 1)[1].split())
    model = next(line for line in text.splitlines() if line.startswith("model name")).split(":", 1)[1].strip()
    assert hw.cpu_model == model
    assert set(hw.cpu_flags) <= raw  # only flags the CPU has, and only the ones that matter
    assert {"avx2", "fma"} <= set(hw.cpu_flags) if {"avx2", "fma"} <= raw else True
    assert "fpu" not in hw.cpu_flags and "sse" not in hw.cpu_flags


def test_arm_features_are_renamed_as_llama_cpp_prints_them(tmp_path):
    write_tree(tmp_path, {"proc/cpuinfo": (DATA / "cpuinfo_arm64_graviton.txt").read_text()})
    hw = detect_hardware(root=tmp_path, system="Linux", machine="aarch64", vm=fake_vm(), nvml=fake_nvml([]), env={})
    assert hw.arch == "arm64"
    assert {"neon", "dotprod", "sve", "sve2", "i8mm", "fp16"} <= set(hw.cpu_flags)
    assert "asimd" not in hw.cpu_flags


def test_memory_and_cores_come_from_psutil(tmp_path):
    hw = linux(tmp_path, vm=fake_vm(total=8 * GIB, available=5 * GIB, logical=8, physical=4))
    assert (hw.ram_total, hw.ram_available, hw.physical_cores, hw.logical_cores) == (8 * GIB, 5 * GIB, 4, 8)


def test_cgroup_limits_cap_memory_and_cores(tmp_path):
    write_tree(
        tmp_path,
        {
            "sys/fs/cgroup/memory.max": f"{4 * GIB}\n",
            "sys/fs/cgroup/memory.current": f"{1 * GIB}\n",
            "sys/fs/cgroup/cpu.max": "150000 100000\n",
        },
    )
    hw = linux(tmp_path, vm=fake_vm(total=64 * GIB, available=60 * GIB, logical=32, physical=16))
    assert hw.ram_total == 4 * GIB
    assert hw.ram_available == 3 * GIB
    assert hw.logical_cores == 2 and hw.physical_cores == 2


def test_unlimited_cgroup_changes_nothing(tmp_path):
    write_tree(tmp_path, {"sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/cpu.max": "max 100000\n"})
    hw = linux(tmp_path, vm=fake_vm(total=64 * GIB, available=60 * GIB, logical=32, physical=16))
    assert (hw.ram_total, hw.logical_cores) == (64 * GIB, 32)


NVIDIA = [
    {
        "name": "NVIDIA GeForce RTX 4090",
        "total": 25757220864,
        "free": 25173688320,
        "cc": (8, 9),
        "uuid": "GPU-aaaa-1111",
    },
    {"name": b"NVIDIA RTX A4000", "total": 17171480576, "free": 16900000000, "cc": (8, 6), "uuid": "GPU-bbbb-2222"},
]


def test_nvidia_gpus_from_nvml(tmp_path):
    nvml = fake_nvml(NVIDIA, driver="550.54.14", cuda=12040)
    hw = linux(tmp_path, nvml=nvml)
    assert [g.name for g in hw.gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA RTX A4000"]  # bytes names decoded
    first = hw.gpus[0]
    assert (first.vendor, first.vram_total, first.vram_free) == ("nvidia", NVIDIA[0]["total"], NVIDIA[0]["free"])
    assert (first.driver, first.cuda_version, first.compute_capability) == ("550.54.14", "12.4", "8.9")
    assert [g.index for g in hw.gpus] == [0, 1]
    assert nvml.calls == ["init", "shutdown"]


@pytest.mark.parametrize("spec, expected", [("1", [1]), ("0,1", [0, 1]), ("", []), ("-1", []), ("GPU-bbbb", [1])])
def test_cuda_visible_devices_is_honoured(tmp_path, spec, expected):
    hw = linux(tmp_path, nvml=fake_nvml(NVIDIA), env={"CUDA_VISIBLE_DEVICES": spec})
    assert [g.index for g in hw.gpus] == expected


def test_no_nvidia_driver_is_a_normal_answer(tmp_path, caplog):
    nvml = fake_nvml(NVIDIA, init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    with caplog.at_level(logging.WARNING):
        hw = linux(tmp_path, nvml=nvml)
    assert hw.gpus == () and hw.notes == ()
    assert not caplog.records


def test_pynvml_not_installed_is_a_normal_answer(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    hw = detect_hardware(root=tmp_path, system="Linux", machine="x86_64", vm=fake_vm(), env={})
    assert hw.gpus == () and hw.notes == ()


def test_one_broken_nvidia_device_does_not_hide_the_others(tmp_path):
    hw = linux(tmp_path, nvml=fake_nvml(NVIDIA, broken={0}))
    assert [g.index for g in hw.gpus] == [1]


def test_apple_silicon_from_recorded_sysctl(tmp_path):
    answers = load_json("apple_m2_sysctl.json")
    hw = detect_hardware(
        root=tmp_path,
        system="Darwin",
        machine="arm64",
        run=sysctl_runner(answers),
        vm=fake_vm(total=int(answers["hw.memsize"])),
        nvml=fake_nvml([]),
        env={},
    )
    memsize = int(answers["hw.memsize"])
    assert hw.os == "darwin" and hw.arch == "arm64"
    assert hw.cpu_model == answers["machdep.cpu.brand_string"]
    assert (hw.apple.chip, hw.apple.unified_memory) == ("Apple M2", memsize)
    assert hw.apple.gpu_working_set_budget == pytest.approx(memsize * 2 / 3, abs=1)  # 10.67 GiB on a 16 GiB Mac
    assert {"neon", "dotprod", "i8mm", "fp16"} <= set(hw.cpu_flags)
    assert hw.gpus == () and hw.notes == ()


def test_apple_wired_limit_overrides_the_default_budget(tmp_path):
    answers = {**load_json("apple_m2_sysctl.json"), "iogpu.wired_limit_mb": "14336"}
    hw = detect_hardware(
        root=tmp_path,
        system="Darwin",
        machine="arm64",
        run=sysctl_runner(answers),
        vm=fake_vm(),
        nvml=fake_nvml([]),
        env={},
    )
    assert hw.apple.gpu_working_set_budget == 14336 * MIB


def test_rosetta_python_still_sees_apple_silicon(tmp_path):
    answers = {**load_json("apple_m2_sysctl.json"), "sysctl.proc_translated": "1"}
    hw = detect_hardware(
        root=tmp_path,
        system="Darwin",
        machine="x86_64",
        run=sysctl_runner(answers),
        vm=fake_vm(),
        nvml=fake_nvml([]),
        env={},
    )
    assert hw.arch == "arm64" and hw.apple is not None


def test_intel_mac_has_no_unified_gpu_budget(tmp_path):
    answers = {
        "hw.memsize": str(16 * GIB),
        "machdep.cpu.brand_string": "Intel(R) Core(TM) i7-9750H",
        "hw.optional": "hw.optional.avx1_0: 1\nhw.optional.avx2_0: 1\nhw.optional.fma: 1\n",
    }
    hw = detect_hardware(
        root=tmp_path,
        system="Darwin",
        machine="x86_64",
        run=sysctl_runner(answers),
        vm=fake_vm(),
        nvml=fake_nvml([]),
        env={},
    )
    assert hw.apple is None and hw.arch == "x86_64"
    assert set(hw.cpu_flags) == {"avx", "avx2", "fma"}


@pytest.mark.parametrize("gib, share", [(8, 2 / 3), (16, 2 / 3), (24, 2 / 3), (36, 3 / 4), (64, 3 / 4), (128, 3 / 4)])
def test_apple_default_budget_share(gib, share):
    assert apple_gpu_budget(gib * GIB) == pytest.approx(gib * GIB * share, abs=1)


def test_amd_gpus_from_a_sysfs_tree(tmp_path):
    files = load_json("amd_sysfs.json")
    write_tree(tmp_path, files)
    driver = tmp_path / "sys" / "bus" / "pci" / "drivers" / "amdgpu"
    driver.mkdir(parents=True)
    (tmp_path / "sys/class/drm/card1/device/driver").symlink_to(driver)
    hw = linux(tmp_path)
    amd = {g.index: g for g in hw.gpus}
    assert set(amd) == {1, 2}  # the Intel card0 and the connector entries are not AMD GPUs
    xtx = amd[1]
    total = int(files["sys/class/drm/card1/device/mem_info_vram_total"])
    used = int(files["sys/class/drm/card1/device/mem_info_vram_used"])
    assert (xtx.vendor, xtx.name, xtx.vram_total, xtx.vram_free) == (
        "amd",
        "AMD Radeon RX 7900 XTX",
        total,
        total - used,
    )
    assert xtx.driver == "amdgpu" and not xtx.integrated
    assert amd[2].integrated and "0x164e" in amd[2].name


def test_a_detector_that_raises_never_takes_detection_down(tmp_path, caplog):
    def boom():
        raise RuntimeError("psutil exploded")

    vm = SimpleNamespace(virtual_memory=boom, cpu_count=lambda **kw: 4)
    write_tree(tmp_path, {"proc/cpuinfo": (DATA / "cpuinfo_x86_epyc.txt").read_text()})
    with caplog.at_level(logging.WARNING, logger="localrun.planning.hardware"):
        hw = linux(tmp_path, vm=vm, nvml=fake_nvml(NVIDIA[:1]))
    assert hw.notes == ("memory and cores detection failed: psutil exploded",)
    assert any("psutil exploded" in r.getMessage() for r in caplog.records)
    assert hw.physical_cores >= 1 and hw.ram_total == 0  # safe defaults for the broken part
    assert hw.gpus and hw.gpus[0].name == NVIDIA[0]["name"]  # the other detectors still ran
    assert hw.cpu_model != "unknown CPU"


def test_a_detector_bug_of_any_kind_is_caught(tmp_path):
    nvml = fake_nvml(NVIDIA)
    nvml.nvmlDeviceGetCount = lambda: 1 / 0  # not an NVMLError: a plain bug
    hw = linux(tmp_path, nvml=nvml)
    assert hw.gpus == ()
    assert any(n.startswith("NVIDIA GPU detection failed") for n in hw.notes)
    assert nvml.calls[-1] == "shutdown"  # NVML is shut down even then


def test_detect_hardware_on_this_machine_is_consistent():
    hw = detect_hardware()
    assert hw.ram_total > 0 and 0 < hw.ram_available <= hw.ram_total
    assert 1 <= hw.physical_cores <= hw.logical_cores
    assert HardwareProfile.from_json(hw.to_json()) == hw


@pytest.mark.parametrize("name", PROFILES)
def test_render_hardware_names_every_part(name):
    hw = profile(name)
    text = "\n".join(hardware_lines(hw))
    assert hw.cpu_model in text
    for g in hw.gpus:
        assert g.name in text
    if hw.apple:
        assert hw.apple.chip in text and "GPU budget" in text
    if not hw.gpus and not hw.apple:
        assert "none detected" in text
    assert render_hardware(hw).plain == text
