"""Fixtures for the client-compatibility tests: in-process apps on the fake runtime for the
server layers, and real ``localrun serve`` processes on llama.cpp (reused from the
capability tests) for the parameters and routes themselves."""

from __future__ import annotations

import pytest

from tests.server.conftest import build_stack, fake_planner, free_port  # noqa: F401 - fixtures re-exported

ALL = ["tools", "json_schema", "logprobs", "embeddings", "n"]


@pytest.fixture
def app_client(build_stack):  # noqa: F811 - the imported fixture
    """``app_client(capabilities=[...], **server_settings)``: a TestClient on the fake runtime."""
    from fastapi.testclient import TestClient

    from localrun.server.app import create_app

    opened = []

    def make(capabilities=ALL, **server):
        stack = build_stack(planner=fake_planner(fake_capabilities=list(capabilities)), **server)
        client = TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost",
                            raise_server_exceptions=False)
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


def chat(client, text="hello there", **fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 8, **fields}
    return client.post("/v1/chat/completions", json=body)


FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


@pytest.fixture(scope="session")
def tiny_fim(tmp_path_factory):
    """The tiny random llama with fill-in-the-middle tokens (right after its vocabulary) and a 1,024-token context."""
    from tests.factories import _tiny_vocab, write_tiny_llama_gguf

    base = len(_tiny_vocab()[0])
    kv = {"tokenizer.ggml.fim_pre_token_id": base, "tokenizer.ggml.fim_suf_token_id": base + 1,
          "tokenizer.ggml.fim_mid_token_id": base + 2}
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny-fim") / "tiny-fim.gguf", n_ctx_train=1024,
                                 extra_tokens=FIM_TOKENS, extra_kv=kv)


#: The reranker fixture's classification head: two classes ("yes", "no"); llama.cpp's rank
#: pooling softmaxes W·h of the last token, and the score is the first class's probability.
RANK_HEAD_SEED = 3


@pytest.fixture(scope="session")
def tiny_reranker(tmp_path_factory):
    """A tiny Qwen3-layout model with rank pooling and a random 2-class head; returns (path, W)."""
    import numpy as np

    from tests.factories import write_tiny_llama_gguf

    head = np.random.default_rng(RANK_HEAD_SEED).standard_normal((2, 64)).astype(np.float32)
    path = write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny-rank") / "tiny-rank.gguf", arch="qwen3",
                                 extra_kv={"qwen3.pooling_type": 4, "qwen3.classifier.output_labels": ["yes", "no"]},
                                 extra_tensors={"cls.output.weight": head})
    return path, head


@pytest.fixture(scope="module")
def serve_module(tmp_path_factory):
    """``serve_module(path, name="tiny", plan={...}, env={...}, **options)``: one real server
    process (``tests.server.launch``, llama.cpp picked by the planner) for a whole test module,
    in a LOCALRUN_HOME of its own, so a module's tests share one model load."""
    import os
    import subprocess
    import sys

    from tests.server.conftest import REPO, ServerProcess, launch_args, wait_for_server

    started: list[ServerProcess] = []

    def start(path, name: str = "tiny", *, plan: dict | None = None, env: dict | None = None, **options) -> ServerProcess:
        home = tmp_path_factory.mktemp("clients-home")
        full_env = {**os.environ, "LOCALRUN_HOME": str(home), "HF_HOME": str(home / "hf"), "LOCALRUN_RUNTIME__FORCE": "",
                    "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
        full_env.pop("LOCALRUN_API_KEY", None)
        subprocess.run([sys.executable, "-c", "import sys; from localrun.modelstore.store import ModelStore; "
                        "from localrun.settings import Settings; ModelStore(Settings()).import_path(sys.argv[1], name=sys.argv[2])",
                        str(path), name], env=full_env, check=True, cwd=REPO)
        port = free_port()
        args = [sys.executable, "-m", *launch_args(port, options, plan)]
        log_path = home / "server.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
        server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
        started.append(server)
        return wait_for_server(server)

    yield start
    for server in started:
        server.stop()
