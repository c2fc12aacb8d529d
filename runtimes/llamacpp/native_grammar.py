"""Lazy tool grammars for the families that write calls in their own native syntax
(:mod:`localrun.chat.tool_formats`): after the family's trigger, only valid calls in that
syntax, each call's arguments held to its tool's schema, then the end.

The same shape as :mod:`.lazy_grammar`'s (which dispatches here): under ``tool_choice: "auto"``
free text that never contains a trigger, which may go on into the calls; under ``required`` or
a named function the calls alone; several calls only with ``parallel_tool_calls: true``.

* JSON arguments (DeepSeek, Kimi, Functionary 3.1 / 3.2, gpt-oss): each tool's arguments are
  the schema's JSON (:func:`localrun.chat.constraints.schema_gbnf`), between the family's
  literal markers with the tool's name in them. Granite needs nothing here: it is Mistral's
  list after ``<|tool_call|>`` (:mod:`localrun.chat.tool_triggers`).
* XML arguments (Qwen3-Coder, GLM): one tag per parameter, in the schema's order, the
  required ones present and no others; a string parameter's value is the raw text (which
  cannot contain its closing tag; an ``enum`` of strings is one of them), any other value the
  JSON of its property's schema (the required ones may also come in any order, as llama.cpp
  allows). A string keyword a raw text cannot be held to (``pattern``,
  ``format``, ``minLength``, ``maxLength``) is refused by name.
* gpt-oss (:func:`harmony_tools_gbnf`): the analysis channel reasons freely first; then the
  final channel's free text, or a call in the commentary channel (the recipient in the
  channel header or in the role), whose ``<|call|>`` is the end-of-generation token.
"""

from __future__ import annotations

import itertools
from typing import Any

from localrun.chat.constraints import schema_gbnf
from localrun.chat.schema_terms import gbnf_literal
from localrun.chat.tool_formats import (
    DEEPSEEK,
    DS_CALL,
    DS_CALL_END,
    DS_CALLS,
    DS_CALLS_END,
    DS_SEP,
    FUNCTIONARY_31,
    FUNCTIONARY_32,
    GLM,
    KIMI,
    KIMI_ARGS,
    KIMI_CALL,
    KIMI_CALL_END,
    KIMI_CALLS,
    KIMI_CALLS_END,
    MARKERS,
    QWEN3_CODER,
)
from localrun.chat.tool_xml import is_string_schema
from localrun.errors import UnsupportedFeature
from localrun.runtimes.llamacpp.gbnf_text import free_text_rules, prefix_rules
from localrun.types import ChatRequest

__all__ = ["NATIVE_GRAMMARS", "harmony_tools_gbnf", "native_calls_gbnf"]

_WS = "lz-ws ::= [ \\t\\n]{0,8}\n"
#: Families whose call grammar is built here (gpt-oss separately, with its channels).
NATIVE_GRAMMARS = frozenset({DEEPSEEK, KIMI, FUNCTIONARY_31, FUNCTIONARY_32, QWEN3_CODER, GLM})
#: String keywords a raw (XML) value cannot be held to.
_RAW_REFUSED = ("pattern", "format", "minLength", "maxLength")
#: Required XML parameters taken in any order up to this many (4! = 24 alternatives).
_MAX_PERMUTED = 4


def _functions(req: ChatRequest) -> list[tuple[int, dict[str, Any]]]:
    """(index in tools, function) of each function a call may name under ``tool_choice``."""
    fns = [(i, t.get("function") or {}) for i, t in enumerate(req.tools) if isinstance(t, dict)]
    if isinstance(req.tool_choice, dict):
        wanted = (req.tool_choice.get("function") or {}).get("name") or req.tool_choice.get("name")
        fns = [(i, f) for i, f in fns if f.get("name") == wanted]
    return fns


def _json_args(i: int, fn: dict[str, Any]) -> tuple[str, str]:
    """(rules, start rule) of tool ``i``'s arguments as JSON."""
    params = fn.get("parameters") or {"type": "object"}
    gbnf = schema_gbnf(params, param=f"tools[{i}].function.parameters")
    return prefix_rules(gbnf, f"a{i}-").rstrip("\n") + "\n", f"a{i}-root"


