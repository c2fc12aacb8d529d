"""The embedded server: OpenAI, Ollama, Anthropic, Responses and llama-server wire families over the ModelManager.

``create_app(settings, manager)`` builds the FastAPI app (server/app.py), including each
family's ``router`` (server/openai/, ollama/, anthropic/, responses/, llama_server/, and mirror/
with ``--mirror``: routes.py, schemas.py, convert.py, answers.py, and errors.py where the wire has
its own error shape). No family imports another: what more than one needs is the kit at the top
(schemas.py, convert.py, embeddings.py, answers.py, errors.py, streams.py).
``run_server(settings, manager, ready_callback=...)`` serves it with uvicorn (server/serve.py).
Security defaults live in server/security.py, the one error mapper in server/errors.py.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "run_server"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from localrun.server.app import create_app

        return create_app
    if name == "run_server":
        from localrun.server.serve import run_server

        return run_server
    raise AttributeError(name)
