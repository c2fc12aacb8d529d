"""The wheelhouse pieces that need no package index: native detection, the refusal, the
requirements file, and wheels carried and verified like model files."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from localrun.modelstore.bundle import wheels
from localrun.modelstore.bundle.export import export_bundle
from localrun.modelstore.bundle.importer import import_bundle, verify_bundle
from localrun.modelstore.bundle.lock import LOCK_NAME, BundleError


def fake_llama_wheel(folder: Path, native: str | None) -> Path:
    wheel = folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llama_cpp/__init__.py", "")
        if native is not None:
            z.writestr("lib/cmake/ggml/ggml-config.cmake", f'set(GGML_AVX2 "OFF")\nset(GGML_NATIVE "{native}")\n')
    return wheel


@pytest.mark.parametrize("flag,expected", [("ON", True), ("OFF", False), ("off", False), (None, None)])
def test_native_flag_is_read_from_the_wheel(flag, expected, tmp_path):
    assert wheels.wheel_is_native(fake_llama_wheel(tmp_path, flag)) is expected


def test_native_wheel_is_refused_unless_allowed(tmp_path):
    wheel = fake_llama_wheel(tmp_path, "ON")
    with pytest.raises(wheels.WheelhouseError, match="GGML_NATIVE=ON") as info:
        wheels.choose_llama_wheel(wheels.WheelhouseOptions(llama_wheel=wheel), tmp_path)
    assert "--build-portable-llama" in info.value.hint
    native = wheels.WheelhouseOptions(llama_wheel=wheel, allow_native=True)
    assert wheels.choose_llama_wheel(native, tmp_path) == (wheel, True)
    (tmp_path / "p").mkdir()
    portable = fake_llama_wheel(tmp_path / "p", "OFF")
    assert wheels.choose_llama_wheel(wheels.WheelhouseOptions(llama_wheel=portable), tmp_path) == (portable, False)


def test_not_a_wheel(tmp_path):
    (tmp_path / "x.whl").write_bytes(b"not a zip")
    with pytest.raises(wheels.WheelhouseError, match="not a readable wheel"):
        wheels.wheel_is_native(tmp_path / "x.whl")


def test_requirements_pin_every_wheel_with_its_hash(tmp_path):
    fake_llama_wheel(tmp_path, "OFF")
    (tmp_path / "localrun-0.1.0-py3-none-any.whl").write_bytes(b"pk")
    lines = wheels.write_requirements(tmp_path).read_text().splitlines()[1:]
    assert lines[0].startswith("llama-cpp-python==0.3.36 --hash=sha256:")
    assert lines[1] == "localrun[llama]==0.1.0 --hash=sha256:" + __import__("hashlib").sha256(b"pk").hexdigest()


def test_platform_recorded(tmp_path):
    info = wheels.platform_info(fake_llama_wheel(tmp_path, "OFF"), False)
    assert (
        info["python_tag"].startswith(("cp3", "pp3"))
        and info["platform"]
        and info["llama_cpp_python"]["ggml_native"] is False
    )


def _tiny_wheelhouse(folder: Path) -> dict:
    (folder / "a-1.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    (folder / "requirements.txt").write_text("a==1.0\n")
    return {"python": "3.x", "platform": "test"}


@pytest.mark.parametrize("form", ["b", "b.tar"])
def test_wheels_travel_and_are_verified(form, source, target, tiny_model, tmp_path):
    out = tmp_path / form
    lock = export_bundle(source.store(), ["tiny"], out, wheelhouse=_tiny_wheelhouse).lock
    assert lock.python == {"python": "3.x", "platform": "test"}
    assert sorted(w.path for w in lock.wheels) == ["wheels/a-1.0-py3-none-any.whl", "wheels/requirements.txt"]
    assert verify_bundle(out).wheels == lock.wheels
    assert import_bundle(target.store(), out).records[0].name == "tiny"
    if form == "b":
        (out / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"wheel bytez")
        with pytest.raises(BundleError, match="a-1.0-py3-none-any.whl.*sha256"):
            verify_bundle(out)
        doc = json.loads((out / LOCK_NAME).read_text())
        assert doc["python"]["platform"] == "test"


VARIANTS = ("x64", "haswell", "skylakex", "zen4", "sapphirerapids")


def fake_dl_wheel(folder: Path) -> Path:
    """A wheel laid out as a GGML_BACKEND_DL build installs it: the CPU modules in bin/."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llama_cpp/__init__.py", "")
        z.writestr("llama_cpp/lib/libggml.so", b"ggml")
        z.writestr("lib/cmake/ggml/ggml-config.cmake", 'set(GGML_NATIVE "OFF")\nset(GGML_BACKEND_DL "ON")\n')
        for v in VARIANTS:
            z.writestr(f"bin/libggml-cpu-{v}.so", f"kernels for {v}".encode())
        z.writestr("llama_cpp_python-0.3.36.dist-info/RECORD", "stale,,\n")
    return wheel


