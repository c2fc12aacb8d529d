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
declares "vision" / "audio"; :mod:`.media_session` turns a request's media into the prompt's
media chunks, :mod:`.media_prefill` runs them inside the batching.

Tools, ``json_schema`` / grammars, logprobs and embeddings are wired in by
:mod:`.features` (capabilities "tools", "json_schema", "logprobs", and
"embeddings" for models whose GGUF declares pooling or whose plan sets ``embedding``).

Sessions are ``concurrent``: the worker calls ``chat``/``complete`` from one thread per
request, and each generator reads its chunks from the scheduler.

``plan.options`` this runtime reads for batching (defaults in :mod:`.slots`):
``n_slots`` (sequences run at once), ``slot_ctx`` (tokens per request; by default the slots
share ``plan.n_ctx``), ``kv_unified`` (one KV pool for all slots), ``step_tokens`` (prefill
tokens per step), ``host_cache_mib`` or ``kv_ram_bytes`` (host RAM for evicted prefixes, 0 = off,
unset = a default from free RAM), ``kv_dir`` and ``kv_disk_bytes`` (the disk tier, :mod:`.prefix_disk`),
``prefix_cache``, ``batch_invariant`` and ``exact_prefix`` (see :mod:`.scheduler`),
``speculative`` and ``draft_k`` (see :mod:`.speculative`), and the context switches
``flash_attn``, ``swa_full``, ``repack``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import ClassVar

from localrun.chat import tools
from localrun.errors import (
    ContextOverflow,
    InvalidModelFile,
    LocalrunError,
    RuntimeUnavailable,
    UnsupportedFeature,
    WontFit,
)
from localrun.runtimes.base import RuntimeStatus
from localrun.runtimes.llamacpp.build_info import load_backends
from localrun.runtimes.llamacpp.cache.checkpoints import memory_kind
from localrun.runtimes.llamacpp.cache.prefix_disk import open_disk_tier
from localrun.runtimes.llamacpp.cache.slots import Layout
from localrun.runtimes.llamacpp.choices import stream_choices
from localrun.runtimes.llamacpp.decode import token_piece_reader
from localrun.runtimes.llamacpp.extras import ServerExtras
from localrun.runtimes.llamacpp.features import SessionFeatures
from localrun.runtimes.llamacpp.job import Job
from localrun.runtimes.llamacpp.media.mtmd import open_projector
from localrun.runtimes.llamacpp.media.prompt import MediaPrompt
from localrun.runtimes.llamacpp.media.session import SessionMedia
from localrun.runtimes.llamacpp.native_log import NATIVE_LOG
from localrun.runtimes.llamacpp.probe import INSTALL_FIX, probe_llamacpp
from localrun.runtimes.llamacpp.scheduler import Scheduler
from localrun.runtimes.llamacpp.slot_api import SlotApi
from localrun.runtimes.llamacpp.speculative.drafting import MAX_DRAFT, speculation
from localrun.runtimes.llamacpp.token_split import FALLBACK_MARKERS, Splitter
from localrun.runtimes.llamacpp.tokens import SessionTokens, VocabScan, split_rules
from localrun.runtimes.llamacpp.turns import special_piece_reader
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, Format, ModelRecord, Plan, Sampling

log = logging.getLogger(__name__)

#: ggml type ids for ``Plan.kv_type`` (ggml.h ``enum ggml_type``).
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8}


@functools.lru_cache(maxsize=1)
def _llama():
    """Import llama_cpp, init its backend and quiet its logging, once per process."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise RuntimeUnavailable(f"llama-cpp-python is not installed ({exc})", hint=INSTALL_FIX) from exc
    NATIVE_LOG.install(llama_cpp)  # after the import (it installs its own printer), before any work
    load_backends(llama_cpp)  # a portable (GGML_BACKEND_DL) build's CPU variants live in its lib/
    llama_cpp.llama_backend_init()
    return llama_cpp


class LlamaCppRuntime:
    name: ClassVar[str] = "llama.cpp"
    formats: ClassVar[frozenset[Format]] = frozenset({Format.GGUF})
    in_worker: ClassVar[bool] = True

    def probe(self, hw=None, *, import_module=None) -> RuntimeStatus:
        """Installed, which GPU backend, and the rebuild this machine's GPU calls for (see :mod:`.probe`)."""
        return probe_llamacpp(hw, import_module=import_module)

    def load(self, model: ModelRecord, plan: Plan) -> LlamaCppSession:
        return LlamaCppSession.open(model, plan)

    def media_before_load(self, model: ModelRecord, plan: Plan) -> frozenset[str] | None:
        """No media without a projector (the manager refuses them before a load of most of a
        minute); with one, its header decides, once loaded (None)."""
        from localrun.types import META_PROJECTOR

        return None if model.metadata.get(META_PROJECTOR) else frozenset()