def _json_call(family: str, name: str, args: str) -> str:
    """One call in ``family``'s syntax around the arguments rule ``args``."""
    if family == DEEPSEEK:
        head = gbnf_literal(f"{DS_CALL}function{DS_SEP}{name}\n```json\n")
        return f"{head} {args} {gbnf_literal(chr(10) + '```' + DS_CALL_END)}"
    if family == KIMI:
        head = gbnf_literal(f"{KIMI_CALL}functions.{name}:")
        return f"{head} [0-9]{{1,3}} {gbnf_literal(KIMI_ARGS)} {args} {gbnf_literal(KIMI_CALL_END)}"
    if family == FUNCTIONARY_31:
        return f"{gbnf_literal(f'<function={name}>')} {args} {gbnf_literal('</function>')}"
    return f"{gbnf_literal(name + chr(10))} {args}"  # Functionary 3.2: the recipient line, then the JSON


def _raw_value(path: str, schema: dict[str, Any], raw_rule: str) -> str:
    options = schema.get("enum") or ([schema["const"]] if "const" in schema else None)
    if options:
        return "(" + " | ".join(gbnf_literal(str(v)) for v in options) + ")"
    for keyword in _RAW_REFUSED:
        if keyword in schema:
            raise UnsupportedFeature(
                f"{path}.{keyword}: this model's tool calls write a string parameter as raw text, "
                f"which the grammar cannot hold to '{keyword}'",
                param=f"{path}.{keyword}",
                hint=f"drop '{keyword}' from the parameter, or check the value in your application",
            )
    return raw_rule


def _xml_call(family: str, i: int, fn: dict[str, Any]) -> str:
    """Rules ``x{i}-call``: one call to tool ``i`` in ``family``'s XML syntax."""
    name = str(fn.get("name", ""))
    params = fn.get("parameters") or {"type": "object"}
    base = f"tools[{i}].function.parameters"
    props = params.get("properties") or {} if isinstance(params, dict) else {}
    required = set(params.get("required") or ()) if isinstance(params, dict) else set()
    defs = {k: params[k] for k in ("$defs", "definitions") if isinstance(params, dict) and k in params}
    keys = list(props) + [k for k in sorted(required) if k not in props]
    rules: list[str] = []
    parts: list[str] = []
    for j, key in enumerate(keys):
        prop = props.get(key, {})
        path = f"{base}.properties.{key}"
        if is_string_schema(prop):
            value = _raw_value(path, prop, "xr-raw")
        else:
            gbnf = schema_gbnf({**prop, **defs} if isinstance(prop, dict) else prop, param=path)
            rules.append(prefix_rules(gbnf, f"x{i}-{j}-").rstrip("\n"))
            value = f"x{i}-{j}-root"
        if family == QWEN3_CODER:
            tag = f'{gbnf_literal(f"<parameter={key}>")} "\\n"? {value} "\\n"? {gbnf_literal("</parameter>")} lz-ws'
        else:
            tag = f'{gbnf_literal(f"<arg_key>{key}</arg_key>")} lz-ws "<arg_value>" {value} "</arg_value>" lz-ws'
        rules.append(f"x{i}-p{j} ::= {tag}")
        parts.append(f"x{i}-p{j}" if key in required else f"x{i}-p{j}?")
    body = _any_order(i, parts, rules)
    if family == QWEN3_CODER:
        open_ = f'"<tool_call>" lz-ws {gbnf_literal(f"<function={name}>")} lz-ws'
        close = '"</function>" lz-ws "</tool_call>"'
    else:
        open_, close = f'"<tool_call>" {gbnf_literal(name)} lz-ws', '"</tool_call>"'
    rules.append(f"x{i}-call ::= {open_} {body} {close}")
    return "\n".join(rules) + "\n"


def _any_order(i: int, parts: list[str], rules: list[str]) -> str:
    """Tool ``i``'s parameters: in the schema's order, or (as llama.cpp allows, since Qwen does not
    always keep it) the required ones in any order (up to 4 of them) and then optional ones."""
    required = [p for p in parts if not p.endswith("?")]
    optional = [p.removesuffix("?") for p in parts if p.endswith("?")]
    alts = [" ".join(parts) or '""']
    if 1 < len(required) <= _MAX_PERMUTED:
        perms = " | ".join(" ".join(p) for p in itertools.permutations(required))
        alts.append(f"({perms})" + (f" ({' | '.join(optional)})*" if optional else ""))
    rules.append(f"x{i}-args ::= {' | '.join(alts)}")
    return f"x{i}-args"


