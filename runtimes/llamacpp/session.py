"""The llama.cpp runtime, through llama-cpp-python's low-level C API.

Sessions run inside a worker process (``in_worker``): the native loader and decoder then
take down one model at worst, never the server. ``llama_cpp`` is imported inside the
functions that use it, so importing this module costs nothing.

What a session does per request:

* chat: render the GGUF's ``tokenizer.chat_template`` in localrun's sandbox (never
  llama-cpp-python's renderer), or a documented fallback when the file has none; tokenize
  with special tokens parsed, adding BOS only when the rendered text lacks it;
* refuse a prompt over ``slot context - 1`` tokens with ContextOverflow (never truncate), and
  cap ``max_tokens`` by what is left of the slot's context (finish "length");
* hand the request to the session's scheduler (:mod:`.scheduler`), which runs several
  requests at once in one context: continuous batching, prefix reuse across requests
  (``cached_tokens``), a C sampler chain per request, cancel checked every step.

Images and audio: a model whose record names a projector (``metadata[META_PROJECTOR]``)
declares "vision" / "audio"; :mod:`.media.session` turns a request's media into the prompt's
media chunks, :mod:`.media.prefill` runs them inside the batching.

Tools, ``json_schema`` / grammars, logprobs and embeddings are wired in by
:mod:`.features` (capabilities "tools", "json_schema", "logprobs", and
"embeddings" for models whose GGUF declares pooling or whose plan sets ``embedding``).

Sessions are ``concurrent``: the worker calls ``chat``/``complete`` from one thread per
request, and each generator reads its chunks from the scheduler.

``plan.options`` this runtime reads for batching (defaults in :mod:`.cache.slots`):
``n_slots`` (sequences run at once), ``slot_ctx`` (tokens per request; by default the slots
share ``plan.n_ctx``), ``kv_unified`` (one KV pool for all slots), ``step_tokens`` (prefill
tokens per step), ``host_cache_mib`` or ``kv_ram_bytes`` (host RAM for evicted prefixes, 0 = off,
unset = a default from free RAM), ``kv_dir`` and ``kv_disk_bytes`` (the disk tier, :mod:`.cache.prefix_disk`),
``prefix_cache``, ``batch_invariant`` and ``exact_prefix`` (see :mod:`.scheduler`),
``speculative`` and ``draft_k`` (see :mod:`.speculative.drafting`), and the context switches
``flash_attn``, ``swa_full``, ``repack``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from localrun.errors import (
    ContextOverflow,
    LocalrunError,
    RuntimeUnavailable,
)
from localrun.runtimes.base import RuntimeStatus
from localrun.runtimes.llamacpp.cache.checkpoints import memory_kind
from localrun.runtimes.llamacpp.cache.prefix_disk import open_disk_tier
from localrun.runtimes.llamacpp.cache.slots import Layout
from localrun.runtimes.llamacpp.choices import stream_choices
from localrun.runtimes.llamacpp.context import context_params, load_model, new_context
from localrun.runtimes.llamacpp.decode import token_piece_reader
from localrun.runtimes.llamacpp.extras import ServerExtras
from localrun.runtimes.llamacpp.features import SessionFeatures
from localrun.runtimes.llamacpp.job import Job
from localrun.runtimes.llamacpp.media.mtmd import open_projector
from localrun.runtimes.llamacpp.media.prompt import MediaPrompt
from localrun.runtimes.llamacpp.media.session import SessionMedia, media_bounds
from localrun.runtimes.llamacpp.probe import Importer, probe_llamacpp
from localrun.runtimes.llamacpp.prompting import Prompting
from localrun.runtimes.llamacpp.scheduler import Scheduler
from localrun.runtimes.llamacpp.slot_api import SlotApi
from localrun.runtimes.llamacpp.speculative.drafting import speculation
from localrun.runtimes.llamacpp.tokens import VocabScan, eog_reader
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, Format, ModelRecord, Plan, Sampling

if TYPE_CHECKING:
    from localrun.planning.hardware import HardwareProfile
    from localrun.runtimes.llamacpp.media.mtmd import Projector
    from localrun.runtimes.llamacpp.overrides import LoadParams

log = logging.getLogger(__name__)


class LlamaCppRuntime:
    name: ClassVar[str] = "llama.cpp"
    formats: ClassVar[frozenset[Format]] = frozenset({Format.GGUF})
    in_worker: ClassVar[bool] = True

    def probe(self, hw: HardwareProfile | None = None, *, import_module: Importer | None = None) -> RuntimeStatus:
        """Installed, which GPU backend, and the rebuild this machine's GPU calls for (see :mod:`.probe`)."""
        return probe_llamacpp(hw, import_module=import_module)

    def load(self, model: ModelRecord, plan: Plan) -> LlamaCppSession:
        return LlamaCppSession.open(model, plan)

    def media_before_load(self, model: ModelRecord, plan: Plan) -> frozenset[str] | None:
        """No media without a projector (the manager refuses them before a load of most of a
        minute); with one, its header decides, once loaded (None)."""
        from localrun.types import META_PROJECTOR

        return None if model.metadata.get(META_PROJECTOR) else frozenset()


