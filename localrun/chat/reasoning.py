"""Reasoning models: telling the reasoning channel from the answer, and bounding it.

Pure Python on text, no runtime import: the server applies it to the one chunk stream of
every runtime, so each API shows the same split (OpenAI ``reasoning_content``/``reasoning``,
Ollama ``thinking``, Anthropic ``thinking`` blocks, Responses ``reasoning`` items).

**Formats** (:func:`detect_format`, from the model's chat template):

* ``think`` — DeepSeek-R1 and Qwen3: ``<think>…</think>`` then the answer. Some templates
  open the block in the generation prompt (the output then *starts* in reasoning);
  :func:`starts_open` renders the template once to find out.
* ``harmony`` — gpt-oss: ``<|channel|>analysis<|message|>…<|end|>`` then
  ``<|start|>assistant<|channel|>final<|message|>…``. Channels named ``analysis`` are
  reasoning; the others (``final``, ``commentary``) the answer. The markers are dropped.
  (No gpt-oss model could be run here: this follows the published format, tested on text.)

**Budgets**: :func:`effort_budget` maps the APIs' effort words to reasoning tokens. The
server enforces a budget above the runtime: when it runs out, it stops the generation and
continues from the prompt plus the reasoning plus :attr:`ReasoningFormat.forced_close`
(the prefix cache makes that cheap), so the answer follows on every runtime that can
continue a turn.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

REASONING, ANSWER = "reasoning", "answer"

#: Reasoning tokens per effort word (OpenAI reasoning_effort, Anthropic output_config.effort,
#: Ollama think levels). ``None``: no bound beyond max_tokens.
EFFORT_TOKENS: dict[str, int | None] = {
    "none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768, "max": None,
}


def effort_budget(effort: str) -> int | None:
    """Tokens of reasoning an effort word allows; a word not in :data:`EFFORT_TOKENS` is a ValueError naming them."""
    try:
        return EFFORT_TOKENS[effort]
    except KeyError:
        raise ValueError(f"unknown effort {effort!r}; use one of: {', '.join(EFFORT_TOKENS)}") from None


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
HARMONY = ReasoningFormat("harmony", ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>", "<|call|>"),
                          "<|end|><|start|>assistant<|channel|>final<|message|>")
FORMATS = {f.name: f for f in (THINK, HARMONY)}


def detect_format(template: str | None) -> ReasoningFormat | None:
    """The reasoning format a chat template speaks, or None for a model without one."""
    if not template:
        return None
    if "<|channel|>" in template:
        return HARMONY
    if "</think>" in template or "<think>" in template:
        return ReasoningFormat(THINK.name, THINK.markers, THINK.forced_close, open_at_start=starts_open(template))
    return None


@functools.lru_cache(maxsize=16)
def starts_open(template: str) -> bool:
    """Whether the template's generation prompt ends inside ``<think>`` (DeepSeek-R1's newer templates)."""
    from localrun.chat.template import render_chat
    from localrun.errors import TemplateError

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
            buf = buf[i + len(marker):]
        hold = max((k for m in self.markers for k in range(1, len(m)) if buf.endswith(m[:k])), default=0)
        self.pending = buf[len(buf) - hold:] if hold else ""
        if len(buf) > hold:
            out.append((False, buf[:len(buf) - hold]))
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


def split_text(fmt: ReasoningFormat | None, text: str) -> tuple[str, str]:
    """(reasoning, answer) of a whole output: what a non-streamed history or answer holds."""
    if fmt is None:
        return "", text
    splitter = ReasoningSplitter(fmt)
    parts = splitter.feed(text) + splitter.flush()
    return ("".join(t for c, t in parts if c == REASONING), "".join(t for c, t in parts if c == ANSWER))
