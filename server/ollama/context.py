"""``/api/generate``'s ``context``: the token ids of prompt and answer, out in the last chunk and
back in on the next request, as Ollama does (its older clients keep a conversation that way).

Out: the prompt as the runtime sees it (the raw prompt, or the chat template applied to the
system and user turns) tokenized, then the answer tokenized again (chunks carry text, not ids:
the same ids wherever the text round-trips, which a byte split inside a character does not).
In: those ids go first, as the prompt's token ids, and the new prompt's ids follow. Both need a runtime that tokenizes
(``token_prompts``: llama.cpp); on others no ``context`` is sent, and one sent is a 400 naming
the field (the route's field policy).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from starlette.requests import Request

from localrun.errors import LocalrunError
from localrun.server.generation import Generation, app_state
from localrun.server.validate import check_id_count
from localrun.types import ChatRequest, CompletionRequest

log = logging.getLogger(__name__)

CAPABILITY = "token_prompts"


def _call(request: Request, model: str, method: str, args: dict[str, Any]) -> Awaitable[dict[str, Any]]:
    return asyncio.to_thread(app_state(request).manager.call, model, method, args)


async def prompt_text(request: Request, model: str, req: ChatRequest | CompletionRequest) -> str:
    """The prompt as text, as the runtime renders it."""
    if isinstance(req, CompletionRequest):
        return req.prompt
    messages = [{"role": m.role, "content": m.content} for m in req.messages]
    out = await _call(request, model, "apply_template", {"messages": messages, "add_generation_prompt": True})
    return str(out.get("prompt", ""))


async def token_ids(request: Request, model: str, text: str, *, add_special: bool) -> list[int]:
    out = await _call(request, model, "tokenize", {"content": text, "add_special": add_special})
    return [int(t) for t in out.get("tokens", ())]


async def with_context(
    request: Request, model: str, req: ChatRequest | CompletionRequest, context: list[int]
) -> CompletionRequest:
    """``req`` continued from ``context``: its prompt's ids appended to the earlier ones."""
    text = await prompt_text(request, model, req)
    ids = await token_ids(request, model, text, add_special=False)
    check_id_count("context" if len(context) >= len(ids) else "prompt", len(context) + len(ids))
    return CompletionRequest(prompt=text, sampling=req.sampling, prompt_tokens=(*context, *ids))


async def answer_context(
    request: Request, gen: Generation, req: ChatRequest | CompletionRequest, answer: str
) -> list[int] | None:
    """Prompt ids + answer ids for the last chunk; None where the runtime cannot tokenize."""
    if CAPABILITY not in (gen.stream.capabilities or ()):
        return None
    model = gen.record.name
    try:
        if isinstance(req, CompletionRequest) and req.prompt_tokens:
            prompt = list(req.prompt_tokens)
        else:
            prompt = await token_ids(request, model, await prompt_text(request, model, req), add_special=True)
        return prompt + await token_ids(request, model, answer, add_special=False)
    except LocalrunError as exc:  # the answer is complete; a context it cannot count is left out, not an error
        log.warning("no context for %s: %s", model, exc)
        return None
