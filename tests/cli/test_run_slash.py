"""Slash commands in ``localrun run``'s chat: parsed by one module (localrun/chat/slash.py) that the
TUI's Chat uses too, and never sent to the model (``/?`` and ``/help`` were); ``/image`` attaches
to the next message, ``/clear`` forgets the conversation. Piped stdin with a prompt argument is
one prompt, stdin first, as Ollama joins them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from localrun.chat.slash import help_lines, parse
from localrun.cli import main
from tests.cli.test_run_media import PNG, _run, model  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(120)


def test_parse_knows_each_command_and_refuses_the_rest():
    assert parse("hello /there") is None
    assert parse("/?").name == parse("/help").name == "help"
    assert parse("/image  cat.png ") == parse("/image cat.png")
    assert parse("/image cat.png").argument == "cat.png" and parse("/IMAGE x").name == "image"
    assert parse("/exit").name == parse("/bye").name == "bye"
    assert "needs a file" in parse("/audio").problem
    assert "unknown command '/usr/bin'" in parse("/usr/bin is a folder").problem
    assert any(line.startswith("/image PATH") for line in help_lines())


def test_help_and_unknown_commands_never_reach_the_model_and_image_clear_work(model, tmp_path):  # noqa: F811
    cat = tmp_path / "cat.png"
    cat.write_bytes(PNG)
    script = f"/?\n/help\n/nope\nfirst\n/image {cat}\nsecond\n/clear\nthird\n/bye\n"
    result = _run("--max-tokens", "2", input=script)
    assert result.exit_code == 0, result.output + result.stderr
    assert "/image PATH" in result.said and "unknown command '/nope'" in result.said
    first, second, third = model["sent"]
    assert [m.content for m in first.messages] == ["first"]  # no /? or /help in the history
    assert len(second.messages[-1].media) == 1 and "second" in second.messages[-1].content
    assert [m.content for m in third.messages] == ["third"]  # /clear forgot the rest


def test_piped_stdin_comes_before_the_prompt_argument(tiny_gguf):
    assert CliRunner().invoke(main, ["import", str(tiny_gguf), "--name", "tiny"]).exit_code == 0
    # the fake runtime's answer repeats the message it got ("You said: …")
    code = (
        "import sys; from localrun.cli import main; "
        "sys.argv = ['localrun', 'run', 'tiny', 'summarise this', '--runtime', 'fake', '--max-tokens', '64']; "
        "main()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input="the notes\n", capture_output=True, text=True, timeout=60, check=True
    )
    assert "You said: the notes summarise this." in out.stdout  # stdin first, then the argument, as Ollama
    assert ">>>" not in out.stdout  # one answer, not the interactive chat
