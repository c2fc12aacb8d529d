"""What a llama.cpp session honours beyond plain sampling: tools, JSON schemas, grammars,
log-probabilities and embeddings, behind one object the session holds.

Kept out of :mod:`.llamacpp` so the session stays about loading and scheduling. Each piece
lives in its own module — :mod:`localrun.chat.tools` (prompt and parsing), :mod:`.grammar`
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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from localrun.chat import tool_reply, tools
from localrun.errors import RuntimeUnavailable, UnsupportedFeature
from localrun.runtimes.llamacpp.decode import EogGuard, Sampler, build_sampler
from localrun.runtimes.llamacpp.embed import POOLING, Embedder, effective_pooling, embeddings_wanted
from localrun.runtimes.llamacpp.grammar import (
    LogprobReader,
    LogprobSampler,
    grammar_sampler,
    request_grammar,
    sequence_sampler,
)
from localrun.runtimes.llamacpp.lazy_grammar import chat_grammar, reasoning_mode
from localrun.types import ChatRequest, Chunk, Plan, Sampling

log = logging.getLogger(__name__)

#: What every llama.cpp session honours; "embeddings", "rerank" and "fill-in-the-middle" are added per model.
CAPABILITIES = frozenset(
    {
        "tools",
        "json_schema",
        "logprobs",
        "grammar",
        "n",
        "logit_bias",
        "frequency_penalty",
        "presence_penalty",
        "typical_p",
        "ignore_eos",
        "min_tokens",
        "token_prompts",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
    }
)


class SessionFeatures:
    """The optional capabilities of one loaded model. Thread-safe: request threads call
    ``chat_inputs``/``job_sampling``/``embed``; built samplers run on the scheduler thread."""

    def __init__(
        self,
        llama: Any,
        model: Any,
        ctx: Any,
        plan: Plan,
        *,
        name: str,
        tokenize: Callable[[str], list[int]],
        check_tokens: Callable[[Sequence[int], str], None],
        is_eog: Callable[[int], bool],
        scan_eog: Callable[[], tuple[int, ...]],
        vocab: Any,
        n_vocab: int,
        piece_of: Callable[[int], bytes],
        call: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self._llama, self._model, self._ctx, self._plan = llama, model, ctx, plan
        self._call = call  # runs native compute on the scheduler thread (calls.py)
        self._name, self._tokenize, self._is_eog, self._scan_eog = name, tokenize, is_eog, scan_eog
        self._check_tokens = check_tokens  # ids in the vocabulary (prompting.Prompting.check_tokens)
        self._vocab, self._n_vocab, self._piece_of = vocab, n_vocab, piece_of
        self.piece = piece_of  # token -> bytes, cached (the extras' /tokenize pieces, /detokenize)
        embeds = embeddings_wanted(llama, model, plan)
        self.pooling = effective_pooling(llama, model, plan)
        ranks = self.pooling == POOLING["rank"]
        self.capabilities = (
            CAPABILITIES
            | ({"embeddings"} if embeds and not ranks else frozenset())
            | ({"rerank"} if ranks else frozenset())
        )
        self._reader: LogprobReader | None = None
        self._eog: tuple[int, ...] | None = None
        self._embedder: Embedder | None = None
        self._lock = threading.Lock()
        self._closed = False

    # --- generation -------------------------------------------------------------------------

    def chat_inputs(
        self, req: ChatRequest, template: str | None
    ) -> tuple[list[dict[str, Any]], dict[str, Any], str | None]:
        """(messages, template variables, grammar) for a chat request."""
        fallback = self.tool_fallback
        if tool_reply.applies(req, template, fallback):  # no tool syntax: a call or a reply
            messages, variables = tool_reply.prompt_messages(req)
        else:
            messages, variables = tools.prompt_messages(req, template)
        return messages, variables, chat_grammar(req, template, fallback=fallback)

    @property
    def tool_fallback(self) -> str:
        """How templates without tool syntax are offered tools (``runtime.tool_fallback``)."""
        return str(self._plan.options.get("tool_fallback", tool_reply.TAGGED))

    def answer_stream(self, chunks: Iterator[Chunk], req: ChatRequest, template: str | None) -> Iterator[Chunk]:
        """The runtime's chunks with tool calls taken out: a call-or-reply answer unwrapped
        (:func:`localrun.chat.tool_reply.with_reply`), any other parsed as its family writes calls."""
        if tool_reply.applies(req, template, self.tool_fallback):
            return tool_reply.with_reply(chunks, req, reasoning_mode(req, template))
        return tools.with_tool_calls(chunks, req, template)

    @staticmethod
    def completion_grammar(sampling: Sampling) -> str | None:
        return request_grammar(sampling, None)

    def job_sampling(
        self, sampling: Sampling, gbnf: str | None
    ) -> tuple[Callable[[], Sampler], list[dict[str, Any]] | None]:
        """(sampler factory for the scheduler thread, the list logprob entries go to or None).

        Raises:
            UnsupportedFeature: llama.cpp cannot parse the grammar (checked here, eagerly), a
                logit bias names a token the vocabulary lacks, or ``ignore_eos`` meets a grammar.
        """
        llama, vocab, n_vocab = self._llama, self._vocab, self._n_vocab
        self._check_tokens([t for t, _ in sampling.logit_bias], "logit_bias")
        if gbnf:
            if sampling.ignore_eos:
                raise UnsupportedFeature(
                    "'ignore_eos' cannot be combined with a grammar or JSON schema: a finished "
                    "grammar allows only the end token",
                    param="ignore_eos",
                    hint="drop 'ignore_eos' or the grammar",
                )
            llama.llama_sampler_free(grammar_sampler(llama, vocab, gbnf))
        entries: list[dict[str, Any]] | None = None
        reader = None
        if sampling.logprobs is not None:
            entries, reader = [], self._logprob_reader()
        top_n, is_eog = int(sampling.logprobs or 0), self._is_eog
        guard = self.eog_tokens() if sampling.ignore_eos or sampling.min_tokens > 0 else ()
        until = None if sampling.ignore_eos else int(sampling.min_tokens)

        def build() -> Sampler:
            sampler: Sampler = sequence_sampler(
                llama, vocab, build_sampler(llama, sampling, n_vocab), gbnf, sampling, n_vocab
            )
            if guard:
                sampler = EogGuard(llama, sampler, guard, until)
            logged = cast("list[dict[str, Any]]", entries)  # a list whenever there is a reader
            return sampler if reader is None else LogprobSampler(sampler, reader, top_n, logged, is_eog)

        return build, entries

    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token of the vocabulary, found once (one pass over it; the
        session starts that pass when it opens, so a request rarely waits for it)."""
        with self._lock:
            if self._eog is None:
                self._eog = self._scan_eog()
            return self._eog

    def _logprob_reader(self) -> LogprobReader:
        with self._lock:
            if self._reader is None:
                self._reader = LogprobReader(self._llama, self._ctx, self._n_vocab, self._piece_of)
            return self._reader

    # --- embeddings -----------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embedder().embed(texts)

    def embedder(self, *, capability: str = "embeddings", param: str = "input") -> Embedder:
        """The session's embedding context, created on first use.

        Raises:
            UnsupportedFeature: this model declares no ``capability`` (embeddings or rerank).
        """
        if capability not in self.capabilities:
            why = (
                "its GGUF declares no pooling"
                if capability == "embeddings"
                else "its GGUF does not declare rank pooling"
            )
            fix = (
                "use an embedding model, or load this one with a pooling override (--pooling mean)"
                if capability == "embeddings"
                else "use a reranker GGUF, or load one with --pooling rank"
            )
            raise UnsupportedFeature(
                f"{capability} are not supported by the llama.cpp runtime serving {self._name}: {why}",
                param=param,
                hint=fix,
            )
        with self._lock:
            if self._closed:
                raise RuntimeUnavailable(f"the llama.cpp session for {self._name} is closed", hint="load it again")
            if self._embedder is None:
                self._embedder = Embedder(
                    self._llama, self._model, self._plan, tokenize=self._tokenize, call=self._call
                )
            return self._embedder

    def close(self) -> None:
        """Free the embedding context (waiting for a running embed); the session frees the model after."""
        with self._lock:
            self._closed = True
            embedder, self._embedder = self._embedder, None
        if embedder is not None:
            embedder.close()
