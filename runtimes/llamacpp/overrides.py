"""ggml's backend API through ctypes: tensor buffer-type overrides at load time, and the device list.

llama-cpp-python binds ``llama_model_params.tensor_buft_overrides`` as an untyped pointer and
binds none of ggml's device functions, but libllama's handle resolves them (its dependency tree
holds libggml). So this module declares llama.cpp's ``llama_model_tensor_buft_override
{const char *pattern; ggml_backend_buffer_type_t buft}`` itself, builds the NULL-terminated
array llama.cpp walks (``src/llama-model-loader.cpp``: the first pattern ``std::regex_search``
finds in a tensor's name picks its buffer type), and keeps the array and its pattern strings
alive for the model's life in a :class:`LoadParams` the session holds.

Plan options read here (see :mod:`localrun.planning.policies.llamacpp`): ``tensor_overrides``
(``[[pattern, "CPU" | a device name such as "CUDA0"], …]``), ``tensor_split`` (a share per
GPU) and ``main_gpu``.
"""

from __future__ import annotations

import ctypes
import json
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localrun.errors import ConfigError

log = logging.getLogger(__name__)

#: ggml-backend.h ``enum ggml_backend_dev_type``.
DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


class BuftOverride(ctypes.Structure):
    """llama.h ``struct llama_model_tensor_buft_override``."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass
class LoadParams:
    """What llama.cpp reads through raw pointers while the model lives: keep it as long as the model."""

    overrides: Any = None  # the ctypes array of BuftOverride
    patterns: list[bytes] = field(default_factory=list)
    split: Any = None  # the ctypes float array of tensor_split
    summary: list[str] = field(default_factory=list)  # what was set, in words, for the log


def _lib(llama: Any) -> Any:
    """The loaded libllama; its handle finds ggml's symbols too."""
    lib = getattr(getattr(llama, "llama_cpp", None), "_lib", None) or getattr(llama, "_lib", None)
    if lib is None:
        raise ConfigError("this llama-cpp-python exposes no native library handle", hint="upgrade llama-cpp-python")
    return lib


def _fn(lib: Any, name: str, restype: Any, *argtypes: Any) -> Any:
    fn = lib[name]  # a fresh function object: llama_cpp's own bindings keep their signatures
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


def buffer_type(llama: Any, target: str) -> int:
    """The buffer type an override sends tensors to: ``CPU`` (what ``-ot exps=CPU`` means) or a
    device by its ggml name (``CUDA0``, ``Metal``…), as ``-ot``'s right-hand side names them."""
    lib = _lib(llama)
    if target.upper() == "CPU":
        buft: int | None = _fn(lib, "ggml_backend_cpu_buffer_type", ctypes.c_void_p)()  # c_void_p: an int, or None
    else:
        dev = _fn(lib, "ggml_backend_dev_by_name", ctypes.c_void_p, ctypes.c_char_p)(target.encode())
        if not dev:
            names = ", ".join(d["name"] for d in read_devices(llama, memory=False))
            raise ConfigError(f"no llama.cpp device named {target!r} for a tensor override", hint=f"devices: {names}")
        buft = _fn(lib, "ggml_backend_dev_buffer_type", ctypes.c_void_p, ctypes.c_void_p)(dev)
    if not buft:
        raise ConfigError(f"llama.cpp has no buffer type for {target!r}")
    return buft


def check_pattern(pattern: Any) -> str:
    """A pattern llama.cpp's std::regex will take; a malformed one fails here, by name, rather than as
    a bare "error loading model" (llama.cpp throws std::regex_error inside the loader)."""
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"a tensor override pattern must be a non-empty string, not {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(
            f"the tensor override pattern {pattern!r} is not a valid regular expression: {exc}",
            hint=r"e.g. '\.ffn_(up|down|gate)_exps' (llama.cpp's -ot syntax)",
        ) from exc
    return pattern


