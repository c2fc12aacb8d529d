"""The grammar of a chat answer on llama.cpp: tool calls that never break, and reasoning that
stays free before a schema.

**Tools** (:func:`tool_calls_gbnf`). Under ``tool_choice: "auto"`` the answer is free text until
the model opens a call in its family's own syntax (:mod:`localrun.chat.tool_triggers`: the
trigger ``<tool_call>``, ``[TOOL_CALLS]``, ``<|python_tag|>``, or bare JSON as the whole
answer); from the trigger on, only one or more valid calls can follow, then the end. This is
llama.cpp's server's lazy grammar, written as one grammar: the free part is "text without the
trigger" (:func:`~.gbnf_text.free_text_rules`), so the sampler checks each token as usual and
the trigger's first characters, written before anyone could know, are already part of the
call's text. Several calls only with ``parallel_tool_calls: true``; false or unset allow one,
as llama-server does (a small model otherwise repeats calls until its length limit cuts one).
Under ``required`` or a named function the same calls, without the free part. Templates with
no tool syntax of their own get our fallback prompt, which asks for the Hermes form, and its
grammar.

**Reasoning** (:func:`chat_grammar`). A reasoning model (``<think>`` tags, gpt-oss channels)
reasons freely and the constrained part (a schema's JSON, the tool calls) starts where its
reasoning ends: the grammar holds "reasoning without its closing marker, the marker, then the
answer", and when the generation prompt (or a continuation's prefix, as a reasoning budget
writes it) already closed the reasoning, just the answer. The budget still holds: the front
end stops the reasoning and continues with the close in the prefix, whose grammar starts at
the answer.
"""

from __future__ import annotations

import dataclasses
import logging

from localrun.chat import tool_reply, tools
from localrun.chat.reasoning import ANSWER, HARMONY, REASONING, ReasoningSplitter, detect_format
from localrun.chat.tool_triggers import CallSyntax, call_syntax
from localrun.chat.tools import ForcedCall
from localrun.runtimes.llamacpp.gbnf_text import free_text_rules, prefix_rules
from localrun.runtimes.llamacpp.grammar import forced_call_gbnf, gbnf_literal, request_grammar
from localrun.runtimes.llamacpp.native_grammar import NATIVE_GRAMMARS, harmony_tools_gbnf, native_calls_gbnf
from localrun.runtimes.llamacpp.reply_grammar import reply_gbnf
from localrun.types import ChatRequest

__all__ = ["chat_grammar", "reasoning_mode", "tool_calls_gbnf"]

log = logging.getLogger(__name__)

#: Whitespace around and between calls, bounded so a small model cannot loop on it.
_WS = "lz-ws ::= [ \\t\\n]{0,8}\n"
#: The first characters a free answer may not start with where bare JSON calls are the whole answer.
_JSON_START = "{[ \t\n"

OPEN, OPTIONAL, CHANNELS = "open", "optional", "channels"


def _one_call_gbnf(req: ChatRequest, style: tools.ToolStyle) -> str:
    """Rules whose start ``s-root`` is the JSON body of one call to one of the request's allowed functions."""
    asked = req if isinstance(req.tool_choice, dict) else dataclasses.replace(req, tool_choice="required")
    forced = tools.forced_call(asked, style)
    assert forced is not None  # tools are offered and the choice asks for a call
    return prefix_rules(forced_call_gbnf(ForcedCall(forced.schema, "", "")), "s-").rstrip("\n") + "\n"


def _calls_rules(syntax: CallSyntax, parallel: bool) -> str:
    """``lz-calls`` (the calls, starting with their trigger) and, for bare-JSON families, ``lz-json``."""
    if syntax.as_list:  # Mistral: one list of calls after the marker
        items = f"s-root (lz-ws {gbnf_literal(syntax.separator)} lz-ws s-root)*" if parallel else "s-root"
        return f'lz-calls ::= {gbnf_literal(syntax.open)} lz-ws "[" lz-ws {items} lz-ws "]"\n'
    if syntax.leading_json:  # Llama 3 / other JSON: bare calls joined by ';', or after a tag
        sep = f"(lz-ws {gbnf_literal(syntax.separator)} lz-ws s-root)*" if parallel else ""
        rules = f"lz-json ::= s-root {sep}\n"
        if syntax.open:
            rules += f"lz-calls ::= {gbnf_literal(syntax.open)} lz-ws lz-json\n"
        return rules
    one = f"{gbnf_literal(syntax.open)} lz-ws s-root lz-ws {gbnf_literal(syntax.close)}"
    return f"lz-one ::= {one}\nlz-calls ::= lz-one {'(lz-ws lz-one)*' if parallel else ''}\n"


