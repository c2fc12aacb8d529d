"""The reasoning channel on a Generation: split it off the answer and hold it to a budget.

Every route asks for it the same way: it turns its own fields into a :class:`ReasoningAsk`
(Anthropic ``thinking``/``output_config.effort``, OpenAI ``reasoning_effort``, Ollama
``think``) and calls :func:`enable_reasoning` on the opened generation. For a model whose
template has a reasoning format (:mod:`localrun.chat.reasoning`) the chunks then carry the
reasoning in ``Chunk.reasoning`` and only the answer in ``Chunk.text``.

The budget is kept above the runtime, so it holds on each runtime that can continue a turn
(the ``reasoning_budget`` capability: the request's ``ChatRequest.prefix``). When the
reasoning reaches the budget (counted in streamed pieces, about a token each), the stream
is stopped and a second one started from the prompt + the reasoning so far + the format's
forced close; the prefix cache holds all but the close, so the answer starts at once.
``think: false`` (a budget of 0) closes the block before any reasoning. The usage of such
an answer adds the reasoning pieces to the continuation's completion tokens.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from localrun.errors import UnsupportedFeature
from localrun.chat.reasoning import REASONING, ReasoningFormat, ReasoningSplitter, detect_format, effort_budget
from localrun.server.errors import InvalidRequest
from localrun.server.generation import Generation, app_state
from localrun.types import ChatRequest, Chunk, Usage

log = logging.getLogger(__name__)


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


def think_reasoning(request, gen: Generation, req: ChatRequest, think) -> None:
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
        raise UnsupportedFeature(f"{gen.record.name} does not support thinking: its chat template has no reasoning channel",
                                 hint="leave 'think' out, or use a reasoning model", param="think")


def reasoning_fields(reasoning: str, settings) -> dict:
    """The OpenAI message/delta fields for reasoning text: ``reasoning_content``, ``reasoning`` or both
    (``server.reasoning_field``), nothing when there is none."""
    if not reasoning:
        return {}
    which = settings.server.reasoning_field if settings is not None else "both"
    names = ("reasoning_content", "reasoning") if which == "both" else (which,)
    return {name: reasoning for name in names}


def reasoning_format(gen: Generation) -> ReasoningFormat | None:
    template = gen.plan.options.get("chat_template") or gen.record.metadata.get("chat_template")
    return detect_format(template if isinstance(template, str) else None)


def enable_reasoning(request, gen: Generation, req: ChatRequest, ask: ReasoningAsk) -> ReasoningFormat | None:
    """Split the reasoning off ``gen``'s chunks (and bound it); None when the model has no reasoning channel."""
    fmt = reasoning_format(gen)
    if fmt is None:
        return None
    budget = ask.budget
    if budget is not None and req.sampling.max_tokens is not None and budget >= req.sampling.max_tokens:
        budget = None  # max_tokens ends it first anyway
    if budget is not None and "reasoning_budget" not in (gen.stream.capabilities or ()):
        raise UnsupportedFeature(f"{ask.field or 'the reasoning budget'!r} is not supported by the {gen.plan.runtime} runtime "
                                 f"serving {gen.record.name}: it cannot continue a turn past a forced end of thinking",
                                 hint="leave the budget out (max_tokens still bounds the answer)", param=ask.field)
    manager = app_state(request).manager
    gen.pipe(lambda source: _reasoned(source, fmt, budget, manager, gen.record.name, req))
    return fmt


async def _reasoned(source: AsyncIterator[Chunk], fmt: ReasoningFormat, budget: int | None, manager, model: str,
                    req: ChatRequest) -> AsyncIterator[Chunk]:
    splitter = ReasoningSplitter(fmt)
    raw: list[str] = []
    pieces = 0
    second = rest = None
    try:
        if budget == 0 and fmt.open_at_start:
            pass  # the prompt opened the block: close it before the model says anything
        else:
            async for chunk in source:
                raw.append(chunk.text)
                out = _split(splitter, chunk)
                pieces += bool(out.reasoning)
                if budget is not None and splitter.channel == REASONING and pieces >= budget and not chunk.finish_reason:
                    if out.reasoning or out.text:
                        yield out
                    break
                yield out
            else:
                return
        await source.aclose()  # stops the first generation in the worker
        splitter.feed(fmt.forced_close)  # now in the answer
        log.debug("%s: reasoning budget of %s reached; closing the reasoning", model, budget)
        sampling = req.sampling
        if sampling.max_tokens is not None:
            sampling = dataclasses.replace(sampling, max_tokens=max(1, sampling.max_tokens - pieces))
        cont = dataclasses.replace(req, prefix=req.prefix + "".join(raw) + fmt.forced_close, sampling=sampling)
        second = await manager.aopen(model, cont)
        rest = second.__aiter__()
        async for chunk in rest:
            out = _split(splitter, chunk)
            if chunk.usage is not None:
                u = chunk.usage
                out = dataclasses.replace(out, usage=Usage(prompt_tokens=max(0, u.prompt_tokens - pieces),
                                                           completion_tokens=u.completion_tokens + pieces,
                                                           cached_tokens=min(u.cached_tokens, max(0, u.prompt_tokens - pieces))))
            yield out
    finally:
        await source.aclose()
        if rest is not None:
            await rest.aclose()  # a client gone mid-answer stops the continuation in the worker too
        if second is not None:
            await second.aclose()


def _split(splitter: ReasoningSplitter, chunk: Chunk) -> Chunk:
    parts = splitter.feed(chunk.text)
    if chunk.finish_reason:
        parts += splitter.flush()
    reasoning = "".join(t for c, t in parts if c == REASONING)
    text = "".join(t for c, t in parts if c != REASONING)
    return dataclasses.replace(chunk, text=text, reasoning=reasoning)
