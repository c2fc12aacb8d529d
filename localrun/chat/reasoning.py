"""Reasoning models: telling the reasoning channel from the answer, and bounding it.

Pure Python on the core ``Chunk`` stream, below every front end: the server's APIs, ``localrun run``
and the TUI's Chat all split with :func:`split_chunks` / :class:`ChunkSplitter`, so each shows the
same reasoning (OpenAI ``reasoning_content``/``reasoning``, Ollama ``thinking``, Anthropic
``thinking`` blocks, Responses ``reasoning`` items, the terminal's and the TUI's thinking block).
What each API calls its knobs lives with the server (``localrun.server.reasoning``).

**Formats** (:func:`detect_format`, from the model's chat template):

* ``think`` — DeepSeek-R1 and Qwen3: ``<think>…</think>`` then the answer. Some templates
  open the block in the generation prompt (the output then *starts* in reasoning); that is
  found by rendering the template once, the first time a template is seen (cached after).
* ``harmony`` — gpt-oss: ``<|channel|>analysis<|message|>…<|end|>`` then
  ``<|start|>assistant<|channel|>final<|message|>…``. Channels named ``analysis`` are
  reasoning; the others (``final``, ``commentary``) the answer. The markers are dropped.
  (No gpt-oss model could be run here: this follows the published format, tested on text.)

**Budgets** (:class:`ChunkSplitter`): when the reasoning reaches its budget, the front end stops
the generation and continues from the prompt plus the reasoning plus
:attr:`ReasoningFormat.forced_close` (:meth:`ChunkSplitter.continuation`; the prefix cache makes
that cheap), so the answer follows on every runtime that can continue a turn.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

from localrun.chat.template import render_chat
from localrun.errors import TemplateError
from localrun.types import ChatRequest, Chunk, Usage

log = logging.getLogger(__name__)

REASONING, ANSWER = "reasoning", "answer"


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    #: Marker strings the splitter looks for (the first two open and close a reasoning block for ``think``).
    markers: tuple[str, ...]
    #: Text appended after the reasoning when its budget runs out: the end of the block and
    #: whatever starts the answer.
    forced_close: str
    #: The generation prompt already opened the reasoning block.
    open_at_start: bool = False


THINK = ReasoningFormat("think", ("<think>", "</think>"), "\n</think>\n\n")
HARMONY = ReasoningFormat(
    "harmony",
    ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>", "<|call|>"),
    "<|end|><|start|>assistant<|channel|>final<|message|>",
)
FORMATS = {f.name: f for f in (THINK, HARMONY)}


@functools.lru_cache(maxsize=32)
def detect_format(template: str | None) -> ReasoningFormat | None:
    """The reasoning format a chat template speaks, or None for a model without one.

    Cached per template: a front end asks once per request, and a template is rendered (to see
    whether its generation prompt opens the block) only the first time it is seen.
    """
    if not template:
        return None
    if "<|channel|>" in template:
        return HARMONY
    if "</think>" in template or "<think>" in template:
        return ReasoningFormat(THINK.name, THINK.markers, THINK.forced_close, open_at_start=starts_open(template))
    return None


def starts_open(template: str) -> bool:
    """Whether the template's generation prompt ends inside ``<think>`` (DeepSeek-R1's newer templates)."""
    if "<think>" not in template:
        return False  # nothing to render: the prompt cannot open a block the template never writes
    try:
        text = render_chat(template, [{"role": "user", "content": "x"}], timeout_s=1.0)
    except TemplateError as exc:
        log.debug("cannot render the template to find its reasoning start: %s", exc)
        return False
    return text.rstrip().endswith("<think>")


class _Scanner:
    """Splits a growing text into plain text and marker strings, holding back a possible marker's start."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self.markers = markers
        self.pending = ""

    def feed(self, text: str) -> list[tuple[bool, str]]:
        """(is_marker, text) pieces, in order."""
        buf = self.pending + text
        out: list[tuple[bool, str]] = []
        while buf:
            hits = [(i, m) for m in self.markers if (i := buf.find(m)) >= 0]
            if not hits:
                break
            i, marker = min(hits)
            if i:
                out.append((False, buf[:i]))
            out.append((True, marker))
            buf = buf[i + len(marker) :]
        hold = max((k for m in self.markers for k in range(1, len(m)) if buf.endswith(m[:k])), default=0)
        self.pending = buf[len(buf) - hold :] if hold else ""
        if len(buf) > hold:
            out.append((False, buf[: len(buf) - hold]))
        return out

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text


