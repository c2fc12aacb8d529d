"""The one op dispatcher: what ``chat``, ``complete``, ``embed`` and ``call`` do to a session.

Both ways a request reaches a session use it: the worker process (``main.py``) once it has
decoded a frame, and the in-process handle (``host.InProcessHandle``) directly, with the
request objects the manager was given. So a request crosses the in-process path as the
frozen :class:`~localrun.types.ChatRequest` / :class:`~localrun.types.CompletionRequest`
(or :class:`Embed` / :class:`Call`), never as a dict; only the pipe to a worker process
serialises, through :func:`to_frame` and :func:`from_frame`.

The worker pipe's frames are :mod:`localrun.frames`' (a JSON header, binary payloads raw).
Parent → worker ops: ``load`` {runtime, record, plan}; ``chat``/``complete`` {id, req};
``embed`` {id, texts}; ``call`` {id, method, args}; ``cancel`` {id}; ``shutdown``. A request's
media travel as the frame's payloads, each item in the JSON naming its payload by index
(``{"kind", "mime", "payload": i}``): one copy of the bytes on the pipe, no base64.
Worker → parent events: ``ready`` {info}; ``load_error`` {error}; ``chunk`` {id, c};
``result`` {id, data}; ``end`` {id}; ``error`` {id, error}. Several requests may be open at
once, keyed by id, so a batching scheduler inside the worker needs no protocol change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from localrun.runtimes.base import Session, call_extra
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, Media


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


def _chat(session: Session, req: ChatRequest, cancel: Cancel, emit: Emit, runtime: str) -> None:
    for chunk in session.chat(req, cancel):
        emit(chunk)


def _complete(session: Session, req: CompletionRequest, cancel: Cancel, emit: Emit, runtime: str) -> None:
    for chunk in session.complete(req, cancel):
        emit(chunk)


def _embed(session: Session, req: Embed, cancel: Cancel, emit: Emit, runtime: str) -> list[list[float]]:
    return session.embed(list(req.texts))


def _call(session: Session, req: Call, cancel: Cancel, emit: Emit, runtime: str) -> Any:
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


def run(session: Session, request: Request, cancel: Cancel, emit: Emit, *, runtime: str) -> Any:
    """Run ``request`` on ``session``: a stream's chunks go to ``emit``; embed's and call's result is returned.

    ``runtime`` names the session's runtime in the error a missing extra gets. The session's own
    errors propagate: each handle reports them its own way (an event on the pipe, a sink call).
    """
    return OPS[op_name(request)][1](session, request, cancel, emit, runtime)


def to_frame(request: Request) -> tuple[dict[str, Any], list[bytes]]:
    """The pipe's form of a request: ``op`` and its fields, JSON-ready, and its media's bytes as
    the frame's payloads (see :mod:`localrun.frames`)."""
    op = op_name(request)
    payloads: list[bytes] = []
    if isinstance(request, ChatRequest):
        bare = tuple(replace(m, media=()) if m.media else m for m in request.messages)
        req = replace(request, messages=bare).to_dict()
        for out, message in zip(req["messages"], request.messages, strict=True):
            out["media"] = _refs(message.media, payloads)
        return {"op": op, "req": req}, payloads
    if isinstance(request, CompletionRequest):
        req = replace(request, media=()).to_dict()
        req["media"] = _refs(request.media, payloads)
        return {"op": op, "req": req}, payloads
    if isinstance(request, Embed):
        return {"op": op, "texts": list(request.texts)}, payloads
    return {"op": op, "method": request.method, "args": dict(request.args)}, payloads


def from_frame(msg: Mapping[str, Any], payloads: Sequence[bytes] = ()) -> Request:
    """The request a frame carries, rebuilt inside the worker process.

    Raises:
        KeyError: the frame names no op of :data:`OPS` or lacks a field.
        IndexError: a media item names a payload the frame does not have.
    """
    op = msg["op"]
    if op == "chat":
        req = dict(msg["req"])
        req["messages"] = [{**m, "media": _media(m.get("media"), payloads)} for m in req["messages"]]
        return ChatRequest.from_dict(req)
    if op == "complete":
        return CompletionRequest.from_dict({**msg["req"], "media": _media(msg["req"].get("media"), payloads)})
    if op == "embed":
        return Embed(tuple(msg["texts"]))
    if op == "call":
        return Call(msg["method"], dict(msg.get("args") or {}))
    raise KeyError(f"unknown op {op!r}")


def _refs(media: tuple[Media, ...], payloads: list[bytes]) -> list[dict[str, Any]]:
    """Each item's kind and type, its bytes appended to ``payloads`` and named by their index."""
    refs = []
    for item in media:
        refs.append({"kind": item.kind, "mime": item.mime, "payload": len(payloads)})
        payloads.append(item.data)
    return refs


def _media(refs: Any, payloads: Sequence[bytes]) -> tuple[Media, ...]:
    return tuple(Media(kind=str(r["kind"]), data=payloads[r["payload"]], mime=r.get("mime")) for r in refs or ())
