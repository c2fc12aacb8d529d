"""Fixtures for the server tests, every wire family: the servers themselves come from the
tests.support plugin (``client``, ``live``, ``spawn_server``, ``serve``, ``serve_module``…);
here are the models only these tests use."""

from __future__ import annotations

import pytest

FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


@pytest.fixture(scope="session")
def tiny_fim(tmp_path_factory):
    """The tiny random llama with fill-in-the-middle tokens (right after its vocabulary) and a 1,024-token context."""
    from tests.factories import _tiny_vocab, write_tiny_llama_gguf

    base = len(_tiny_vocab()[0])
    kv = {
        "tokenizer.ggml.fim_pre_token_id": base,
        "tokenizer.ggml.fim_suf_token_id": base + 1,
        "tokenizer.ggml.fim_mid_token_id": base + 2,
    }
    return write_tiny_llama_gguf(
        tmp_path_factory.mktemp("tiny-fim") / "tiny-fim.gguf", n_ctx_train=1024, extra_tokens=FIM_TOKENS, extra_kv=kv
    )


#: The reranker fixture's classification head: two classes ("yes", "no"); llama.cpp's rank
#: pooling softmaxes W·h of the last token, and the score is the first class's probability.
RANK_HEAD_SEED = 3


@pytest.fixture(scope="session")
def tiny_reranker(tmp_path_factory):
    """A tiny Qwen3-layout model with rank pooling and a random 2-class head; returns (path, W)."""
    import numpy as np

    from tests.factories import write_tiny_llama_gguf

    head = np.random.default_rng(RANK_HEAD_SEED).standard_normal((2, 64)).astype(np.float32)
    path = write_tiny_llama_gguf(
        tmp_path_factory.mktemp("tiny-rank") / "tiny-rank.gguf",
        arch="qwen3",
        extra_kv={"qwen3.pooling_type": 4, "qwen3.classifier.output_labels": ["yes", "no"]},
        extra_tensors={"cls.output.weight": head},
    )
    return path, head
