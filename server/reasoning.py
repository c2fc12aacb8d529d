"""The reasoning knobs of each wire family, turned into one budget for the splitter below them.

Every route asks the same way: it turns its own fields into a :class:`ReasoningAsk`
(Anthropic ``thinking.budget_tokens``/``output_config.effort``, OpenAI ``reasoning_effort``,
Responses ``reasoning.effort``, Ollama ``think``) and calls :func:`enable_reasoning` on the
opened generation. The split and the budget are :mod:`localrun.chat.reasoning`'s, the same code
``localrun run`` and the TUI use; for a model whose template has a reasoning format the chunks
then carry the reasoning in ``Chunk.reasoning`` and only the answer in ``Chunk.text``.

A budget needs the runtime to continue a turn (the ``reasoning_budget`` capability): past it
the splitter stops the stream and the answer continues from the prompt + the reasoning + the
format's forced close. ``think: false`` (a budget of 0) closes the block before any reasoning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

from localrun.chat.reasoning import ChunkSplitter, ReasoningFormat, asplit_chunks, detect_format, template_of
from localrun.errors import UnsupportedFeature
from localrun.server.errors import InvalidRequest
from localrun.server.generation import Generation, app_state
from localrun.types import ChatRequest

if TYPE_CHECKING:
    from localrun.settings import Settings

log = logging.getLogger(__name__)

#: Reasoning tokens per effort word (OpenAI reasoning_effort, Anthropic output_config.effort,
#: Ollama think levels). ``None``: no bound beyond max_tokens.
EFFORT_TOKENS: dict[str, int | None] = {
    "none": 0,
    "minimal": 256,
    "low": 1024,
    "medium": 4096,
    "high": 16384,
    "xhigh": 32768,
    "max": None,
}


def effort_budget(effort: str) -> int | None:
    """Tokens of reasoning an effort word allows; a word not in :data:`EFFORT_TOKENS` is a ValueError naming them."""
    try:
        return EFFORT_TOKENS[effort]
    except KeyError:
        raise ValueError(f"unknown effort {effort!r}; use one of: {', '.join(EFFORT_TOKENS)}") from None


@dataclass(frozen=True)
class ReasoningAsk:
    """What a request asked of the reasoning channel."""

    #: Reasoning tokens allowed: None for no bound beyond max_tokens, 0 to skip reasoning.
    budget: int | None = None
    #: The request field that set the budget, named in a 400 when the runtime cannot keep it.
    field: str | None = None


def effort_ask(effort: str | None, field: str) -> ReasoningAsk:
    """A budget from an effort word (OpenAI ``reasoning_effort``…); an unknown word is a 400 listing the known ones."""
    if effort is None:
        return ReasoningAsk()
    try:
        return ReasoningAsk(effort_budget(effort), field)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param=field) from None


def think_reasoning(request: Request, gen: Generation, req: ChatRequest, think: bool | str | None) -> None:
    """Ollama's ``think``: true (no bound), false (no reasoning), or a level word (a budget).
    Asking a model without a reasoning channel to think is a 400, as Ollama answers."""
    if think is None:
        ask = ReasoningAsk()
    elif think is True:
        ask = ReasoningAsk()
    elif think is False:
        ask = ReasoningAsk(0, "think")
    else:
        ask = effort_ask(str(think), "think")
    if enable_reasoning(request, gen, req, ask) is None and think not in (None, False):
        raise UnsupportedFeature(
            f"{gen.record.name} does not support thinking: its chat template has no reasoning channel",
            hint="leave 'think' out, or use a reasoning model",
            param="think",
        )


def reasoning_fields(reasoning: str, settings: Settings | None) -> dict[str, str]:
    """The OpenAI message/delta fields for reasoning text: ``reasoning_content``, ``reasoning`` or both
    (``server.reasoning_field``), nothing when there is none."""
    if not reasoning:
        return {}
    which = settings.server.reasoning_field if settings is not None else "both"
    names = ("reasoning_content", "reasoning") if which == "both" else (which,)
    return {name: reasoning for name in names}


def enable_reasoning(request: Request, gen: Generation, req: ChatRequest, ask: ReasoningAsk) -> ReasoningFormat | None:
    """Split the reasoning off ``gen``'s chunks (and bound it); None when the model has no reasoning channel."""
    fmt = detect_format(template_of(gen.record, gen.plan))
    if fmt is None:
        return None
    budget = ask.budget
    if budget is not None and req.sampling.max_tokens is not None and budget >= req.sampling.max_tokens:
        budget = None  # max_tokens ends it first anyway
    if budget is not None and "reasoning_budget" not in (gen.stream.capabilities or ()):
        raise UnsupportedFeature(
            f"{ask.field or 'the reasoning budget'!r} is not supported by the {gen.plan.runtime} runtime "
            f"serving {gen.record.name}: it cannot continue a turn past a forced end of thinking",
            hint="leave the budget out (max_tokens still bounds the answer)",
            param=ask.field,
        )
    manager, model = app_state(request).manager, gen.record.name
    splitter = ChunkSplitter(fmt, budget)
    gen.pipe(lambda source: asplit_chunks(source, splitter, req, lambda cont: manager.aopen(model, cont)))
    return fmt
