"""A test launcher for a real server process: like ``localrun serve``, plus test knobs.

``python -m tests.server.launch --port P [--fake-delay S] [--queue-size N]
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
import sys


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
    from localrun.planning.facts import default_plan
    from localrun.modelstore.store import ModelStore
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
