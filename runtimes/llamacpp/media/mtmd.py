"""A model's multimodal projector, through llama.cpp's ``mtmd`` library (llama-cpp-python's
``llama_cpp.mtmd_cpp`` bindings), kept to the four things the scheduler needs:

* load it beside the text model (``mtmd_init_from_file``) with explicit threads, the GPU as the
  plan says, localrun's :data:`~localrun.types.MEDIA_MARKER` as its marker and no warmup pass
  (a warmup encodes a dummy image at load: seconds on a CPU, for nothing a request needs);
* bitmaps from decoded pixels / PCM (the bytes a client sent are decoded elsewhere, in a
  sacrificial process: :mod:`.decoder`), each with its content digest as its id;
* ``mtmd_tokenize`` of a rendered prompt into a :class:`~.prompt.MediaPrompt` (text ids
  and pseudo ids for the media chunks), in one call or piece by piece as the items come
  (:meth:`Projector.tokenize_into`: the text before a marker, the marker, its bitmap; the chunk
  lists are joined). mtmd splits a text at its markers and tokenizes each part alone, so the
  pieces make the same positions and chunks as one call; the BOS/EOS a call with
  ``add_special`` adds are added once, around the whole (:meth:`Projector.add_specials`);
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
from typing import TYPE_CHECKING, Any, cast

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
    """Owns a prompt's ``mtmd_input_chunks`` lists: one for a prompt tokenized in one call, one per
    media item for a prompt tokenized as its items came (:class:`~.tokenizing.MediaTokens`).
    A span's ``index`` counts chunks across the lists, in order. ``close`` (or garbage
    collection) frees each list once."""

    __slots__ = ("_m", "_parts", "_frees", "__weakref__")

    def __init__(self, mtmd: Any, ptr: Any = None) -> None:
        self._m = mtmd
        self._parts: list[tuple[Any, int]] = []  # (list, its chunk count)
        self._frees: list[weakref.finalize[Any, Any]] = []
        if ptr is not None:
            self.add(ptr)

    def add(self, ptr: Any) -> int:
        """Own one more list (freed with the others); returns the index its first chunk takes."""
        first = self.size
        self._frees.append(weakref.finalize(self, self._m.mtmd_input_chunks_free, ptr))
        self._parts.append((ptr, int(self._m.mtmd_input_chunks_size(ptr))))
        return first

    @property
    def size(self) -> int:
        return sum(n for _, n in self._parts)

    def chunk(self, index: int) -> Any:
        """The chunk at ``index`` counted across the lists."""
        for ptr, n in self._parts:
            if index < n:
                return self._m.mtmd_input_chunks_get(ptr, index)
            index -= n
        raise IndexError(index)

    def close(self) -> None:
        for free in self._frees:
            free()


class BitmapBytes:
    """The bytes of pixels and samples a projector's live bitmaps hold, and the most they held at
    once (``peak``): what a request's media cost the worker between decoding and tokenizing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def made(self, bitmap: Any, size: int) -> None:
        with self._lock:
            self._sizes[int(bitmap)] = size
            self.live += size
            self.peak = max(self.peak, self.live)

    def freed(self, bitmap: Any) -> None:
        with self._lock:
            self.live -= self._sizes.pop(int(bitmap), 0)

    def reset_peak(self) -> int:
        """The peak so far, and start counting it again from what is live now."""
        with self._lock:
            peak, self.peak = self.peak, self.live
            return peak


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
        self.bitmaps = BitmapBytes()
        vocab = llama.llama_model_get_vocab(model)
        self._bos = int(llama.llama_vocab_bos(vocab)) if llama.llama_vocab_get_add_bos(vocab) else None
        self._eos = int(llama.llama_vocab_eos(vocab)) if llama.llama_vocab_get_add_eos(vocab) else None
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
        return self._named(self._m.mtmd_bitmap_init(nx, ny, buf), digest, len(rgb))

    def audio_bitmap(self, pcm: Buffer, digest: str) -> Any:
        """``pcm``: mono float32 samples at :attr:`sample_rate` (bytes or anything with the buffer protocol)."""
        view = memoryview(pcm).cast("B")
        n = len(view) // 4
        if n == 0:
            raise InvalidMedia("the audio clip has no samples", hint="send a clip that is not empty")
        buf = (ctypes.c_float * n).from_buffer_copy(view[: n * 4])
        return self._named(self._m.mtmd_bitmap_init_from_audio(n, buf), digest, n * 4)

    def _named(self, bitmap: Any, digest: str, size: int) -> Any:
        if not bitmap:
            raise InvalidMedia("llama.cpp could not make a bitmap of this media", hint="send another file")
        self.bitmaps.made(bitmap, size)
        self._m.mtmd_bitmap_set_id(bitmap, digest.encode())
        return bitmap

    def free_bitmaps(self, bitmaps: Sequence[Any]) -> None:
        for b in bitmaps:
            if b:
                self.bitmaps.freed(b)
                self._m.mtmd_bitmap_free(b)

    def new_prompt(self) -> MediaPrompt:
        """An empty prompt for :meth:`tokenize_into` to fill."""
        return MediaPrompt([], [], NativeChunks(self._m))

    def tokenize(self, text: str, bitmaps: Sequence[Any], *, add_special: bool) -> MediaPrompt:
        """The prompt's positions and media chunks, in one ``mtmd_tokenize`` call; ``text`` holds one
        marker per bitmap, in order. The bitmaps are freed here, whatever happens."""
        prompt = self.new_prompt()
        try:
            self.tokenize_into(prompt, text, bitmaps, add_special=add_special, seen={})
        except BaseException:
            prompt.close()
            raise
        return prompt

    def tokenize_into(
        self, prompt: MediaPrompt, text: str, bitmaps: Sequence[Any], *, add_special: bool, seen: dict[str, int]
    ) -> None:
        """Tokenize ``text`` (one marker per bitmap) and append its positions and chunks to ``prompt``
        (one of :meth:`new_prompt`'s); ``seen`` counts the chunks per media id across the calls
        that build one prompt. The bitmaps are freed here, whatever happens: mtmd's chunks hold
        their own preprocessed copy."""
        m, ptr = self._m, None
        try:
            if self.marker != MEDIA_MARKER:
                text = text.replace(MEDIA_MARKER, self.marker)
            data = text.encode("utf-8")
            inp = m.mtmd_input_text(data, len(data), bool(add_special), True)
            arr = (m.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            with self._lock:  # the context stays until this prompt is read (close() takes the lock)
                self._check_open()
                ptr = m.mtmd_input_chunks_init()
                rc = m.mtmd_tokenize(self._ctx, ptr, ctypes.byref(inp), arr, len(bitmaps))
                if rc == 0:
                    first, owned, ptr = cast("NativeChunks", prompt.native).add(ptr), ptr, None  # the prompt frees it
                    self._read(owned, first, prompt, seen)
                    return
        finally:
            self.free_bitmaps(bitmaps)
            if ptr is not None:
                m.mtmd_input_chunks_free(ptr)
        if rc == 1:
            raise InvalidMedia(
                f"the prompt places {text.count(self.marker)} media items but {len(bitmaps)} were sent",
                hint="the chat template dropped or repeated a message that carries an image",
            )
        raise InvalidMedia("llama.cpp could not preprocess this media for the projector", hint="send another file")

    def add_specials(self, prompt: MediaPrompt) -> None:
        """The BOS (and EOS) the vocabulary adds, as ``mtmd_tokenize`` with ``add_special`` would:
        for a prompt tokenized in pieces, each without."""
        if self._bos is not None:
            prompt.tokens.insert(0, self._bos)
            for span in prompt.spans:
                span.start += 1
        if self._eos is not None:
            prompt.tokens.append(self._eos)

    def _read(self, ptr: Any, first: int, prompt: MediaPrompt, seen: dict[str, int]) -> None:
        m, tokens, spans = self._m, prompt.tokens, prompt.spans
        n_out = ctypes.c_size_t(0)
        for i in range(m.mtmd_input_chunks_size(ptr)):
            chunk = m.mtmd_input_chunks_get(ptr, i)
            kind = m.mtmd_input_chunk_get_type(chunk)
            if kind == CHUNK_TEXT:
                toks = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_out))
                tokens.extend(toks[: n_out.value] if n_out.value else ())
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
            spans.append(MediaSpan(len(tokens), n, _KINDS.get(kind, "image"), first + i, digest, causal_off))
            tokens.extend(pseudo_ids(digest, n))

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
        chunk = native.chunk(span.index)
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
