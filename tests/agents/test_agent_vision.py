"""A real agent sends an image: Claude Code, headless through ``localrun launch claude``, with a
user message holding an image block on its ``--input-format stream-json`` input (the shape its
own SDKs send a pasted screenshot in), against Gemma 3 270M + the tiny fixture projector.

The proof is the server's own activity log (one line per request, "NAME: chat of N prompt
tokens", written by the server ``launch`` starts): the run with the image reaches the model with
at least the image's tokens more in its prompt than the same run without it. The same request
shape through the ``anthropic`` SDK (image blocks, an image inside a ``tool_result``) is in
tests/server/test_vision_clients.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agents.conftest import agent_binary
from tests.conftest import needs_llama
from tests.support.servers import free_port
from tests.support.vision_serve import MODEL, b64, good_image, import_pair

pytestmark = [pytest.mark.agents, needs_llama, pytest.mark.llama, pytest.mark.gemma, pytest.mark.timeout(1200)]

RUN_S = 900
ARGS = [
    "-p",
    "--bare",
    "--system-prompt",
    "Answer in one short sentence.",
    "--tools",
    "",
    "--no-session-persistence",
    "--input-format",
    "stream-json",
    "--output-format",
    "stream-json",
    "--verbose",
]


def _user_line(with_image: bool) -> str:
    content = [{"type": "text", "text": "What is in this picture?"}]
    if with_image:
        source = {"type": "base64", "media_type": "image/png", "data": b64(good_image("PNG", (64, 64), seed=7))}
        content.insert(0, {"type": "image", "source": source})
    return json.dumps({"type": "user", "message": {"role": "user", "content": content}}) + "\n"


def _run(netns, env: dict, work: Path, with_image: bool) -> tuple[subprocess.CompletedProcess, list[int]]:
    """One headless turn; (the run, the prompt tokens of each request the server logged)."""
    from localrun.settings import Settings

    log = Settings().data_dir / "logs" / "launch-claude.log"  # where launch writes it (this test's home)
    log.unlink(missing_ok=True)
    port = 18741 if netns else free_port()
    cmd = [*netns, sys.executable, "-m", "localrun", "launch", "claude", "--model", MODEL, "--", *ARGS]
    result = subprocess.run(
        cmd,
        input=_user_line(with_image),
        env={**env, "PWD": str(work), "LOCALRUN_SERVER__PORT": str(port)},
        cwd=work,
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    logged = log.read_text() if log.exists() else ""
    tokens = [int(m) for m in re.findall(rf"{MODEL}: \S+ of (\d+) prompt tokens", logged)]
    return result, tokens


def test_claude_code_sends_an_image_and_the_model_counts_it(agents_bin, agent_env, netns, tmp_path, gemma_gguf):
    vision = pytest.importorskip("tests.support.vision")
    agent_binary(agents_bin, "claude")
    import_pair(Path(os.environ["LOCALRUN_HOME"]), gemma_gguf, vision.vision_projector(vision.TINY))
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **agent_env,
        "LOCALRUN_RUNTIME__THREADS": "2",
        "LOCALRUN_RUNTIME__MAX_TOKENS_CAP": "48",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "48",
    }
    plain, plain_tokens = _run(netns, env, work, with_image=False)
    seen, seen_tokens = _run(netns, env, work, with_image=True)
    for result in (plain, seen):
        out = result.stdout + result.stderr
        # The random-weight projector's noise never ends an answer: every reply stops at the token
        # cap, and Claude Code may call that an error (its exit status 1, "exceeded the output token
        # maximum") after a few continuations. What the run must show is that it ran headless, sent
        # its turn to localrun and got answers back: a result event, and the requests in the log.
        events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        assert [e for e in events if e.get("type") == "result"], out[-4000:]
    assert plain_tokens and seen_tokens, (plain_tokens, seen_tokens)
    # The first request of each run is the same turn, once without and once with the image.
    assert seen_tokens[0] >= plain_tokens[0] + vision.TINY.tokens_per_image, (plain_tokens, seen_tokens)
