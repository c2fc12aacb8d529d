"""The README's first commands use what a newcomer has (the built-in models) and name no file the
reader lacks; its time for ``--build-portable-llama`` is the one ``--help`` gives."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from localrun.cli import main
from localrun.modelstore.builtins import CHAT_MODEL_NAME, DEFAULT_MODEL_NAME

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _first_commands() -> list[str]:
    block = README.split("## Using it", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]


def test_the_first_commands_run_the_builtins_before_anything_else():
    first = _first_commands()
    runs = [c for c in first if c.startswith("localrun run ")]
    assert first[0] == "localrun ls"
    assert runs[0].split()[2] == CHAT_MODEL_NAME and DEFAULT_MODEL_NAME in runs[2]
    before_import = first[: next(i for i, c in enumerate(first) if c.startswith("localrun import"))]
    assert all(c.split()[2] in (CHAT_MODEL_NAME, DEFAULT_MODEL_NAME) for c in before_import if " run " in f" {c} ")
    assert 'model="gemma"' not in README  # the Python example names a model the reader has


def test_readme_and_help_agree_on_the_portable_build_time():
    helped = " ".join(CliRunner().invoke(main, ["bundle", "export", "--help"]).output.split())
    said = " ".join(README.split())
    when = re.search(r"~?(\d+ CPU-(?:hour|minute)s?)", helped).group(1)
    assert when in helped and "about " + when in said.replace("~", "")
    assert "15 CPU-minutes" not in said
