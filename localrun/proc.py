"""Small helpers about child processes, shared by the worker host and subprocess runtimes."""

from __future__ import annotations

import signal


def describe_exit(returncode: int | None) -> str:
    """How a process ended, in words: 'killed by SIGKILL', 'exit code 3', or 'still running'."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
