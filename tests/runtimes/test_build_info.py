"""Which backends the installed llama.cpp build has, read from ggml's registry (build_info.py)."""

from __future__ import annotations

import types

from localrun.runtimes.llamacpp import build_info
from tests.conftest import needs_llama


@needs_llama
def test_the_installed_build_names_its_backends():
    import llama_cpp

    names = build_info.build_backends(llama_cpp)
    assert "cpu" in names and build_info.load_backends(llama_cpp) >= 1
    assert build_info.build_backend(llama_cpp) == next((b for b in build_info.GPU_BACKENDS if b in names), "cpu")
    assert build_info.has_amx(llama_cpp) is (b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info())


def test_no_native_library_means_no_build(tmp_path):
    (tmp_path / "llama_cpp").mkdir()
    fake = types.SimpleNamespace(__file__=str(tmp_path / "llama_cpp" / "__init__.py"))
    assert build_info.build_backends(fake) == () and build_info.build_backend(fake) is None
    assert build_info.load_backends(fake) == 0 and not build_info.is_dynamic(fake)
    (tmp_path / "llama_cpp" / "lib").mkdir()
    (tmp_path / "llama_cpp" / "lib" / "libggml-cpu-haswell.so").write_bytes(b"")
    assert build_info.is_dynamic(fake)
