"""``localrun run`` with a reasoning model: the thinking streams apart from the answer (dimmed on
stderr under "Thinking…", the answer alone on stdout), ``--hide-thinking`` leaves it out, in a
one-shot answer and in the interactive chat. The fake runtime plays the reasoning model behind a
tiny GGUF whose chat template has a ``<think>`` channel."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from localrun.cli import main
from tests.server.test_reasoning import THINK_TEMPLATE

pytestmark = pytest.mark.timeout(120)

#: The fake's reasoning is the first filler words: "... seven small llamas count" (none of them in its answer).
THINK_WORDS = 14


@pytest.fixture
def reasoner(tmp_path, monkeypatch):
    """A registered reasoning model, run by the fake runtime thinking THINK_WORDS words."""
    from localrun.cli import run as run_cmd
    from tests.factories import write_tiny_llama_gguf

    gguf = write_tiny_llama_gguf(tmp_path / "tiny-r1.gguf", chat_template=THINK_TEMPLATE)
    assert CliRunner().invoke(main, ["import", str(gguf), "--name", "r1"]).exit_code == 0

    def make_manager(settings, store, overrides=None):
        from localrun.manager import ModelManager
        from localrun.planning.facts import default_plan

        def plan(record):
            p = default_plan(record, settings, overrides)
            return dataclasses.replace(p, options={**p.options, "fake_think_words": THINK_WORDS, "fake_reply_words": 3})

        return ModelManager(settings, store, planner=plan)

    monkeypatch.setattr(run_cmd, "make_manager", make_manager)
    return "r1"


def _run(*args: str, input: str | None = None):
    result = CliRunner().invoke(main, ["run", *args, "--runtime", "fake", "--temperature", "0"], input=input)
    assert result.exit_code == 0, result.output + result.stderr
    return result


def test_one_shot_shows_the_thinking_apart_and_the_flag_hides_it(reasoner):
    shown = _run(reasoner, "hello")
    assert shown.stdout.startswith("You said: hello.") and "llamas" not in shown.stdout and "think>" not in shown.stdout
    thinking = shown.stderr.split("Thinking…", 1)[1]
    assert "seven small llamas count" in thinking.split("tokens ·")[0] and "think>" not in shown.stderr
    hidden = _run(reasoner, "hello", "--hide-thinking")
    assert hidden.stdout == shown.stdout
    assert "Thinking" not in hidden.stderr and "llamas" not in hidden.stderr and "tok/s" in hidden.stderr


def test_interactive_chat_shows_the_thinking_apart_and_the_flag_hides_it(reasoner):
    shown = _run(reasoner, input="hello\nagain\n/bye\n")
    assert shown.stdout.count("You said:") == 2 and "llamas" not in shown.stdout and "think>" not in shown.stdout
    assert shown.stderr.count("Thinking…") == 2 and shown.stderr.count("seven small llamas count") == 2
    hidden = _run(reasoner, "--hide-thinking", input="hello\n/bye\n")
    assert "You said: hello." in hidden.stdout and "Thinking" not in hidden.stderr and "llamas" not in hidden.stderr
