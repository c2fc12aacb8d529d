"""The plain data that crosses rooms: model records, plans, requests and chunks (:mod:`localrun.chunks`).

These are frozen dataclasses owned by the core. The server translates OpenAI and Ollama
wire formats to and from them; the worker pipe carries them as dicts (``to_dict`` /
``from_dict``). Nothing here imports a runtime or a UI.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import os
import threading
from dataclasses import dataclass, field
from typing import Any

# Re-exported: they lived here first, and every layer imports them from here.
from localrun.chunks import CallDelta as CallDelta
from localrun.chunks import Chunk as Chunk
from localrun.chunks import Usage as Usage
from localrun.chunks import fold as fold
from localrun.chunks import logprob_entry as logprob_entry


class Format(str, enum.Enum):
    GGUF = "gguf"
    MLX = "mlx"
    MLC = "mlc"
    REMOTE = "remote"  # served by an upstream server; no files here


class Source(str, enum.Enum):
    """Where a model's files came from; decides whether localrun may delete them."""

    IMPORTED = "imported"  # a local path registered in place
    HUB = "hub"  # pulled by localrun into the HF cache
    HF_CACHE = "hf-cache"  # found in the HF cache, fetched by another tool
    OLLAMA = "ollama"
    LMSTUDIO = "lmstudio"
    BUILTIN = "builtin"  # the embedded default model
    BUNDLE = "bundle"  # imported from a `localrun bundle` into the HF cache
    UPSTREAM = "upstream"  # a model another server serves (localrun/upstreams.py)


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str | None = None
    #: st_mtime_ns when the file last matched ``sha256``; a file touched since is re-hashed before use.
    mtime_ns: int | None = None
    #: st_ctime_ns at the same moment: ``touch -r``, ``cp -p`` and ``rsync -t`` put an mtime back,
    #: nothing puts a change time back, so a file is trusted unread only when both still match.
    ctime_ns: int | None = None

    def matched_at(self, path: str | os.PathLike[str]) -> FileEntry:
        """This entry with ``path``'s current mtime and ctime: the moment it was seen to match ``sha256``."""
        st = os.stat(path)
        return dataclasses.replace(self, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)

    def unchanged_at(self, st: os.stat_result) -> bool:
        """Whether a file with stat ``st`` is, by its times and size, the one that matched (never by mtime alone)."""
        return self.ctime_ns is not None and (st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (
            self.size,
            self.mtime_ns,
            self.ctime_ns,
        )


@dataclass(frozen=True)
class ModelRecord:
    """One registered model, as the index stores it."""

    name: str
    format: Format
    path: str  # the file a runtime loads (first shard for split GGUF) or the model folder
    files: tuple[FileEntry, ...] = ()
    source: Source = Source.IMPORTED
    owned: bool = False  # True only for files localrun itself downloaded
    repo: str | None = None
    revision: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    added_at: float = 0.0

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["format"] = self.format.value
        d["source"] = self.source.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelRecord:
        d = dict(d)
        d["format"] = Format(d["format"])
        d["source"] = Source(d.get("source", "imported"))
        d["files"] = tuple(FileEntry(**f) for f in d.get("files", ()))
        return cls(**d)


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    overhead: int
    #: Host RAM the prompt cache may fill with prefixes evicted from the slots (``cache.kv_ram_bytes``):
    #: empty at load, it grows as slots are evicted, so it is outside :attr:`total` and inside
    #: :attr:`ceiling`.
    prompt_cache: int = 0

    @property
    def total(self) -> int:
        """What the model takes once loaded."""
        return self.weights + self.kv_cache + self.overhead

    @property
    def ceiling(self) -> int:
        """The most it takes once the prompt cache has filled too."""
        return self.total + self.prompt_cache


@dataclass(frozen=True)
class Plan:
    """How and where a model runs, and why. Built by the planner, carried to the worker."""

    runtime: str
    device: str = "cpu"
    n_gpu_layers: int = 0
    n_ctx: int = 2048
    n_threads: int = 2
    n_batch: int = 512
    kv_type: str = "f16"
    memory: MemoryEstimate | None = None
    verdict: str = "fits"  # fits | tight | wont-fit
    reasons: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        d = dict(d)
        if d.get("memory"):
            d["memory"] = MemoryEstimate(**d["memory"])
        d["reasons"] = tuple(d.get("reasons", ()))
        return cls(**d)


#: Where one media item (an image, an audio clip) sits in a message's ``content`` or a completion's
#: ``prompt``: the runtime puts that item's tokens there, the n-th marker taking ``media[n]``. Wire
#: converters add one per item where the client placed it and neutralise the literal in client text
#: (:func:`strip_media_markers`), so a user cannot forge one.
MEDIA_MARKER = "<__media__>"
#: ``ModelRecord.metadata`` key: the absolute path of the model's multimodal projector (an
#: ``mmproj*.gguf``), which is also one of ``ModelRecord.files`` (so verify, rm, bundles and the
#: mirror carry it with the model). Absent for a text-only model.
META_PROJECTOR = "localrun.projector"
#: Capabilities a session declares when its projector takes images / audio.
VISION, AUDIO = "vision", "audio"
#: The media limits the server's door and the runtime's decoder child share, so that what one
#: admits the other decodes: the most pixels an image may claim (8000×8000, Anthropic's largest;
#: ``server.max_image_pixels`` may lower it, never raise it), and the most channels a WAV may have.
MAX_IMAGE_PIXELS = 64_000_000
MAX_AUDIO_CHANNELS = 32
#: The longest audio clip, in seconds (ten 30-second Whisper windows): the door reads it from a
#: WAV's or FLAC's header, the decoder from the stream.
MAX_AUDIO_SECONDS = 300.0


def strip_media_markers(text: str) -> str:
    """``text`` with every literal :data:`MEDIA_MARKER` defused (client text must not place media)."""
    return text.replace(MEDIA_MARKER, "<__media_>") if MEDIA_MARKER in text else text


@dataclass(frozen=True)
class Media:
    """One image or audio clip of a request, as the client sent it (decoded from base64 or a
    fetched URL, not yet decoded as an image: the runtime does that, where a bad file can only
    hurt a sacrificial process)."""

    kind: str  # "image" | "audio"
    data: bytes  # the encoded file: PNG, JPEG, WebP, GIF, BMP…; WAV, MP3, FLAC
    mime: str | None = None  # as declared by the client (a data: URL's type, input_audio's format)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "data": base64.b64encode(self.data).decode("ascii"), "mime": self.mime}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Media:
        try:
            data = base64.b64decode(d["data"], validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise ValueError(f"media data is not base64: {exc}") from None
        return cls(kind=str(d["kind"]), data=data, mime=d.get("mime"))


def _media_to_dict(items: tuple[Media, ...]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in items]


def _media_from(items: Any) -> tuple[Media, ...]:
    return tuple(m if isinstance(m, Media) else Media.from_dict(m) for m in items or ())


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    #: For an assistant turn that called tools: ``({"id", "type": "function", "function": {"name", "arguments"}}, …)``.
    tool_calls: tuple[dict[str, Any], ...] = ()
    #: For a ``tool`` turn: which call this result answers.
    tool_call_id: str | None = None
    name: str | None = None
    #: An assistant turn's reasoning (an Anthropic ``thinking`` block, OpenAI's ``reasoning_content``):
    #: templates that render it (Qwen3's, gpt-oss's) keep it inside a tool-use loop.
    reasoning: str = ""
    #: Images and audio of this turn, in order; ``content`` holds one :data:`MEDIA_MARKER` per item.
    media: tuple[Media, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["media"] = _media_to_dict(self.media)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        d = dict(d)
        d["tool_calls"] = tuple(d.get("tool_calls") or ())
        d["media"] = _media_from(d.get("media"))
        return cls(**d)


@dataclass(frozen=True)
class Sampling:
    """Sampling knobs shared by every runtime. ``None`` means the runtime's default."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    #: A GBNF grammar every sampled token must keep valid.
    grammar: str | None = None
    #: Constrain the output to JSON: ``{}`` for any JSON object (json_object mode), else a JSON Schema.
    #: The runtime compiles it (llama.cpp: to a grammar, inside the worker).
    json_schema: dict[str, Any] | None = None
    #: Return log-probabilities: ``0`` for the chosen token only, ``n`` for the top n alternatives too.
    logprobs: int | None = None
    #: Choices to generate from the one prompt (OpenAI ``n``); chunks carry their choice's ``index``.
    n: int = 1
    #: ``((token id, bias), …)`` added to the logits before sampling; ±100 bans or forces a token.
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: OpenAI's penalties: per occurrence of a token so far, and once for any occurrence.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    #: Locally typical sampling (1.0: off).
    typical_p: float = 1.0
    #: Never stop at an end-of-generation token (benchmarks); the length limit still ends the answer.
    ignore_eos: bool = False
    #: No end-of-generation token before this many tokens.
    min_tokens: int = 0
    #: llama-server's ``id_slot``: run in this slot (a llama.cpp sequence), waiting for it if busy; -1: any.
    id_slot: int = -1


def _sampling_from(d: dict[str, Any] | None) -> Sampling:
    s = dict(d or {})
    s["stop"] = tuple(s.get("stop") or ())
    s["logit_bias"] = tuple((int(t), float(b)) for t, b in s.get("logit_bias") or ())
    return Sampling(**s)


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[Message, ...]
    sampling: Sampling = field(default_factory=Sampling)
    #: OpenAI-shaped tool definitions (``{"type": "function", "function": {...}}``), passed to the template.
    tools: tuple[dict[str, Any], ...] = ()
    #: ``"auto"`` | ``"none"`` | ``"required"`` | ``{"type": "function", "function": {"name": …}}``.
    tool_choice: Any = None
    #: Several calls in one answer (OpenAI's ``parallel_tool_calls``): True allows them; False and
    #: unset (None) hold a grammar-capable runtime to one, as llama-server does, so a small model
    #: cannot repeat calls until its length limit cuts one.
    parallel_tool_calls: bool | None = None
    #: Extra variables for the chat template (``chat_template_kwargs``: ``enable_thinking``…).
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: Open an assistant turn after the messages (the template's ``add_generation_prompt``).
    add_generation_prompt: bool = True
    #: Continue the last (assistant) message instead of starting a new turn.
    continue_final_message: bool = False
    #: Text the assistant's answer already starts with, appended after the rendered prompt: how a
    #: reasoning budget continues past a forced end of thinking (runtimes declaring "reasoning_budget").
    prefix: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["messages"] = [m.to_dict() for m in self.messages]
        return d

    @property
    def media(self) -> tuple[Media, ...]:
        """Every media item of the conversation, in prompt order."""
        return tuple(item for m in self.messages for item in m.media)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChatRequest:
        return cls(
            messages=tuple(Message.from_dict(m) for m in d["messages"]),
            sampling=_sampling_from(d.get("sampling")),
            tools=tuple(d.get("tools") or ()),
            tool_choice=d.get("tool_choice"),
            parallel_tool_calls=d.get("parallel_tool_calls"),
            template_kwargs=dict(d.get("template_kwargs") or {}),
            add_generation_prompt=bool(d.get("add_generation_prompt", True)),
            continue_final_message=bool(d.get("continue_final_message", False)),
            prefix=d.get("prefix") or "",
        )


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    sampling: Sampling = field(default_factory=Sampling)
    #: The prompt as token ids (OpenAI's token-array prompt); when set, ``prompt`` is unused.
    prompt_tokens: tuple[int, ...] = ()
    #: Text after the insertion point: the prompt and this are filled in the middle (FIM tokens).
    suffix: str | None = None
    #: With ``suffix``: how the middle begins (llama-server's /infill ``prompt``); the model goes on from it.
    middle: str = ""
    #: Images and audio for the prompt (llama-server's ``multimodal_data``); ``prompt`` holds one
    #: :data:`MEDIA_MARKER` per item (appended after the text when the client placed none).
    media: tuple[Media, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["media"] = _media_to_dict(self.media)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompletionRequest:
        return cls(
            prompt=d["prompt"],
            sampling=_sampling_from(d.get("sampling")),
            prompt_tokens=tuple(int(t) for t in d.get("prompt_tokens") or ()),
            suffix=d.get("suffix"),
            middle=d.get("middle") or "",
            media=_media_from(d.get("media")),
        )


class Cancel:
    """A flag a generation loop checks every decode step. Thread-safe, cheap to poll."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()
