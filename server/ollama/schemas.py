"""Strict request schemas for the Ollama-compatible routes (``/api/...``).

Declares what the official ``ollama`` client sends (``ollama._types``). ``options`` are
lenient, as Ollama's are: the keys localrun honours are typed and bounded; Ollama's load-time
options (``num_thread``, ``num_gpu``, ``use_mmap``…) and samplers the runtime lacks are
accepted and ignored, and unknown keys (``draft_num_predict`` in Ollama's own docs) too;
every ignored key is named in the ``X-Localrun-Ignored-Fields`` header and the log
(:meth:`Options.ignored`), never silently dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import ConfigDict, Field, StringConstraints

from localrun.server.schemas import KeepAlive, ModelName, Seed, Stop, Strict, ToolDef, ToolName


class Options(Strict):
    """Ollama's ``options``. The first block is honoured; the rest is honoured where the runtime
    can (penalties, typical_p) and otherwise ignored and named; unknown keys land in ``model_extra``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    temperature: Annotated[float, Field(ge=0, le=100)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0, le=100_000)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Field(ge=0, le=10)] | None = None
    seed: Seed | None = None
    stop: Stop = None
    num_predict: Annotated[int, Field(ge=-2, le=2**31 - 1)] | None = None
    num_ctx: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None

    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    num_keep: int | None = None
    tfs_z: float | None = None
    typical_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repeat_last_n: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    penalize_newline: bool | None = None

    HONOURED: ClassVar[frozenset[str]] = frozenset(
        {"temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "stop", "num_predict", "num_ctx"}
    )

    #: Sampler knobs honoured when the runtime declares the capability of the same name.
    RUNTIME_KNOBS: ClassVar[tuple[str, ...]] = ("typical_p", "presence_penalty", "frequency_penalty")
    #: Values that ask for nothing (a sampler switched off, localrun's own penalty window): not ignored.
    NO_OP: ClassVar[dict[str, Any]] = {
        "mirostat": 0,
        "tfs_z": 1.0,
        "typical_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repeat_last_n": 64,
    }

    def unknown(self) -> list[str]:
        """The keys no Ollama version defines (or a typo), as the header names them."""
        return [f"options.{k}" for k in (self.model_extra or {})]

    def knobs(self, capabilities: frozenset[str]) -> dict[str, float]:
        """The runtime-dependent samplers to pass on: set, not a no-op, and declared by the runtime."""
        return {
            k: getattr(self, k)
            for k in self.RUNTIME_KNOBS
            if getattr(self, k) is not None and getattr(self, k) != self.NO_OP[k] and k in capabilities
        }

    def ignored(self, capabilities: frozenset[str]) -> list[str]:
        """Known keys that were set and will not act: load-time options (the model is already
        loaded as planned), samplers this runtime lacks (mirostat, tfs_z: none has them), and
        ``repeat_last_n`` other than localrun's fixed window of 64. Ollama ignores them too."""
        out = []
        for k in sorted(self.model_fields_set - self.HONOURED):
            value = getattr(self, k)
            if value is None or (k in self.NO_OP and value == self.NO_OP[k]):
                continue
            if k in self.RUNTIME_KNOBS and k in capabilities:
                continue
            out.append(f"options.{k}")
        return out


class CalledFunction(Strict):
    name: ToolName
    arguments: dict[str, Any] = {}
    index: int | None = None


class ToolCallIn(Strict):
    """A call in an assistant turn of the history: Ollama's shape, arguments as an object."""

    function: CalledFunction
    id: Annotated[str, StringConstraints(max_length=256)] | None = None
    type: str | None = None


class ChatMessage(Strict):
    role: Annotated[str, StringConstraints(pattern=r"^(system|user|assistant|tool)$")]
    content: str | None = None
    thinking: str | None = None
    #: Base64 files (images, or audio where the projector takes it), placed by Ollama's ``[img]`` rule.
    images: Annotated[list[str], Field(max_length=1000)] | None = None
    tool_calls: Annotated[list[ToolCallIn], Field(max_length=128)] | None = None
    tool_name: Annotated[str, StringConstraints(max_length=256)] | None = None
    tool_call_id: Annotated[str, StringConstraints(max_length=256)] | None = None


class _Generating(Strict):
    model: ModelName
    stream: bool | None = None
    options: Options | None = None
    format: Annotated[str, StringConstraints(max_length=16)] | dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def json_schema(self) -> dict[str, Any] | None:
        """``Sampling.json_schema`` from ``format``: ``"json"`` → any object, an object → that schema."""
        if self.format in (None, ""):
            return None
        if isinstance(self.format, str):
            if self.format != "json":
                raise ValueError(f'format {self.format!r} is neither "json" nor a JSON schema object')
            return {}
        return self.format

    def _unsupported_common(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []  # options are never refused: see Options.ignored
        if self.format not in (None, ""):
            found.append(("format", "json_schema"))
        if self.logprobs or self.top_logprobs:
            found.append(("logprobs", "logprobs"))
        return found


class ChatBody(_Generating):
    messages: Annotated[list[ChatMessage], Field(max_length=10_000)] | None = None
    tools: Annotated[list[ToolDef], Field(max_length=128)] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        found = self._unsupported_common()
        if self.tools:
            found.append(("tools", "tools"))
        for i, m in enumerate(self.messages or ()):  # images need what they hold: the MediaReader says
            if m.tool_calls or m.role == "tool":
                found.append((f"messages[{i}]", "tools"))
        return found


class GenerateBody(_Generating):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: Annotated[list[str], Field(max_length=1000)] | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        found = self._unsupported_common()
        for name, cap in (
            ("suffix", "fill-in-the-middle"),
            ("template", "custom templates"),
            ("context", "token_prompts"),
        ):
            if getattr(self, name):
                found.append((name, cap))
        for name in ("width", "height", "steps"):
            if getattr(self, name) is not None:
                found.append((name, "image generation"))
        return found


class EmbedBody(Strict):
    model: ModelName
    input: str | Annotated[list[str], Field(max_length=2048)]
    truncate: bool | None = None
    options: Options | None = None
    keep_alive: KeepAlive = None
    dimensions: Annotated[int, Field(ge=1, le=65_536)] | None = None


class EmbeddingsBody(Strict):
    """The legacy ``/api/embeddings`` (one prompt, one vector)."""

    model: ModelName
    prompt: str | None = None
    options: Options | None = None
    keep_alive: KeepAlive = None


#: ``model`` or the older ``name`` is required: the document says so as the routes enforce it.
def _one_required(*names: str) -> dict[str, Any]:
    """JSON Schema for "at least one of ``names``, as a non-empty string" (null is not one)."""
    return {"anyOf": [{"required": [n], "properties": {n: {"type": "string", "minLength": 1}}} for n in names]}


MODEL_OR_NAME = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_one_required("model", "name"))


class ModelBody(Strict):
    """``/api/show`` and ``/api/delete``: ``model``, or the older ``name``."""

    model_config = MODEL_OR_NAME

    model: ModelName | None = None
    name: ModelName | None = None
    verbose: bool | None = None

    def model_name(self) -> str | None:
        return self.model or self.name


class PullBody(Strict):
    model_config = MODEL_OR_NAME
    model: ModelName | None = None
    name: ModelName | None = None
    insecure: bool | None = None
    stream: bool | None = None
    username: str | None = None
    password: str | None = None


class CopyBody(Strict):
    """``/api/copy``: register ``destination`` as another model with ``source``'s files and overrides."""

    source: ModelName
    destination: ModelName


Sha256Ref = Annotated[str, StringConstraints(pattern=r"^sha256[:-][0-9a-fA-F]{64}$")]
FileName = Annotated[str, StringConstraints(max_length=1024)]


class CreateBody(Strict):
    """``/api/create`` as Ollama's docs/api.md has it today (``from`` or ``files``, then the layers)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "allOf": [
                _one_required("model", "name"),
                {
                    "anyOf": [
                        {"required": ["from"], "properties": {"from": {"type": "string"}}},
                        {"required": ["files"], "properties": {"files": {"type": "object"}}},
                    ]
                },
            ]
        },
    )

    model: ModelName | None = None
    name: ModelName | None = None  # the older field
    from_: Annotated[ModelName | None, Field(alias="from")] = None
    files: Annotated[dict[FileName, Sha256Ref], Field(max_length=64)] | None = None
    adapters: dict[str, Any] | None = None
    template: Annotated[str, StringConstraints(max_length=262_144)] | None = None
    renderer: str | None = None
    parser: str | None = None
    license: Annotated[str, StringConstraints(max_length=262_144)] | list[str] | None = None
    system: Annotated[str, StringConstraints(max_length=262_144)] | None = None
    parameters: dict[str, Any] | None = None
    messages: list[Any] | None = None
    stream: bool | None = None
    quantize: str | None = None
    modelfile: str | None = None  # the pre-0.5 body: a Modelfile's text
    path: str | None = None  # the pre-0.5 body: a Modelfile's path on the server