class ReasoningSplitter:
    """Feeds on the model's output text; returns (channel, text) pieces, channel REASONING or ANSWER."""

    def __init__(self, fmt: ReasoningFormat) -> None:
        self.fmt = fmt
        self._scan = _Scanner(fmt.markers)
        self.channel = REASONING if fmt.open_at_start else ANSWER
        self._answered = False  # answer text seen: a later <think> is just text
        self._strip = False  # drop the blank line between the reasoning and the answer
        self._header: str | None = None  # harmony: the text between <|channel|> and <|message|>
        self._reasoned = False  # reasoning text seen in this block (its leading new lines are dropped)

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for is_marker, piece in self._scan.feed(text):
            if is_marker:
                self._marker(piece, out)
            else:
                self._text(piece, out)
        return out

    def flush(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        self._text(self._scan.flush(), out)
        return out

    def _text(self, text: str, out: list[tuple[str, str]]) -> None:
        if not text:
            return
        if self._header is not None:
            self._header += text
            return
        if self.channel == ANSWER and self._strip:
            text = text.lstrip()
            if not text:
                return
            self._strip = False
        if self.channel == ANSWER and text.strip():
            self._answered = True
        if self.channel == REASONING and not self._reasoned:
            text = text.lstrip()
            if not text:
                return
        if self.channel == REASONING:
            self._reasoned = True
        if out and out[-1][0] == self.channel:
            out[-1] = (self.channel, out[-1][1] + text)
        else:
            out.append((self.channel, text))

    def _marker(self, marker: str, out: list[tuple[str, str]]) -> None:
        if self.fmt.name == THINK.name:
            if marker == "<think>" and self.channel == ANSWER and not self._answered:
                self.channel, self._reasoned = REASONING, False
            elif marker == "</think>" and self.channel == REASONING:
                self.channel, self._strip = ANSWER, True
            else:
                self._text(marker, out)  # a tag in the wrong place is the model's text
            return
        if marker in ("<|channel|>", "<|start|>"):  # a role or channel name follows: not text
            self._header = ""
        elif marker == "<|message|>" and self._header is not None:
            name, self._header = self._header.strip(), None
            self.channel = REASONING if name.startswith("analysis") else ANSWER
            self._reasoned = False
        # <|end|>, <|return|>, <|call|>: structure, not text


def template_of(record: Any, plan: Any) -> str | None:
    """The chat template a loaded model speaks: the plan's override (``--chat-template``) or the GGUF's."""
    template = (getattr(plan, "options", None) or {}).get("chat_template") or record.metadata.get("chat_template")
    return template if isinstance(template, str) else None


class ChunkSplitter:
    """One request's reasoning split on the core ``Chunk`` stream, with its budget kept.

    :meth:`split` moves reasoning text from ``Chunk.text`` to ``Chunk.reasoning``. With a
    ``budget`` (reasoning pieces, about a token each), :attr:`exhausted` turns true when the
    reasoning reaches it; the caller then closes its stream and opens :meth:`continuation`,
    whose chunks go through :meth:`split_continued` (usage counts the reasoning as completion).
    """

    def __init__(self, fmt: ReasoningFormat, budget: int | None = None) -> None:
        self.fmt = fmt
        self.budget = budget
        self._splitter = ReasoningSplitter(fmt)
        self._raw: list[str] = []
        #: Reasoning pieces streamed before the continuation (what its usage adds to the completion).
        self.pieces = 0
        self._continued = False

    @property
    def skips_generation(self) -> bool:
        """No reasoning allowed and the prompt opened the block: close it before the model says anything."""
        return self.budget == 0 and self.fmt.open_at_start

    @property
    def exhausted(self) -> bool:
        return self.budget is not None and self._splitter.channel == REASONING and self.pieces >= self.budget

    def split(self, chunk: Chunk) -> Chunk:
        if not self._continued:
            self._raw.append(chunk.text)
        parts = self._splitter.feed(chunk.text)
        if chunk.finish_reason:
            parts += self._splitter.flush()
        reasoning = chunk.reasoning + "".join(t for c, t in parts if c == REASONING)  # kept if split already
        if not self._continued:
            self.pieces += bool(reasoning)
        return dataclasses.replace(chunk, text="".join(t for c, t in parts if c != REASONING), reasoning=reasoning)

    def continuation(self, req: ChatRequest) -> ChatRequest:
        """``req`` continued past a forced end of the reasoning: the prompt, the reasoning so far, the close."""
        self._splitter.feed(self.fmt.forced_close)  # now in the answer
        self._continued = True
        sampling = req.sampling
        if sampling.max_tokens is not None:
            sampling = dataclasses.replace(sampling, max_tokens=max(1, sampling.max_tokens - self.pieces))
        prefix = req.prefix + "".join(self._raw) + self.fmt.forced_close
        return dataclasses.replace(req, prefix=prefix, sampling=sampling)

    def split_continued(self, chunk: Chunk) -> Chunk:
        out = self.split(chunk)
        if chunk.usage is None:
            return out
        u, n = chunk.usage, self.pieces
        usage = Usage(
            prompt_tokens=max(0, u.prompt_tokens - n),
            completion_tokens=u.completion_tokens + n,
            cached_tokens=min(u.cached_tokens, max(0, u.prompt_tokens - n)),
        )
        return dataclasses.replace(out, usage=usage)


def split_chunks(chunks: Iterable[Chunk], fmt: ReasoningFormat | None) -> Generator[Chunk, None, None]:
    """``chunks`` with the reasoning in ``Chunk.reasoning`` (unchanged for a model without a format):
    the blocking form, for the CLI and the TUI's workers. Closing it closes ``chunks``."""
    if fmt is None:
        yield from chunks
        return
    splitter = ChunkSplitter(fmt)
    try:
        for chunk in chunks:
            yield splitter.split(chunk)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


async def _aclose(stream: AsyncIterator[Chunk]) -> None:
    """Close an async stream the way :func:`split_chunks` closes a sync one (the worker's streams and
    async generators have ``aclose``)."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


async def asplit_chunks(
    source: AsyncIterator[Chunk],
    splitter: ChunkSplitter,
    req: ChatRequest,
    reopen: Callable[[ChatRequest], Awaitable[Any]],
) -> AsyncIterator[Chunk]:
    """``source`` split by ``splitter``; at the budget ``source`` is closed (the worker stops) and the
    answer comes from ``await reopen(continuation)``, an async iterable closed with it. The server's form."""
    second = rest = None
    try:
        if not splitter.skips_generation:
            async for chunk in source:
                out = splitter.split(chunk)
                if splitter.exhausted and not chunk.finish_reason:
                    if out.reasoning or out.text:
                        yield out
                    break
                yield out
            else:
                return
        await _aclose(source)
        log.debug("reasoning budget of %s reached; closing the reasoning", splitter.budget)
        second = await reopen(splitter.continuation(req))
        rest = second.__aiter__()
        async for chunk in rest:
            yield splitter.split_continued(chunk)
    finally:
        await _aclose(source)
        if rest is not None:
            await rest.aclose()  # a client gone mid-answer stops the continuation in the worker too
        if second is not None:
            await second.aclose()
