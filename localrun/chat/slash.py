"""The slash commands of a chat, the same in ``localrun run``'s interactive chat and the TUI's Chat.

A line that starts with ``/`` is a command, never a message (as in Ollama's ``run``): a known one
is done, an unknown one is answered with the list, and neither reaches the model. Each front end
does what a command asks in its own way; this module only says which command a line is.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Each command's canonical name, its spellings, what it takes and what it does.
COMMANDS: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("help", ("/help", "/?"), "", "show these commands"),
    ("image", ("/image",), "PATH", "attach a picture to your next message (a model that sees)"),
    ("audio", ("/audio",), "PATH", "attach a wav or mp3 clip to your next message (a model that hears)"),
    ("clear", ("/clear",), "", "forget the conversation so far (the system prompt stays)"),
    ("bye", ("/bye", "/exit", "/quit"), "", "leave the chat (Ctrl-D too)"),
)
_BY_WORD = {word: name for name, words, _, _ in COMMANDS for word in words}
#: Commands that need their argument.
TAKES_ARGUMENT = frozenset(name for name, _, arg, _ in COMMANDS if arg)


@dataclass(frozen=True)
class Slash:
    """A command line: ``name`` is one of :data:`COMMANDS`' names, or "unknown" (``word`` says what was typed)."""

    name: str
    word: str
    argument: str = ""

    @property
    def problem(self) -> str | None:
        """What is wrong with the line, in words, or None."""
        if self.name == "unknown":
            return f"unknown command {self.word!r}: /? lists the commands"
        if self.name in TAKES_ARGUMENT and not self.argument:
            return f"{self.word} needs a file: {self.word} PATH, then your message"
        return None


def parse(line: str) -> Slash | None:
    """The command ``line`` is, or None for a message to send."""
    text = line.strip()
    if not text.startswith("/"):
        return None
    word, _, argument = text.partition(" ")
    return Slash(_BY_WORD.get(word.lower(), "unknown"), word, argument.strip())


def help_lines() -> list[str]:
    """One line per command, for /help in any front end."""
    out = []
    for _, words, arg, what in COMMANDS:
        spelled = ", ".join(f"{w} {arg}".strip() for w in words)
        out.append(f"{spelled:<28} {what}")
    return out
