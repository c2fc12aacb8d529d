"""The one error tree of localrun.

Every error a person can meet derives from :class:`LocalrunError` and carries a message
that names what went wrong and, where there is one, what to do about it (``hint``). Each
front end maps the tree to its own form in exactly one place: the server to an
OpenAI-shaped JSON error with :attr:`LocalrunError.http_status`, the CLI to a message
and :attr:`LocalrunError.exit_code`, the TUI to a notification.

    LocalrunError
     ├── ConfigError              bad settings or config file
     ├── InvalidName              a model name, ref or file name that is not allowed
     ├── ModelNotFound            no model by that name or ref
     ├── ModelExists              a name already taken
     ├── InvalidModelFile         a model file that fails validation (bad GGUF, …)
     ├── VerificationFailed       a stored file no longer matches its sha256
     ├── RuntimeUnavailable       a runtime that cannot run here (not installed, no device)
     ├── UnknownRuntime           a runtime name that does not exist
     ├── WontFit                  the plan says the model does not fit this machine
     ├── ContextOverflow          the prompt is longer than the context
     ├── TemplateError            a chat template failed, timed out or is missing
     ├── UnsupportedFeature       a request field the runtime cannot honour
     ├── InvalidMedia             an image or audio clip that cannot be read, or is over a cap
     ├── SlotError                a slot id, action or slot file the llama.cpp runtime cannot use
     ├── Overloaded               a model's queue is full (retry later)
     ├── WorkerCrashed            a worker process died while holding requests
     ├── InvalidModelOutput       the model's answer breaks what the request asked (a call's schema)
     ├── Cancelled                the request was cancelled
     ├── DownloadFailed           a pull that could not finish
     └── AccessDenied             a gated/private repo or a missing API key
"""

from __future__ import annotations

from typing import Any


class LocalrunError(Exception):
    """Base of every error localrun raises on purpose."""

    http_status: int = 500
    exit_code: int = 1
    code: str = "localrun_error"

    def __init__(self, message: str, *, hint: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.param = param

    def __str__(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message

    def to_dict(self) -> dict[str, Any]:
        """A plain form that crosses the worker pipe and rebuilds the same class."""
        return {"kind": type(self).__name__, "message": self.message, "hint": self.hint, "param": self.param}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> LocalrunError:
        cls = ERRORS_BY_NAME.get(data.get("kind", ""), LocalrunError)
        return cls(data.get("message", "unknown error"), hint=data.get("hint"), param=data.get("param"))


class ConfigError(LocalrunError):
    code = "config_error"
    exit_code = 2


class InvalidName(LocalrunError):
    http_status = 400
    code = "invalid_name"
    exit_code = 2


class ModelNotFound(LocalrunError):
    http_status = 404
    code = "model_not_found"
    exit_code = 3


class ModelExists(LocalrunError):
    http_status = 409
    code = "model_exists"
    exit_code = 2


class InvalidModelFile(LocalrunError):
    http_status = 422
    code = "invalid_model_file"
    exit_code = 4


class VerificationFailed(LocalrunError):
    http_status = 409
    code = "verification_failed"
    exit_code = 4


class RuntimeUnavailable(LocalrunError):
    http_status = 503
    code = "runtime_unavailable"
    exit_code = 5


class UnknownRuntime(LocalrunError):
    http_status = 400
    code = "unknown_runtime"
    exit_code = 2


class WontFit(LocalrunError):
    http_status = 507
    code = "wont_fit"
    exit_code = 6


class ContextOverflow(LocalrunError):
    http_status = 400
    code = "context_length_exceeded"
    exit_code = 2


class TemplateError(LocalrunError):
    http_status = 422
    code = "template_error"
    exit_code = 4


class UnsupportedFeature(LocalrunError):
    http_status = 400
    code = "unsupported_feature"
    exit_code = 2


class InvalidMedia(LocalrunError):
    """A request's image or audio that is corrupt, truncated, of an unknown format, over a size
    or pixel cap, or of a kind the projector does not take: always the client's 400."""

    http_status = 400
    code = "invalid_media"
    exit_code = 2


class SlotError(LocalrunError):
    """llama-server's slot API: a slot that does not exist, an unknown action, or a slot file
    that is missing, damaged or saved from another model or context."""

    http_status = 400
    code = "invalid_slot"
    exit_code = 2


class Overloaded(LocalrunError):
    http_status = 503
    code = "overloaded"
    exit_code = 7


class WorkerCrashed(LocalrunError):
    # 503, so clients retry (with Retry-After): the next request starts a new worker.
    http_status = 503
    code = "worker_crashed"
    exit_code = 8


class InvalidModelOutput(LocalrunError):
    # 500, as OpenAI answers "the model produced invalid content": the client may retry, the
    # sampling differs each time; what broke is named, the broken text is not passed on as valid.
    http_status = 500
    code = "invalid_model_output"
    exit_code = 1


class Cancelled(LocalrunError):
    http_status = 499
    code = "cancelled"
    exit_code = 130


class DownloadFailed(LocalrunError):
    http_status = 502
    code = "download_failed"
    exit_code = 9


class AccessDenied(LocalrunError):
    http_status = 401
    code = "access_denied"
    exit_code = 10


_ERROR_CLASSES: list[type[LocalrunError]] = [LocalrunError, *LocalrunError.__subclasses__()]
ERRORS_BY_NAME: dict[str, type[LocalrunError]] = {cls.__name__: cls for cls in _ERROR_CLASSES}
