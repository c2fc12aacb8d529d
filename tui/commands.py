"""Command palette entries for models: load, unload, pin and chat with any model by name."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from localrun.tui.messages import ModelsChanged, Notice

if TYPE_CHECKING:
    from localrun.tui.app import LocalrunApp

log = logging.getLogger(__name__)


class ModelCommands(Provider):
    """Every registered model, with the actions that make sense for its state."""

    async def startup(self) -> None:
        backend = getattr(self.app, "backend", None)
        self._names: list[str] = []
        if backend is None:
            return
        records = await asyncio.to_thread(backend.list_models)
        self._names = [r.name for r in records]

    def _commands(self) -> list[tuple[str, Callable[[], None], str]]:
        app = self.app
        loaded = {m.name for m in getattr(app, "loaded", ())}
        out: list[tuple[str, Callable[[], None], str]] = []
        for name in self._names:
            if name in loaded:
                out.append((f"Unload {name}", partial(self._run, "unload", name), "free its memory now"))
            else:
                out.append((f"Load {name}", partial(self._run, "load", name), "start it so requests answer at once"))
            out.append((f"Pin {name}", partial(self._run, "pin", name), "keep it loaded until unpinned"))
            out.append((f"Chat with {name}", partial(self._chat, name), "open the chat screen with this model"))
        return out

    async def discover(self) -> Hits:
        for text, callback, help_text in self._commands():
            yield DiscoveryHit(text, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, callback, help_text in self._commands():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), callback, help=help_text)

    def _run(self, what: str, name: str) -> None:
        app = cast("LocalrunApp", self.app)
        backend = app.backend
        if backend is None:  # the palette lists models only when a backend listed them
            return
        calls: dict[str, tuple[Callable[[], object], str]] = {
            "load": (partial(backend.load, name), f"Loaded {name}"),
            "unload": (partial(backend.unload, name), f"Unloaded {name}"),
            "pin": (partial(backend.set_pin, name, True), f"Pinned {name}"),
        }
        fn, done = calls[what]

        def job() -> None:
            fn()
            app.post_message(Notice(done))
            app.post_message(ModelsChanged(f"{what} {name}"))

        app.run_worker(job, thread=True, name=f"{what} {name}", group=f"model:{name}", exit_on_error=False)

    def _chat(self, name: str) -> None:
        app = self.app
        app.switch_mode("chat")

        def choose() -> None:
            from localrun.tui.chat import ChatScreen

            screen = app.screen
            if isinstance(screen, ChatScreen):
                screen.select_model(name)

        app.call_after_refresh(choose)
