"""A runtime with no model: a deterministic, word-per-token echo.

It ships in the package (as httpx ships ``MockTransport``) so the manager, worker, server,
TUI and CLI can be tested and demonstrated in milliseconds, and so the runtime contract
tests have a second implementation to keep the protocol honest. It follows the same rules
as llama.cpp: a chat template from the record's metadata when there is one, ContextOverflow
past ``n_ctx - 1``, ``max_tokens`` capped by the context, stop strings cut, cancel checked
every step, usage on the last chunk and prefix reuse reported as ``cached_tokens``.

The answer is ``"You said: <last user message>."`` followed by filler words: a fixed
cycle when ``temperature == 0``, seeded random words otherwise. It ends ("stop") after
``plan.options["fake_reply_words"]`` filler words (default 48). ``plan.options["fake_delay_s"]``
sleeps before each token, to make streams slow enough to cancel or kill mid-way.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import time
from collections.abc import Iterator, Sequence
from typing import ClassVar

from localrun import __version__
from localrun.chat_template import fallback_chat, render_chat
from localrun.errors import ContextOverflow, RuntimeUnavailable
from localrun.runtimes.base import RuntimeStatus
from localrun.runtimes.llamacpp_text import TextAssembler
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, Format, ModelRecord, Plan, Sampling, Usage

log = logging.getLogger(__name__)

_FILLER = (
    "the quick brown fox jumps over a lazy dog while seven small llamas count tokens "
    "under a quiet sky and nobody minds the weather"
).split()
_TOKEN = re.compile(r"\s*\S+")
EMBED_DIM = 16


def fake_tokenize(text: str) -> list[str]:
    """The fake vocabulary: one token per word, carrying its leading whitespace."""
    return _TOKEN.findall(text)


class FakeRuntime:
    name: ClassVar[str] = "fake"
    formats: ClassVar[frozenset[Format]] = frozenset(Format)
    in_worker: ClassVar[bool] = False

    def probe(self, hw=None) -> RuntimeStatus:
        return RuntimeStatus(name=self.name, available=True, version=__version__, devices=("cpu",),
                             reason="no model: a deterministic echo for tests and demos")

    def load(self, model: ModelRecord, plan: Plan) -> "FakeSession":
        return FakeSession(model, plan)


class FakeSession:
    capabilities: frozenset[str] = frozenset({"embeddings"})

    def __init__(self, model: ModelRecord, plan: Plan) -> None:
        self.model = model
        self.plan = plan
        self._delay = float(plan.options.get("fake_delay_s", 0) or 0)
        self._reply_words = int(plan.options.get("fake_reply_words", 48))
        self._last_prompt: list[str] = []
        self._closed = False

    # --- the protocol ---------------------------------------------------------------

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        template = self.model.metadata.get("tokenizer.chat_template") or self.model.metadata.get("chat_template")
        stops: tuple[str, ...] = ()
        if template:
            prompt = render_chat(template, req.messages, bos_token="<s>", eos_token="</s>")
        else:
            fallback = fallback_chat(req.messages)
            prompt, stops = fallback.text, fallback.stop
        last_user = next((m.content for m in reversed(req.messages) if m.role == "user"), "")
        return self._generate(prompt, f"You said: {last_user.strip()}.", req.sampling, cancel, stops)

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        tail = " ".join(req.prompt.split()[-8:])
        return self._generate(req.prompt, f" ... {tail}.", req.sampling, cancel, ())

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Deterministic unit vectors from a hash of each text: equal texts, equal vectors."""
        out = []
        for text in texts:
            digest = hashlib.sha256(text.encode()).digest()
            vec = [b / 255.0 - 0.5 for b in digest[:EMBED_DIM]]
            norm = sum(v * v for v in vec) ** 0.5 or 1.0
            out.append([v / norm for v in vec])
        return out

    def close(self) -> None:
        self._closed = True

    # --- generation ---------------------------------------------------------------------

    def _answer_tokens(self, head: str, sampling: Sampling) -> list[str]:
        if sampling.temperature and sampling.temperature > 0:
            rng = random.Random(sampling.seed)
            filler = [rng.choice(_FILLER) for _ in range(self._reply_words)]
        else:
            filler = [_FILLER[i % len(_FILLER)] for i in range(self._reply_words)]
        return fake_tokenize(head + " " + " ".join(filler))

    def _generate(self, prompt: str, head: str, sampling: Sampling, cancel: Cancel,
                  extra_stops: tuple[str, ...]) -> Iterator[Chunk]:
        if self._closed:
            raise RuntimeUnavailable("this fake session is closed", hint="load the model again")
        tokens = fake_tokenize(prompt)
        n_ctx = self.plan.n_ctx
        if len(tokens) > n_ctx - 1:
            raise ContextOverflow(
                f"the prompt is {len(tokens)} tokens but the context holds {n_ctx} (at most {n_ctx - 1} for the prompt)",
                hint="shorten the conversation or load the model with a larger context",
            )
        # Validation happens above, eagerly; the stream itself is a generator.
        return self._stream(tokens, head, sampling, cancel, extra_stops)

    def _stream(self, tokens: list[str], head: str, sampling: Sampling, cancel: Cancel,
                extra_stops: tuple[str, ...]) -> Iterator[Chunk]:
        cached = 0
        for a, b in zip(tokens, self._last_prompt):
            if a != b:
                break
            cached += 1
        cached = min(cached, len(tokens) - 1) if tokens else 0
        self._last_prompt = tokens
        room = self.plan.n_ctx - len(tokens)
        limit = room if sampling.max_tokens is None else min(sampling.max_tokens, room)
        answer = self._answer_tokens(head, sampling)
        text = TextAssembler((*sampling.stop, *extra_stops))
        produced = 0

        def final(reason: str, tail: str = "") -> Chunk:
            usage = Usage(prompt_tokens=len(tokens), completion_tokens=produced, cached_tokens=cached)
            return Chunk(text=tail, finish_reason=reason, usage=usage)

        while True:
            if cancel.is_set():
                yield final("cancelled", text.finish())
                return
            if produced >= limit:
                yield final("length", text.finish())
                return
            if produced >= len(answer):
                yield final("stop", text.finish())
                return
            if self._delay:
                time.sleep(self._delay)
            piece, stopped = text.feed(answer[produced].encode())
            produced += 1
            if stopped:
                yield final("stop", piece)
                return
            if piece:
                yield Chunk(text=piece)