def tool_calls_gbnf(req: ChatRequest, template: str | None, *, required: bool) -> str:
    """Rules whose start ``lz-answer`` is the answer under ``tool_choice``: free text that may
    open valid calls (``auto``), or only the calls (``required``, a named function)."""
    syntax = call_syntax(template)
    if syntax.family in NATIVE_GRAMMARS:  # DeepSeek, Kimi, Functionary, Qwen3-Coder XML, GLM: their own markers
        return native_calls_gbnf(req, syntax.family, required=required)
    style = tools.tool_style(template)
    parallel = req.parallel_tool_calls is True
    rules = _one_call_gbnf(req, style) + _WS + _calls_rules(syntax, parallel)
    tagged = "lz-calls" if not syntax.leading_json or syntax.open else None
    if syntax.leading_json:
        starts = ["lz-json"] + (["lz-calls"] if tagged else [])
        if required:
            return rules + f"lz-answer ::= lz-ws ({' | '.join(starts)})\n"
        free = free_text_rules("lz-free", syntax.triggers, exit_rule=tagged, not_first=_JSON_START)
        return rules + free + "lz-answer ::= lz-ws (lz-json | lz-free)\n"
    if required:
        return rules + "lz-answer ::= lz-ws lz-calls\n"
    return rules + free_text_rules("lz-free", syntax.triggers, exit_rule="lz-calls") + "lz-answer ::= lz-free\n"


def reasoning_mode(req: ChatRequest, template: str | None) -> str | None:
    """Where the answer starts relative to the model's reasoning: ``open`` (inside a ``<think>``
    block the prompt opened), ``optional`` (a ``<think>`` block may come first), ``channels``
    (gpt-oss: an analysis channel may come first), or None (no reasoning before the answer)."""
    fmt = detect_format(template)
    if fmt is None:
        return None
    splitter = ReasoningSplitter(fmt)
    splitter.feed(req.prefix)
    if req.prefix and splitter.channel == ANSWER:
        return None  # a continuation past the reasoning (a budget's forced close): the answer follows
    if fmt.name == HARMONY.name:
        return CHANNELS
    return OPEN if splitter.channel == REASONING else OPTIONAL


def _reasoning_rules(mode: str | None) -> str:
    """``root``: the reasoning ``mode`` asks for, then ``lz-answer``."""
    if mode is None:
        return "root ::= lz-answer\n"
    if mode == CHANNELS:
        analysis = gbnf_literal("<|channel|>analysis<|message|>")
        close = gbnf_literal("<|end|><|start|>assistant")
        final = gbnf_literal("<|channel|>final<|message|>")
        return (
            free_text_rules("lz-think", ("<|end|>",), exit_rule="lz-think-end", may_end=False)
            + f"lz-think-end ::= {close}\n"
            + f"root ::= ({analysis} lz-think)? {final} lz-answer\n"
        )
    rules = free_text_rules("lz-think", ("</think>",), exit_rule="lz-think-end", may_end=False)
    rules += f"lz-think-end ::= {gbnf_literal('</think>')} lz-ws lz-answer\n"
    if mode == OPEN:
        return rules + "root ::= lz-think\n"
    return rules + f"root ::= lz-ws {gbnf_literal('<think>')} lz-think | lz-answer\n"


def chat_grammar(req: ChatRequest, template: str | None, *, fallback: str = tool_reply.CALL_OR_REPLY) -> str | None:
    """The grammar of a chat request's answer, or None when it is free.

    Tools offered (and neither a schema nor a raw grammar asked): :func:`tool_calls_gbnf`, or
    for a template without tool syntax under the ``call_or_reply`` ``fallback`` the whole answer
    as a call or a reply (:func:`~.reply_grammar.reply_gbnf`).
    Otherwise what :func:`~.grammar.request_grammar` gives (a forced call, a schema, a raw
    grammar); a schema's or a call's grammar starts after a reasoning model's reasoning, a raw
    grammar is the client's and stays as sent.

    Raises:
        UnsupportedFeature: what :func:`~.grammar.request_grammar` and
            :func:`~localrun.chat.tools.forced_call` refuse.
    """
    sampling = req.sampling
    style = tools.tool_style(template)
    forced = tools.forced_call(req, style)  # refuses a choice naming an unknown function
    mode = reasoning_mode(req, template)
    calls_free = tools.active(req) and sampling.json_schema is None and sampling.grammar is None
    if calls_free and style.name == "gpt-oss":  # calls in the commentary channel, none once the final one began
        return harmony_tools_gbnf(req, required=forced is not None) if mode == CHANNELS else None
    # Other channel templates' calls (none known) stay free under auto.
    lazy = mode != CHANNELS or forced is not None
    if lazy and tool_reply.applies(req, template, fallback):
        answer = reply_gbnf(req, required=forced is not None)
    elif lazy and calls_free:
        answer = tool_calls_gbnf(req, template, required=forced is not None)
    else:
        gbnf = request_grammar(sampling, forced)
        if gbnf is None or sampling.grammar is not None or mode is None:
            return gbnf
        answer = prefix_rules(gbnf, "s-").rstrip("\n") + "\nlz-answer ::= s-root\n" + _WS
        return _reasoning_rules(mode) + answer
    return _reasoning_rules(mode) + answer
