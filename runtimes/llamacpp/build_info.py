"""Which ggml backends the installed llama-cpp-python build has, read from ggml's own registry.

Two kinds of build exist. A plain one links its backends into ``libggml``: they are registered
the moment the library loads. A portable one (``GGML_BACKEND_DL`` with ``GGML_CPU_ALL_VARIANTS``,
as llama.cpp's releases and ``bundle export --build-portable-llama``) ships every backend as a
``libggml-<name>-<variant>.so`` module that ggml loads at run time, picking the variant whose
score is best for this CPU. ggml looks for those modules beside the executable (python's bin/)
and in the current directory, never in the package's ``lib/`` folder where llama-cpp-python puts
them, so :func:`load_backends` points it there before anything initialises the backend.

Self-contained on purpose (stdlib and ``llama_cpp`` only): ``scripts/llama_backend.py`` loads this
file by path during set-up, before localrun itself is installed. gpu-plan's probe and ``localrun
hw`` call :func:`build_backends` / :func:`build_backend`.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: ggml registry names (``ggml_backend_reg_name``) of the backends localrun knows, lower-cased.
_REG_NAMES = {"cpu": "cpu", "cuda": "cuda", "metal": "metal", "mtl": "metal", "rocm": "hip", "hip": "hip"}
_REG_NAMES |= {"vulkan": "vulkan", "sycl": "sycl", "blas": "blas", "rpc": "rpc"}
#: The GPU backends, most specific first: a CUDA build that also has RPC or BLAS is a CUDA build.
GPU_BACKENDS = ("cuda", "metal", "hip", "vulkan", "sycl")
#: libggml by the name libllama links (its SONAME) first: a wheel cannot hold symlinks, so
#: libggml.so, .so.0 and .so.0.x are separate copies, and opening another copy than libllama's
#: gives a second registry that libllama never sees ("no backends are loaded" on every model load).
_LIB_NAMES = ("libggml.so.0", "libggml.so", "libggml.0.dylib", "libggml.dylib", "ggml.dll")


def lib_dir(llama_cpp: Any) -> Path:
    """The folder llama-cpp-python loads its native libraries from."""
    return Path(llama_cpp.__file__).resolve().parent / "lib"


def _ggml(llama_cpp: Any) -> ctypes.CDLL | None:
    """libggml as already loaded by libllama (dlopen of the same path returns the same handle)."""
    folder = lib_dir(llama_cpp)
    for name in _LIB_NAMES:
        if (folder / name).exists():
            lib = ctypes.CDLL(str(folder / name))
            lib.ggml_backend_reg_count.restype = ctypes.c_size_t
            lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
            lib.ggml_backend_reg_get.restype = ctypes.c_void_p
            lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
            lib.ggml_backend_reg_name.restype = ctypes.c_char_p
            return lib
    return None


def is_dynamic(llama_cpp: Any) -> bool:
    """A ``GGML_BACKEND_DL`` build: its backends are modules in lib/ (``libggml-cpu-haswell.so``…)."""
    folder = lib_dir(llama_cpp)
    return any(folder.glob("libggml-cpu-*.so")) or any(folder.glob("ggml-cpu-*.dll"))


def load_backends(llama_cpp: Any) -> int:
    """Register a dynamic build's backends from the package's lib/ folder (once; a no-op for a
    plain build, whose backends registered themselves). Returns how many backends are registered.
    Call it before ``llama_backend_init``: that loads from python's bin/ and the cwd otherwise,
    finds nothing, and every model load then fails with "no backends are loaded"."""
    lib = _ggml(llama_cpp)
    if lib is None:
        return 0
    count = int(lib.ggml_backend_reg_count())
    if count == 0 and is_dynamic(llama_cpp):
        lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        lib.ggml_backend_load_all_from_path(str(lib_dir(llama_cpp)).encode())
        count = int(lib.ggml_backend_reg_count())
        logger.debug("loaded %d ggml backend(s) from %s", count, lib_dir(llama_cpp))
    return count


def build_backends(llama_cpp: Any = None) -> tuple[str, ...]:
    """The backends the installed build registers, e.g. ``("cuda", "cpu")``; () when llama-cpp-python
    is missing or its library does not load. Unknown registry names pass through lower-cased."""
    try:
        if llama_cpp is None:
            import llama_cpp
        lib = _ggml(llama_cpp)
        if lib is None:
            return ()
        load_backends(llama_cpp)
        names = []
        for i in range(int(lib.ggml_backend_reg_count())):
            raw = lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)) or b""
            name = raw.decode(errors="replace").lower()
            names.append(_REG_NAMES.get(name, name))
        return tuple(dict.fromkeys(names))
    except (ImportError, OSError, AttributeError) as exc:
        logger.debug("llama.cpp build not readable: %s", exc)
        return ()


def build_backend(llama_cpp: Any = None) -> str | None:
    """The one word for a build: its GPU backend, else ``"cpu"``; None when there is no build."""
    names = build_backends(llama_cpp)
    if not names:
        return None
    return next((b for b in GPU_BACKENDS if b in names), "cpu")


def has_amx(llama_cpp: Any = None) -> bool:
    """Whether the build's CPU kernels include AMX (they crash 0.3.36 on Q4_K models, see scripts/dev)."""
    try:
        if llama_cpp is None:
            import llama_cpp
        load_backends(llama_cpp)
        return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()
    except (ImportError, OSError) as exc:
        logger.debug("llama.cpp build not readable: %s", exc)
        return False


def describe_installed() -> dict[str, Any]:
    """What this interpreter's llama-cpp-python is: set-up (scripts/llama_backend.py) reads it
    from the venv's own python, by path, before localrun is installed there."""
    try:
        import llama_cpp as _lc
    except (ImportError, OSError):
        return {"installed": False}
    from importlib import metadata

    return {
        "installed": True,
        "version": metadata.version("llama_cpp_python"),
        "backend": build_backend(_lc),
        "backends": list(build_backends(_lc)),
        "amx": has_amx(_lc),
        "dynamic": is_dynamic(_lc),
    }
