"""The CLI's one rule (docs/architecture.md): the file is the command. Every module of
``localrun/cli/`` that defines ``COMMAND`` is the command of its name, each command of ``localrun``
comes from the module of its name, and the only other modules are what commands share."""

from __future__ import annotations

import importlib
import pkgutil

import localrun.cli
from localrun.cli import main

#: Not commands: what several commands share (consoles and options; the store, a model, the manager;
#: loading a model for one user, visibly; a server's log lines; what launch is built from).
SHARED = {"output", "common", "loading", "serverlog", "launch_kit"}


def _modules() -> dict[str, object]:
    return {
        info.name: importlib.import_module(f"localrun.cli.{info.name}")
        for info in pkgutil.iter_modules(localrun.cli.__path__)
    }


def test_each_module_is_the_command_of_its_name():
    modules = _modules()
    commands = {name: m for name, m in modules.items() if hasattr(m, "COMMAND")}
    assert set(modules) - set(commands) == SHARED
    for name, module in commands.items():
        command = module.COMMAND
        assert command.name == name.rstrip("_"), f"localrun/cli/{name}.py defines `{command.name}`"
        assert main.commands[command.name] is command
    assert set(main.commands) == {name.rstrip("_") for name in commands}


def test_shared_modules_define_no_command():
    import click

    for name in SHARED:
        module = _modules()[name]
        assert not [v for v in vars(module).values() if isinstance(v, click.Command)], name
