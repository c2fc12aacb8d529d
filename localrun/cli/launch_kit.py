"""Not a command: what ``launch`` is built from — the model it serves to an agent when ``--model``
names none, the server it starts (or finds running), the log of what that server does, and the
folder of the files ``--print`` names.

An agent's first request is long (measured: Claude Code's ~20k tokens, opencode's ~7.7k, Codex's
~4.6k), so a model that cannot hold it, with room for a short answer, fails the agent's first turn
with "prompt is too long". ``launch``
plans every registered model (the built-ins first registered) as it would serve it and takes,
in this order: one whose context holds the first request, whose plan fits in memory, whose
template takes tools, that chats at all, the default chat model, the larger. It says which and
why on stderr.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localrun.errors import LocalrunError

if TYPE_CHECKING:
    from collections.abc import Callable

    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.planning.planner import PlanOverrides
    from localrun.settings import Settings
    from localrun.types import ModelRecord, Plan


#: Tokens left for the answer beyond the first request, for a context to count as holding it.
ANSWER_ROOM = 512


def holds(n_ctx: int, first_request: int) -> bool:
    """A context of ``n_ctx`` tokens takes the agent's first request and a short answer."""
    return n_ctx >= first_request + ANSWER_ROOM


@dataclass(frozen=True)
class Choice:
    """A model planned for an agent, and what decides between them."""

    record: ModelRecord
    plan: Plan
    holds: bool  # its context holds the agent's first request
    fits: bool  # its plan fits in memory
    tools: bool
    chats: bool
    default: bool  # the default chat model

    def key(self) -> tuple[bool, bool, bool, bool, bool, int]:
        return (self.holds, self.fits, self.tools, self.chats, self.default, self.record.size)

    def why(self, first_request: int, agent: str) -> str:
        held = "holds" if self.holds else "is the longest here, yet does not hold"
        kind = "takes tools" if self.tools else ("chats" if self.chats else "completes text only")
        return (
            f"{self.plan.n_ctx:,}-token context {held} {agent}'s first request (about {first_request:,} tokens); "
            f"it {kind}; --model picks another"
        )


def candidates(store: ModelStore) -> list[ModelRecord]:
    """The registered models an agent could use (the built-ins registered first): those that generate."""
    from localrun.modelstore.capabilities import capabilities
    from localrun.types import Format

    for ensure in ("ensure_chat_model", "ensure_default_model"):
        method = getattr(store, ensure, None)
        if method is not None:
            method()
    return [r for r in store.list() if r.format is not Format.REMOTE and "completion" in capabilities(r)]


def choose(
    settings: Settings,
    records: list[ModelRecord],
    first_request: int,
    overrides_for: Callable[[ModelRecord], PlanOverrides | None],
) -> Choice | None:
    """The best of ``records`` for an agent whose first request is ``first_request`` tokens; None for none."""
    from localrun.modelstore.builtins import CHAT_MODEL_NAME
    from localrun.modelstore.capabilities import capabilities, chat_template
    from localrun.planning.facts import default_plan

    choices = []
    for record in records:
        plan = default_plan(record, settings, overrides_for(record))
        caps = capabilities(record, settings)
        choices.append(
            Choice(
                record,
                plan,
                holds=holds(plan.n_ctx, first_request),
                fits=plan.verdict != "wont-fit",
                tools="tools" in caps,
                chats=bool(chat_template(record)),
                default=record.name == CHAT_MODEL_NAME,
            )
        )
    return max(choices, key=Choice.key, default=None)


def print_dir(settings: Settings, agent: str) -> Path:
    """Where ``launch --print`` keeps the files the printed command names (Codex's catalog): one
    folder per agent in the cache, rewritten each time, never a new temporary folder."""
    folder = settings.cache_dir / "launch" / agent
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def input_modalities(record: ModelRecord, settings: Settings | Any = None) -> tuple[str, ...]:
    """What the model reads, in Codex's catalog words: text, and image when it sees."""
    from localrun.modelstore.capabilities import capabilities

    return ("text", "image") if "vision" in capabilities(record, settings) else ("text",)


def running_server(url: str, key: str) -> dict[str, Any] | None:
    """The /health answer of a localrun server at ``url``, or None when none answers."""
    import httpx

    try:
        r = httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {key}"}, timeout=2)
        data = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("status") == "ok" and "version" in data else None


class Background:
    """A localrun server on a thread of this process, for as long as the agent runs."""

    def __init__(self, settings: Settings, manager: ModelManager) -> None:
        from localrun.server.serve import build_server

        self.url = ""
        ready = threading.Event()

        def on_ready(url: str) -> None:
            self.url = url
            ready.set()

        self.manager = manager
        self.server = build_server(settings, manager, ready_callback=on_ready, handle_signals=False)
        self.thread = threading.Thread(target=self.server.run, name="localrun-server", daemon=True)
        self.thread.start()
        if not ready.wait(30):
            self.stop()
            raise LocalrunError("the localrun server did not start within 30 s", hint="run `localrun serve` to see why")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.manager.shutdown()


def activity_log(path: Path) -> logging.Handler:
    """Send the server's activity (one line per request, refusals, reloads) and the workers' prefill
    progress to ``path``. A file, not the terminal: the agent's full-screen interface owns the terminal
    and repaints it, so lines written there would garble it and then be wiped. ``tail -f`` it elsewhere."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    activity = logging.getLogger("localrun.activity")
    activity.setLevel(logging.INFO)
    activity.addHandler(handler)
    activity.propagate = False  # not to the terminal's handler either
    os.environ["LOCALRUN_WORKER_LOG"] = "INFO"  # the workers (children of this process) log prefill progress
    return handler
