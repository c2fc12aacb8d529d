"""MLX runtime: mlx-lm models (an ``mlx-community`` style folder) run in a worker process.

mlx and mlx-lm are imported inside the functions that use them, so this module costs
nothing where MLX is not installed. A model folder is untrusted input: folders that ship
code (``model_file`` or ``auto_map`` in their configs, ``*.py`` files) or pickle weights
are refused before mlx-lm sees them unless the plan says ``trust_remote_code``; mlx-lm
itself would import a ``model_file`` (CVE-2026-5843) and never touch the network for a
folder that exists, which is checked first.

Chat prompts are rendered from the tokenizer's chat template by localrun's sandboxed,
time-boxed renderer (:mod:`localrun.chat.template`), not by transformers' Jinja: a model
without a template gets that module's plain-transcript fallback. Generation streams with
``mlx_lm.stream_generate``; the KV cache of the previous request is kept and trimmed to
the prefix the next prompt shares with it, so a chat's next turn prefills only its new
tokens.

Capabilities "tools" and "logprobs" are wired in by :mod:`.mlx_features`: tools reach the
template (or the fallback block, or ``tools=`` of mlx-lm's own renderer) and the answer's
calls are parsed onto its last chunk; a forced ``tool_choice`` is refused (no grammar
engine). ``json_schema`` and ``grammar`` are not supported on MLX: the server answers 400
for them and the session refuses them too.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from localrun.chat import tools
from localrun.errors import (
    ContextOverflow,
    InvalidModelFile,
    ModelNotFound,
    RuntimeUnavailable,
    UnsupportedFeature,
)
from localrun.jsonfile import NotAJsonObject, read_json_object
from localrun.runtimes import mlx_features
from localrun.runtimes.base import RuntimeStatus
from localrun.runtimes.openai_compat.wire import refuse_media
from localrun.runtimes.pieces import Piece, shape_stream
from localrun.types import (
    Cancel,
    ChatRequest,
    Chunk,
    CompletionRequest,
    Format,
    Message,
    ModelRecord,
    Plan,
    Sampling,
    Usage,
)

if TYPE_CHECKING:
    from localrun.planning.hardware import HardwareProfile

log = logging.getLogger(__name__)

#: mlx-lm runs text models only (vision models need mlx-vlm, a separate engine): no vision, no audio.
_TEXT_ONLY = "mlx-lm runs the text part of a model only"

FIX = "pip install 'localrun[mlx]'"
#: Files that would be imported or unpickled by some loader; MLX itself needs none of them.
CODE_SUFFIXES = (".py", ".pyc")
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt")
#: Config keys that make transformers or mlx-lm import code shipped with the model.
CODE_KEYS = ("model_file", "auto_map")
#: Keys mlx-lm turns into a module name to import; only plain identifiers are allowed.
MODULE_NAME_KEYS = ("chat_template_type", "tool_parser_type")
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return read_json_object(path, max_bytes=MAX_CONFIG_BYTES)
    except NotAJsonObject as exc:
        raise InvalidModelFile(str(exc)) from exc


def check_model_folder(folder: Path, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """Validate an MLX model folder before any loader reads it; return its config.

    Raises:
        ModelNotFound: the folder does not exist.
        InvalidModelFile: not an MLX model folder, or it ships code or pickles and
            ``trust_remote_code`` is off.
    """
    if not folder.exists():
        raise ModelNotFound(f"no MLX model folder at {folder}", hint="pull or import the model again")
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise InvalidModelFile(f"{folder} is not an MLX model folder (no config.json)")
    config = _read_json(folder / "config.json")
    if not any(folder.glob("model*.safetensors")):
        raise InvalidModelFile(f"{folder} has no model*.safetensors weights")
    if trust_remote_code:
        return config
    hint = "only load it if you trust its author: set trust_remote_code for this model"
    tok_config = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    for name, data in (("config.json", config), ("tokenizer_config.json", tok_config)):
        for key in CODE_KEYS:
            if data.get(key):
                raise InvalidModelFile(f"{folder / name} asks to run code shipped with the model ({key!r})", hint=hint)
    for key in MODULE_NAME_KEYS:
        value = tok_config.get(key)
        if value is not None and not (isinstance(value, str) and value.isidentifier()):
            raise InvalidModelFile(f"{folder / 'tokenizer_config.json'} has a bad {key!r}: {value!r}")
    for path in folder.rglob("*"):
        if path.suffix.lower() in CODE_SUFFIXES:
            raise InvalidModelFile(f"{path} is Python code shipped with the model", hint=hint)
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise InvalidModelFile(f"{path} may be a pickle, which can run code when loaded", hint=hint)
    return config


class _PrefillCancelled(Exception):
    """Raised from mlx-lm's prefill progress callback to stop between prefill chunks."""


