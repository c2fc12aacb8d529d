"""Not a command: how ``run`` loads its model — for one user, and never in silence.

``localrun run`` answers one person: one slot (not the server's four, each holding the whole
context) and no host-RAM or disk prompt cache (a single conversation keeps its prefix in its
slot), unless ``--parallel`` or the settings' ``[cache]`` ask otherwise. On a terminal the load
shows a spinner line on stderr at once (``loading gemma3-270m (253 MB)…``), and the time it took
is given apart from the first token, as Ollama's spinner and ``lms load``'s bar do.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from localrun.cli.output import err_console, human_bytes

if TYPE_CHECKING:
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings
    from localrun.types import ModelRecord


def for_one_user(settings: Settings) -> Settings:
    """``settings`` with the prompt cache's RAM and disk tiers off, where the user left them unset."""
    cache = settings.cache
    update = {k: 0 for k in ("kv_ram_bytes", "kv_disk_bytes") if getattr(cache, k) is None}
    if not update:
        return settings
    return settings.model_copy(update={"cache": cache.model_copy(update=update)})


def load_visibly(manager: ModelManager, record: ModelRecord) -> float:
    """Load ``record`` (a spinner line on a terminal's stderr meanwhile); the seconds it took,
    0.0 when it was already loaded."""
    if manager.is_loaded(record.name):
        return 0.0
    t0 = time.perf_counter()
    what = f"loading {record.name} ({human_bytes(record.size)})…"
    if sys.stderr.isatty():
        with err_console().status(what, spinner="dots"):
            manager.load(record.name)
    else:
        manager.load(record.name)
    return time.perf_counter() - t0


def ensure_builtins_visibly(store: ModelStore) -> None:
    """Register the built-in models for ``serve`` and the TUI, saying so first when it is the first
    time (assembling Gemma takes seconds, once): a new home never starts in silence."""
    from localrun.modelstore.builtins import CHAT_MODEL_NAME, DEFAULT_MODEL_NAME

    if any(store.index.find(name) is None for name in (DEFAULT_MODEL_NAME, CHAT_MODEL_NAME)):
        err_console().print("[dim]registering the built-in models (first run)…[/]", highlight=False)
    store.ensure_default_model()
    store.ensure_chat_model()


def announce_first_use(store: ModelStore, name: str) -> None:
    """Say so before a built-in model is registered on its first run (assembling Gemma takes seconds)."""
    from localrun.modelstore.builtins import CHAT_MODEL_NAME, DEFAULT_MODEL_NAME

    if name in (DEFAULT_MODEL_NAME, CHAT_MODEL_NAME) and store.index.find(name) is None:
        err_console().print(f"[dim]registering the built-in {name} (first run)…[/]", highlight=False)


def completion_note(record: ModelRecord, raw: bool, max_tokens: int | None, default: int) -> str | None:
    """What ``run`` says before completing with a model that has no chat template and no --max-tokens."""
    from localrun.modelstore.capabilities import chat_template

    if max_tokens is not None or not raw or chat_template(record):
        return None
    return f"no chat template: completing up to {default} tokens; --max-tokens changes it"
