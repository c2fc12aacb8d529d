"""Render a model's chat template safely, within a time and size budget.

A GGUF's ``tokenizer.chat_template`` is untrusted input: rendering it with a plain Jinja
environment is how llama-cpp-python got remote code execution (CVE-2024-34359), and the
same bug came back in vLLM and SGLang. Jinja's ``ImmutableSandboxedEnvironment`` stops
attribute tricks and code execution, but not a template that loops forever or builds a
gigabyte string. This module adds what the sandbox leaves out:

* a **deadline** checked at every loop iteration (each ``{% for %}`` iterable is wrapped
  by rewriting the template's syntax tree before it is compiled), every call from the
  template (macros, methods, recursive loops), every attribute lookup and between output
  pieces. The deadline lives in a ``ContextVar``, so renders on different threads each
  keep their own and nothing needs signals or a main thread;
* a **size budget**: ``*``, ``**``, ``+``, ``%``, ``~`` and the amplifying filters and
  string methods are checked *before* they allocate, and the rendered text is capped;
* ``range()`` capped, ``lipsum`` removed, no loader (no ``include``/``import``).

The budget and the size checks live in :mod:`localrun.chat.budget`.

Models without a template get :func:`fallback_chat`: a plain ``System:/User:/Assistant:``
transcript that a base model continues as the assistant, with ``"User:"`` and
``"Assistant:"`` as extra stop strings, since a base model starts the next turn mid-line
too (Gemma 3 270M, a base model shipped without a template, answers sensibly this way).
Gemma's own turn format is available for a Gemma-vocabulary model whose file lost its template
(``gemma_turns=True``; the caller checks the vocab has ``<start_of_turn>``).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from localrun.chat.budget import (
    CURRENT_BUDGET,
    DEFAULT_MAX_OUTPUT_CHARS,
    FILTER_CHECKS,
    MAX_RANGE,
    Budget,
    check_binop,
    check_format,
    check_method_call,
    checked_filter,
    current_budget,
)
from localrun.errors import TemplateError

if TYPE_CHECKING:
    from jinja2 import Environment, Template, nodes
    from jinja2.parser import Parser
    from jinja2.runtime import Context

log = logging.getLogger(__name__)

#: Longest template source accepted; real chat templates are a few KB to ~30 KB.
MAX_TEMPLATE_CHARS = 1_000_000
_GUARD_ITER = "localrun_guard_iter"
_GUARD_CONCAT = "localrun_guard_concat"
_STRFTIME_WIDTH = re.compile(r"%[^a-zA-Z%]*\d{4,}")


class _GuardedIterable:
    """Wraps a ``{% for %}`` iterable so every step checks the deadline. Keeps ``len()``
    working, so ``loop.length`` and ``loop.last`` cost no extra pass."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Iterable[Any]) -> None:
        self._inner = inner

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]  # TypeError for iterators: LoopContext handles that

    def __iter__(self) -> Iterator[Any]:
        budget = current_budget()
        for item in self._inner:
            budget.check_time()
            yield item


def _pass_context(f: Callable[..., Any]) -> Callable[..., Any]:
    # A context-taking filter is never folded at compile time, so the guard stays.
    from jinja2 import pass_context

    return pass_context(f)


def _guard_iter_filter(_context: Any, value: Iterable[Any]) -> _GuardedIterable:
    return _GuardedIterable(value)


def _guard_concat_filter(_context: Any, parts: Iterable[Any]) -> str:
    strings = [str(p) for p in parts]
    current_budget().check_size(sum(map(len, strings)), "a string")
    return "".join(strings)


def _rewrite(node: nodes.Node) -> nodes.Node:
    """Wrap every for-loop iterable and replace every ``~`` concatenation with a guard."""
    from jinja2 import nodes

    for name in node.fields:
        value = getattr(node, name, None)
        if isinstance(value, nodes.Node):
            setattr(node, name, _rewrite(value))
        elif isinstance(value, list):
            setattr(node, name, [_rewrite(v) if isinstance(v, nodes.Node) else v for v in value])
    if isinstance(node, nodes.For):
        node.iter = nodes.Filter(node.iter, _GUARD_ITER, [], [], None, None, lineno=node.lineno)
    if isinstance(node, nodes.Concat):
        items = nodes.List(node.nodes, lineno=node.lineno)
        return nodes.Filter(items, _GUARD_CONCAT, [], [], None, None, lineno=node.lineno)
    return node


# --- the environment ---------------------------------------------------------------


def _raise_exception(message: Any = "") -> None:
    raise TemplateError(
        f"the chat template rejected the conversation: {message}",
        hint="check the message roles and order this model's template expects",
    )


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str) or len(fmt) > 200 or _STRFTIME_WIDTH.search(fmt):
        raise TemplateError("the chat template passed an unusable format to strftime_now")
    return datetime.now().strftime(fmt)


def _safe_range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise TemplateError(f"the chat template asks for range() of {len(r)} items, over the {MAX_RANGE} limit")
    return r


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """``tojson`` as Hugging Face templates expect it: plain json.dumps, no HTML escaping."""
    if isinstance(indent, int) and indent > 32 or isinstance(indent, str) and len(indent) > 32:
        raise TemplateError("the chat template asks tojson for an indent over 32")
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys, default=_listed
    )


def _listed(value: Any) -> list[Any]:
    """A filter's lazy result (``tools | map(attribute='function')``, DeepSeek R1) as the JSON list it stands for."""
    if isinstance(value, Iterator | _GuardedIterable):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


