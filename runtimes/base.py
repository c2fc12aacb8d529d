"""The runtime protocol every runtime implements.

A ``Runtime`` is stateless and cheap: it says whether it can run here (``probe``) and
loads a model into a ``Session``. A ``Session`` owns loaded weights and yields chunks.
Sessions of in-process libraries (llama.cpp, MLX) only ever run inside a worker process.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from localrun.errors import UnsupportedFeature
from localrun.types import (
    Cancel,
    ChatRequest,
    Chunk,
    CompletionRequest,
    Format,
    ModelRecord,
    Plan,
)

if TYPE_CHECKING:
    from localrun.planning.hardware import HardwareProfile  # plain data; the planner's, typed only

#: Optional session methods (``serve_<name>``) the server reaches through the worker's one
#: ``call`` op, with why each exists. A session that lacks one answers a 400 naming it; a name
#: not listed here is refused before it reaches the session (the pipe never calls arbitrary
#: attributes).
EXTRAS = {
    "embed_usage": "embeddings with the tokens counted: {'embeddings': [...], 'prompt_tokens': n}",
    "tokenize": "text -> token ids (and pieces): llama-server's /tokenize",
    "detokenize": "token ids -> text: /detokenize, echo of a token prompt",
    "apply_template": "the chat prompt as text: /apply-template",
    "props": "context size, template, FIM and pooling facts: /props",
    "rerank": "relevance scores of documents for a query: /rerank",
    "embed_tokens": "per-token vectors (pooling none): llama-server's native /embeddings",
    "count_prompt": "a chat request's prompt tokens, not run: Anthropic's message_start usage",
    "slots": "each slot's state (context, tokens held, busy): llama-server's GET /slots",
    "slot_action": "save, restore or erase one slot's state to/from a named file: POST /slots/{id}",
    "cache_stats": "cached prefixes in RAM and on disk (entries, tokens, bytes) and the disk counters",
}


@dataclass(frozen=True)
class RuntimeStatus:
    name: str
    available: bool
    version: str | None = None
    devices: tuple[str, ...] = ()
    reason: str | None = None  # why not available, or a caveat
    fix: str | None = None  # the command that would make it available
    details: dict[str, Any] = field(default_factory=dict)


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


def call_extra(session: Any, runtime: str, method: str, args: dict[str, Any]) -> object:
    """Run one of :data:`EXTRAS` on ``session``.

    Raises:
        UnsupportedFeature: ``method`` is not an extra, or this session does not offer it.
    """
    if method not in EXTRAS:
        raise UnsupportedFeature(f"unknown session call {method!r}", hint="use one of: " + ", ".join(EXTRAS))
    fn = getattr(session, "serve_" + method, None)
    if fn is None:
        raise UnsupportedFeature(
            f"{method!r} is not supported by the {runtime} runtime",
            param=method,
            hint="load the model on a runtime that offers it (llama.cpp does)",
        )
    return fn(**args)


class Runtime(Protocol):
    name: ClassVar[str]
    formats: ClassVar[frozenset[Format]]
    #: True when sessions must live in a worker subprocess (native code in-process).
    in_worker: ClassVar[bool]
    #: False for a runtime that probing (``localrun hw``) and the planner's own choice leave out:
    #: the fake, which runs only when asked for by name.
    listed: ClassVar[bool] = True

    def probe(self, hw: HardwareProfile | None = None) -> RuntimeStatus:
        """Whether it can run here, and if not why and what would fix it; ``hw`` is a
        HardwareProfile or None. May raise on a bug: the caller turns that into a status.
        Implementations add keyword-only hooks (an importer, an environment) for tests."""
        ...

    def load(self, model: ModelRecord, plan: Plan) -> Session: ...
