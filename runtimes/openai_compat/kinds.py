"""What differs between the engines behind an upstream, and their errors mapped to localrun's.

Every engine says it is "OpenAI-compatible"; they still differ in the health endpoint,
where they tell their version, which optional features they honour, whether they take
llama.cpp-style sampling knobs, and the shape of an error body. Facts are from the
engines' own sources (see /work/shared/reference/offline-and-gateway.md, part B4):

* vLLM 0.32: ``GET /health`` (200 empty, 503 when the engine died), ``GET /version``,
  errors ``{"error": {"message", "type", "param", "code": int}}`` (older releases: flat).
* SGLang: ``/health``, ``/get_server_info`` (has ``version``), flat errors
  ``{"object": "error", "message", "type", "param", "code": 400}``.
* TGI: ``/health``, ``/info`` (``version``, ``model_id``), errors ``{"error": "…",
  "error_type": "…"}``, the same object sent as an SSE event mid-stream; accepts any model
  name, so localrun sends the id TGI reports.
* TensorRT-LLM (``trtllm-serve``): ``/health`` (503 "LLM is unavailable"), flat
  ``ErrorResponse(message, type, code)``, validation errors ``{"error": str}``; one model.
* LMDeploy: ``/health`` (JSON ``status``), flat errors with ``object: "error"``.
* llama-server: ``/health`` (503 while loading), OpenAI-shaped errors.
* Ollama: ``/api/version``; ``/v1`` errors OpenAI-shaped, ``/api`` ones ``{"error": "…"}``.
* localrun: ``/health`` (with ``version``), OpenAI-shaped errors.

Capabilities are declared per kind, so the server's 400 rule holds for upstream models:
a field a kind is not known to honour is refused before any request leaves localrun.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from localrun.errors import ContextOverflow, LocalrunError, ModelNotFound

#: Servers' wording for a prompt longer than the context (MLC, Ollama, llama-server, vLLM).
CONTEXT_WORDS = re.compile(r"input length limit|context (length|window)|too long|exceeds? the (context|maximum)", re.I)

ALL_FEATURES = frozenset({"tools", "json_schema", "logprobs", "embeddings"})


@dataclass(frozen=True)
class Kind:
    """One engine's dialect of the OpenAI API."""

    name: str
    health_path: str
    capabilities: frozenset[str]
    #: Where the engine tells its version (a JSON object with "version"), if anywhere.
    version_path: str | None = None
    #: Takes top_k, min_p and repetition_penalty beside OpenAI's fields.
    extra_sampling: bool = False
    #: Serves one model and ignores the name asked for (TGI, TRT-LLM): send its own id.
    single_model: bool = False


KINDS: dict[str, Kind] = {
    "vllm": Kind("vllm", "/health", ALL_FEATURES, "/version", extra_sampling=True),
    "sglang": Kind("sglang", "/health", ALL_FEATURES, "/get_server_info", extra_sampling=True),
    "tgi": Kind("tgi", "/health", frozenset({"tools", "json_schema", "logprobs"}), "/info", single_model=True),
    "trtllm": Kind("trtllm", "/health", frozenset({"logprobs"}), None, extra_sampling=True, single_model=True),
    "lmdeploy": Kind("lmdeploy", "/health", frozenset({"tools", "json_schema", "logprobs"}), None, extra_sampling=True),
    "llama-server": Kind("llama-server", "/health", ALL_FEATURES, None, extra_sampling=True),
    "ollama": Kind("ollama", "/api/version", frozenset({"tools", "json_schema", "embeddings"}), "/api/version"),
    "localrun": Kind("localrun", "/health", ALL_FEATURES, "/health", extra_sampling=True),
    "openai": Kind("openai", "/v1/models", ALL_FEATURES, None),
}


#: How /v1/models entries say a model takes images or audio: llama-server's (and localrun's)
#: ``capabilities`` (``multimodal`` means its projector loaded: images at least), localrun's
#: ``modalities``, OpenRouter-style ``architecture.input_modalities``, LM Studio's ``type: vlm``.
_MEDIA_WORDS = {"vision": "vision", "image": "vision", "multimodal": "vision", "audio": "audio"}


