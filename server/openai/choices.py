"""OpenAI answers with several choices (``n``, ``best_of``), and the pieces every OpenAI answer
shares: usage, log-probability shapes, ``system_fingerprint``.

The runtime streams the choices interleaved, each chunk tagged with ``Chunk.index``, every
choice ending with its own final chunk. A collected answer lists them by index; ``best_of``
keeps the ``n`` candidates whose tokens have the highest mean log-probability (OpenAI's
ranking) and numbers them again from 0. A stream sends each choice's role first, then
its chunks as they come, and each choice's closing event when that choice ends.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from localrun import __version__
from localrun.errors import LocalrunError, UnsupportedFeature
from localrun.server.errors import InvalidRequest, stream_error_line
from localrun.server.generation import Generation, finish_for_wire
from localrun.server.streams import stream_tail
from localrun.types import Chunk, Usage

log = logging.getLogger(__name__)


def usage_dict(u: Usage) -> dict[str, Any]:
    out = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }
    if u.drafted_tokens:
        # Speculative decoding: OpenAI's predicted-output fields say what was kept and what
        # was rejected; the "speculative" extension gives the plain counts.
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": u.accepted_tokens,
            "rejected_prediction_tokens": u.drafted_tokens - u.accepted_tokens,
        }
        out["speculative"] = {"drafted_tokens": u.drafted_tokens, "accepted_tokens": u.accepted_tokens}
    return out


@dataclass(frozen=True)
class AnswerHead:
    """What every object of one OpenAI answer repeats (the whole answer, or each event of its
    stream): its id, creation time, kind and fingerprint; and what the request asked of it
    (log-probabilities, a closing usage event). :func:`answer_head` derives it from the request."""

    ident: str
    created: int
    chat: bool
    fingerprint: str
    asked_logprobs: bool
    include_usage: bool

    def base(self, gen: Generation, *, chunk: bool = True) -> dict[str, Any]:
        """The fields an answer's object starts with: a stream's event (``chunk``), else the whole answer."""
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {
            "id": self.ident,
            "object": kind,
            "created": self.created,
            "model": gen.record.name,
            "system_fingerprint": self.fingerprint,
        }


def answer_head(gen: Generation, body: Any, *, chat: bool) -> AnswerHead:
    """The head of the answer to ``body`` (a chat or completions request): a fresh id, now."""
    return AnswerHead(
        ident=("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12),
        created=int(time.time()),
        chat=chat,
        fingerprint=system_fingerprint(gen),
        # chat asks with a flag; completions with a count, where 0 still asks for the chosen token's
        asked_logprobs=bool(body.logprobs) if chat else body.logprobs is not None,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
    )


def system_fingerprint(gen: Generation) -> str:
    """What produced the answer (localrun's version, the runtime, the model's file and plan), as
    OpenAI's ``system_fingerprint``: equal fingerprints, same backend configuration."""
    plan = gen.plan
    basis = f"{__version__}|{plan.runtime}|{gen.record.name}|{gen.record.path}|{plan.n_ctx}|{plan.kv_type}"
    return "fp_" + hashlib.sha256(basis.encode()).hexdigest()[:12]


def chat_logprobs(entries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"content": list(entries), "refusal": None}


def legacy_logprobs(entries: Sequence[dict[str, Any]], offset: int) -> dict[str, Any]:
    """The completions API's older shape: parallel lists, top alternatives as {token: logprob}."""
    tokens: list[str] = []
    offsets: list[int] = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
        tokens.append(e["token"])
    return {
        "tokens": tokens,
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{a["token"]: a["logprob"] for a in e.get("top_logprobs", ())} for e in entries],
        "text_offset": offsets,
    }


