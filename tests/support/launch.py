"""The one place a test server's command line and environment are built, and the launcher itself.

``python -m tests.support.launch --port P [--fake-delay S] [--queue-size N]
[--option KEY=JSON ...] [--plan KEY=JSON ...]`` builds settings (``LOCALRUN_*`` env
applies, ``LOCALRUN_HOME`` included), the store and a ModelManager whose plans take the
planner's choice with the test's changes: ``--option`` merges into every plan's options
(``fake_capabilities=["tools"]`` for the fake runtime, ``embedding=true`` for llama.cpp),
``--plan`` sets a Plan field (``n_threads=1``: no thread barrier to stall on a busy shared
machine), ``--fake-delay``/``--fake-words`` are shorthands for the fake runtime's options.
It prints ``READY <url>`` on stdout once listening, and exits 2 with the message on a
ConfigError — what the CLI does, without assembling the default model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def launch_args(
    port: int,
    options: dict | None = None,
    plan: dict | None = None,
    *,
    host: str | None = None,
    api_key: str | None = None,
    log_level: str | None = None,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """This launcher on ``port`` with settings ``--option`` and plan ``--plan`` pairs (JSON values):
    the argument list after ``python -m``, so every test that starts one spells it the same way."""
    args = ["tests.support.launch", "--port", str(port)]
    if host:
        args += ["--host", host]
    if api_key:
        args += ["--api-key", api_key]
    if log_level:
        args += ["--log-level", log_level]
    for key, value in (options or {}).items():
        args += ["--option", f"{key}={json.dumps(value)}"]
    for key, value in (plan or {}).items():
        args += ["--plan", f"{key}={json.dumps(value)}"]
    return [*args, *extra]


def serve_args(port: int, *extra: str) -> list[str]:
    """``localrun serve`` itself (the real CLI, no default model) after ``python -m``."""
    return ["localrun", "serve", "--port", str(port), "--no-default-model", *extra]


def launch_env(home: Path | None = None, *, runtime: str | None = None, clean: bool = False, **extra: str) -> dict:
    """The child's environment: this repository importable, and where given, a LOCALRUN_HOME of
    its own (``home``), a forced runtime ("" lets the planner pick) and the user's own HF/LOCALRUN
    variables dropped (``clean``), so a server never reads the caller's config or models."""
    env = dict(os.environ)
    if clean:
        env = {k: v for k, v in env.items() if not k.startswith(("HF_", "LOCALRUN_", "HUGGING"))}
        env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    if home is not None:
        home = Path(home)
        env.update(LOCALRUN_HOME=str(home), HF_HOME=str(home / "hf"), OLLAMA_MODELS=str(home / "ollama-models"))
        env.pop("LOCALRUN_API_KEY", None)
    if runtime is not None:
        env["LOCALRUN_RUNTIME__FORCE"] = runtime
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def _pairs(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = json.loads(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--queue-size", type=int, default=None)
    parser.add_argument("--fake-delay", type=float, default=None, help="seconds per token of the fake runtime")
    parser.add_argument("--fake-words", type=int, default=None, help="filler words the fake runtime answers with")
    parser.add_argument("--option", action="append", default=[], help="KEY=JSON, merged into each plan's options")
    parser.add_argument("--plan", action="append", default=[], help="KEY=JSON, a Plan field to set (n_threads=1)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)

    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from localrun.errors import LocalrunError
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.planning.facts import default_plan
    from localrun.server.serve import run_server
    from localrun.settings import load_settings

    server = {"host": args.host, "port": args.port}
    if args.api_key:
        server["api_key"] = args.api_key
    if args.queue_size:
        server["queue_size"] = args.queue_size
    extra, fields = _pairs(args.option), _pairs(args.plan)
    if args.fake_delay is not None:
        extra["fake_delay_s"] = args.fake_delay
    if args.fake_words is not None:
        extra["fake_reply_words"] = args.fake_words
    try:
        settings = load_settings(server=server)
        store = ModelStore(settings)

        def planner(record):
            plan = default_plan(record, settings)
            if not (extra or fields):
                return plan
            return dataclasses.replace(plan, **fields, options={**plan.options, **extra})

        manager = ModelManager(settings, store, planner=planner)
        try:
            run_server(settings, manager, ready_callback=lambda url: print(f"READY {url}", flush=True))
        finally:
            manager.shutdown()
    except LocalrunError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
