"""Ollama runtime: an HTTP client to the Ollama server the user already runs.

Nothing native runs in localrun's process, so sessions live on threads in the server
(``in_worker = False``) and requests run concurrently: Ollama queues and batches them
itself (``OLLAMA_NUM_PARALLEL``). The context length is always sent (``num_ctx``), since
Ollama's own default silently truncates long prompts. Cancelling a request closes its
HTTP stream, which makes Ollama stop generating.

The server is found the way Ollama's own CLI finds it: ``OLLAMA_HOST`` with scheme and
port optional, default ``127.0.0.1:11434``.

Tools, structured outputs (json_object and json_schema) and log-probabilities are passed to
Ollama's own support for them; :mod:`.ollama_wire` holds the translation. What a session
declares depends on the model and on the server: ``tools`` when ``/api/show`` lists it,
``json_schema`` from Ollama 0.5.0, ``logprobs`` from Ollama 0.12.11 (read from
``/api/version`` at load). An older Ollama ignores ``logprobs`` rather than refusing it, so
the capability is not declared there and the server answers 400 naming the field; should
a server that claims a newer version still answer without any, the request fails with
:class:`~localrun.errors.UnsupportedFeature` rather than returning an empty list. Ollama
cannot force a tool call (``tool_choice`` "required" or a named function: 400) and cannot
follow a GBNF grammar (400).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

from localrun.errors import (
    Cancelled,
    DownloadFailed,
    LocalrunError,
    ModelNotFound,
    RuntimeUnavailable,
)
from localrun.runtimes.base import RuntimeStatus
from localrun.runtimes.ollama_client import (
    PROBE_TIMEOUT_S,
    START_HINT,
    OllamaClient,
    OllamaModel,
    PullProgress,
    ollama_base_url,
)
from localrun.runtimes.ollama_wire import (
    check_media,
    check_sampling,
    offered_tools,
    ollama_messages,
    parse_version,
    raw_prompt,
    sampling_fields,
    session_capabilities,
    shape_ollama_stream,
)
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, Format, ModelRecord, Plan, Sampling

if TYPE_CHECKING:
    from localrun.planning.hardware import HardwareProfile

log = logging.getLogger(__name__)

DEFAULT_KEEP_ALIVE = "30m"


def ollama_options(s: Sampling, *, n_ctx: int | None) -> dict[str, Any]:
    """Ollama's ``options`` for ``s``. ``num_ctx`` always goes, so no prompt is cut silently."""
    options: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "repeat_penalty": s.repeat_penalty,
    }
    if n_ctx:
        options["num_ctx"] = int(n_ctx)
    if s.seed is not None:
        options["seed"] = s.seed
    if s.stop:
        options["stop"] = list(s.stop)
    if s.max_tokens is not None:
        options["num_predict"] = s.max_tokens
    return options


def _tagged(name: str) -> str:
    """``llama3.2`` and ``llama3.2:latest`` are one model to Ollama."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _model_name(record: ModelRecord) -> str:
    return str(record.metadata.get("ollama_name") or record.repo or record.name)


class OllamaRuntime:
    name: ClassVar[str] = "ollama"
    formats: ClassVar[frozenset[Format]] = frozenset({Format.GGUF})
    in_worker: ClassVar[bool] = False

    def __init__(self, host: str | None = None, *, transport: httpx.BaseTransport | None = None):
        self._host = host
        self._transport = transport

    def _client(self, host: str | None = None, **kw: Any) -> OllamaClient:
        return OllamaClient(ollama_base_url(host or self._host), transport=self._transport, **kw)

    def probe(self, hw: HardwareProfile | None = None, *, env: Mapping[str, str] | None = None) -> RuntimeStatus:
        """An Ollama server reachable, its version and models. The host is this runtime's, else
        ``OLLAMA_HOST`` from ``env`` (default: the process environment); the transport is the
        runtime's, so tests replay every answer. Waits at most PROBE_TIMEOUT_S per request."""
        host = self._host if self._host is not None else (os.environ if env is None else env).get("OLLAMA_HOST", "")
        try:
            client = OllamaClient(
                ollama_base_url(host),
                transport=self._transport,
                read_timeout_s=PROBE_TIMEOUT_S,
                connect_timeout_s=PROBE_TIMEOUT_S,
            )
        except LocalrunError as exc:  # an OLLAMA_HOST that does not parse
            return RuntimeStatus(self.name, False, reason=exc.message, fix=exc.hint)
        try:
            version = client.request("GET", "/api/version").get("version")
            models = [m.get("name", "") for m in client.request("GET", "/api/tags").get("models", [])]
        except LocalrunError as exc:
            # Nothing answering wants a server started; something else answering wants the address checked.
            fix = "ollama serve" if exc.hint == START_HINT else "check OLLAMA_HOST"
            return RuntimeStatus(self.name, False, reason=exc.message, fix=fix, details={"url": client.base_url})
        finally:
            client.close()
        return RuntimeStatus(
            self.name, True, version=version, devices=("ollama",), details={"url": client.base_url, "models": models}
        )

    def list_models(self) -> list[OllamaModel]:
        client = self._client()
        try:
            rows = client.request("GET", "/api/tags").get("models", [])
        finally:
            client.close()
        out = []
        for m in rows:
            d = m.get("details") or {}
            out.append(
                OllamaModel(
                    name=m.get("name") or m.get("model", ""),
                    size=int(m.get("size") or 0),
                    digest=m.get("digest", ""),
                    modified_at=m.get("modified_at", ""),
                    family=d.get("family", ""),
                    parameter_size=d.get("parameter_size", ""),
                    quantization_level=d.get("quantization_level", ""),
                )
            )
        return out

    def pull(
        self, model: str, progress: Callable[[PullProgress], None] | None = None, *, cancel: Cancel | None = None
    ) -> None:
        """Have Ollama pull ``model`` into its own store, reporting each status line.

        Raises:
            ModelNotFound: the registry has no such model.
            DownloadFailed: the pull broke off or Ollama reported an error.
            Cancelled: ``cancel`` was set (Ollama keeps the part it fetched).
        """
        cancel = cancel or Cancel()
        client = self._client()
        last = None
        try:
            for event in client.stream("/api/pull", {"model": model, "stream": True}, cancel, model=model):
                last = PullProgress(
                    status=str(event.get("status", "")),
                    digest=event.get("digest"),
                    total=event.get("total"),
                    completed=event.get("completed"),
                )
                if progress is not None:
                    progress(last)
        except LocalrunError as exc:
            if isinstance(exc, (RuntimeUnavailable, ModelNotFound)):
                raise
            text = exc.message.lower()
            if "not exist" in text or "not found" in text:
                raise ModelNotFound(
                    f"the Ollama registry has no model {model!r}: {exc.message}",
                    hint="check the name on https://ollama.com/library",
                ) from exc
            raise DownloadFailed(f"Ollama could not pull {model!r}: {exc.message}", hint="run the pull again") from exc
        finally:
            client.close()
        if cancel.is_set():
            raise Cancelled(f"the pull of {model!r} was cancelled")
        if last is None or last.status != "success":
            raise DownloadFailed(f"Ollama's pull of {model!r} ended before it succeeded", hint="run the pull again")

    def load(self, model: ModelRecord, plan: Plan) -> OllamaSession:
        name = _model_name(model)
        client = self._client(
            plan.options.get("ollama_host"), read_timeout_s=float(plan.options.get("read_timeout_s", 600.0))
        )
        try:
            info = client.request("POST", "/api/show", model=name, json={"model": name})
            running = {_tagged(m.get("name", "")) for m in client.request("GET", "/api/ps").get("models", [])}
            was_loaded = _tagged(name) in running
            keep_alive = plan.options.get("keep_alive", DEFAULT_KEEP_ALIVE)
            caps = info.get("capabilities")  # absent before Ollama 0.6: assume a chat model
            version = parse_version(client.version())
            if plan.options.get("preload", True) and (caps is None or "completion" in caps):
                client.request(
                    "POST",
                    "/api/generate",
                    model=name,
                    json={"model": name, "stream": False, "keep_alive": keep_alive, "options": {"num_ctx": plan.n_ctx}},
                )
        except LocalrunError:
            client.close()
            raise
        capabilities = session_capabilities(caps, version)
        return OllamaSession(
            client, name, plan=plan, keep_alive=keep_alive, capabilities=capabilities, unload_on_close=not was_loaded
        )


