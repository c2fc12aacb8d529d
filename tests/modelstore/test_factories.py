"""The test model factory makes files that real loaders accept, and raw files as told."""

from __future__ import annotations

import pytest

from localrun.modelstore.gguf_meta import read_gguf_metadata
from tests.conftest import needs_llama
from tests.factories import DEFAULT_TINY_TEMPLATE, RawGGUF, write_meta_only_gguf, write_tiny_llama_gguf


def test_tiny_is_small_and_deterministic(tmp_path):
    a = write_tiny_llama_gguf(tmp_path / "a.gguf", seed=3)
    b = write_tiny_llama_gguf(tmp_path / "b.gguf", seed=3)
    c = write_tiny_llama_gguf(tmp_path / "c.gguf", seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert a.stat().st_size < 1_000_000


def test_meta_only_file_holds_the_given_values(tmp_path):
    path = write_meta_only_gguf(
        tmp_path / "m.gguf",
        {"general.architecture": "qwen3", "qwen3.context_length": 40960, "general.name": "x", "general.flag": True},
    )
    info = read_gguf_metadata(path)
    assert (info.architecture, info.context_length, info.name) == ("qwen3", 40960, "x")
    assert info.scalars["general.flag"] is True and info.tensor_count == 1


def test_raw_builder_can_lie_about_counts(tmp_path):
    raw = RawGGUF(tensor_count=5)
    assert raw.header()[8:16] == (5).to_bytes(8, "little")


@needs_llama
@pytest.mark.llama
def test_tiny_llama_loads_and_completes_in_llama_cpp(tiny_gguf):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(tiny_gguf), n_ctx=128, n_threads=2, verbose=False)
    try:
        out = llm.create_completion("hello", max_tokens=4, temperature=0.0)
        assert out["usage"]["completion_tokens"] == 4 and out["choices"][0]["finish_reason"] == "length"
        assert llm.n_vocab() == read_gguf_metadata(tiny_gguf).vocab_size
        # the SPM vocabulary merges whole words and falls back to bytes for the rest
        assert len(llm.tokenize(b"hello world", add_bos=False)) == 2
        text = "zq\u00e9!".encode()  # SPM adds a leading space; the bytes survive the round trip
        assert llm.detokenize(llm.tokenize(text, add_bos=False)).lstrip(b" ") == text
        assert llm.metadata.get("tokenizer.chat_template") == DEFAULT_TINY_TEMPLATE
    finally:
        llm.close()


@needs_llama
@pytest.mark.llama
def test_split_and_templateless_tiny_models_load(tmp_path, tiny_gguf_no_template):
    import llama_cpp

    first = write_tiny_llama_gguf(tmp_path / "split" / "t.gguf", split_max_tensors=8)
    for path in (first, tiny_gguf_no_template):
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=1, verbose=False)
        try:
            assert llm.create_completion("the", max_tokens=2)["usage"]["completion_tokens"] == 2
        finally:
            llm.close()