def test_portable_build_is_asked_of_pip_with_every_cpu_variant_and_kept(tmp_path, monkeypatch):
    """The build itself (~1 CPU-hour) is not run here; what pip is asked, and what is kept, is checked."""
    calls = []

    def fake_pip(args, what, env=None, timeout=None):
        calls.append((args, env))
        fake_dl_wheel(Path(args[args.index("-w") + 1]))

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(wheels, "_pip", fake_pip)
    monkeypatch.setattr(wheels, "_installed_llama_version", lambda: "0.3.36")
    wheel, native = wheels.choose_llama_wheel(wheels.WheelhouseOptions(build_portable=True), tmp_path)
    args, env = calls[0]
    assert native is False and wheel.parent == wheels.portable_wheelhouse("0.3.36")
    assert wheel.parent.name.startswith("0.3.36-cpu-portable-")
    for flag in ("-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_NATIVE=OFF"):
        assert flag in env["CMAKE_ARGS"]
    assert "--no-cache-dir" in args and "llama-cpp-python==0.3.36" in args
    assert args[args.index("--no-binary") + 1] == "llama-cpp-python"
    # built once: the kept wheel answers the next export
    assert wheels.choose_llama_wheel(wheels.WheelhouseOptions(build_portable=True), tmp_path)[0] == wheel
    assert len(calls) == 1


def test_the_portable_wheel_carries_its_variants_where_ggml_is_pointed_and_no_amx(tmp_path):
    out = wheels.make_portable(fake_dl_wheel(tmp_path / "raw"), tmp_path / "kept")
    assert wheels.portable_variants(out) == ["haswell", "skylakex", "x64", "zen4"]
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        record = z.read("llama_cpp_python-0.3.36.dist-info/RECORD").decode().splitlines()
        assert z.read("llama_cpp/lib/libggml-cpu-zen4.so") == b"kernels for zen4"
    assert not [n for n in names if n.startswith("bin/")] and "sapphirerapids" not in " ".join(names)
    rows = {line.split(",")[0]: line.split(",")[1] for line in record}
    import base64
    import hashlib

    digest = base64.urlsafe_b64encode(hashlib.sha256(b"kernels for zen4").digest()).rstrip(b"=").decode()
    assert rows["llama_cpp/lib/libggml-cpu-zen4.so"] == f"sha256={digest}"
    assert set(rows) == set(names) and "stale" not in rows
    info = wheels.platform_info(out, False)["llama_cpp_python"]["note"]
    assert info.startswith("GGML_BACKEND_DL: picks the best of 4 CPU variants")


def test_a_wheel_without_variants_is_not_called_portable(tmp_path):
    plain = fake_llama_wheel(tmp_path, "OFF")
    with zipfile.ZipFile(plain, "a") as z:
        z.writestr("x.dist-info/RECORD", "")
    assert wheels.portable_variants(plain) == []
    with pytest.raises(wheels.WheelhouseError, match="no libggml-cpu-\\* variants"):
        wheels.make_portable(plain, tmp_path / "out")


def test_the_wheelhouse_offers_cpu_builds_only_portable_first(tmp_path, monkeypatch):
    house = tmp_path / "cache" / "localrun" / "wheels"
    for key in ("0.3.36-cuda-sm90", "0.3.36-cpu-noamx-abc"):
        (house / key).mkdir(parents=True)
    fake_llama_wheel(house / "0.3.36-cuda-sm90", "OFF")
    plain = fake_llama_wheel(house / "0.3.36-cpu-noamx-abc", "OFF")
    portable = wheels.make_portable(fake_dl_wheel(tmp_path / "raw"), house / "0.3.36-cpu-portable-x86_64")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    found = wheels.cached_llama_wheels("0.3.36")
    assert portable in found and plain in found and not [w for w in found if "cuda" in str(w)]
    monkeypatch.setattr(wheels, "_installed_llama_version", lambda: "0.3.36")
    assert wheels.choose_llama_wheel(wheels.WheelhouseOptions(), tmp_path) == (portable, False)


def test_cached_native_wheel_is_found_and_refused(tmp_path, monkeypatch):
    cached = tmp_path / "cache"
    cached.mkdir()
    fake_llama_wheel(cached, "ON")
    monkeypatch.setattr(wheels, "cached_llama_wheels", lambda version: sorted(cached.glob("*.whl")))
    monkeypatch.setattr(wheels, "_installed_llama_version", lambda: "0.3.36")
    with pytest.raises(wheels.WheelhouseError, match="GGML_NATIVE=ON"):
        wheels.choose_llama_wheel(wheels.WheelhouseOptions(), tmp_path)
    assert wheels.choose_llama_wheel(wheels.WheelhouseOptions(allow_native=True), tmp_path)[1] is True
