"""How each model family opens a tool call in its own output: the trigger text that makes the
rest of the answer a call, and the literal text around and between calls.

Pure data, read from the chat template the way :func:`localrun.chat.tools.tool_style` reads it.
The llama.cpp runtime turns a :class:`CallSyntax` into a *lazy* grammar
(:mod:`localrun.runtimes.llamacpp.lazy_grammar`): text is free until a trigger appears, and
from the trigger on only valid calls can follow, as llama.cpp's server does with its grammar
triggers. Every family here writes calls that
:func:`localrun.chat.tool_calls.parse_tool_calls` reads back.

Families:

* ``hermes`` — Hermes, Qwen 2.5 / Qwen3 and our fallback prompt (templates without tool
  syntax of their own): ``<tool_call>{"name": …, "arguments": …}</tool_call>``, anywhere in
  the answer, one block per call.
* ``mistral`` — ``[TOOL_CALLS][{…}, {…}]``, anywhere in the answer.
* ``llama3`` — Llama 3.x: the whole answer is a JSON call ``{"name": …, "parameters": …}``
  (several joined by ``;``), or text then ``<|python_tag|>`` and the call.
* native families (DeepSeek, Kimi, Granite, Functionary, gpt-oss, Qwen3-Coder XML, GLM):
  :mod:`localrun.chat.tool_formats`; their markers are the triggers.
* ``json`` — any other template that takes ``tools``: a JSON call (or a list of them) as the
  whole answer, a call starting with ``{`` held valid.
"""

from __future__ import annotations

from dataclasses import dataclass

from localrun.chat.tool_formats import GRANITE, MARKERS
from localrun.chat.tools import BARE_JSON, HERMES, LLAMA3, MISTRAL, ToolStyle, tool_style

__all__ = ["CallSyntax", "call_syntax"]


@dataclass(frozen=True)
class CallSyntax:
    """The text shape of a family's calls (each call's JSON body is ``{"name", args_key}``)."""

    family: str
    args_key: str
    #: Literal text before each call's JSON (``<tool_call>``), or before the list of calls (Mistral).
    open: str
    #: Literal text after each call's JSON (``</tool_call>``) or after the list.
    close: str
    #: Between two calls' JSON bodies inside one list (``","`` for Mistral and bare JSON lists, ``";"`` for Llama 3).
    separator: str
    #: Calls are a JSON list (``[…]``) after ``open``.
    as_list: bool
    #: Strings that, wherever they appear in free text, start the calls (the free text may not contain them).
    triggers: tuple[str, ...]
    #: The calls may also be the whole answer, as bare JSON from its first character (Llama 3, other JSON).
    leading_json: bool


_HERMES = CallSyntax("hermes", "arguments", "<tool_call>", "</tool_call>", "", False, ("<tool_call>",), False)
_MISTRAL = CallSyntax("mistral", "arguments", "[TOOL_CALLS]", "", ",", True, ("[TOOL_CALLS]",), False)
_LLAMA3 = CallSyntax("llama3", "parameters", "<|python_tag|>", "", ";", False, ("<|python_tag|>",), True)
_JSON = CallSyntax("json", "arguments", "", "", ";", False, (), True)

_BY_STYLE: dict[ToolStyle, CallSyntax] = {HERMES: _HERMES, MISTRAL: _MISTRAL, LLAMA3: _LLAMA3, BARE_JSON: _JSON}


def _native(family: str) -> CallSyntax:
    """A native family (:mod:`.tool_formats`): Granite writes Mistral's list after its own marker; the
    others' grammars are :mod:`localrun.runtimes.llamacpp.native_grammar`'s, which read ``family``."""
    if family == GRANITE:
        return CallSyntax(GRANITE, "arguments", "<|tool_call|>", "", ",", True, ("<|tool_call|>",), False)
    return CallSyntax(family, "arguments", "", "", "", False, MARKERS[family], False)


def call_syntax(template: str | None) -> CallSyntax:
    """The call syntax of the model behind ``template`` (Hermes for templates without tool syntax)."""
    style = tool_style(template)
    return _BY_STYLE[style] if style in _BY_STYLE else _native(style.name)
