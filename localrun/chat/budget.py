"""The size and time budget of one chat-template render, and the checks that keep a
template from allocating past it.

:mod:`localrun.chat.template` sets a :class:`Budget` in a ``ContextVar`` for each render
(so renders on different threads keep their own) and routes the template's operators,
filters and method calls through the checks here, which raise ``TemplateError`` *before*
a huge string, list or number is built.
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localrun.errors import TemplateError

#: Largest ``range()`` a template may build (Jinja's own sandbox uses the same number).
MAX_RANGE = 100_000
#: Default cap on the rendered prompt and on any string or list built while rendering.
DEFAULT_MAX_OUTPUT_CHARS = 8_000_000

WIDE_FORMAT = re.compile(r"%[^a-zA-Z%]*(\d{6,}|\*)|\{[^{}]*:[^{}]*(\d{6,}|\{)")


@dataclass(frozen=True)
class Budget:
    deadline: float
    max_chars: int
    timeout_s: float

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(
                f"the chat template ran longer than its {self.timeout_s:g} s budget",
                hint="the model's template loops too much; pass a template of your own",
            )

    def check_size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise TemplateError(
                f"the chat template would build {what} of {n} items, over the {self.max_chars} limit",
                hint="the model's template or the conversation is too large",
            )


# Used when no render is running (e.g. Jinja folding constants at compile time).
COMPILE_BUDGET = Budget(deadline=float("inf"), max_chars=DEFAULT_MAX_OUTPUT_CHARS, timeout_s=float("inf"))
CURRENT_BUDGET: contextvars.ContextVar[Budget] = contextvars.ContextVar(
    "localrun_template_budget", default=COMPILE_BUDGET
)


def current_budget() -> Budget:
    return CURRENT_BUDGET.get()


def size_of(x: Any) -> int:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else 0


def check_binop(op: str, left: Any, right: Any) -> None:
    b = current_budget()
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if size_of(seq) and isinstance(n, int):
                b.check_size(size_of(seq) * max(n, 0), "a repeated sequence")
    elif op == "+":
        if size_of(left) and size_of(right):
            b.check_size(size_of(left) + size_of(right), "a joined sequence")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if right > 100_000 or right * abs(left).bit_length() > 1_000_000:
                raise TemplateError(f"the chat template computes {left}**{right}, a number too large to build")
    elif op == "%" and isinstance(left, str) and WIDE_FORMAT.search(left):
        raise TemplateError("the chat template uses a %-format with a huge or variable width")


def checked_filter(check: Callable[..., None], original: Callable[..., Any]) -> Callable[..., Any]:
    # Filters marked pass_environment / pass_eval_context get that object first.
    skip = 1 if getattr(original, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check(*args[skip:], **kwargs)
        return original(*args, **kwargs)

    return wrapper


def _check_center(value: Any = "", width: Any = 80, *_a: Any, **_k: Any) -> None:
    current_budget().check_size(int(width) if isinstance(width, int) else 0, "a centred string")


def _check_indent(s: Any = "", width: Any = 4, *_a: Any, **_k: Any) -> None:
    pad = width if isinstance(width, int) else size_of(width)
    current_budget().check_size(size_of(s) + str(s).count("\n") * max(pad, 0) + pad, "an indented string")


def _check_wordwrap(
    s: Any = "", width: Any = 79, break_long_words: Any = True, wrapstring: Any = None, *_a: Any, **_k: Any
) -> None:
    current_budget().check_size(size_of(s) * (1 + size_of(wrapstring or "\n")), "a wrapped string")


def _check_count_arg(value: Any = None, n: Any = 1, *_a: Any, **_k: Any) -> None:
    if isinstance(n, int) and n > MAX_RANGE:
        raise TemplateError(f"the chat template asks for {n} groups, over the {MAX_RANGE} limit")


def check_format(value: Any = "", *_a: Any, **_k: Any) -> None:
    if isinstance(value, str) and WIDE_FORMAT.search(value):
        raise TemplateError("the chat template uses a format with a huge or variable width")


def _check_replace(*args: Any, **kwargs: Any) -> None:
    s, old, new = (list(args) + [kwargs.get("old", ""), kwargs.get("new", "")])[:3]
    _check_replace_sizes(str(s), str(old), str(new))


def _check_replace_sizes(s: str, old: str, new: str) -> None:
    if len(new) > len(old):
        hits = len(s) + 1 if not old else s.count(old)
        current_budget().check_size(len(s) + hits * (len(new) - len(old)), "a replaced string")


def _check_join(*args: Any, **kwargs: Any) -> None:
    items, sep = (list(args) + [None, kwargs.get("d", "")])[:2]
    if isinstance(items, (list, tuple)):
        total = sum(size_of(x) for x in items) + size_of(sep) * len(items)
        current_budget().check_size(total, "a joined string")


FILTER_CHECKS = {
    "center": _check_center,
    "indent": _check_indent,
    "wordwrap": _check_wordwrap,
    "batch": _check_count_arg,
    "slice": _check_count_arg,
    "format": check_format,
    "replace": _check_replace,
    "join": _check_join,
}

STR_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "to_bytes"})


def check_method_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Bound methods of str/bytes/int that allocate by an argument (``'a'.ljust(10**9)``,
    ``(1).to_bytes(10**9)``, ``s.replace('', big)``) are checked before they run."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if not isinstance(owner, (str, bytes, int)) or isinstance(owner, bool):
        return
    b = current_budget()
    ints = [a for a in (*args, *kwargs.values()) if isinstance(a, int)]
    if name in STR_WIDTH_METHODS:
        scale = size_of(owner) if name == "expandtabs" else 1
        for n in ints:
            b.check_size(max(n, 0) * max(scale, 1), f"the result of {name}()")
    elif name == "replace" and isinstance(owner, str) and len(args) >= 2:
        _check_replace_sizes(owner, str(args[0]), str(args[1]))
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        b.check_size(sum(size_of(x) for x in args[0]) + size_of(owner) * len(args[0]), "a joined string")
