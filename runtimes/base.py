"""The runtime protocol every runtime implements.

A ``Runtime`` is stateless and cheap: it says whether it can run here (``probe``) and
loads a model into a ``Session``. A ``Session`` owns loaded weights and yields chunks.
Sessions of in-process libraries (llama.cpp, MLX) only ever run inside a worker process.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, Format, ModelRecord, Plan


@dataclass(frozen=True)
class RuntimeStatus:
    name: str
    available: bool
    version: str | None = None
    devices: tuple[str, ...] = ()
    reason: str | None = None  # why not available, or a caveat
    fix: str | None = None  # the command that would make it available
    details: dict = field(default_factory=dict)


@runtime_checkable
class Session(Protocol):
    #: Optional capabilities, checked by the server before a request reaches the worker.
    capabilities: frozenset[str]

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        """Stream a chat answer. Raises ContextOverflow, TemplateError, UnsupportedFeature."""
        ...

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        """Stream a raw completion of ``req.prompt``."""
        ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embeddings; raises UnsupportedFeature where the model has none."""
        ...

    def close(self) -> None: ...


class Runtime(Protocol):
    name: ClassVar[str]
    formats: ClassVar[frozenset[Format]]
    #: True when sessions must live in a worker subprocess (native code in-process).
    in_worker: ClassVar[bool]

    def probe(self, hw=None) -> RuntimeStatus: ...

    def load(self, model: ModelRecord, plan: Plan) -> Session: ...
