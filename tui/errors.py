"""The one place where an exception becomes what the TUI shows: a title, what went wrong
and the action to take. The app's single error handler calls :func:`describe_error`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from localrun import errors as E

log = logging.getLogger(__name__)

#: Title per error class, and the action to suggest when the error carries no hint.
TITLES: dict[type[E.LocalrunError], tuple[str, str]] = {
    E.ConfigError: ("Settings problem", "fix the config file or LOCALRUN_* variables, then restart"),
    E.InvalidName: ("Invalid name", "use letters, digits, '.', '_' or '-'"),
    E.ModelNotFound: ("Model not found", "check the name in the Library (1), or pull it from Discover (2)"),
    E.ModelExists: ("Name taken", "choose another name or delete the existing model"),
    E.InvalidModelFile: ("Invalid model file", "pull the model again or pick another file"),
    E.VerificationFailed: ("File damaged", "delete the model and pull it again"),
    E.InvalidModelOutput: (
        "Broken tool call",
        "send it again (each try samples anew), or pick a model that calls tools well",
    ),
    E.RuntimeUnavailable: ("Runtime unavailable", "see Hardware (3) for how to install or start it"),
    E.UnknownRuntime: ("Unknown runtime", "see Hardware (3) for the runtimes localrun knows"),
    E.WontFit: ("Model won't fit", "pick a smaller quant, lower the context, or unload other models"),
    E.ContextOverflow: ("Prompt too long", "start a new chat (ctrl+l) or shorten the prompt"),
    E.TemplateError: ("Chat template failed", "try raw completion, or another build of the model"),
    E.UnsupportedFeature: ("Not supported", "this runtime or model cannot do that"),
    E.InvalidMedia: ("Bad image or audio", "check the file (format, size) or attach another"),
    E.SlotError: ("Slot action failed", "check the slot id and the slot file"),
    E.Overloaded: ("Busy", "wait for running requests to finish, or unload a model"),
    E.WorkerCrashed: ("Model crashed", "load it again; if it keeps crashing, see the worker log"),
    E.Cancelled: ("Cancelled", "nothing to do"),
    E.DownloadFailed: ("Download failed", "check the network or the hub address, then pull again"),
    E.AccessDenied: ("Access denied", "run `hf auth login` or set HF_TOKEN, and accept the repo's terms"),
}


@dataclass(frozen=True)
class ErrorView:
    title: str
    message: str
    action: str

    def text(self) -> str:
        return f"{self.message}\n→ {self.action}"


def describe_error(exc: BaseException, *, doing: str = "", log_hint: str | None = None) -> ErrorView:
    """Title, message and action for any exception; unexpected ones point at the log."""
    if isinstance(exc, E.LocalrunError):
        title, default_action = next(
            (v for cls, v in TITLES.items() if type(exc) is cls),
            next((v for cls, v in TITLES.items() if isinstance(exc, cls)), ("Error", "see the log")),
        )
        return ErrorView(title, exc.message, exc.hint or default_action)
    where = f" while trying to {doing}" if doing else ""
    action = (
        f"this is a bug; the details are in {log_hint}"
        if log_hint
        else "this is a bug; run with --log-level DEBUG for details"
    )
    return ErrorView(f"Unexpected error{where}", f"{type(exc).__name__}: {exc}", action)
