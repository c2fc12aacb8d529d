"""The grammar of a call-or-reply answer (:mod:`localrun.chat.tool_reply`): the whole answer is
one JSON object, a call or a reply, as llama.cpp's server holds templates without tool syntax::

    {"tool_call": <one call>}                    parallel_tool_calls false or unset
    {"tool_calls": [<call>, <call>, …]}          parallel_tool_calls true
    {"response": "<any JSON string>"}            not under required or a named function

A call is ``{"name": <one of the allowed functions>, "arguments": <valid for its schema>}``,
compiled by localrun's schema converter (:func:`~.grammar.forced_call_gbnf`), so a call that
starts always finishes valid. The start rule is ``lz-answer``, which
:func:`~.lazy_grammar.chat_grammar` puts after a reasoning model's reasoning.
"""

from __future__ import annotations

import dataclasses

from localrun.chat import tools
from localrun.chat.tools import ForcedCall
from localrun.runtimes.llamacpp.gbnf_text import prefix_rules
from localrun.runtimes.llamacpp.grammar import forced_call_gbnf, gbnf_literal
from localrun.types import ChatRequest

__all__ = ["reply_gbnf"]

#: Whitespace between the wrapper's tokens, bounded so a small model cannot loop on it.
_WS = "lz-ws ::= [ \\t\\n]{0,8}\n"
#: The reply's characters (any number; escapes as JSON writes them).
_CHAR = 'rp-char ::= [^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt/] | "u" [0-9a-fA-F]{4})\n'
#: The reply: its closing quote and brace are optional, so the end of generation is allowed
#: anywhere in it. A small model stops where it would stop a free reply; made to close a JSON
#: string first, SmolLM2 greedy wrote on to the length cap (Codex: "Incomplete response").
_REPLY_END = '("\\"" lz-ws "}")?'


def _key(name: str) -> str:
    """The wrapper's key ``"name":`` with the whitespace around its colon."""
    return f"{gbnf_literal(chr(34) + name + chr(34))} lz-ws {gbnf_literal(':')} lz-ws"


def reply_gbnf(req: ChatRequest, *, required: bool) -> str:
    """Rules whose start ``lz-answer`` is the wrapper: a call (or a list of them when
    ``parallel_tool_calls`` is true) or, unless ``required``, a reply string.

    Raises:
        UnsupportedFeature: a tool's schema the converter refuses, or ``tool_choice`` naming an
            unknown function (:func:`localrun.chat.tools.forced_call`).
    """
    asked = req if isinstance(req.tool_choice, dict) else dataclasses.replace(req, tool_choice="required")
    forced = tools.forced_call(asked, tools.HERMES)
    assert forced is not None  # tools are offered and the choice asks for a call
    rules = prefix_rules(forced_call_gbnf(ForcedCall(forced.schema, "", "")), "s-").rstrip("\n") + "\n" + _WS
    if req.parallel_tool_calls is True:
        items = 's-root (lz-ws "," lz-ws s-root)*'
        call = f'{_key("tool_calls")} "[" lz-ws {items} lz-ws "]" lz-ws "}}"'
    else:
        call = f'{_key("tool_call")} s-root lz-ws "}}"'
    body = call
    if not required:
        body = f'({call} | {_key("response")} "\\"" rp-char* {_REPLY_END})'
        rules += _CHAR
    return rules + f'lz-answer ::= lz-ws "{{" lz-ws {body}\n'