@functools.lru_cache(maxsize=1)
def _environment() -> Environment:
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """``{% generation %}…{% endgeneration %}`` marks assistant text for training
        masks in Hugging Face templates; for inference it renders its body as is."""

        tags = {"generation"}

        def parse(self, parser: Parser) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    class BudgetedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
            check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's
            current_budget().check_time()
            check_method_call(__obj, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value: Any) -> Any:
            # str.format is handed out at attribute time, so its width check is here too.
            owner = getattr(value, "__self__", None)
            if isinstance(owner, str) and getattr(value, "__name__", "") in ("format", "format_map"):
                check_format(owner)
            return super().wrap_str_format(value)

        def getattr(self, obj: Any, attribute: str) -> Any:
            current_budget().check_time()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            current_budget().check_time()
            return super().getitem(obj, argument)

    env = BudgetedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationTag])
    for name, check in FILTER_CHECKS.items():
        env.filters[name] = checked_filter(check, env.filters[name])
    env.filters["tojson"] = _tojson
    env.filters[_GUARD_ITER] = _pass_context(_guard_iter_filter)
    env.filters[_GUARD_CONCAT] = _pass_context(_guard_concat_filter)
    env.globals.pop("lipsum", None)
    env.globals.update(range=_safe_range, raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env


@functools.lru_cache(maxsize=64)
def _compile(source: str) -> Template:
    """Parse, rewrite and compile once per distinct template string."""
    from jinja2 import TemplateSyntaxError

    env = _environment()
    try:
        tree = cast("nodes.Template", _rewrite(env.parse(source)))  # a Template stays one
        return env.template_class.from_code(env, env.compile(tree), env.make_globals(None), None)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"the chat template does not parse: {exc.message} (line {exc.lineno})") from exc


def _as_dict(message: Any) -> dict[str, Any]:
    if isinstance(message, Mapping):
        return dict(message)
    return {"role": message.role, "content": message.content}


def render_chat(
    template: str,
    messages: Sequence[Any],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    timeout_s: float = 2.0,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render ``messages`` (Message objects or role/content dicts) with ``template``.

    Raises:
        TemplateError: the template does not parse, raises, touches something unsafe,
            runs past ``timeout_s`` or builds more than ``max_output_chars``.
    """
    if not isinstance(template, str) or not template.strip():
        raise TemplateError("the chat template is empty")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"the chat template is {len(template)} characters, over the {MAX_TEMPLATE_CHARS} limit")
    compiled = _compile(template)
    context = dict(variables or {})
    context.update(
        messages=[_as_dict(m) for m in messages],
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
    )
    budget = Budget(deadline=time.monotonic() + timeout_s, max_chars=max_output_chars, timeout_s=timeout_s)
    token = CURRENT_BUDGET.set(budget)
    pieces: list[str] = []
    total = 0
    try:
        for piece in compiled.generate(context):
            total += len(piece)
            budget.check_size(total, "a prompt")
            budget.check_time()
            pieces.append(piece)
    except TemplateError:
        raise
    except RecursionError as exc:
        raise TemplateError("the chat template recursed too deeply") from exc
    except Exception as exc:  # anything a template can raise: SecurityError, UndefinedError, TypeError…
        raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc
    finally:
        CURRENT_BUDGET.reset(token)
    return "".join(pieces)


# --- models without a template -------------------------------------------------------


#: Where a base model continuing a plain transcript has begun another turn.
TRANSCRIPT_STOPS = ("User:", "Assistant:")


@dataclass(frozen=True)
class FallbackPrompt:
    """A prompt built without the model's template, and stop strings that end a turn."""

    text: str
    stop: tuple[str, ...]
    style: str


def fallback_chat(messages: Sequence[Any], *, gemma_turns: bool = False, bos_token: str = "") -> FallbackPrompt:
    """A prompt for a model whose GGUF has no chat template.

    ``gemma_turns`` (the vocab has ``<start_of_turn>``): Gemma's own turn format, the system
    message folded into the first user turn as Gemma's template does. Otherwise a plain
    transcript ending in ``"Assistant:"``, which a base model continues as the assistant;
    ``"User:"`` and ``"Assistant:"`` stop it where it starts a next turn, on a new line or
    mid-line as small base models do (Gemma 3 270M: "Paris. Assistant: The capital of…").
    """
    msgs = [_as_dict(m) for m in messages]
    if gemma_turns:
        system = "\n\n".join(str(m["content"]) for m in msgs if m["role"] == "system")
        parts = [bos_token]
        for m in (m for m in msgs if m["role"] != "system"):
            role = "model" if m["role"] == "assistant" else "user"
            content = str(m["content"])
            if system and role == "user":
                content, system = f"{system}\n\n{content}", ""
            parts.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
        parts.append("<start_of_turn>model\n")
        return FallbackPrompt("".join(parts), ("<end_of_turn>",), "gemma")
    labels = {"system": "System", "user": "User", "assistant": "Assistant"}
    lines = [f"{labels.get(m['role'], str(m['role']).title())}: {m['content']}" for m in msgs]
    return FallbackPrompt(bos_token + "\n".join(lines) + "\nAssistant:", TRANSCRIPT_STOPS, "transcript")


#: A short conversation every chat template must render (a user's template is tried on it before it is kept).
SAMPLE_CONVERSATION = (
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
    {"role": "user", "content": "u2"},
)


def try_render(template: str) -> None:
    """Render ``template`` on :data:`SAMPLE_CONVERSATION` in the sandbox; a TemplateError says why it cannot serve."""
    render_chat(template, list(SAMPLE_CONVERSATION), bos_token="<s>", eos_token="</s>")