def _device_kind(mx: Any, device: Any, hw: HardwareProfile | None) -> str:
    """``metal``, ``cuda`` or ``cpu`` for MLX's default device: the hardware profile says which GPU
    when there is one; without it, MLX's own Metal check (``gpu`` when neither tells)."""
    if "gpu" not in str(device):  # "Device(gpu, 0)" / "Device(cpu, 0)"
        return "cpu"
    if hw is not None:
        return "metal" if hw.apple else "cuda"
    metal = getattr(mx, "metal", None)
    return "metal" if metal is not None and metal.is_available() else "gpu"


class MlxRuntime:
    name: ClassVar[str] = "mlx"
    formats: ClassVar[frozenset[Format]] = frozenset({Format.MLX})
    in_worker: ClassVar[bool] = True

    def probe(
        self,
        hw: HardwareProfile | None = None,
        *,
        import_module: Callable[[str], Any] | None = None,
        find_spec: Callable[[str], Any] | None = None,
    ) -> RuntimeStatus:
        """mlx.core is imported for its device; mlx-lm is only looked up (importing it pulls in
        transformers, about a second). ``import_module``/``find_spec`` replay a machine in tests."""
        import_module = import_module or importlib.import_module
        find_spec = find_spec or importlib.util.find_spec
        try:
            mx = import_module("mlx.core")
        except ImportError:
            return RuntimeStatus(self.name, False, reason="mlx is not installed", fix=FIX)
        except OSError as exc:  # a wheel whose native library cannot load on this machine
            return RuntimeStatus(self.name, False, reason=f"mlx is installed but will not load: {exc}", fix=FIX)
        if find_spec("mlx_lm") is None:
            return RuntimeStatus(self.name, False, reason="mlx is installed but mlx-lm is not", fix=FIX)
        device = mx.default_device()
        kind = _device_kind(mx, device, hw)
        details: dict[str, Any] = {"device": str(device), "mlx_version": _dist_version("mlx")}
        try:
            info = mx.device_info(device).items()
            details["device_info"] = {k: v for k, v in info if isinstance(v, (str, int, float))}
        except (AttributeError, RuntimeError, ValueError) as exc:
            log.debug("mlx device_info: %s", exc)
        reason = None if kind != "cpu" else "no GPU for MLX here: it runs on the CPU, slower than llama.cpp"
        return RuntimeStatus(
            self.name, True, version=_dist_version("mlx-lm"), devices=(kind,), reason=reason, details=details
        )

    def load(self, model: ModelRecord, plan: Plan) -> MlxSession:
        folder = Path(model.path)
        trust = bool(plan.options.get("trust_remote_code"))
        config = check_model_folder(folder, trust_remote_code=trust)
        try:
            import mlx.core as mx
            import mlx_lm
        except ImportError as exc:
            raise RuntimeUnavailable(f"MLX is not installed ({exc})", hint=FIX) from exc
        if plan.device == "cpu":
            mx.set_default_device(mx.cpu)
        try:
            # Two values without return_config=True; mlx-lm's annotation names both shapes.
            mlx_model, tokenizer = mlx_lm.load(str(folder), trust_remote_code=trust)  # type: ignore[misc]
        except (FileNotFoundError, ValueError, KeyError, TypeError, OSError, RuntimeError) as exc:
            raise InvalidModelFile(f"{model.name}: mlx-lm cannot load {folder}: {exc}") from exc
        log.info("loaded %s with mlx-lm on %s", model.name, mx.default_device())
        return MlxSession(mlx_model, tokenizer, plan=plan, name=model.name, config=config)


