"""The one op dispatcher: what ``chat``, ``complete``, ``embed`` and ``call`` do to a session.

Both ways a request reaches a session use it: the worker process (``main.py``) once it has
decoded a frame, and the in-process handle (``host.InProcessHandle``) directly, with the
request objects the manager was given. So a request crosses the in-process path as the
frozen :class:`~localrun.types.ChatRequest` / :class:`~localrun.types.CompletionRequest`
(or :class:`Embed` / :class:`Call`), never as a dict; only the pipe to a worker process
serialises, through :func:`to_frame` and :func:`from_frame`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localrun.runtimes.base import call_extra
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest


@dataclass(frozen=True)
class Embed:
    """Embeddings of ``texts`` (one vector each)."""

    texts: tuple[str, ...]


@dataclass(frozen=True)
class Call:
    """One of the session extras of :data:`localrun.runtimes.base.EXTRAS` (tokenize, rerank…)."""

    method: str
    args: Mapping[str, Any] = field(default_factory=dict)


Request = ChatRequest | CompletionRequest | Embed | Call
Emit = Callable[[Chunk], None]


def _chat(session, req: ChatRequest, cancel: Cancel, emit: Emit, runtime: str) -> None:
    for chunk in session.chat(req, cancel):
        emit(chunk)


def _complete(session, req: CompletionRequest, cancel: Cancel, emit: Emit, runtime: str) -> None:
    for chunk in session.complete(req, cancel):
        emit(chunk)


def _embed(session, req: Embed, cancel: Cancel, emit: Emit, runtime: str) -> list[list[float]]:
    return session.embed(list(req.texts))


def _call(session, req: Call, cancel: Cancel, emit: Emit, runtime: str) -> Any:
    return call_extra(session, runtime, req.method, dict(req.args))


#: Op name -> (its request type, what it does, whether it streams chunks rather than returning a result).
OPS: dict[str, tuple[type, Callable[..., Any], bool]] = {
    "chat": (ChatRequest, _chat, True),
    "complete": (CompletionRequest, _complete, True),
    "embed": (Embed, _embed, False),
    "call": (Call, _call, False),
}
_BY_TYPE = {kind: name for name, (kind, _, _) in OPS.items()}


def op_name(request: Request) -> str:
    """The op a request object stands for; a ``TypeError`` for anything else (a caller's bug)."""
    try:
        return _BY_TYPE[type(request)]
    except KeyError:
        raise TypeError(f"not a worker request: {type(request).__name__}") from None


def streams(request: Request) -> bool:
    """True for chat and complete (chunks, then the end); False for embed and call (one result)."""
    return OPS[op_name(request)][2]


def run(session, request: Request, cancel: Cancel, emit: Emit, *, runtime: str) -> Any:
    """Run ``request`` on ``session``: a stream's chunks go to ``emit``; embed's and call's result is returned.

    ``runtime`` names the session's runtime in the error a missing extra gets. The session's own
    errors propagate: each handle reports them its own way (an event on the pipe, a sink call).
    """
    return OPS[op_name(request)][1](session, request, cancel, emit, runtime)


def to_frame(request: Request) -> dict[str, Any]:
    """The pipe's form of a request (see :mod:`.protocol`): ``op`` and its fields, JSON-ready."""
    op = op_name(request)
    if isinstance(request, (ChatRequest, CompletionRequest)):
        return {"op": op, "req": request.to_dict()}
    if isinstance(request, Embed):
        return {"op": op, "texts": list(request.texts)}
    return {"op": op, "method": request.method, "args": dict(request.args)}


def from_frame(msg: Mapping[str, Any]) -> Request:
    """The request a frame carries, rebuilt inside the worker process.

    Raises:
        KeyError: the frame names no op of :data:`OPS` or lacks a field.
    """
    op = msg["op"]
    if op == "chat":
        return ChatRequest.from_dict(msg["req"])
    if op == "complete":
        return CompletionRequest.from_dict(msg["req"])
    if op == "embed":
        return Embed(tuple(msg["texts"]))
    if op == "call":
        return Call(msg["method"], dict(msg.get("args") or {}))
    raise KeyError(f"unknown op {op!r}")
