"""Tool calls streamed while the model writes them: a call starts as soon as its name is known,
its arguments follow as the raw JSON text grows, and it ends when its object closes.

:func:`localrun.chat.tools.with_tool_calls` holds everything from the first call marker on
(:class:`~localrun.chat.tool_calls.ToolCallFilter`) and parses it at the end; :class:`CallStream`
reads the same held text as it grows and turns it into :class:`~localrun.types.CallDelta` s:

* the first delta of a call has its ``id`` and ``name``; it comes once the name's string has
  closed and the name is one of the request's tools (a JSON answer that merely has a ``name``
  starts nothing);
* the arguments' text follows piece by piece, each accumulated prefix a prefix of valid JSON
  (checked character by character, :mod:`localrun.chat.json_prefix`), never the text after the
  object (``}`` of the call, ``</tool_call>``);
* ``end`` comes when the call's object closes; an arguments value that is not an object (a
  JSON string holding the arguments) is not streamed, and is sent whole at the end.

The final parse (:func:`~localrun.chat.tool_calls.parse_tool_calls`) stays the truth;
:meth:`CallStream.settle` gives its calls the streamed ids, and the model's own text of each
streamed arguments object (the same JSON as the parse's re-dump, byte for byte what the deltas
sent), so the deltas of a call concatenate to its final ``arguments`` exactly.

**Families** are one small object each behind :class:`CallFamily` (``opens``, ``streamer``), in
:data:`FAMILIES`: Hermes ``<tool_call>{…}</tool_call>`` (a marker per call), Mistral
``[TOOL_CALLS][{…}, …]``, Llama 3 ``<|python_tag|>{…}`` (``parameters``; several joined by
``;``) and bare JSON at the answer's start (an object, a list, a code fence). A family without
incremental support registers a streamer that emits nothing (:class:`WholeCalls`): its calls
then go out whole when the answer ends, as every API's stream sends calls the runtime parsed
after the fact (Ollama, upstreams).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from localrun.chat.json_prefix import JsonScan, ScanEvent
from localrun.chat.tool_calls import new_call_id
from localrun.types import CallDelta

__all__ = ["FAMILIES", "CallFamily", "CallStream", "CallStreamer", "JsonCalls", "StreamedCall", "WholeCalls"]

log = logging.getLogger(__name__)

#: The keys a call's arguments may have (Llama 3 writes ``parameters``), in the parse's preference.
ARGS_KEYS = ("arguments", "parameters")


@dataclass
class StreamedCall:
    """One call as streamed so far."""

    index: int
    id: str
    name: str
    arguments: str = ""
    #: The arguments object closed: ``arguments`` is its whole text.
    complete: bool = False
    ended: bool = False


class CallStreamer(Protocol):
    """Reads one answer's held text as it grows (each call gets the whole held text so far)."""

    calls: list[StreamedCall]

    def feed(self, held: str) -> list[CallDelta]: ...


class CallFamily(Protocol):
    """How one family's calls open, and the streamer that reads them."""

    def opens(self, held: str, at_start: bool) -> bool | None:
        """True: the held text is this family's calls; False: it is not; None: too short to tell."""
        ...

    def streamer(self, names: frozenset[str]) -> CallStreamer: ...


def _marker_opens(lead: str, marker: str) -> bool | None:
    if lead.startswith(marker):
        return True
    return None if marker.startswith(lead) else False


class WholeCalls:
    """A streamer that streams nothing: the family's calls go out whole at the answer's end."""

    def __init__(self) -> None:
        self.calls: list[StreamedCall] = []

    def feed(self, held: str) -> list[CallDelta]:
        return []


class _Deltas:
    """The deltas of one feed, one record per call (a start, its text and its end may come together)."""

    def __init__(self) -> None:
        self.by_index: dict[int, CallDelta] = {}

    def add(self, call: StreamedCall, *, start: bool = False, text: str = "", end: bool = False) -> None:
        d = self.by_index.get(call.index) or CallDelta(call.index)
        if start:
            d = replace(d, id=call.id, name=call.name)
        self.by_index[call.index] = replace(d, arguments=d.arguments + text, end=d.end or end)

    def out(self) -> list[CallDelta]:
        return [self.by_index[i] for i in sorted(self.by_index)]


@dataclass
class _Object:
    """The call object being read: its keys' values as they come."""

    key: str = ""
    name: str | None = None
    name_start: int = -1
    args_key: str = ""
    args_start: int = -1  # where the arguments object's text starts (-1: not yet, or not an object)
    args_end: int = -1
    other_args: bool = False  # an arguments value that is not an object: sent whole at the end
    call: StreamedCall | None = None
    sent: int = 0  # how far into the held text the arguments were sent