def apply(llama: Any, mp: Any, options: Mapping[str, Any]) -> LoadParams:
    """Set the overrides, split and main GPU of ``options`` on the model params ``mp``.

    Raises:
        ConfigError: a malformed pattern, an unknown device, too many overrides or GPUs.
    """
    keep = LoadParams()
    pairs: Sequence[Any] = options.get("tensor_overrides") or ()
    if pairs:
        limit = int(llama.llama_max_tensor_buft_overrides()) if hasattr(llama, "llama_max_tensor_buft_overrides") else 0
        if limit and len(pairs) + 1 > limit:
            raise ConfigError(f"{len(pairs)} tensor overrides, but this llama.cpp takes at most {limit - 1}")
        array = (BuftOverride * (len(pairs) + 1))()  # zeroed: the last entry is the NULL terminator
        bufts: dict[str, int] = {}
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ConfigError(f"a tensor override is [pattern, buffer type], not {pair!r}")
            pattern, target = check_pattern(pair[0]), str(pair[1])
            if target not in bufts:
                bufts[target] = buffer_type(llama, target)
            keep.patterns.append(pattern.encode())
            array[i].pattern, array[i].buft = keep.patterns[-1], bufts[target]
        keep.overrides = array
        mp.tensor_buft_overrides = ctypes.addressof(array)
        keep.summary.append(f"{len(pairs)} tensor overrides ({', '.join(sorted(bufts))})")
    split = options.get("tensor_split")
    if split:
        n = int(llama.llama_max_devices())
        if len(split) > n:
            raise ConfigError(f"tensor_split names {len(split)} GPUs, but this llama.cpp takes at most {n}")
        keep.split = (ctypes.c_float * n)(*(float(x) for x in split))
        mp.tensor_split = keep.split
        keep.summary.append(f"tensor_split {list(split)}")
    if options.get("main_gpu") is not None:
        mp.main_gpu = int(options["main_gpu"])
        keep.summary.append(f"main_gpu {mp.main_gpu}")
    return keep


def read_devices(llama: Any, *, memory: bool = True) -> list[dict[str, Any]]:
    """llama.cpp's own device list: name, description, type and (``memory``) free and total bytes.

    Reading memory initialises each GPU (a CUDA context holds VRAM for the process's life), so
    the probe asks in a child process (:func:`main`); names alone are cheap."""
    lib = _lib(llama)
    if hasattr(llama, "llama_supports_gpu_offload"):
        llama.llama_supports_gpu_offload()  # loads dynamically built backends (GGML_BACKEND_DL) if none are
    count = _fn(lib, "ggml_backend_dev_count", ctypes.c_size_t)()
    get = _fn(lib, "ggml_backend_dev_get", ctypes.c_void_p, ctypes.c_size_t)
    name = _fn(lib, "ggml_backend_dev_name", ctypes.c_char_p, ctypes.c_void_p)
    desc = _fn(lib, "ggml_backend_dev_description", ctypes.c_char_p, ctypes.c_void_p)
    kind = _fn(lib, "ggml_backend_dev_type", ctypes.c_int, ctypes.c_void_p)
    mem = _fn(
        lib,
        "ggml_backend_dev_memory",
        None,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    )
    devices = []
    for i in range(count):
        dev = get(i)
        entry: dict[str, Any] = {
            "name": (name(dev) or b"").decode(errors="replace"),
            "description": (desc(dev) or b"").decode(errors="replace"),
            "type": DEVICE_TYPES.get(kind(dev), "unknown"),
        }
        if memory:
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            mem(dev, ctypes.byref(free), ctypes.byref(total))
            entry.update(free=int(free.value), total=int(total.value))
        devices.append(entry)
    return devices


def main() -> int:
    """``python -m localrun.runtimes.llamacpp.overrides``: print llama.cpp's devices as JSON (the probe's child)."""
    import llama_cpp

    json.dump(read_devices(llama_cpp), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
