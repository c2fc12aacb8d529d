"""Runtimes: one small module per runtime behind one protocol (see base.py).

The registry maps a runtime's name to the dotted path of its class, so a runtime's
library is imported only when that runtime is used: a runtime module imports its library
inside the methods that need it, so reading a class's ``formats`` or ``listed`` is cheap.
Its order is the order ``localrun hw`` lists the runtimes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from localrun.errors import UnknownRuntime

if TYPE_CHECKING:
    from localrun.runtimes.base import Runtime

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


def runtime_class(name: str) -> type[Runtime]:
    """The class of a runtime, for its class attributes (``formats``, ``listed``…) without an instance.

    Raises:
        UnknownRuntime: no runtime has that name (the error lists the right ones).
    """
    try:
        target = REGISTRY[name]
    except KeyError:
        raise UnknownRuntime(f"no runtime named {name!r}", hint="try one of: " + ", ".join(runtime_names())) from None
    module, _, cls = target.partition(":")
    found: type[Runtime] = getattr(importlib.import_module(module), cls)
    return found


def get_runtime(name: str) -> Runtime:
    """Instantiate a runtime by name; a wrong name lists the right ones."""
    return runtime_class(name)()


def listed_runtimes() -> list[str]:
    """The runtimes probing lists and the planner may choose, in registry order (``listed``: not the fake)."""
    return [name for name in REGISTRY if getattr(runtime_class(name), "listed", True)]