class LlamaCppSession:
    """One loaded model, one context, several sequences (slots) run by a scheduler thread.

    ``concurrent``: requests may call ``chat``/``complete`` from many threads at once; more
    requests than slots wait for a slot in arrival order.

    Composed of the parts it holds: its prompts (:class:`Prompting`: tokens, chat text, media
    prompts), the scheduler, the optional features (:mod:`.features`), the media side
    (:class:`SessionMedia`), llama-server's utility calls (:class:`ServerExtras`) and slot API
    (:class:`SlotApi`); the ``serve_*`` calls hand over to the last two.
    """

    capabilities: frozenset[str] = frozenset()
    concurrent: ClassVar[bool] = True
    _load_params: LoadParams  # set by open(): what llama.cpp reads through raw pointers while the model lives

    def __init__(
        self,
        llama: Any,
        model: Any,
        ctx: Any,
        record: ModelRecord,
        plan: Plan,
        layout: Layout,
        projector: Projector | None = None,
        eog: VocabScan | None = None,
    ) -> None:
        self._llama, self._model, self._ctx = llama, model, ctx
        self.record, self.plan, self.layout = record, plan, layout
        self._vocab = llama.llama_model_get_vocab(model)
        self._eog = eog if eog is not None else VocabScan(llama, model, record.name)
        self._n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        # Guards the vocabulary against close(): request threads tokenize while it frees.
        self._native = threading.Lock()
        self._closed = False
        self._freed = False
        per_seq = llama.llama_n_ctx_seq(ctx) if hasattr(llama, "llama_n_ctx_seq") else llama.llama_n_ctx(ctx)
        self.n_ctx = min(layout.slot_ctx, per_seq)  # what one request may use
        # Images and audio (media/session.py): the projector, its decoder, "vision" / "audio".
        self._media = SessionMedia(projector, record.name, **media_bounds(plan))
        self.prompting = Prompting(
            llama,
            model,
            record=record,
            plan=plan,
            eog=self._eog,
            media=self._media,
            max_chunk=llama.llama_n_ubatch(ctx),
            native=self._native,
            check_open=self._check_open,
            is_freed=lambda: self._freed,
        )
        self.chat_template = self.prompting.chat_template
        is_eog = eog_reader(llama, self._vocab)
        piece_of = token_piece_reader(llama, self._vocab)  # one cache of pieces: the scheduler and logprobs
        n_swa = llama.llama_model_n_swa(model)
        #: "recurrent", "hybrid", "swa" (without swa_full): a memory that cannot be cut back (checkpoints.py).
        self.memory = memory_kind(llama, model, swa_full=bool(plan.options.get("swa_full", True)))
        mode, draft_k = speculation(plan, n_swa, self.memory)
        self._drafter = self._load_drafter(mode) if plan.options.get("draft") else None
        # The disk tier under the prefix cache (cache/prefix_disk.py): keyed by the model's sha256 and the context.
        disk = open_disk_tier(llama, model, ctx, context_params(llama, plan, layout), record, layout)
        try:
            self._sched = Scheduler(
                llama,
                ctx,
                layout,
                n_swa=n_swa,
                piece_of=piece_of,
                is_eog=is_eog,
                speculative=mode,
                draft_k=draft_k,
                drafter=self._drafter,
                projector=self._media.usable,
                disk=disk,
                memory=self.memory,
            )
        except BaseException:
            if disk is not None:
                disk.close()
            if self._drafter is not None:
                self._drafter.close()
            raise
        self.speculative = self._sched.speculative  # what auto became on this machine
        # Tools, JSON schemas, grammars, logprobs and embeddings (features.py).
        self._features = SessionFeatures(
            llama,
            model,
            ctx,
            plan,
            name=record.name,
            is_eog=is_eog,
            scan_eog=self._eog.result,
            tokenize=lambda text: self.prompting.tokenize(text, add_special=True),
            check_tokens=self.prompting.check_tokens,
            vocab=self._vocab,
            n_vocab=self._n_vocab,
            piece_of=piece_of,
            call=self._sched.call,
        )
        facts = {"n_ctx": self.n_ctx, "total_slots": layout.n_slots, "n_vocab": self._n_vocab}
        self._extras = ServerExtras(llama, self._vocab, self.prompting, self._features, facts=facts)
        self._slot_api = SlotApi(self._sched, llama, ctx, name=record.name, n_ctx=self.n_ctx, n_vocab=self._n_vocab)
        # "reasoning_budget": a turn continues from a prefix (ChatRequest.prefix), so the server can force the end of
        # thinking.
        self.capabilities = (
            self._features.capabilities
            | self.prompting.capabilities
            | self._media.capabilities
            | {"reasoning_budget", "slots"}  # slots: llama-server's id_slot and /slots (slot_api.py)
        )

    def _load_drafter(self, mode: str) -> Any:
        """The draft model the plan names, for ``auto`` (but not under exact_prefix) and ``draft``."""
        layout, plan = self.layout, self.plan
        if mode not in ("auto", "draft") or (mode == "auto" and layout.exact_prefix):
            return None
        from localrun.runtimes.llamacpp.speculative.draft_model import load_drafter

        flash = context_params(self._llama, plan, layout).flash_attn_type
        return load_drafter(self._llama, self._model, plan, layout, self.record.path, flash_attn_type=flash)

    @classmethod
    def open(cls, record: ModelRecord, plan: Plan) -> LlamaCppSession:
        llama, model, layout, cp, load_params = load_model(record, plan)
        eog = VocabScan(llama, model, record.name)  # runs while the context is created (tokens.py)
        try:
            projector = open_projector(llama, model, record, plan, cp)  # cp's batches grow to one image
        except BaseException:
            eog.stop()
            llama.llama_model_free(model)
            raise
        try:
            ctx = new_context(llama, model, cp, layout, record.name)
        except BaseException:
            if projector is not None:
                projector.close()
            eog.stop()
            llama.llama_model_free(model)
            raise
        log.debug(
            "loaded %s: %s threads=%d gpu_layers=%d %s",
            record.path,
            layout,
            plan.n_threads,
            plan.n_gpu_layers,
            " ".join(load_params.summary),
        )
        try:
            session = cls(llama, model, ctx, record, plan, layout, projector, eog)
            session._load_params = load_params
            return session
        except BaseException:
            if projector is not None:
                projector.close()
            eog.stop()
            llama.llama_free(ctx)
            llama.llama_model_free(model)
            raise

    # --- the protocol ---------------------------------------------------------------------

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._check_open()
        tokens, stops, gbnf = self.chat_tokens(req)
        stream = self._start(tokens, req.sampling, cancel, stops, gbnf)
        return self._features.answer_stream(stream, req, self.prompting.chat_template)

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._check_open()
        gbnf = self._features.completion_grammar(req.sampling)
        return self._start(self.prompting.completion_tokens(req), req.sampling, cancel, (), gbnf)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self._check_open()
        return self._features.embed(texts)

    def close(self) -> None:
        """End running requests ("cancelled"), stop the scheduler and free the model."""
        with self._native:
            if self._closed:
                return
            self._closed = True
        self._sched.close()
        self._media.close()
        if self._drafter is not None:
            self._drafter.close()
        self._features.close()
        self._eog.stop()  # a slice of the vocabulary at most
        self.prompting.close()
        with self._native:
            self._freed = True
            self._llama.llama_free(self._ctx)
            self._llama.llama_model_free(self._model)

    def _check_open(self) -> None:
        # The vocab and context are freed native memory after close: touching them aborts.
        if self._closed:
            raise RuntimeUnavailable(f"the llama.cpp session for {self.record.name} is closed", hint="load it again")

    # --- prompts ------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        return self.prompting.tokenize(text, add_special=add_special)

    def chat_prompt(
        self, messages: Sequence[Any], variables: dict[str, Any] | None = None, *, add_generation_prompt: bool = True
    ) -> tuple[list[int] | MediaPrompt, tuple[str, ...]]:
        """The conversation's tokens and the stop strings its format adds (:meth:`Prompting.chat_prompt`)."""
        return self.prompting.chat_prompt(messages, variables, add_generation_prompt=add_generation_prompt)

    def chat_tokens(self, req: ChatRequest) -> tuple[list[int] | MediaPrompt, tuple[str, ...], str | None]:
        """(prompt tokens, stop strings, grammar) of a chat request: what ``chat`` runs and
        ``serve_count_prompt`` counts, so the two cannot disagree."""
        messages, variables, gbnf = self._features.chat_inputs(req, self.prompting.chat_template)
        tokens, stops = self.prompting.chat_prompt(
            messages,
            {**req.template_kwargs, **variables},
            add_generation_prompt=req.add_generation_prompt,
            continue_final=req.continue_final_message,
            prefix=req.prefix,
            media=req.media,
        )
        return tokens, stops, gbnf

    # --- llama-server's calls (runtimes.base.EXTRAS): extras.py and slot_api.py -------------------

    def serve_tokenize(self, content: str, add_special: bool = False, with_pieces: bool = False) -> dict[str, Any]:
        return self._extras.tokenize(content, add_special, with_pieces)

    def serve_detokenize(self, tokens: Sequence[int]) -> dict[str, Any]:
        return self._extras.detokenize(tokens)

    def serve_apply_template(
        self,
        messages: list[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> dict[str, Any]:
        return self._extras.apply_template(messages, template_kwargs, add_generation_prompt)

    def serve_count_prompt(self, request: dict[str, Any]) -> dict[str, Any]:
        """How many tokens a chat request (a ``ChatRequest`` as a dict) renders to, without running
        it: Anthropic's ``message_start`` carries the prompt's size before the prefill starts."""
        self._check_open()
        tokens, _, _ = self.chat_tokens(ChatRequest.from_dict(request))
        if isinstance(tokens, MediaPrompt):  # media counted too (the image's tokens), then freed
            tokens.close()
            return {"prompt_tokens": len(tokens.tokens)}
        return {"prompt_tokens": len(tokens)}

    def serve_props(self) -> dict[str, Any]:
        return self._extras.props(self.capabilities)

    def serve_embed_usage(self, inputs: Sequence[str | Sequence[int]]) -> dict[str, Any]:
        return self._extras.embed_usage(inputs)

    def serve_embed_tokens(self, inputs: Sequence[str | Sequence[int]]) -> dict[str, Any]:
        return self._extras.embed_tokens(inputs)

    def serve_rerank(self, query: str, documents: Sequence[str]) -> dict[str, Any]:
        return self._extras.rerank(query, documents)

    def serve_slots(self) -> list[dict[str, Any]]:
        return self._slot_api.slots()

    def serve_slot_action(self, id_slot: int, action: str, folder: str = "", filename: str = "") -> dict[str, Any]:
        return self._slot_api.action(id_slot, action, folder, filename)

    def serve_cache_stats(self) -> dict[str, Any]:
        return self._slot_api.cache_stats()

    # --- generation -------------------------------------------------------------------------

    def _start(
        self,
        prompt: list[int] | MediaPrompt,
        sampling: Sampling,
        cancel: Cancel,
        stops: tuple[str, ...],
        gbnf: str | None = None,
    ) -> Iterator[Chunk]:
        """Validate eagerly (so errors come before any chunk), then hand back the stream; the
        request joins the scheduler when the stream is first read."""
        if not isinstance(prompt, MediaPrompt):
            return self._start_jobs(prompt, None, sampling, cancel, stops, gbnf)
        try:
            return self._start_jobs(prompt.tokens, prompt, sampling, cancel, stops, gbnf)
        except BaseException:
            prompt.close()  # it never reached the scheduler
            raise

    def _start_jobs(
        self,
        prompt: list[int],
        media: MediaPrompt | None,
        sampling: Sampling,
        cancel: Cancel,
        stops: tuple[str, ...],
        gbnf: str | None,
    ) -> Iterator[Chunk]:
        self._check_open()
        if not prompt:
            raise LocalrunError("the prompt is empty", hint="send some text")
        if len(prompt) > self.n_ctx - 1:
            where = (
                f"a slot's context holds {self.n_ctx}" if self.layout.n_slots > 1 else f"the context holds {self.n_ctx}"
            )
            raise ContextOverflow(
                f"the prompt is {len(prompt)} tokens but {where} (at most {self.n_ctx - 1} for the prompt)",
                hint="shorten the conversation or load the model with a larger context",
            )
        room = self.n_ctx - len(prompt)
        limit = room if sampling.max_tokens is None else max(0, min(int(sampling.max_tokens), room))
        jobs = []
        with self._native:
            self._check_open()
            for i in range(max(1, int(sampling.n))):
                # Each choice draws its own tokens: a seeded request seeds choice i with seed + i.
                own = (
                    sampling
                    if i == 0 or sampling.seed is None
                    else dataclasses.replace(sampling, seed=(int(sampling.seed) + i) & 0xFFFFFFFF)
                )
                build, logprobs = self._features.job_sampling(own, gbnf)
                jobs.append(
                    Job(
                        prompt,
                        limit=limit,
                        stops=(*sampling.stop, *stops),
                        cancel=cancel,
                        build_sampler=build,
                        logprobs=logprobs,
                        media=media,
                        id_slot=self._slot_api.pinned_slot(sampling) if i == 0 else -1,
                    )
                )
        if media is not None:
            media.users = len(jobs)  # the choices share its chunks; the last to end frees them
        if len(jobs) == 1:
            return self._sched.stream(jobs[0])
        return stream_choices(self._sched.submit, jobs, cancel)  # the choices share the scheduler's inbox
