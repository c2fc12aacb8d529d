"""Tool calls in a streamed answer, as events every API's stream writes in its own shape:
a call starts (index, id, name), its arguments' JSON text grows, it ends.

The chunks carry :class:`~localrun.types.CallDelta` s where the runtime streams calls while the
model writes them (``localrun.chat.tool_stream``: llama.cpp, MLX, the fake runtime), and the
final chunk carries every call whole (``Chunk.tool_calls``, the answer's truth). :class:`CallEvents`
turns both into one sequence: a call no delta announced (Ollama's and the upstreams' calls,
parsed after the fact) starts, gets its whole arguments in one piece and ends when the answer
does; a streamed one gets whatever its deltas did not send.

**Validation.** A call is checked against its function's schema when it ends
(:func:`~localrun.chat.tool_checks.check_tool_calls`), before its end goes out; a call that breaks
it raises :class:`~localrun.errors.InvalidModelOutput`, which ends the stream with the API's
error event (``localrun.server.streams``), as a broken call did before calls streamed, so a
client's SDK raises instead of handing the app the call. What went out before is only ever a
prefix of the call. On a runtime that holds calls valid with a grammar (llama.cpp's lazy
tool grammar: a call that starts finishes valid) the deltas go out as they come. On a runtime
without grammars (``"grammar"`` not among its capabilities) each call is held until it ends
and is checked, then sent whole: its model may write a call that breaks its schema, and no
part of such a call goes out.

A streamed call that the final parse does not confirm (the length limit cut it, or a model
without a grammar wrote malformed JSON after its start went out) cannot be taken back: it is
an :class:`~localrun.errors.InvalidModelOutput` too, naming the call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localrun.chat.tool_checks import check_tool_calls
from localrun.errors import InvalidModelOutput
from localrun.types import Chunk

__all__ = ["CallEvent", "CallEvents"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallEvent:
    """``start`` (``id``, ``name``), ``arguments`` (``text``: the next piece) or ``end`` (``text``:
    the whole arguments; ``id`` and ``name`` again)."""

    kind: str
    index: int
    id: str = ""
    name: str = ""
    text: str = ""

    def call(self) -> dict[str, Any]:
        """An ``end`` event's call in OpenAI's shape (the shape ``Chunk.tool_calls`` holds)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.text}}


@dataclass
class _Call:
    id: str
    name: str
    arguments: str = ""
    sent: bool = False  # its start went out
    ended: bool = False


class CallEvents:
    """One streamed answer's calls; ``push`` each chunk (after the generation noted it).

    ``limit``: calls past it are not sent (``parallel_tool_calls: false``, ``max_tool_calls``), as
    the non-streamed answer drops them. ``hold``: send each call only once it ended and validated.
    """

    def __init__(
        self, *, tools: Sequence[dict[str, Any]], model: str, limit: int | None = None, hold: bool = False
    ) -> None:
        self.tools, self.model, self.limit, self.hold = tools, model, limit, hold
        self._calls: dict[int, _Call] = {}

    def _within(self, index: int) -> bool:
        return self.limit is None or index < self.limit

    def push(self, chunk: Chunk) -> list[CallEvent]:
        """The events of ``chunk``; at the final chunk, every call of the answer has ended.

        Raises:
            InvalidModelOutput: a call breaks its schema, or a streamed call was not confirmed.
        """
        events: list[CallEvent] = []
        for d in chunk.call_deltas:
            if not self._within(d.index):
                continue
            call = self._calls.get(d.index)
            if call is None:
                if not d.name:
                    continue  # a delta of a call whose start was never seen: the final chunk has it whole
                call = self._calls[d.index] = _Call(d.id, d.name)
                events += self._start(d.index, call)
            call.arguments += d.arguments
            if d.arguments and call.sent:
                events.append(CallEvent("arguments", d.index, text=d.arguments))
            if d.end:
                events += self._end(d.index, call)
        if chunk.finish_reason is not None and chunk.finish_reason != "cancelled":
            events += self._final(chunk.tool_calls, chunk.finish_reason)
        return events

    def _start(self, index: int, call: _Call) -> list[CallEvent]:
        if self.hold:
            return []
        call.sent = True
        return [CallEvent("start", index, call.id, call.name)]

    def _end(self, index: int, call: _Call) -> list[CallEvent]:
        call.ended = True
        whole = CallEvent("end", index, call.id, call.name, call.arguments)
        check_tool_calls([whole.call()], self.tools, model=self.model)
        if call.sent:
            return [whole]
        call.sent = True  # held until now (or never streamed): the whole call at once
        out = [CallEvent("start", index, call.id, call.name)]
        if call.arguments:
            out.append(CallEvent("arguments", index, text=call.arguments))
        return [*out, whole]

    def _final(self, calls: Sequence[dict[str, Any]], finish: str) -> list[CallEvent]:
        events: list[CallEvent] = []
        for index, parsed in enumerate(calls):
            if not self._within(index):
                break
            fn = parsed.get("function") or {}
            name, arguments = str(fn.get("name", "")), str(fn.get("arguments", ""))
            call = self._calls.get(index)
            if call is None or not (call.sent or call.ended):  # never streamed, or held: the parse's call
                ident = str(parsed.get("id") or (call.id if call else ""))
                call = self._calls[index] = _Call(ident, name, arguments)
                events += self._end(index, call)
                continue
            if call.name != name or not arguments.startswith(call.arguments):
                raise self._unconfirmed(index, call, finish)
            if call.ended and arguments != call.arguments:
                raise self._unconfirmed(index, call, finish)
            if not call.ended:
                rest = arguments[len(call.arguments) :]
                call.arguments = arguments
                events += ([CallEvent("arguments", index, text=rest)] if rest else []) + self._end(index, call)
        for index, call in self._calls.items():
            if call.sent and index >= len(calls):
                raise self._unconfirmed(index, call, finish)
        return events

    def _unconfirmed(self, index: int, call: _Call, finish: str) -> InvalidModelOutput:
        cut = finish == "length"
        log.info("%s: streamed call %d (%s) not confirmed by the answer's parse", self.model, index, call.name)
        return InvalidModelOutput(
            f"{self.model} started tool call {index} ({call.name!r}) in the stream, but "
            + ("the length limit cut it" if cut else "the answer did not finish it as a valid call"),
            hint="raise max_tokens" if cut else "retry (each try samples anew)",
            param="tools",
        )