def native_calls_gbnf(req: ChatRequest, family: str, *, required: bool) -> str:
    """Rules whose start ``lz-answer`` is the answer under ``tool_choice`` in ``family``'s syntax.

    Raises:
        UnsupportedFeature: a schema the grammar cannot hold (named by its path).
    """
    parallel = req.parallel_tool_calls is True
    rules = _WS
    calls: list[str] = []
    for i, fn in _functions(req):
        if family in (QWEN3_CODER, GLM):
            rules += _xml_call(family, i, fn)
            calls.append(f"x{i}-call")
        else:
            args, start = _json_args(i, fn)
            rules += args + f"nc-call-{i} ::= {_json_call(family, str(fn.get('name', '')), start)}\n"
            calls.append(f"nc-call-{i}")
    rules += f"nc-call ::= {' | '.join(calls)}\n"
    if family in (QWEN3_CODER, GLM):
        closing = "</parameter>" if family == QWEN3_CODER else "</arg_value>"
        rules += free_text_rules("xr-raw", (closing,))
    if family == FUNCTIONARY_32:
        rules += f"nc-first ::= nc-call {'(' + gbnf_literal('>>>') + ' nc-call)*' if parallel else ''}\n"
        if required:
            return rules + "lz-answer ::= nc-first\n"
        rules += f"lz-more ::= {gbnf_literal('>>>')} nc-first\n" + free_text_rules(
            "lz-free", (">>>",), exit_rule="lz-more"
        )
        return rules + f"lz-answer ::= {gbnf_literal('all' + chr(10))} lz-free | nc-first\n"
    more = "(lz-ws nc-call)*" if parallel else ""
    section = {DEEPSEEK: (DS_CALLS, DS_CALLS_END), KIMI: (KIMI_CALLS, KIMI_CALLS_END)}.get(family)
    if section:
        rules += f"lz-calls ::= {gbnf_literal(section[0])} lz-ws nc-call {more} lz-ws {gbnf_literal(section[1])}\n"
    else:
        rules += f"lz-calls ::= nc-call {more}\n"
    if required:
        return rules + "lz-answer ::= lz-ws lz-calls\n"
    return rules + free_text_rules("lz-free", MARKERS[family], exit_rule="lz-calls") + "lz-answer ::= lz-free\n"


def harmony_tools_gbnf(req: ChatRequest, *, required: bool) -> str:
    """gpt-oss: a whole grammar (start ``root``): the analysis channel, then a call in the
    commentary channel, or (under ``auto``) the final channel's text.

    Raises:
        UnsupportedFeature: a schema the grammar cannot hold (named by its path).
    """
    rules = _WS
    calls = []
    for i, fn in _functions(req):
        args, start = _json_args(i, fn)
        name = str(fn.get("name", ""))
        in_channel = f'{gbnf_literal(f"<|channel|>commentary to=functions.{name}")} " "? ("<|constrain|>")? "json"?'
        in_role = f'{gbnf_literal(f" to=functions.{name}<|channel|>commentary")} " "? ("<|constrain|>")? "json"?'
        rules += args + f'nc-call-{i} ::= ({in_channel} | {in_role}) "<|message|>" {start}\n'
        calls.append(f"nc-call-{i}")
    rules += f"nc-call ::= {' | '.join(calls)}\n"
    rules += free_text_rules("lz-think", ("<|end|>",), exit_rule="lz-think-end", may_end=False)
    rules += 'lz-think-end ::= "<|end|><|start|>assistant"\n'
    analysis = '("<|channel|>analysis<|message|>" lz-think)?'
    if required:
        return rules + f"root ::= {analysis} nc-call\n"
    rules += free_text_rules("lz-final", ())
    return rules + f'root ::= {analysis} (nc-call | "<|channel|>final<|message|>" lz-final)\n'
