"""A scripted runtime for the agents' tool step, and a server launcher that serves it.

A tiny real model does not call an agent's tools on cue, so the tool-using runs use this
runtime (the fake runtime's machinery: its template rendering, its tool-call text parsed by
the same parser as llama.cpp's answers): offered one of the tools in its script, it calls
it with the scripted arguments; once the last message is that tool's result, it answers
``The tool said: <result>`` and stops. A request without a scripted tool (titles, probes)
gets the fake runtime's ordinary echo. Only tests use it.

    python -m tests.agents.scripted --port P --option 'script_calls={"Read": {...}}'
"""

from __future__ import annotations

import json
import sys
from typing import ClassVar

from localrun.chat import tools as toolcalls
from localrun.runtimes import REGISTRY
from localrun.runtimes.fake import FakeRuntime, FakeSession
from localrun.types import Cancel, ChatRequest

NAME = "scripted"


class ScriptedRuntime(FakeRuntime):
    name: ClassVar[str] = NAME

    def load(self, model, plan) -> ScriptedSession:
        return ScriptedSession(model, plan)


class ScriptedSession(FakeSession):
    capabilities = frozenset({"tools", "json_schema"})

    def chat(self, req: ChatRequest, cancel: Cancel):
        script: dict = self.plan.options.get("script_calls") or {}
        head = None
        last = req.messages[-1] if req.messages else None
        if last is not None and last.role == "tool":
            head = f"The tool said: {' '.join(last.content.split())[:300]}"
        elif toolcalls.active(req):
            offered = toolcalls.tool_names(req.tools)
            name = next((n for n in script if n in offered), None)
            if name is not None:
                head = f"<tool_call>{json.dumps({'name': name, 'arguments': script[name]})}</tool_call>"
        if head is None:
            return super().chat(req, cancel)
        from localrun.chat.template import fallback_chat

        messages, _ = toolcalls.prompt_messages(req, None)
        prompt = fallback_chat(messages)
        stream = self._generate(prompt.text, head, req.sampling, cancel, (), filler=False)
        return toolcalls.with_tool_calls(stream, req)


def main(argv: list[str] | None = None) -> int:
    REGISTRY[NAME] = "tests.agents.scripted:ScriptedRuntime"
    from tests.support import launch

    return launch.main(argv)


if __name__ == "__main__":
    sys.exit(main())