@dataclass
class JsonCalls:
    """Calls that are JSON objects ``{"name": …, "arguments"|"parameters": {…}}`` after ``marker``.

    ``each_marked``: every call has its own marker (Hermes), whatever lies between; otherwise the
    calls follow the marker (or the answer's start) as one object, a list of objects, or objects
    joined by ``;`` (Llama 3). A code fence around bare JSON is skipped.
    """

    marker: str
    each_marked: bool
    names: frozenset[str]
    calls: list[StreamedCall] = field(default_factory=list)
    _pos: int = 0
    _mode: str = "seek"  # seek (the marker) | lead (before a value) | scan | between (after one) | stopped
    _scan: JsonScan | None = None
    _base: int = 0  # how deep the call objects sit: 0 for one object, 1 inside a list
    _obj: _Object | None = None

    def feed(self, held: str) -> list[CallDelta]:
        out = _Deltas()
        while self._pos < len(held) and self._mode != "stopped":
            if self._mode == "scan":
                self._read(held, out)
            elif not (self._seek(held) if self._mode == "seek" else self._lead(held)):
                break  # waiting for more text
        if self._mode == "scan":
            self._send(held, self._pos, out)
        return out.out()

    def _seek(self, held: str) -> bool:
        """Find the next marker; False while it has not come (yet)."""
        at = held.find(self.marker, self._pos) if self.marker else self._pos
        if at < 0:
            self._pos = max(self._pos, len(held) - len(self.marker) + 1)  # a marker may be arriving
            return False
        self._pos, self._mode = at + len(self.marker), "lead"
        return True

    def _lead(self, held: str) -> bool:
        """Skip what comes before a value (space, a code fence's line; ``;`` between two calls);
        start reading the value; False while what comes is not known yet."""
        rest = held[self._pos :]
        lead = rest.lstrip()
        self._pos += len(rest) - len(lead)
        if not lead:
            return False
        if self._mode == "between":
            if lead[0] != ";" or self.each_marked:
                self._mode = "seek" if self.each_marked else "stopped"
            else:
                self._pos, self._mode = self._pos + 1, "lead"
            return True
        if lead.startswith("```"):
            nl = lead.find("\n")
            if nl < 0:
                return False  # the fence's language tag is still being written
            self._pos += nl + 1
            return True
        if "```".startswith(lead):  # may be a fence
            return False
        self._scan, self._mode = JsonScan(), "scan"
        self._base = 1 if lead[0] == "[" else 0
        return True

    def _read(self, held: str, out: _Deltas) -> None:
        scan = self._scan
        assert scan is not None  # set with the mode
        pos = self._pos
        ch = held[pos]
        self._pos += 1
        for event in scan.push(ch, pos):
            self._event(held, event, out)
        if scan.bad:
            log.debug("streamed tool call: not JSON at %d of %r; the rest goes out at the end", pos, held[-80:])
            self._mode = "stopped"
        elif scan.done:
            self._mode = "seek" if self.each_marked else "between"

    def _event(self, held: str, event: ScanEvent, out: _Deltas) -> None:
        depth, pos = event.depth, event.pos
        if event.kind == "start" and depth == self._base:
            self._obj = _Object() if held[pos] == "{" else None  # a call object (anything else is not one)
            return
        obj = self._obj
        if obj is None:
            return
        if event.kind == "end" and depth == self._base:
            self._close(obj, out)
            return
        if depth != self._base + 1:
            return
        if event.kind == "key":
            obj.key = json.loads(held[event.start : pos])
        elif event.kind == "start" and obj.key == "name" and obj.name_start < 0:
            obj.name_start = pos
        elif event.kind == "start" and obj.key in ARGS_KEYS and not obj.args_key:
            obj.args_key = obj.key
            obj.args_start = pos if held[pos] == "{" else -1
            obj.other_args = held[pos] != "{"
        elif event.kind == "end":
            self._value_end(held, obj, pos, out)

    def _value_end(self, held: str, obj: _Object, pos: int, out: _Deltas) -> None:
        if obj.key == "name" and obj.name_start >= 0 and obj.name is None:
            name = json.loads(held[obj.name_start : pos])
            obj.name = name if isinstance(name, str) else None
            self._start(held, obj, out)
        elif obj.key == obj.args_key and obj.args_start >= 0:
            obj.args_end = pos
            self._send(held, pos, out)

    def _start(self, held: str, obj: _Object, out: _Deltas) -> None:
        if obj.name is None or obj.call is not None or (self.names and obj.name not in self.names):
            return  # a name the parse would not take: not a call (the parse decides at the end)
        obj.call = StreamedCall(len(self.calls), new_call_id(), obj.name)
        self.calls.append(obj.call)
        out.add(obj.call, start=True)
        if obj.args_start >= 0:
            obj.sent = obj.args_start
            self._send(held, self._pos, out)

    def _send(self, held: str, upto: int, out: _Deltas) -> None:
        obj = self._obj
        if obj is None or obj.call is None or obj.args_start < 0 or obj.call.complete:
            return
        upto = obj.args_end if obj.args_end >= 0 else upto
        if upto > obj.sent:
            text = held[max(obj.sent, obj.args_start) : upto]
            obj.sent = upto
            obj.call.arguments += text
            out.add(obj.call, text=text)
        if obj.args_end >= 0:
            obj.call.complete = True

    def _close(self, obj: _Object, out: _Deltas) -> None:
        call = obj.call
        self._obj = None
        if call is None or obj.other_args:
            return  # not a call, or its arguments go out whole at the end
        if not obj.args_key:  # no arguments at all: the parse's are "{}"
            call.arguments, call.complete = "{}", True
            out.add(call, text="{}")
        call.ended = True
        out.add(call, end=True)


