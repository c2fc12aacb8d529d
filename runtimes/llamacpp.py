"""The llama.cpp runtime, through llama-cpp-python's low-level C API.

Sessions run inside a worker process (``in_worker``): the native loader and decoder then
take down one model at worst, never the server. ``llama_cpp`` is imported inside the
functions that use it, so importing this module costs nothing.

What a session does per request:

* chat: render the GGUF's ``tokenizer.chat_template`` in localrun's sandbox (never
  llama-cpp-python's renderer), or a documented fallback when the file has none; tokenize
  with special tokens parsed, adding BOS only when the rendered text lacks it;
* refuse a prompt over ``n_ctx - 1`` tokens with ContextOverflow (never truncate), and cap
  ``max_tokens`` by what is left of the context (finish "length");
* reuse the KV of the longest common token prefix with the previous request
  (``cached_tokens``), prefill the rest in ``n_batch`` chunks checking ``cancel`` between
  chunks, then sample with a C sampler chain, checking ``cancel`` every token.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import ClassVar

from localrun.chat_template import fallback_chat, render_chat
from localrun.errors import (
    ContextOverflow,
    InvalidModelFile,
    LocalrunError,
    Overloaded,
    RuntimeUnavailable,
    UnsupportedFeature,
    WontFit,
)
from localrun.runtimes.base import RuntimeStatus
from localrun.runtimes.llamacpp_decode import SequenceDecoder, build_sampler, token_piece_reader
from localrun.runtimes.llamacpp_text import TextAssembler
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, Format, ModelRecord, Plan, Sampling, Usage

log = logging.getLogger(__name__)
native_log = logging.getLogger(__name__ + ".native")

#: ggml type ids for ``Plan.kv_type`` (ggml.h ``enum ggml_type``).
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8}
INSTALL_FIX = "pip install 'localrun[llama]'"


class _NativeLog:
    """Routes llama.cpp's log lines to :mod:`logging` at debug level instead of stderr,
    and remembers the last warnings and errors so a failed load can say why. Holds the
    ctypes callback: if it were collected, llama.cpp would call freed memory."""

    def __init__(self) -> None:
        self.recent: collections.deque[str] = collections.deque(maxlen=6)
        self.callback = None

    def install(self, llama) -> None:
        last_level = [0]

        def on_log(level: int, text: bytes, _user_data) -> None:
            # ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line)
            if level == 5:
                level = last_level[0]
            last_level[0] = level
            line = (text or b"").decode("utf-8", errors="replace").rstrip()
            if line:
                native_log.debug("%s", line)
                if level >= 3:
                    self.recent.append(line)

        self.callback = llama.llama_log_callback(on_log)
        llama.llama_log_set(self.callback, ctypes.c_void_p(0))

    def take_recent(self) -> str:
        lines = "; ".join(self.recent)
        self.recent.clear()
        return lines


_NATIVE_LOG = _NativeLog()


@functools.lru_cache(maxsize=1)
def _llama():
    """Import llama_cpp, init its backend and quiet its logging, once per process."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise RuntimeUnavailable(f"llama-cpp-python is not installed ({exc})", hint=INSTALL_FIX) from exc
    _NATIVE_LOG.install(llama_cpp)  # after the import (it installs its own printer), before any work
    llama_cpp.llama_backend_init()
    return llama_cpp


class LlamaCppRuntime:
    name: ClassVar[str] = "llama.cpp"
    formats: ClassVar[frozenset[Format]] = frozenset({Format.GGUF})
    in_worker: ClassVar[bool] = True

    def probe(self, hw=None) -> RuntimeStatus:
        try:
            llama = _llama()
        except RuntimeUnavailable as exc:
            return RuntimeStatus(self.name, False, reason=exc.message, fix=INSTALL_FIX)
        except OSError as exc:  # the bundled native library fails to load
            return RuntimeStatus(self.name, False, reason=f"llama-cpp-python's native library fails to load: {exc}",
                                 fix=INSTALL_FIX)
        gpu = bool(llama.llama_supports_gpu_offload())
        info = llama.llama_print_system_info().decode("utf-8", errors="replace").strip()
        return RuntimeStatus(
            self.name, True, version=getattr(llama, "__version__", None),
            devices=("cpu", "gpu") if gpu else ("cpu",),
            reason=None if gpu else "built without GPU offload: runs on the CPU",
            details={"gpu_offload": gpu, "system_info": info},
        )

    def load(self, model: ModelRecord, plan: Plan) -> "LlamaCppSession":
        return LlamaCppSession.open(model, plan)


