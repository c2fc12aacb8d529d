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


def test_portable_build_is_asked_of_pip_with_native_off(tmp_path, monkeypatch):
    """The build itself (~15 CPU-minutes) is not run here; what pip is asked to do is checked."""
    calls = []

    def fake_pip(args, what, env=None):
        calls.append((args, env))
        fake_llama_wheel(Path(args[args.index("-w") + 1]), "OFF")

    monkeypatch.setattr(wheels, "_pip", fake_pip)
    monkeypatch.setattr(wheels, "_installed_llama_version", lambda: "0.3.36")
    wheel, native = wheels.choose_llama_wheel(wheels.WheelhouseOptions(build_portable=True), tmp_path)
    args, env = calls[0]
    assert native is False and wheel.parent == tmp_path
    assert "-DGGML_NATIVE=off" in env["CMAKE_ARGS"] and "--no-cache-dir" in args and "llama-cpp-python==0.3.36" in args
    assert args[args.index("--no-binary") + 1] == "llama-cpp-python"


def test_cached_native_wheel_is_found_and_refused(tmp_path, monkeypatch):
    cached = tmp_path / "cache"
    cached.mkdir()
    fake_llama_wheel(cached, "ON")
    monkeypatch.setattr(wheels, "cached_llama_wheels", lambda version: sorted(cached.glob("*.whl")))
    monkeypatch.setattr(wheels, "_installed_llama_version", lambda: "0.3.36")
    with pytest.raises(wheels.WheelhouseError, match="GGML_NATIVE=ON"):
        wheels.choose_llama_wheel(wheels.WheelhouseOptions(), tmp_path)
    assert wheels.choose_llama_wheel(wheels.WheelhouseOptions(allow_native=True), tmp_path)[1] is True
