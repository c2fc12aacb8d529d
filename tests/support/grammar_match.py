"""Does a text match a GBNF grammar? Asked of llama.cpp's own grammar engine, through the
vocabulary of a real model (SmolLM2's byte-level BPE covers every byte): the text is tokenized,
each token must pass the grammar sampler from the state the ones before left, and at the end
the end-of-generation token must be allowed (the grammar has completed). Also samples from the
real model under a grammar, so a schema test can check what a model writes too.
"""

from __future__ import annotations

import ctypes
from pathlib import Path


class GrammarMatcher:
    def __init__(self, model_path: Path, *, load_weights: bool = False, n_ctx: int = 512) -> None:
        import llama_cpp as llama

        from localrun.runtimes.llamacpp.grammar import LogprobReader  # noqa: F401 - loads the library like the runtime

        self.llama = llama
        llama.llama_backend_init()
        params = llama.llama_model_default_params()
        params.vocab_only = not load_weights
        self.model = llama.llama_model_load_from_file(str(model_path).encode(), params)
        assert self.model, model_path
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.eos = llama.llama_vocab_eos(self.vocab)
        self.ctx = None
        if load_weights:
            cp = llama.llama_context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = n_ctx, n_ctx, 2, 2
            self.ctx = llama.llama_init_from_model(self.model, cp)
            assert self.ctx
        self._cell = (llama.llama_token_data * 1)()
        self._one = llama.llama_token_data_array(self._cell, 1, -1, False)

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (self.llama.llama_token * (len(data) + 8))()
        n = self.llama.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, False)
        return list(buf[:n])

    def parses(self, gbnf: str) -> bool:
        """llama.cpp accepts the grammar (its sampler can be made)."""
        sampler = self.llama.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        if not sampler:
            return False
        self.llama.llama_sampler_free(sampler)
        return True

    def _allowed(self, sampler: object, token: int) -> bool:
        cell = self._cell[0]
        cell.id, cell.logit, cell.p = token, 1.0, 0.0
        self._one.size, self._one.selected, self._one.sorted = 1, -1, False
        self.llama.llama_sampler_apply(sampler, ctypes.byref(self._one))
        return cell.logit != float("-inf")

    def matches(self, gbnf: str, text: str) -> bool:
        llama = self.llama
        sampler = llama.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        assert sampler, "llama.cpp refused a grammar the checker accepted"
        try:
            for token in self.tokenize(text):
                if not self._allowed(sampler, token):
                    return False
                llama.llama_sampler_accept(sampler, token)
            return self._allowed(sampler, self.eos)
        finally:
            llama.llama_sampler_free(sampler)

    def sample(
        self, gbnf: str, prompt: str, *, temperature: float, seed: int, max_tokens: int = 96
    ) -> tuple[str, bool]:
        """(text, completed) of the real model writing under ``gbnf`` at ``temperature``."""
        from localrun.runtimes.llamacpp.decode import build_sampler
        from localrun.runtimes.llamacpp.grammar import sequence_sampler
        from localrun.types import Sampling

        llama = self.llama
        assert self.ctx is not None, "load_weights=True to sample"
        llama.llama_memory_clear(llama.llama_get_memory(self.ctx), True)
        sampling = Sampling(temperature=temperature, seed=seed, top_k=0, top_p=1.0)
        self._decode(self.tokenize(prompt))
        sampler = sequence_sampler(
            llama, self.vocab, build_sampler(llama, sampling, self.n_vocab), gbnf, sampling, self.n_vocab
        )
        out = b""
        try:
            for _ in range(max_tokens):
                token = sampler.sample(self.ctx, -1)
                if llama.llama_vocab_is_eog(self.vocab, token):
                    return out.decode("utf-8", errors="replace"), True
                buf = ctypes.create_string_buffer(256)
                n = llama.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
                out += buf.raw[:n]
                self._decode([token])
        finally:
            sampler.free()
        return out.decode("utf-8", errors="replace"), False

    def _decode(self, tokens: list[int]) -> None:
        arr = (self.llama.llama_token * len(tokens))(*tokens)
        assert self.llama.llama_decode(self.ctx, self.llama.llama_batch_get_one(arr, len(tokens))) == 0

    def close(self) -> None:
        if self.ctx:
            self.llama.llama_free(self.ctx)
        self.llama.llama_model_free(self.model)