class OllamaSession:
    """One model in Ollama. Requests may run concurrently: Ollama schedules them."""

    concurrent = True

    def __init__(
        self,
        client: OllamaClient,
        name: str,
        *,
        plan: Plan,
        keep_alive: Any,
        capabilities: frozenset[str],
        unload_on_close: bool,
    ):
        self._client = client
        self.model = name
        self._plan = plan
        self._keep_alive = keep_alive
        self.capabilities = capabilities
        self._unload_on_close = unload_on_close

    def _body(self, s: Sampling, **fields: Any) -> dict[str, Any]:
        check_sampling(s, self.capabilities, model=self.model)
        return {
            "model": self.model,
            "stream": True,
            "keep_alive": self._keep_alive,
            "options": ollama_options(s, n_ctx=self._plan.n_ctx),
            **sampling_fields(s),
            **fields,
        }

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        """Refusals are raised here, before anything is sent; the answer streams after."""
        tools = offered_tools(req, self.capabilities, model=self.model)
        check_media(req.media, self.capabilities, model=self.model)
        body = self._body(req.sampling, messages=ollama_messages(req.messages))
        if tools:
            body["tools"] = tools
        events = self._client.stream("/api/chat", body, cancel, model=self.model)
        return shape_ollama_stream(events, "chat", sampling=req.sampling, cancel=cancel, server=self._client.base_url)

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        # raw: the prompt goes to the model as is, without the model's chat template.
        check_media(req.media, self.capabilities, model=self.model)
        body = self._body(req.sampling, raw=True, **raw_prompt(req.prompt, req.media))
        events = self._client.stream("/api/generate", body, cancel, model=self.model)
        return shape_ollama_stream(
            events, "generate", sampling=req.sampling, cancel=cancel, server=self._client.base_url
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        vectors: list[list[float]] = self.serve_embed_usage(texts)["embeddings"]
        return vectors

    def serve_embed_usage(self, inputs: Sequence[str]) -> dict[str, Any]:
        """Vectors and Ollama's own count of the tokens they took (``prompt_eval_count``)."""
        data = self._client.request(
            "POST",
            "/api/embed",
            model=self.model,
            json={"model": self.model, "input": list(inputs), "keep_alive": self._keep_alive},
        )
        return {
            "embeddings": [list(map(float, row)) for row in data.get("embeddings", [])],
            "prompt_tokens": int(data.get("prompt_eval_count") or 0),
        }

    def close(self) -> None:
        """Unload the model from Ollama, unless it was loaded before localrun asked for it."""
        try:
            if self._unload_on_close:
                self._client.request(
                    "POST",
                    "/api/generate",
                    model=self.model,
                    timeout=5.0,
                    json={"model": self.model, "keep_alive": 0, "stream": False},
                )
        except LocalrunError as exc:
            log.warning("could not unload %s from Ollama: %s", self.model, exc)
        finally:
            self._client.close()