class LlamaCppSession(SessionTokens, ServerExtras, SlotApi):
    """One loaded model, one context, several sequences (slots) run by a scheduler thread.

    ``concurrent``: requests may call ``chat``/``complete`` from many threads at once; more
    requests than slots wait for a slot in arrival order.
    """

    capabilities: frozenset[str] = frozenset()
    concurrent: ClassVar[bool] = True

    def __init__(
        self, llama, model, ctx, record: ModelRecord, plan: Plan, layout: Layout, projector=None, eog=None
    ) -> None:
        self._llama = llama
        self._model = model
        self._ctx = ctx
        self.record = record
        self.plan = plan
        self.layout = layout
        self._vocab = llama.llama_model_get_vocab(model)
        self._eog = eog if eog is not None else VocabScan(llama, model, record.name)
        self._n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        # Guards the vocabulary against close(): request threads tokenize while it frees.
        self._native = threading.Lock()
        self._closed = False
        self._freed = False
        per_seq = llama.llama_n_ctx_seq(ctx) if hasattr(llama, "llama_n_ctx_seq") else llama.llama_n_ctx(ctx)
        self.n_ctx = min(layout.slot_ctx, per_seq)  # what one request may use
        self._bos = self._token_text(llama.llama_vocab_bos(self._vocab))
        self._eos = self._token_text(llama.llama_vocab_eos(self._vocab))
        template = plan.options.get("chat_template")
        if template is None:
            raw = llama.llama_model_chat_template(model, None)
            template = raw.decode("utf-8", errors="replace") if raw else None
        self.chat_template: str | None = template or None
        splits, raw = split_rules(llama, self._vocab)
        # Pieces start at the template's special texts; without one, at the turn markers the
        # fallback formats write (only those that are this vocabulary's special tokens count).
        # Raw text may be cut after a newline too (an agent's system prompt has no markers).
        markers = (self.chat_template or "") + "".join((self._bos, self._eos, *FALLBACK_MARKERS))
        followers = self._eog.newline_followers if raw else None
        self._splitter = Splitter(self._eog.specials, markers, plan.n_threads if splits else 1, followers)
        # Without a template: a plain transcript by default. Measured on the base Gemma 3
        # 270M: with Gemma's turn markers it babbles, with the transcript it answers
        # "The capital of France is Paris." Instruction-tuned files carry their template.
        self._gemma_turns = plan.options.get("fallback_format") == "gemma" and self._is_single_token("<start_of_turn>")
        self._template_timeout_s = float(plan.options.get("template_timeout_s", 2.0))
        is_eog = self._eog_reader()
        piece_of = token_piece_reader(llama, self._vocab)  # one cache of pieces: the scheduler and logprobs
        self._special_length = special_piece_reader(llama, self._vocab)  # where a prompt's last turn begins
        n_swa = llama.llama_model_n_swa(model)
        mode, draft_k = speculation(plan, n_swa)
        #: "recurrent", "hybrid", "swa" (without swa_full): a memory that cannot be cut back (checkpoints.py).
        self.memory = memory_kind(llama, model, swa_full=bool(plan.options.get("swa_full", True)))
        if self.memory in ("recurrent", "hybrid") and mode != "off":
            # A rejected draft's tokens cannot be taken back out of a recurrent state.
            log.info("speculative decoding off: %s memory cannot be cut back after a rejected draft", self.memory)
            mode = "off"
        self._drafter = None
        # Images and audio (media_session.py): the projector, its decoder, "vision" / "audio".
        self._media = SessionMedia(projector, record.name)
        self._n_ubatch = llama.llama_n_ubatch(ctx)
        if plan.options.get("draft") and mode in ("auto", "draft") and not (mode == "auto" and layout.exact_prefix):
            # auto is off under exact_prefix
            from localrun.runtimes.llamacpp.speculative.draft_model import load_drafter

            self._drafter = load_drafter(
                llama,
                model,
                plan,
                layout,
                record.path,
                flash_attn_type=self._context_params(llama, plan, layout).flash_attn_type,
            )
        # The disk tier under the prefix cache (prefix_disk.py): keyed by the model's sha256 and the context.
        disk = open_disk_tier(llama, model, ctx, self._context_params(llama, plan, layout), record, layout)
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
            tokenize=lambda text: self.tokenize(text, add_special=True),
            vocab=self._vocab,
            n_vocab=self._n_vocab,
            piece_of=piece_of,
            call=self._sched.call,
        )
        # "reasoning_budget": a turn continues from a prefix (ChatRequest.prefix), so the server can force the end of
        # thinking.
        self.capabilities = (
            self._features.capabilities
            | self.extra_capabilities()
            | self._media.capabilities
            | {"reasoning_budget", "slots"}  # slots: llama-server's id_slot and /slots (slot_api.py)
        )

    @classmethod
    def open(cls, record: ModelRecord, plan: Plan) -> LlamaCppSession:
        if record.format is not Format.GGUF:
            raise UnsupportedFeature(
                f"llama.cpp runs GGUF files, not {record.format.value}",
                param="format",
                hint="pick a runtime that runs this format",
            )
        if not os.path.isfile(record.path):
            raise InvalidModelFile(f"model file not found: {record.path}", hint="re-import or pull the model")
        llama = _llama()
        layout = Layout.from_plan(plan)
        cp = cls._context_params(llama, plan, layout)  # bad options fail before anything is allocated
        mp = llama.llama_model_default_params()
        mp.n_gpu_layers = int(plan.n_gpu_layers)
        if layout.exact and hasattr(mp, "use_extra_bufts"):
            # Repacked weights (AVX2 Q4_K 8x8, …) change a row's arithmetic with the rows
            # decoded beside it; measured here they bought no speed on Gemma 3 270M.
            mp.use_extra_bufts = bool(plan.options.get("repack", False))
        from localrun.runtimes.llamacpp import overrides  # MoE experts to RAM, several GPUs (see overrides.py)

        load_params = overrides.apply(llama, mp, plan.options)  # held until the model is freed
        NATIVE_LOG.take_recent()
        model = llama.llama_model_load_from_file(os.fsencode(record.path), mp)
        if not model:
            why = NATIVE_LOG.take_recent()
            raise InvalidModelFile(
                f"llama.cpp could not load {record.path}" + (f": {why}" if why else ""),
                hint="the file may be corrupt or an architecture this llama.cpp does not know",
            )
        eog = VocabScan(llama, model, record.name)  # runs while the context is created (tokens.py)
        try:
            projector = open_projector(llama, model, record, plan, cp)  # cp's batches grow to one image
        except BaseException:
            eog.stop()
            llama.llama_model_free(model)
            raise
        ctx = llama.llama_init_from_model(model, cp)
        if not ctx:
            if projector is not None:
                projector.close()
            eog.stop()
            llama.llama_model_free(model)
            why = NATIVE_LOG.take_recent()
            raise WontFit(
                f"llama.cpp could not create a {layout.n_ctx}-token context ({layout.n_slots} slots) for "
                f"{record.name}" + (f": {why}" if why else ""),
                hint="lower the context length, the slots or the GPU layers",
            )
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

    @staticmethod
    def _context_params(llama, plan: Plan, layout: Layout):
        cp = llama.llama_context_default_params()
        cp.n_ctx = int(layout.n_ctx)
        cp.n_batch = max(layout.step_tokens, layout.n_slots, MAX_DRAFT + 1)  # a verification pass is one call
        cp.n_ubatch = min(cp.n_batch, 512)
        cp.n_seq_max = layout.n_slots
        cp.kv_unified = layout.unified
        # Both, explicitly: a default n_threads_batch of cpu_count/2 made prefill 50x slower
        # in llama-cpp-python's server on a 2-core box.
        cp.n_threads = cp.n_threads_batch = max(1, int(plan.n_threads))
        kv = KV_TYPES.get(plan.kv_type)
        if kv is None:
            raise UnsupportedFeature(
                f"unknown KV cache type {plan.kv_type!r}", param="kv_type", hint="use one of: " + ", ".join(KV_TYPES)
            )
        cp.type_k = cp.type_v = kv
        if layout.exact_prefix:
            # Flash attention on the CPU makes a prefill's result depend on its chunking
            # (see llamacpp/scheduler.py), so a cached prefix would differ from a cold one in the last bits.
            cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if kv not in (0, 1):  # a quantized V cache needs flash attention
            cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if "swa_full" in plan.options:
            # Sliding-window layers (Gemma 3) get a full-size cache by llama.cpp's default, so
            # any cached prefix can be reused. False keeps only the window (less memory); the
            # prefix cache then refuses a prefix whose window was already overwritten.
            cp.swa_full = bool(plan.options["swa_full"])
        if "flash_attn" in plan.options:
            flag = plan.options["flash_attn"]
            cp.flash_attn_type = (
                llama.LLAMA_FLASH_ATTN_TYPE_AUTO
                if flag is None
                else llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
                if flag
                else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        return cp

    # --- the protocol ---------------------------------------------------------------------

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._check_open()
        tokens, stops, gbnf = self.chat_tokens(req)
        return tools.with_tool_calls(self._start(tokens, req.sampling, cancel, stops, gbnf), req)

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._check_open()
        gbnf = self._features.completion_grammar(req.sampling)
        return self._start(self.completion_tokens(req), req.sampling, cancel, (), gbnf)

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
        self._splitter.close()
        with self._native:
            self._freed = True
            self._llama.llama_free(self._ctx)
            self._llama.llama_model_free(self._model)

    def _check_open(self) -> None:
        # The vocab and context are freed native memory after close: touching them aborts.
        if self._closed:
            raise RuntimeUnavailable(f"the llama.cpp session for {self.record.name} is closed", hint="load it again")

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

    def _start_jobs(self, prompt, media, sampling, cancel, stops, gbnf) -> Iterator[Chunk]:
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
                        id_slot=self._pinned_slot(sampling) if i == 0 else -1,  # slot_api.py
                    )
                )
        if media is not None:
            media.users = len(jobs)  # the choices share its chunks; the last to end frees them
        if len(jobs) == 1:
            return self._sched.stream(jobs[0])
        return stream_choices(self._sched.submit, jobs, cancel)  # the choices share the scheduler's inbox
