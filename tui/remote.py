"""The attached backend: another localrun serves the port, so the TUI is its client.

It uses the admin routes every localrun server has (``/admin/status``, ``/admin/load``,
``/admin/unload``, ``/admin/pin``) and its Ollama-compatible ones (``/api/tags``,
``/api/show``, ``/api/delete``, ``/api/chat`` streaming), so a TUI can manage a server
started by ``localrun serve`` or by another TUI. Plans, verification and GGUF details stay with the process that owns
the store; the library says so instead of guessing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any, ClassVar

from localrun.catalog import CatalogEntry
from localrun.errors import LocalrunError, RuntimeUnavailable, UnsupportedFeature
from localrun.tui.backend import LoadedInfo, ModelDetails, VerifyResult, metadata_lines
from localrun.types import (
    Cancel,
    ChatRequest,
    Chunk,
    CompletionRequest,
    FileEntry,
    Format,
    ModelRecord,
    Plan,
    Source,
    Usage,
)

log = logging.getLogger(__name__)


def _error_from(resp: Any) -> LocalrunError:
    """An HTTP error answer as the LocalrunError the server meant (OpenAI- or Ollama-shaped body)."""
    from localrun.errors import ERRORS_BY_NAME

    try:
        body = resp.json()
    except ValueError:
        body = {}
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        message = err.get("message") or f"HTTP {resp.status_code}"
        kind = next((cls for cls in ERRORS_BY_NAME.values() if cls.code == err.get("code")), LocalrunError)
        return kind(message, hint=err.get("hint"))
    return LocalrunError(
        str(err or f"the server answered HTTP {resp.status_code}"), hint="see the serving localrun's log"
    )


class RemoteBackend:
    """A client of a localrun server at ``url``."""

    mode: ClassVar[str] = "attached"
    can_plan: ClassVar[bool] = False

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout_s, connect=3.0))

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            resp = self._client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(
                f"the localrun server at {self.url} did not answer: {exc}",
                hint="restart `localrun tui` to serve from this window",
            ) from exc
        if resp.status_code >= 400:
            raise _error_from(resp)
        return resp.json() if resp.content else {}

    def list_models(self) -> list[ModelRecord]:
        return [e.record for e in self.catalog()]

    def catalog(self) -> list[CatalogEntry]:
        """The server's catalog as its /api/tags tells it: an upstream model's label comes from there."""
        models = self._call("GET", "/api/tags").get("models", [])
        return sorted((_entry_from_tag(m) for m in models), key=lambda e: e.name)

    def upstreams(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/admin/status").get("upstreams", []))

    def plan(self, record: ModelRecord) -> Plan | None:
        return None

    def details(self, name: str) -> ModelDetails:
        show = self._call("POST", "/api/show", json={"model": name})
        record = next((r for r in self.list_models() if r.name == name), None) or ModelRecord(name, Format.GGUF, "")
        extra = tuple(f"{k:<16} {v}" for k, v in (show.get("details") or {}).items() if v not in (None, "", []))
        lines = (*metadata_lines(record)[:1], *extra)
        return ModelDetails(record, None, ("Plans are shown by the localrun that serves this port.",), lines)

    def loaded(self) -> list[LoadedInfo]:
        return [LoadedInfo.from_manager(m) for m in self._call("GET", "/admin/status").get("models", [])]

    def load(self, name: str, *, pin: bool | None = None) -> None:
        self._call("POST", "/admin/load", json={"model": name, "pin": pin})

    def unload(self, name: str) -> bool:
        return bool(self._call("POST", "/admin/unload", json={"model": name}).get("unloaded"))

    def set_pin(self, name: str, pinned: bool) -> None:
        self._call("POST", "/admin/pin", json={"model": name, "pinned": pinned})

    def delete(self, name: str) -> ModelRecord | None:
        self._call("DELETE", "/api/delete", json={"model": name})
        return None

    def verify(self, name: str) -> VerifyResult:
        raise UnsupportedFeature(
            "verifying files is done by the localrun that owns the store",
            hint="run `localrun verify NAME`, or close the other localrun and serve from here",
        )

    def stream(self, name: str, req: ChatRequest | CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        s = req.sampling
        options: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k}
        if s.max_tokens:
            options["num_predict"] = s.max_tokens
        path: str
        body: dict[str, Any]
        if isinstance(req, ChatRequest):
            path, body = (
                "/api/chat",
                {"model": name, "messages": [{"role": m.role, "content": m.content} for m in req.messages]},
            )
        else:
            path, body = "/api/generate", {"model": name, "prompt": req.prompt, "raw": True}
        body.update(stream=True, options=options)
        with self._client.stream("POST", path, json=body) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise _error_from(resp)
            for line in resp.iter_lines():
                if cancel.is_set():
                    yield Chunk(finish_reason="cancelled")
                    return  # closing the response tells the server to stop generating
                if line.strip():
                    yield _chunk_from_ndjson(json.loads(line))

    def close(self) -> None:
        self._client.close()


def _entry_from_tag(m: dict[str, Any]) -> CatalogEntry:
    record = _record_from_tag(m)
    lr = m.get("localrun") or {}
    where = str(lr.get("source") or "")
    if not where.startswith("upstream "):
        return CatalogEntry(record.name, record, record.source.value)
    health = lr.get("health")
    label = where + (f" ({health})" if health else "")
    return CatalogEntry(record.name, record, label, health, tuple(where.removeprefix("upstream ").split(",")))


def _record_from_tag(m: dict[str, Any]) -> ModelRecord:
    details = m.get("details") or {}
    lr = m.get("localrun") or {}
    fmt = details.get("format") or "gguf"
    try:
        format_ = Format(fmt)
    except ValueError:
        format_ = Format.GGUF
    try:
        source = Source(lr.get("source", "imported"))
    except ValueError:
        source = Source.IMPORTED
    meta = {
        "quant": details.get("quantization_level"),
        "architecture": details.get("family"),
        "parameters": details.get("parameter_size"),
    }
    size = int(m.get("size") or 0)
    path = lr.get("path") or ""
    return ModelRecord(
        name=lr.get("name") or m.get("name") or m.get("model") or "?",
        format=format_,
        path=path,
        files=(FileEntry(path, size),),
        source=source,
        metadata={k: v for k, v in meta.items() if v},
    )


def _chunk_from_ndjson(d: dict[str, Any]) -> Chunk:
    if d.get("error"):
        raise LocalrunError(str(d["error"]), hint="see the serving localrun's log")
    text = (d.get("message") or {}).get("content", "") if "message" in d else d.get("response", "")
    if not d.get("done"):
        return Chunk(text=text)
    usage = Usage(prompt_tokens=int(d.get("prompt_eval_count") or 0), completion_tokens=int(d.get("eval_count") or 0))
    return Chunk(text=text, finish_reason=d.get("done_reason") or "stop", usage=usage)
