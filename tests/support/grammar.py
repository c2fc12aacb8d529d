"""``accepts``: whether llama.cpp's own grammar sampler lets a text through a GBNF grammar,
checked byte by byte on the tiny GGUF's vocabulary (256 byte tokens: any text, one byte a
token). Import the fixture into a test module that needs it."""

from __future__ import annotations

import ctypes

import pytest


@pytest.fixture(scope="module")
def accepts(tiny_gguf):
    """``accepts(gbnf, text)``: llama.cpp's grammar sampler lets ``text`` through and may then end."""
    import llama_cpp.llama_cpp as L

    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(tiny_gguf).encode(), params)
    vocab = L.llama_model_get_vocab(model)
    cell = (L.llama_token_data * 1)()
    one = L.llama_token_data_array(cell, 1, -1, False)

    def allowed(sampler, token: int) -> bool:
        cell[0].id, cell[0].logit, cell[0].p = token, 1.0, 0.0
        one.size, one.selected, one.sorted = 1, -1, False
        L.llama_sampler_apply(sampler, ctypes.byref(one))
        return cell[0].logit != float("-inf")

    def check(gbnf: str, text: str) -> bool:
        sampler = L.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        assert sampler, "llama.cpp could not parse the grammar"
        try:
            for byte in text.encode():
                token = 5 + byte  # the tiny vocabulary: 5 specials, then <0x00>…<0xFF>
                if not allowed(sampler, token):
                    return False
                L.llama_sampler_accept(sampler, token)
            return allowed(sampler, 2)  # </s>: the grammar may end here
        finally:
            L.llama_sampler_free(sampler)

    yield check
    L.llama_model_free(model)