class MlxSession:
    """One loaded MLX model. Requests run one at a time (the worker serialises them)."""

    capabilities: frozenset[str] = mlx_features.CAPABILITIES
    concurrent = False

    def __init__(self, model: Any, tokenizer: Any, *, plan: Plan, name: str, config: dict[str, Any]):
        self._model = model
        self._tokenizer = tokenizer
        self._plan = plan
        self._name = name
        self._config = config
        self._cache: list[Any] | None = None  # KV cache of the last request
        self._cached_tokens: list[int] = []  # the tokens that cache holds, in order
        self._token_text: mlx_features.TokenText | None = None  # built on the first logprobs request

    # -- prompts -----------------------------------------------------------------------
    def prompt_template(self) -> str | None:
        """The template the chat prompt is rendered with: the tokenizer's Jinja template,
        :data:`~.mlx_features.RENDERER_TEMPLATE` for mlx-lm's own renderer, None for the fallback."""
        tok = self._tokenizer
        template = tok.chat_template
        if isinstance(template, dict):  # named templates: "default" is the chat one
            template = template.get("default")
        if isinstance(template, str) and template.strip():
            return template
        if getattr(tok, "has_chat_template", False):
            return mlx_features.RENDERER_TEMPLATE
        return None

    def chat_prompt(
        self, messages: Sequence[Message | dict[str, Any]], variables: dict[str, Any] | None = None
    ) -> tuple[list[int], tuple[str, ...]]:
        """Token ids of the chat prompt, and stop strings the prompt format adds.

        ``variables`` are extra template variables (``tools``, from :mod:`localrun.chat.tools`).
        """
        from localrun.chat.template import fallback_chat, render_chat

        tok = self._tokenizer
        template = self.prompt_template()
        if template is mlx_features.RENDERER_TEMPLATE:
            # mlx-lm's own renderer for this model family (code that ships with mlx-lm).
            msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
            extra = {"tools": variables["tools"]} if variables and variables.get("tools") else {}
            return list(tok.apply_chat_template(msgs, add_generation_prompt=True, **extra)), ()
        if template is not None:
            text = render_chat(
                template, messages, bos_token=tok.bos_token or "", eos_token=tok.eos_token or "", variables=variables
            )
            return list(tok.encode(text, add_special_tokens=False)), ()
        fallback = fallback_chat(messages, bos_token=tok.bos_token or "")
        return list(tok.encode(fallback.text, add_special_tokens=False)), fallback.stop

    # -- requests ----------------------------------------------------------------------
    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        refuse_media(req, runtime="mlx", model=self._name, why=_TEXT_ONLY)
        messages, variables = mlx_features.chat_inputs(req, self.prompt_template(), self._name)
        prompt, stops = self.chat_prompt(messages, variables)
        return tools.with_tool_calls(self._generate(prompt, req.sampling, stops, cancel), req, self.prompt_template())

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        refuse_media(req, runtime="mlx", model=self._name, why=_TEXT_ONLY)
        prompt = list(self._tokenizer.encode(req.prompt))
        return self._generate(prompt, req.sampling, (), cancel)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise UnsupportedFeature(
            f"{self._name}: the MLX runtime does not compute embeddings",
            hint="use a GGUF embedding model with llama.cpp or Ollama",
            param="input",
        )

    def close(self) -> None:
        self._model = self._tokenizer = self._cache = None
        self._cached_tokens = []
        try:
            import mlx.core as mx

            mx.clear_cache()
        except (ImportError, AttributeError) as exc:
            log.debug("mlx clear_cache: %s", exc)

    def _generate(
        self, prompt: list[int], s: Sampling, extra_stops: tuple[str, ...], cancel: Cancel
    ) -> Iterator[Chunk]:
        """Check the request and the prompt now (so the error comes before any chunk)."""
        mlx_features.check_sampling(s, self._name)
        n_ctx = self._plan.n_ctx
        if not prompt:
            raise ContextOverflow("the prompt is empty", hint="send at least one token of text")
        if len(prompt) >= n_ctx:
            raise ContextOverflow(
                f"the prompt is {len(prompt)} tokens; {self._name} is loaded with a {n_ctx}-token context",
                hint="shorten the conversation or load the model with a larger context",
            )
        room = n_ctx - len(prompt)
        max_tokens = room if s.max_tokens is None else min(max(s.max_tokens, 0), room)
        stops = tuple(s.stop) + extra_stops
        if max_tokens == 0:
            return iter([Chunk("", finish_reason="length", usage=Usage(prompt_tokens=len(prompt)))])
        track = None
        if s.logprobs is not None:
            if self._token_text is None:
                self._token_text = mlx_features.TokenText(self._tokenizer)
            track = mlx_features.LogprobTrack(self._token_text, s.logprobs)
        pieces = self._pieces(prompt, s, max_tokens, cancel, track)
        return shape_stream(pieces, stops=stops, cancel=cancel, prompt_tokens=len(prompt))

    def _pieces(
        self,
        prompt: list[int],
        s: Sampling,
        max_tokens: int,
        cancel: Cancel,
        track: mlx_features.LogprobTrack | None = None,
    ) -> Iterator[Piece]:
        import mlx.core as mx
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        if s.seed is not None:
            mx.random.seed(s.seed)
        sampler = make_sampler(
            temp=max(float(s.temperature), 0.0),
            top_p=float(s.top_p) if s.top_p and 0 < s.top_p < 1 else 0.0,
            min_p=float(s.min_p or 0.0),
            top_k=int(s.top_k or 0),
        )
        processors = None
        if s.repeat_penalty and s.repeat_penalty != 1.0:
            processors = make_logits_processors(repetition_penalty=float(s.repeat_penalty))
        cache, reused = self._take_cache(prompt)

        def on_prefill(done: int, total: int) -> None:
            if cancel.is_set():
                raise _PrefillCancelled

        produced: list[int] = []
        clean = False
        try:
            # The default stream, not mlx-lm's thread-local one: a thread-local stream used
            # from a request thread aborts the process when that thread's stream is torn down.
            for r in stream_generate(
                self._model,
                self._tokenizer,
                mx.array(prompt[reused:]),
                max_tokens=max_tokens,
                sampler=sampler,
                logits_processors=processors,
                prompt_cache=cache,
                prefill_step_size=max(int(self._plan.n_batch), 16),
                prompt_progress_callback=on_prefill,
                stream=mx.default_stream(mx.default_device()),
            ):
                produced.append(r.token)
                if track is not None and r.finish_reason != "stop":  # "stop": r.token ends the generation
                    track.read(r.token, r.logprobs)
                usage = None
                if r.finish_reason is not None:
                    usage = Usage(
                        prompt_tokens=len(prompt), completion_tokens=r.generation_tokens, cached_tokens=reused
                    )
                logprobs: tuple[dict[str, Any], ...] = ()
                if track is not None and track.entries:
                    logprobs = tuple(track.entries)
                    track.entries.clear()
                yield Piece(r.text, finish_reason=r.finish_reason, usage=usage, logprobs=logprobs)
            clean = True
        except _PrefillCancelled:
            clean = True  # the cache holds whole prefill chunks: still consistent
        except GeneratorExit:
            clean = True  # closed between tokens (stop string, cancel)
            raise
        finally:
            self._keep_cache(cache, prompt + produced if clean else None)

    # -- prefix cache ------------------------------------------------------------------
    def _take_cache(self, prompt: list[int]) -> tuple[list[Any], int]:
        """The last request's cache trimmed to the prefix it shares with ``prompt``, or a new one."""
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

        cache, cached = self._cache, self._cached_tokens
        self._cache, self._cached_tokens = None, []
        if cache is not None and cached and can_trim_prompt_cache(cache):
            common = 0
            for a, b in zip(cached, prompt):
                if a != b:
                    break
                common += 1
            common = min(common, len(prompt) - 1)  # at least one token must be fed
            if common > 0:
                # mlx-lm annotates a list; it returns the count of tokens trimmed.
                trimmed: int = trim_prompt_cache(cache, len(cached) - common)  # type: ignore[assignment]
                if trimmed == len(cached) - common:
                    return cache, common
        return make_prompt_cache(self._model), 0

    def _keep_cache(self, cache: list[Any], tokens: list[int] | None) -> None:
        offsets = {getattr(c, "offset", None) for c in cache}
        if tokens is None or len(offsets) != 1 or None in offsets:
            return  # an error mid-step may leave layers at different positions: start fresh next time
        offset = offsets.pop()
        if offset is None or offset > len(tokens):
            return
        self._cache, self._cached_tokens = cache, tokens[:offset]
