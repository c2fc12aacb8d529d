"""``make_app``: build the TUI from what the caller has, and make what it lacks.

Tests pass their own settings, store, manager and hardware facts; ``localrun tui`` passes
settings and lets the rest be made here. A store that cannot open does not stop the app:
it starts with the reason on screen (the Hardware screen still works).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from localrun.errors import LocalrunError

if TYPE_CHECKING:
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings
    from localrun.tui.app import LocalrunApp

log = logging.getLogger(__name__)


def make_app(
    settings: Settings | None = None,
    *,
    manager: ModelManager | None = None,
    store: ModelStore | None = None,
    serve: bool = True,
    facts: tuple[Any, dict[str, Any]] | None = None,
    planner: Any = None,
    log_path: str | None = None,
    poll_s: float = 1.0,
    default_model: bool = False,
) -> LocalrunApp:
    """A ready-to-run ``LocalrunApp``; ``app.owned_manager`` is the manager made here (the
    caller shuts it down after the app exits, see :func:`close_app`)."""
    from localrun.settings import load_settings
    from localrun.tui.app import LocalrunApp

    settings = settings if settings is not None else load_settings()
    problem = None
    owned = None
    if store is None:
        try:
            from localrun.modelstore.store import ModelStore

            store = ModelStore(settings)
        except (ImportError, LocalrunError) as exc:
            problem = f"The model store could not open: {exc}"
            log.error("%s", problem)
    if manager is None and store is not None:
        from localrun.manager import ModelManager

        manager = owned = ModelManager(settings, store, planner=planner)
    app = LocalrunApp(
        settings=settings,
        manager=manager,
        store=store,
        serve=serve,
        facts=facts,
        backend_error=problem,
        log_path=log_path,
        poll_s=poll_s,
        default_model=default_model,
    )
    app.owned_manager = owned
    return app


def close_app(app: LocalrunApp) -> None:
    """Stop what ``make_app`` started: the manager's workers (the server stops with the app)."""
    backend = getattr(app, "backend", None)
    if backend is not None and getattr(backend, "mode", "") == "attached":
        backend.close()
    owned = getattr(app, "owned_manager", None)
    if owned is not None:
        owned.shutdown()
