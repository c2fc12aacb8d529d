"""Runtimes: one small module per runtime behind one protocol (see base.py).

The registry maps a runtime's name to the dotted path of its class, so a runtime's
library is imported only when that runtime is used.
"""

from __future__ import annotations

import importlib

from localrun.errors import UnknownRuntime

REGISTRY: dict[str, str] = {
    "llama.cpp": "localrun.runtimes.llamacpp.session:LlamaCppRuntime",
    "fake": "localrun.runtimes.fake:FakeRuntime",
    "mlx": "localrun.runtimes.mlx:MlxRuntime",
    "ollama": "localrun.runtimes.ollama:OllamaRuntime",
    "mlc": "localrun.runtimes.mlc:MlcRuntime",
    "vllm": "localrun.runtimes.vllm:VllmRuntime",
}


def runtime_names() -> list[str]:
    return sorted(REGISTRY)


def get_runtime(name: str):
    """Instantiate a runtime by name; a wrong name lists the right ones."""
    try:
        target = REGISTRY[name]
    except KeyError:
        raise UnknownRuntime(f"no runtime named {name!r}", hint="try one of: " + ", ".join(runtime_names())) from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()
