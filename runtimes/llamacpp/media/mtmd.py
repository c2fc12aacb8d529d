"""A model's multimodal projector, through llama.cpp's ``mtmd`` library (llama-cpp-python's
``llama_cpp.mtmd_cpp`` bindings), kept to the four things the scheduler needs:

* load it beside the text model (``mtmd_init_from_file``) with explicit threads, the GPU as the
  plan says, localrun's :data:`~localrun.types.MEDIA_MARKER` as its marker and no warmup pass
  (a warmup encodes a dummy image at load: seconds on a CPU, for nothing a request needs);
* bitmaps from decoded pixels / PCM (the bytes a client sent are decoded elsewhere, in a
  sacrificial process: :mod:`.decoder`), each with its content digest as its id;
* ``mtmd_tokenize`` of a rendered prompt into a :class:`~.prompt.MediaPrompt` (text ids
  and pseudo ids for the media chunks);
* encode one media chunk into embeddings (``mtmd_encode_chunk``), copied out of the context.

Threads: ``mtmd_tokenize`` is documented thread-safe on a shared context (llama-server calls it
from its HTTP threads too), so request threads tokenize; encoding is only ever called from the
encoder thread (:mod:`.prefill`). Every native object (bitmaps, chunk lists) is freed on
every path: bitmaps right after tokenizing (the chunks hold their own preprocessed copy), a
chunk list when its last job ends, or by its finalizer if a request never reached the scheduler.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import uuid
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from localrun.errors import InvalidMedia, InvalidModelFile
from localrun.runtimes.llamacpp.media.prompt import MediaPrompt, MediaSpan, pseudo_ids
from localrun.runtimes.llamacpp.native_log import NATIVE_LOG
from localrun.types import MEDIA_MARKER

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from localrun.types import ModelRecord, Plan

log = logging.getLogger(__name__)

CHUNK_TEXT, CHUNK_IMAGE, CHUNK_AUDIO = 0, 1, 2
_KINDS = {CHUNK_IMAGE: "image", CHUNK_AUDIO: "audio"}


class NativeChunks:
    """Owns one ``mtmd_input_chunks``; ``close`` (or garbage collection) frees it once."""

    __slots__ = ("ptr", "_free", "__weakref__")

    def __init__(self, mtmd: Any, ptr: Any) -> None:
        self.ptr = ptr
        self._free = weakref.finalize(self, mtmd.mtmd_input_chunks_free, ptr)

    def close(self) -> None:
        self._free()


class Projector:
    """One loaded projector (``mmproj*.gguf``) paired with a loaded text model."""

    def __init__(self, llama: Any, model: Any, path: str, *, n_threads: int, use_gpu: bool) -> None:
        from llama_cpp import mtmd_cpp

        self._m, self.path = mtmd_cpp, path
        if NATIVE_LOG.callback is not None:  # mtmd and its helpers log on their own (per image, at info)
            mtmd_cpp.mtmd_log_set(NATIVE_LOG.callback, None)
            mtmd_cpp.mtmd_helper_log_set(NATIVE_LOG.callback, None)
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = bool(use_gpu)
        params.n_threads = max(1, int(n_threads))
        params.print_timings = False
        params.warmup = False
        self._marker = MEDIA_MARKER.encode()  # kept alive: the context keeps the pointer until init copies it
        params.media_marker = self._marker
        if not os.path.isfile(path):
            raise InvalidModelFile(f"projector file not found: {path}", hint="re-import the model with --mmproj FILE")
        ctx = mtmd_cpp.mtmd_init_from_file(os.fsencode(path), model, params)
        if not ctx:
            raise InvalidModelFile(
                f"llama.cpp could not load the projector {path}",
                hint="the file may be corrupt, or made for another model (its embedding size must match)",
            )
        self._ctx = ctx
        self._lock = threading.Lock()  # close() against tokenize() on request threads
        self.vision = bool(mtmd_cpp.mtmd_support_vision(ctx))
        self.audio = bool(mtmd_cpp.mtmd_support_audio(ctx))
        self.sample_rate = int(mtmd_cpp.mtmd_get_audio_sample_rate(ctx)) if self.audio else 0
        self.mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(ctx))
        raw = mtmd_cpp.mtmd_get_marker(ctx)
        self.marker = raw.decode() if raw else MEDIA_MARKER
        self.n_embd = int(llama.llama_model_n_embd_inp(model))
        log.info(
            "projector %s: vision=%s audio=%s (rate %d) mrope=%s",
            path,
            self.vision,
            self.audio,
            self.sample_rate,
            self.mrope,
        )

    # --- request threads ------------------------------------------------------------------------

    def image_bitmap(self, nx: int, ny: int, rgb: bytes, digest: str) -> Any:
        if len(rgb) != nx * ny * 3:
            raise InvalidMedia(f"decoded image is {len(rgb)} bytes, not {nx}x{ny} RGB", hint="send a valid image")
        # mtmd copies the pixels into its bitmap: hand it the bytes object's own buffer, no copy here.
        buf = ctypes.cast(ctypes.c_char_p(rgb), ctypes.POINTER(ctypes.c_uint8))
        return self._named(self._m.mtmd_bitmap_init(nx, ny, buf), digest)

    def audio_bitmap(self, pcm: Buffer, digest: str) -> Any:
        """``pcm``: mono float32 samples at :attr:`sample_rate` (bytes or anything with the buffer protocol)."""
        view = memoryview(pcm).cast("B")
        n = len(view) // 4
        if n == 0:
            raise InvalidMedia("the audio clip has no samples", hint="send a clip that is not empty")
        buf = (ctypes.c_float * n).from_buffer_copy(view[: n * 4])
        return self._named(self._m.mtmd_bitmap_init_from_audio(n, buf), digest)

    def _named(self, bitmap: Any, digest: str) -> Any:
        if not bitmap:
            raise InvalidMedia("llama.cpp could not make a bitmap of this media", hint="send another file")
        self._m.mtmd_bitmap_set_id(bitmap, digest.encode())
        return bitmap

    def free_bitmaps(self, bitmaps: Sequence[Any]) -> None:
        for b in bitmaps:
            if b:
                self._m.mtmd_bitmap_free(b)

    def tokenize(self, text: str, bitmaps: Sequence[Any], *, add_special: bool) -> MediaPrompt:
        """The prompt's positions and media chunks; ``text`` holds one marker per bitmap, in order.
        The bitmaps are freed here, whatever happens."""
        m = self._m
        try:
            if self.marker != MEDIA_MARKER:
                text = text.replace(MEDIA_MARKER, self.marker)
            data = text.encode("utf-8")
            inp = m.mtmd_input_text(data, len(data), bool(add_special), True)
            arr = (m.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            with self._lock:  # the context stays until this prompt is read (close() takes the lock)
                self._check_open()
                native = NativeChunks(m, m.mtmd_input_chunks_init())
                rc = m.mtmd_tokenize(self._ctx, native.ptr, ctypes.byref(inp), arr, len(bitmaps))
                if rc == 0:
                    try:
                        return self._prompt(native)
                    except BaseException:
                        native.close()
                        raise
        finally:
            self.free_bitmaps(bitmaps)
        native.close()
        if rc == 1:
            raise InvalidMedia(
                f"the prompt places {text.count(self.marker)} media items but {len(bitmaps)} were sent",
                hint="the chat template dropped or repeated a message that carries an image",
            )
        raise InvalidMedia("llama.cpp could not preprocess this media for the projector", hint="send another file")

    def _prompt(self, native: NativeChunks) -> MediaPrompt:
        tokens: list[int]
        spans: list[MediaSpan]
        seen: dict[str, int]
        m, tokens, spans, seen = self._m, [], [], {}
        n_out = ctypes.c_size_t(0)
        for i in range(m.mtmd_input_chunks_size(native.ptr)):
            chunk = m.mtmd_input_chunks_get(native.ptr, i)
            kind = m.mtmd_input_chunk_get_type(chunk)
            if kind == CHUNK_TEXT:
                ptr = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_out))
                tokens.extend(ptr[: n_out.value] if n_out.value else ())
                continue
            n = int(m.mtmd_input_chunk_get_n_tokens(chunk))
            if int(m.mtmd_input_chunk_get_n_pos(chunk)) != n:
                raise InvalidMedia(
                    "this projector places media tokens at their own positions (M-RoPE), which localrun's "
                    "llama.cpp scheduler does not support yet",
                    hint="use a model without M-RoPE (Gemma 3, SmolVLM, LLaVA…) or the Ollama runtime",
                )
            raw = m.mtmd_input_chunk_get_id(chunk)
            cid = raw.decode(errors="replace") if raw else uuid.uuid4().hex  # no id: never matches another
            nth = seen[cid] = seen.get(cid, -1) + 1  # a long clip is several chunks with one id
            digest = f"{cid}#{nth}"
            causal_off = bool(m.mtmd_decode_use_non_causal(self._ctx, chunk))
            spans.append(MediaSpan(len(tokens), n, _KINDS.get(kind, "image"), i, digest, causal_off))
            tokens.extend(pseudo_ids(digest, n))
        return MediaPrompt(tokens, spans, native)

    def image_tokens(self) -> int:
        """What one image costs in tokens (for a dynamic-resolution projector: a small image's),
        so the context's batch can take a whole image in one ubatch; 0 without vision."""
        if not self.vision:
            return 0
        bitmap = self.image_bitmap(64, 64, bytes(64 * 64 * 3), "localrun-probe")
        prompt = self.tokenize(MEDIA_MARKER, [bitmap], add_special=False)
        try:
            return max((s.n_tokens for s in prompt.spans), default=0)
        finally:
            prompt.close()

    # --- the encoder thread ---------------------------------------------------------------------

    def encode(self, native: NativeChunks, span: MediaSpan) -> ctypes.Array[ctypes.c_float]:
        """The embeddings of one media chunk, ``n_tokens * n_embd`` floats owned by Python."""
        m = self._m
        chunk = m.mtmd_input_chunks_get(native.ptr, span.index)
        rc = m.mtmd_encode_chunk(self._ctx, chunk)
        if rc != 0:
            raise InvalidMedia(f"the projector could not encode this {span.kind} (code {rc})", hint="send another file")
        size = span.n_tokens * self.n_embd
        out = (ctypes.c_float * size)()
        ctypes.memmove(out, m.mtmd_get_output_embd(self._ctx), size * ctypes.sizeof(ctypes.c_float))
        return out

    def _check_open(self) -> None:
        if self._ctx is None:
            raise InvalidMedia("the projector is closed", hint="load the model again")

    def close(self) -> None:
        with self._lock:
            ctx, self._ctx = self._ctx, None
        if ctx:
            self._m.mtmd_free(ctx)


def open_projector(llama: Any, model: Any, record: ModelRecord, plan: Plan, cp: Any = None) -> Projector | None:
    """The record's projector (``metadata[META_PROJECTOR]``, or the plan's ``mmproj`` option), or None.

    With the context params ``cp`` (before the context exists): their batch and ubatch grow to
    one image's tokens, which must go in one ubatch when they attend to each other (Gemma 3)."""
    from localrun.types import META_PROJECTOR

    path = plan.options.get("mmproj") or (record.metadata or {}).get(META_PROJECTOR)
    if not path:
        return None
    use_gpu = plan.options.get("mmproj_gpu")
    if use_gpu is None:
        use_gpu = int(plan.n_gpu_layers) > 0 and plan.device != "cpu"
    threads = int(plan.options.get("mmproj_threads") or plan.n_threads)
    projector = Projector(llama, model, str(path), n_threads=threads, use_gpu=bool(use_gpu))
    if cp is not None:
        try:
            need = projector.image_tokens()
        except BaseException:
            projector.close()
            raise
        cp.n_batch = max(cp.n_batch, need)
        cp.n_ubatch = max(cp.n_ubatch, need)
    return projector
