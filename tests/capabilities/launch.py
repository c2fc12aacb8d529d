"""A server process for the capability tests: ``tests.server.launch`` plus plan options.

``python -m tests.capabilities.launch --port P [--option KEY=JSON ...]`` serves like
``localrun serve`` (settings from ``LOCALRUN_*``, the store under ``LOCALRUN_HOME``) with
the planner's choice, and each ``--option`` merged into every plan's options — e.g.
``fake_capabilities=["tools"]`` for the fake runtime or ``embedding=true`` for llama.cpp;
each ``--plan KEY=JSON`` sets a plan field (``n_threads=1``: no thread barrier to stall on a
busy shared machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--option", action="append", default=[], help="KEY=JSON, merged into each plan's options")
    parser.add_argument("--plan", action="append", default=[], help="KEY=JSON, a Plan field to set (n_threads=1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")

    from localrun.errors import LocalrunError
    from localrun.manager import ModelManager, default_plan
    from localrun.modelstore.store import ModelStore
    from localrun.server.serve import run_server
    from localrun.settings import load_settings

    extra, fields = {}, {}
    for items, into in ((args.option, extra), (args.plan, fields)):
        for item in items:
            key, _, value = item.partition("=")
            into[key] = json.loads(value)
    try:
        settings = load_settings(server={"host": "127.0.0.1", "port": args.port})
        store = ModelStore(settings)

        def planner(record):
            plan = default_plan(record, settings)
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