class LlamaCppSession:
    """One loaded model and one context. Used from one thread at a time (the worker
    serialises requests); a second concurrent stream is refused with Overloaded."""

    capabilities: frozenset[str] = frozenset()

    def __init__(self, llama, model, ctx, record: ModelRecord, plan: Plan) -> None:
        self._llama = llama
        self._model = model
        self._ctx = ctx
        self.record = record
        self.plan = plan
        self._vocab = llama.llama_model_get_vocab(model)
        self._n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self.n_ctx = min(plan.n_ctx, llama.llama_n_ctx(ctx))
        self._decoder = SequenceDecoder(llama, ctx, n_batch=plan.n_batch, n_swa=llama.llama_model_n_swa(model))
        self._piece = token_piece_reader(llama, self._vocab)
        self._bos = self._token_text(llama.llama_vocab_bos(self._vocab))
        self._eos = self._token_text(llama.llama_vocab_eos(self._vocab))
        template = plan.options.get("chat_template")
        if template is None:
            raw = llama.llama_model_chat_template(model, None)
            template = raw.decode("utf-8", errors="replace") if raw else None
        self.chat_template: str | None = template or None
        # Without a template: a plain transcript by default. Measured on the base Gemma 3
        # 270M: with Gemma's turn markers it babbles, with the transcript it answers
        # "The capital of France is Paris." Instruction-tuned files carry their template.
        self._gemma_turns = (plan.options.get("fallback_format") == "gemma"
                             and self._is_single_token("<start_of_turn>"))
        self._template_timeout_s = float(plan.options.get("template_timeout_s", 2.0))
        self._busy = threading.Lock()
        self._close_pending = False
        self._freed = False

    @classmethod
    def open(cls, record: ModelRecord, plan: Plan) -> "LlamaCppSession":
        if record.format is not Format.GGUF:
            raise UnsupportedFeature(f"llama.cpp runs GGUF files, not {record.format.value}", param="format",
                                     hint="pick a runtime that runs this format")
        if not os.path.isfile(record.path):
            raise InvalidModelFile(f"model file not found: {record.path}", hint="re-import or pull the model")
        llama = _llama()
        cp = cls._context_params(llama, plan)  # bad options fail before anything is allocated
        mp = llama.llama_model_default_params()
        mp.n_gpu_layers = int(plan.n_gpu_layers)
        _NATIVE_LOG.take_recent()
        model = llama.llama_model_load_from_file(os.fsencode(record.path), mp)
        if not model:
            why = _NATIVE_LOG.take_recent()
            raise InvalidModelFile(f"llama.cpp could not load {record.path}" + (f": {why}" if why else ""),
                                   hint="the file may be corrupt or an architecture this llama.cpp does not know")
        ctx = llama.llama_init_from_model(model, cp)
        if not ctx:
            llama.llama_model_free(model)
            why = _NATIVE_LOG.take_recent()
            raise WontFit(f"llama.cpp could not create a {plan.n_ctx}-token context for {record.name}"
                          + (f": {why}" if why else ""), hint="lower the context length or the GPU layers")
        log.debug("loaded %s: n_ctx=%d threads=%d gpu_layers=%d", record.path, plan.n_ctx, plan.n_threads,
                  plan.n_gpu_layers)
        try:
            return cls(llama, model, ctx, record, plan)
        except BaseException:
            llama.llama_free(ctx)
            llama.llama_model_free(model)
            raise

    @staticmethod
    def _context_params(llama, plan: Plan):
        cp = llama.llama_context_default_params()
        cp.n_ctx = int(plan.n_ctx)
        cp.n_batch = int(plan.n_batch)
        cp.n_ubatch = min(int(plan.n_batch), 512)
        cp.n_seq_max = 1
        # Both, explicitly: a default n_threads_batch of cpu_count/2 made prefill 50x slower
        # in llama-cpp-python's server on a 2-core box.
        cp.n_threads = cp.n_threads_batch = max(1, int(plan.n_threads))
        kv = KV_TYPES.get(plan.kv_type)
        if kv is None:
            raise UnsupportedFeature(f"unknown KV cache type {plan.kv_type!r}", param="kv_type",
                                     hint="use one of: " + ", ".join(KV_TYPES))
        cp.type_k = cp.type_v = kv
        if kv not in (0, 1):  # a quantized V cache needs flash attention
            cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if "swa_full" in plan.options:
            # Sliding-window layers (Gemma 3) get a full-size cache by llama.cpp's default, so
            # any cached prefix can be reused. False keeps only the window (less memory); the
            # decoder then refuses a prefix whose window was already overwritten.
            cp.swa_full = bool(plan.options["swa_full"])
        if "flash_attn" in plan.options:
            flag = plan.options["flash_attn"]
            cp.flash_attn_type = (llama.LLAMA_FLASH_ATTN_TYPE_AUTO if flag is None else
                                  llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if flag else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        return cp

    # --- tokens -------------------------------------------------------------------------

    def _token_text(self, token: int) -> str:
        if token is None or token < 0:
            return ""
        raw = self._llama.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        buf = (self._llama.llama_token * size)()
        n = self._llama.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, True)
        if n < 0:
            size = -n
            buf = (self._llama.llama_token * size)()
            n = self._llama.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, True)
        return list(buf[:n])

    def _is_single_token(self, text: str) -> bool:
        toks = self.tokenize(text, add_special=False)
        return len(toks) == 1 and self._token_text(toks[0]) == text

    def chat_prompt(self, messages: Sequence) -> tuple[list[int], tuple[str, ...]]:
        """Tokens of the rendered conversation, and stop strings the prompt format adds."""
        if self.chat_template:
            text = render_chat(self.chat_template, messages, bos_token=self._bos, eos_token=self._eos,
                               timeout_s=self._template_timeout_s)
            stops: tuple[str, ...] = ()
        else:
            fallback = fallback_chat(messages, gemma_turns=self._gemma_turns)
            text, stops = fallback.text, fallback.stop
        add_bos = not (self._bos and text.startswith(self._bos))
        return self.tokenize(text, add_special=add_bos), stops

    # --- the protocol ---------------------------------------------------------------------

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._check_open()
        tokens, stops = self.chat_prompt(req.messages)
        return self._start(tokens, req.sampling, cancel, stops)

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._check_open()
        return self._start(self.tokenize(req.prompt, add_special=True), req.sampling, cancel, ())

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise UnsupportedFeature("embeddings are not supported by localrun's llama.cpp runtime yet",
                                 param="input", hint="use a runtime that declares the embeddings capability")

    def close(self) -> None:
        """Free the model now, or, if a stream is running, as soon as it ends."""
        if self._busy.acquire(blocking=False):
            try:
                self._free()
            finally:
                self._busy.release()
        else:
            self._close_pending = True

    def _check_open(self) -> None:
        # The vocab and context are freed native memory after close: touching them aborts.
        if self._freed or self._close_pending:
            raise RuntimeUnavailable(f"the llama.cpp session for {self.record.name} is closed", hint="load it again")

    def _free(self) -> None:
        if self._freed:
            return
        self._freed = True
        self._decoder.close()
        self._llama.llama_free(self._ctx)
        self._llama.llama_model_free(self._model)

    # --- generation -------------------------------------------------------------------------

    def _start(self, prompt: list[int], sampling: Sampling, cancel: Cancel, stops: tuple[str, ...]) -> Iterator[Chunk]:
        """Validate eagerly (so errors come before any chunk), then hand back the stream."""
        self._check_open()
        if not prompt:
            raise LocalrunError("the prompt is empty", hint="send some text")
        if len(prompt) > self.n_ctx - 1:
            raise ContextOverflow(
                f"the prompt is {len(prompt)} tokens but the context holds {self.n_ctx} "
                f"(at most {self.n_ctx - 1} for the prompt)",
                hint="shorten the conversation or load the model with a larger context",
            )
        room = self.n_ctx - len(prompt)
        limit = room if sampling.max_tokens is None else max(0, min(int(sampling.max_tokens), room))
        return self._stream(prompt, sampling, cancel, (*sampling.stop, *stops), limit)

    def _stream(self, prompt: list[int], sampling: Sampling, cancel: Cancel, stops: tuple[str, ...],
                limit: int) -> Iterator[Chunk]:
        if not self._busy.acquire(blocking=False):
            raise Overloaded("this llama.cpp session is already generating",
                             hint="sessions run one request at a time; the worker queues requests")
        llama, vocab, dec, piece_of = self._llama, self._vocab, self._decoder, self._piece
        sampler = None
        produced = cached = 0
        text = TextAssembler(stops)

        def final(reason: str, tail: str = "") -> Chunk:
            usage = Usage(prompt_tokens=len(prompt), completion_tokens=produced, cached_tokens=cached)
            return Chunk(text=tail, finish_reason=reason, usage=usage)

        try:
            cached = dec.reuse_prefix(prompt)
            if not dec.prefill(prompt, cancel):
                yield final("cancelled")
                return
            if limit <= 0:
                yield final("length")
                return
            sampler = build_sampler(llama, sampling, self._n_vocab)
            pending = None
            while True:
                if cancel.is_set() or self._close_pending:
                    yield final("cancelled", text.finish())
                    return
                if pending is not None:
                    dec.advance(pending)
                token = dec.sample(sampler)
                if llama.llama_vocab_is_eog(vocab, token):
                    yield final("stop", text.finish())
                    return
                produced += 1
                piece, stopped = text.feed(piece_of(token))
                if stopped:
                    yield final("stop", piece)
                    return
                if produced >= limit:
                    yield final("length", piece + text.finish())
                    return
                if piece:
                    yield Chunk(text=piece)
                pending = token
        finally:
            if sampler is not None:
                llama.llama_sampler_free(sampler)
            if self._close_pending:
                self._free()
            self._busy.release()
