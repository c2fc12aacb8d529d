"""Fixtures for the MLX, Ollama and MLC runtime tests: a tiny MLX model folder, a fake
Ollama server on 127.0.0.1, an MLC weight folder and the ``mlc_llm serve`` stand-in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from localrun.types import Format, ModelRecord, Plan
from tests.runtimes.fake_ollama import FakeModel, FakeOllama

HERE = Path(__file__).resolve().parent
FAKE_MLC = HERE / "fake_mlc_llm.py"


def mlx_available() -> bool:
    try:
        import mlx.core  # noqa: F401
        import mlx_lm  # noqa: F401
    except ImportError:
        return False
    return True


needs_mlx = pytest.mark.skipif(not mlx_available(), reason="mlx / mlx-lm are not installed")


@pytest.fixture(scope="session")
def tiny_mlx_dir(tmp_path_factory) -> Path:
    if not mlx_available():
        pytest.skip("mlx / mlx-lm are not installed")
    from tests.runtimes.mlx_model import write_tiny_mlx_model

    return write_tiny_mlx_model(tmp_path_factory.mktemp("mlx") / "tiny-mlx")


@pytest.fixture(scope="session")
def tiny_mlx_session(tiny_mlx_dir):
    """One loaded tiny model shared by the tests that only read from it."""
    from localrun.runtimes.mlx import MlxRuntime

    record = ModelRecord(name="tiny-mlx", format=Format.MLX, path=str(tiny_mlx_dir))
    session = MlxRuntime().load(record, Plan(runtime="mlx", n_ctx=256, n_batch=64))
    yield session
    session.close()


@pytest.fixture
def fake_ollama():
    models = [FakeModel("llama3.2:latest"), FakeModel("nomic-embed-text:latest", capabilities=("embedding",))]
    with FakeOllama(models) as server:
        yield server
    assert server.state.errors == [], "the fake Ollama server failed while handling a request"


@pytest.fixture
def mlc_dir(tmp_path) -> Path:
    folder = tmp_path / "Tiny-q4f16_1-MLC"
    folder.mkdir()
    (folder / "mlc-chat-config.json").write_text(
        json.dumps({"model_type": "llama", "quantization": "q4f16_1", "context_window_size": 2048, "conv_template": {}})
    )
    (folder / "tensor-cache.json").write_text(json.dumps({"records": []}))
    (folder / "params_shard_0.bin").write_bytes(b"\0" * 64)
    return folder


def mlc_plan(tmp_path: Path, **options) -> Plan:
    opts = {
        "mlc_command": [sys.executable, str(FAKE_MLC)],
        "log_dir": str(tmp_path / "logs"),
        "mlc_start_timeout_s": 20.0,
        **options,
    }
    return Plan(runtime="mlc", n_ctx=512, options=opts)
