"""What a llama.cpp session honours beyond plain sampling: tools, JSON schemas, grammars,
log-probabilities and embeddings, behind one object the session holds.

Kept out of :mod:`.llamacpp` so the session stays about loading and scheduling. Each piece
lives in its own module — :mod:`localrun.tools` (prompt and parsing), :mod:`.grammar`
(grammar and logprob samplers), :mod:`.embed` (the embedding context) — and this
one wires them to a request:

* chat: tools reach the template (or the fallback block), a forced ``tool_choice`` or a
  ``json_schema`` becomes the request's grammar, and the answer's calls are parsed onto
  its last chunk;
* every request: its sampler is built on the scheduler thread — the C chain, behind the
  grammar when there is one, behind a logprob reader when asked — and the grammar is
  compiled once up front on the request thread, so a bad schema is a 400 before any token;
* embeddings: declared when the GGUF says it is an embedding model (or the plan forces
  it), computed on a context of their own created on first use.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from localrun import tools
from localrun.errors import RuntimeUnavailable, UnsupportedFeature
from localrun.runtimes.llamacpp.decode import build_sampler
from localrun.runtimes.llamacpp.embed import Embedder, embeddings_wanted
from localrun.runtimes.llamacpp.grammar import LogprobReader, LogprobSampler, grammar_sampler, request_grammar, sequence_sampler
from localrun.types import ChatRequest, Plan, Sampling

log = logging.getLogger(__name__)

#: What every llama.cpp session honours; "embeddings" is added per model.
CAPABILITIES = frozenset({"tools", "json_schema", "logprobs"})


class SessionFeatures:
    """The optional capabilities of one loaded model. Thread-safe: request threads call
    ``chat_inputs``/``job_sampling``/``embed``; built samplers run on the scheduler thread."""

    def __init__(self, llama, model, ctx, plan: Plan, *, name: str, tokenize: Callable[[str], list[int]],
                 is_eog: Callable[[int], bool], vocab, n_vocab: int, piece_of: Callable[[int], bytes]) -> None:
        self._llama, self._model, self._ctx, self._plan = llama, model, ctx, plan
        self._name, self._tokenize, self._is_eog = name, tokenize, is_eog
        self._vocab, self._n_vocab, self._piece_of = vocab, n_vocab, piece_of
        embeds = embeddings_wanted(llama, model, plan)
        self.capabilities = CAPABILITIES | ({"embeddings"} if embeds else frozenset())
        self._reader: LogprobReader | None = None
        self._embedder: Embedder | None = None
        self._lock = threading.Lock()
        self._closed = False

    # --- generation -------------------------------------------------------------------------

    def chat_inputs(self, req: ChatRequest, template: str | None) -> tuple[list[dict[str, Any]], dict[str, Any], str | None]:
        """(messages, template variables, grammar) for a chat request."""
        messages, variables = tools.prompt_messages(req, template)
        forced = tools.forced_call(req, tools.tool_style(template))
        return messages, variables, request_grammar(req.sampling, forced)

    @staticmethod
    def completion_grammar(sampling: Sampling) -> str | None:
        return request_grammar(sampling, None)


    def job_sampling(self, sampling: Sampling, gbnf: str | None) -> tuple[Callable[[], Any], list | None]:
        """(sampler factory for the scheduler thread, the list logprob entries go to or None).

        Raises:
            UnsupportedFeature: llama.cpp cannot parse the grammar (checked here, eagerly).
        """
        llama, vocab, n_vocab = self._llama, self._vocab, self._n_vocab
        if gbnf:
            llama.llama_sampler_free(grammar_sampler(llama, vocab, gbnf))
        entries: list | None = None
        reader = None
        if sampling.logprobs is not None:
            entries, reader = [], self._logprob_reader()
        top_n, is_eog = int(sampling.logprobs or 0), self._is_eog

        def build():
            sampler = sequence_sampler(llama, vocab, build_sampler(llama, sampling, n_vocab), gbnf, sampling, n_vocab)
            return sampler if reader is None else LogprobSampler(sampler, reader, top_n, entries, is_eog)

        return build, entries

    def _logprob_reader(self) -> LogprobReader:
        with self._lock:
            if self._reader is None:
                self._reader = LogprobReader(self._llama, self._ctx, self._n_vocab, self._piece_of)
            return self._reader

    # --- embeddings -----------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if "embeddings" not in self.capabilities:
            raise UnsupportedFeature(
                f"embeddings are not supported by the llama.cpp runtime serving {self._name}: its GGUF declares no pooling",
                param="input", hint="use an embedding model, or load this one with the plan option embedding=true")
        with self._lock:
            if self._closed:
                raise RuntimeUnavailable(f"the llama.cpp session for {self._name} is closed", hint="load it again")
            if self._embedder is None:
                self._embedder = Embedder(self._llama, self._model, self._plan, tokenize=self._tokenize)
            embedder = self._embedder
        return embedder.embed(texts)

    def close(self) -> None:
        """Free the embedding context (waiting for a running embed); the session frees the model after."""
        with self._lock:
            self._closed = True
            embedder, self._embedder = self._embedder, None
        if embedder is not None:
            embedder.close()