@dataclass(frozen=True)
class JsonFamily:
    """A family whose calls are JSON objects after ``marker`` (bare JSON: no marker, at the answer's start)."""

    name: str
    marker: str
    each_marked: bool = False

    def opens(self, held: str, at_start: bool) -> bool | None:
        lead = held.lstrip()
        if not lead:
            return None
        if self.marker:
            return _marker_opens(lead, self.marker)
        return at_start and lead[0] in "{[`"

    def streamer(self, names: frozenset[str]) -> CallStreamer:
        return JsonCalls(self.marker, self.each_marked, names)


#: The families whose calls stream, tried in order; a native family adds itself here (registries are dicts).
FAMILIES: dict[str, CallFamily] = {
    "hermes": JsonFamily("hermes", "<tool_call>", each_marked=True),
    "mistral": JsonFamily("mistral", "[TOOL_CALLS]"),
    "llama3": JsonFamily("llama3", "<|python_tag|>"),
    "json": JsonFamily("json", ""),
}


class CallStream:
    """The calls of one answer, streamed from the text :class:`ToolCallFilter` holds back."""

    def __init__(self, names: frozenset[str], families: dict[str, CallFamily] | None = None) -> None:
        self.names = names
        self.families = FAMILIES if families is None else families
        self._streamer: CallStreamer | None = None
        self._offset = -1

    @property
    def calls(self) -> list[StreamedCall]:
        return self._streamer.calls if self._streamer is not None else []

    def feed(self, held: str, offset: int, *, at_start: bool) -> list[CallDelta]:
        """Deltas for ``held`` (what the filter holds, starting ``offset`` characters into the answer)."""
        if offset != self._offset and not self.calls:  # the held text before was content after all
            self._streamer, self._offset = None, offset
        if self._streamer is None:
            self._streamer = self._choose(held, at_start)
            if self._streamer is None:
                return []
        return self._streamer.feed(held)

    def _choose(self, held: str, at_start: bool) -> CallStreamer | None:
        for name, family in self.families.items():
            opened = family.opens(held, at_start)
            if opened is None:
                return None
            if opened:
                log.debug("streaming tool calls of the %s family", name)
                return family.streamer(self.names)
        return WholeCalls()

    def settle(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The parsed ``calls`` with the streamed ids, and each streamed arguments object's own text
        where it is the same JSON (so the deltas concatenate to the final ``arguments``)."""
        out = []
        for i, call in enumerate(calls):
            streamed = self.calls[i] if i < len(self.calls) else None
            fn = call.get("function") or {}
            if streamed is None or streamed.name != fn.get("name"):
                out.append(call)
                continue
            args = fn.get("arguments", "")
            if streamed.complete and _same_json(streamed.arguments, args):
                args = streamed.arguments
            out.append({**call, "id": streamed.id, "function": {**fn, "arguments": args}})
        return out


def _same_json(a: str, b: Any) -> bool:
    try:
        return bool(json.loads(a) == (json.loads(b) if isinstance(b, str) else b))
    except ValueError:
        return False