def check_best_of(body: Any, n: int, best_of: int) -> None:
    """OpenAI's rules for ``best_of`` and ``echo``, before anything is loaded."""
    if best_of > 1:
        if best_of < n:
            raise InvalidRequest(f"'best_of' ({best_of}) must be at least 'n' ({n})", param="best_of")
        if body.stream:
            raise InvalidRequest(
                "'best_of' cannot be streamed: the best candidates are known only at the end",
                param="best_of",
                hint="set stream to false, or use 'n' instead",
            )
    if body.echo and body.logprobs is not None:
        raise UnsupportedFeature(
            "'echo' with 'logprobs' would need the prompt's log-probabilities, which localrun does not compute",
            param="echo",
            hint="drop 'logprobs', or 'echo'",
        )
    if body.echo and body.suffix is not None:
        raise InvalidRequest("'echo' cannot be combined with 'suffix'", param="echo")


def _mean_logprob(entries: Sequence[dict[str, Any]]) -> float:
    return sum(e["logprob"] for e in entries) / len(entries) if entries else 0.0


def many_choices(
    gen: Generation, body: Any, *, chat: bool, asked_logprobs: bool, echo: str | None
) -> list[dict[str, Any]]:
    """The collected choices of a request with ``n`` or ``best_of`` above 1."""
    order = sorted(gen.texts)
    n, best_of = body.n or 1, getattr(body, "best_of", None) or 1
    if best_of > n:
        order = sorted(order, key=lambda i: -_mean_logprob(gen.choice_logprobs.get(i, ())))[:n]
    choices = []
    for new, i in enumerate(order):
        text, entries = gen.texts[i], gen.choice_logprobs.get(i, [])
        finish = finish_for_wire(gen.finishes.get(i))
        if chat:
            lp = chat_logprobs(entries) if asked_logprobs else None
            choices.append(
                {
                    "index": new,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": lp,
                    "finish_reason": finish,
                }
            )
        else:
            base = len(echo) if echo is not None else len(body.prompt_text())
            lp = legacy_logprobs(entries, base) if asked_logprobs else None
            choices.append({"index": new, "text": (echo or "") + text, "logprobs": lp, "finish_reason": finish})
    return choices


async def sse_choices(
    gen: Generation, first: Chunk | None, body: Any, head: AnswerHead, *, echo: str | None = None
) -> AsyncIterator[bytes]:
    """The stream of an ``n`` > 1 request: whole-object events, one choice index each."""
    chat, include_usage, asked_logprobs = head.chat, head.include_usage, head.asked_logprobs
    base = head.base(gen)
    offsets: dict[int, int] = {}

    def event(
        index: int,
        text: str,
        *,
        role: bool = False,
        finish: str | None = None,
        logprobs: Sequence[dict[str, Any]] = (),
    ) -> bytes:
        if chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": text}
                if role
                else ({"content": text} if text or finish is None else {})
            )
            lp = chat_logprobs(logprobs) if logprobs and asked_logprobs else None
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            at = offsets.get(index, len(echo) if echo is not None else len(body.prompt_text()))
            lp = legacy_logprobs(logprobs, at) if logprobs and asked_logprobs else None
            offsets[index] = at + len(text)
            choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}
        return b"data: " + json.dumps({**base, "choices": [choice]}, ensure_ascii=False).encode() + b"\n\n"

    def lines(chunk: Chunk) -> Iterator[bytes]:
        if chunk.text or chunk.logprobs:
            yield event(chunk.index, chunk.text, logprobs=chunk.logprobs)
        if chunk.finish_reason:
            yield event(chunk.index, "", finish=finish_for_wire(chunk.finish_reason))

    async def finish() -> AsyncIterator[bytes]:
        if include_usage:
            yield b"data: " + json.dumps({**base, "choices": [], "usage": usage_dict(gen.usage)}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    for i in range(body.n):
        yield event(i, echo or "", role=True) if chat or echo else event(i, "")
    opening = [first] if first is not None else []
    async for out in stream_tail(gen, opening, lines, failed=sse_error, finish=finish):
        yield out


def sse_error(exc: LocalrunError) -> bytes:
    """The error event of a stream that started: OpenAI's error object as one ``data:`` event."""
    return b"data: " + json.dumps(stream_error_line(exc)).encode() + b"\n\n"