def entry_media(entry: dict[str, Any] | None) -> frozenset[str]:
    """``vision`` / ``audio`` where an upstream's /v1/models entry says the model takes them.

    Nothing is assumed: an entry that says nothing (vLLM's, OpenAI's) declares no media, so
    the server's 400 rule answers instead of an upstream that would drop or reject the image.
    """
    if not isinstance(entry, dict):
        return frozenset()
    words: list[Any] = []
    caps = entry.get("capabilities")
    if isinstance(caps, list):
        words += caps
    modalities = entry.get("modalities")
    if isinstance(modalities, dict):
        words += [k for k, on in modalities.items() if on is True]
    arch = entry.get("architecture")
    if isinstance(arch, dict) and isinstance(arch.get("input_modalities"), list):
        words += arch["input_modalities"]
    if entry.get("type") == "vlm":
        words.append("vision")
    return frozenset(_MEDIA_WORDS[w] for w in words if isinstance(w, str) and w in _MEDIA_WORDS)


def get_kind(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise LocalrunError(f"unknown upstream kind {name!r}", hint="try one of: " + ", ".join(KINDS)) from None


# --- errors ---------------------------------------------------------------------------


class UpstreamError(LocalrunError):
    """An upstream failed or refused a request. ``retryable``: another upstream may succeed."""

    code = "upstream_error"
    http_status = 502

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        retryable: bool = False,
        kind: str = "error",
        hint: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message, hint=hint, param=param)
        self.http_status = status
        self.retryable = retryable
        #: For metrics: connect, timeout, http_4xx, http_5xx, auth, stream, overloaded.
        self.error_kind = kind


class UpstreamAuthFailed(UpstreamError):
    code = "upstream_auth_failed"


class UpstreamTimeout(UpstreamError):
    code = "upstream_timeout"


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced, so no key reaches a log line or a client."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return re.sub(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}", r"\1***", text)


def error_text(body: bytes | str) -> tuple[str, str | None]:
    """(message, type) from an error body in any of the engines' shapes.

    OpenAI / vLLM 0.32: ``{"error": {"message", "type", …}}``; flat (SGLang, LMDeploy,
    TRT-LLM, older vLLM): ``{"object": "error", "message", "type", …}``; TGI and Ollama:
    ``{"error": "…", "error_type": "…"}``; FastAPI (Xinference, validation):
    ``{"detail": "…" | [{"loc", "msg"}]}``; anything else: the text itself.
    """
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:500] or "(empty body)", None
    if not isinstance(data, dict):
        return json.dumps(data)[:500], None
    err = data.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or json.dumps(err))[:500], _str(err.get("type"))
    if isinstance(err, str):
        return err[:500], _str(data.get("error_type"))
    if "message" in data:
        return str(data["message"])[:500], _str(data.get("type"))
    detail = data.get("detail")
    if isinstance(detail, list):
        parts = [f"{'.'.join(map(str, d.get('loc', ())))}: {d.get('msg', '')}" for d in detail if isinstance(d, dict)]
        return "; ".join(parts)[:500] or json.dumps(detail)[:500], "validation_error"
    if detail is not None:
        return str(detail)[:500], None
    return json.dumps(data)[:500], None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def status_error(
    status: int,
    body: bytes | str,
    *,
    upstream: str,
    model: str,
    secrets: Iterable[str] = (),
    retry_after: str | None = None,
) -> LocalrunError:
    """The localrun error for an upstream's HTTP error answer, naming the upstream."""
    message, _type = error_text(body)
    message = scrub(message, secrets)
    where = f"upstream {upstream!r}"
    if status in (401, 403):
        return UpstreamAuthFailed(
            f"{where} refused localrun's key (HTTP {status}): {message}",
            status=403,
            kind="auth",
            hint=(
                f"fix 'key' or 'key_env' of [[upstreams]] name = {upstream!r} in config.toml (`localrun upstream "
                "add --replace`)"
            ),
        )
    if status == 404:
        err = ModelNotFound(
            f"{where} has no model {model!r} (HTTP 404): {message}",
            hint="`localrun upstream check` lists what it serves",
        )
        return err
    if status in (400, 413, 422) and CONTEXT_WORDS.search(message):
        return ContextOverflow(f"{where}: {message}", hint="shorten the conversation")
    if status in (400, 409, 413, 422):
        return UpstreamError(f"{where} refused the request (HTTP {status}): {message}", status=400, kind="http_4xx")
    if status == 429:
        hint = f"retry after {retry_after} s" if retry_after else "retry in a moment"
        return UpstreamError(
            f"{where} is overloaded (HTTP 429): {message}", status=503, retryable=True, kind="overloaded", hint=hint
        )
    retryable = status in (408, 500, 502, 503, 504)
    return UpstreamError(
        f"{where} failed (HTTP {status}): {message}",
        status=502,
        retryable=retryable,
        kind="http_5xx" if status >= 500 else "http_4xx",
    )
