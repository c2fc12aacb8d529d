"""What a llama.cpp session does with a request's images and audio, before the scheduler sees them.

* The projector (:mod:`.mtmd`) is loaded with the model, from ``record.metadata[META_PROJECTOR]``
  (or a plan's ``mmproj`` option); it adds "vision" / "audio" to the session's capabilities.
* A request's media bytes are decoded in a sacrificial process (:mod:`.decoder`: a file
  that crashes the native decoder fails that request alone), made into bitmaps named by their
  content digest, and tokenized with the rendered prompt into a
  :class:`~.prompt.MediaPrompt`: the scheduler's prompt, pseudo ids where the media go. One
  item at a time: each is decoded, made a bitmap and tokenized with the text before its marker,
  and its pixels freed, before the next is decoded, so the worker holds one item's pixels (and
  the chunks mtmd keeps, at the projector's own input size), never a whole request's.
* Refusals are 400s that say what to do: media to a model without a projector
  (``UnsupportedFeature``, naming ``--mmproj``), a kind the projector does not take, a bad file or
  an image too large for one batch (``InvalidMedia``).

The rendered prompt carries :data:`~localrun.types.MEDIA_MARKER` where each item goes: message
content is a plain string with the marker in it, which every chat template passes through, and
mtmd adds the model's own image delimiters around the chunk (Gemma 3: ``<start_of_image>`` …
``<end_of_image>``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from localrun.errors import InvalidMedia, UnsupportedFeature
from localrun.runtimes.llamacpp.media.prompt import MediaPrompt, MediaSpan
from localrun.types import AUDIO, MEDIA_MARKER, VISION, Media, Plan

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.media.decoder import MediaDecoder
    from localrun.runtimes.llamacpp.media.mtmd import Projector

log = logging.getLogger(__name__)

#: The pixels a picture keeps when the plan does not say what the projector consumes
#: (``plan.options["media"]["decode_pixels"]``, from :func:`localrun.planning.media.decode_pixels`).
DEFAULT_FIT_PIXELS = 4096 * 4096
#: The most bytes one request's media may decode to (RGB pixels after scaling, float32 samples):
#: 32 pictures at Gemma 3's fit (2 × 896², 4.8 MB each) come to 154 MB; 32 full-size 64-MP
#: pictures would be 6 GB in the worker.
DECODED_BUDGET_BYTES = 256 * 1024 * 1024


def media_bounds(plan: Plan) -> dict[str, int]:
    """SessionMedia's bounds from the plan: ``options["media"]["decode_pixels"]`` (the planner's, from
    the projector's header) and ``options["media_budget_bytes"]`` (an override of the budget)."""
    bounds: dict[str, int] = {}
    fit = (plan.options.get("media") or {}).get("decode_pixels")
    if fit:
        bounds["fit_pixels"] = int(fit)
    if plan.options.get("media_budget_bytes"):
        bounds["budget_bytes"] = int(plan.options["media_budget_bytes"])
    return bounds


class SessionMedia:
    """The media side of one session: its projector (or None), the decoder, the capabilities."""

    def __init__(
        self,
        projector: Projector | None,
        name: str,
        *,
        fit_pixels: int = DEFAULT_FIT_PIXELS,
        budget_bytes: int = DECODED_BUDGET_BYTES,
    ) -> None:
        self.projector = projector
        self._name = name
        self.fit_pixels = fit_pixels
        self.budget_bytes = budget_bytes
        self._decoder: MediaDecoder | None = None
        self._lock = threading.Lock()
        caps: set[str] = set()
        if projector is not None and projector.mrope:
            log.warning(
                "%s: its projector uses M-RoPE positions, which localrun's llama.cpp scheduler does not place "
                "yet; images are refused",
                name,
            )
        elif projector is not None:
            caps |= {VISION} if projector.vision else set()
            caps |= {AUDIO} if projector.audio else set()
        self.capabilities = frozenset(caps)

    @property
    def usable(self) -> Projector | None:
        """The projector the scheduler encodes with, or None."""
        return self.projector if self.capabilities else None

    def check(self, media: Sequence[Media]) -> None:
        """Refuse media this model cannot take, before anything is decoded."""
        if not media:
            return
        if self.projector is None:
            raise UnsupportedFeature(
                f"{self._name} has no multimodal projector, so it cannot take images or audio",
                param="media",
                hint=f"pair one with 'localrun import MODEL.gguf --mmproj FILE' (or pull a repo that has an mmproj "
                f"file), or send {self._name} text only",
            )
        if not self.capabilities:
            raise UnsupportedFeature(
                f"{self._name}'s projector places media with M-RoPE positions, which localrun's llama.cpp "
                "runtime does not support yet",
                param="media",
                hint="use the Ollama runtime for this model, or a model such as Gemma 3",
            )
        for item in media:
            if item.kind == "audio" and AUDIO not in self.capabilities:
                raise InvalidMedia(
                    f"{self._name}'s projector takes images, not audio", hint="send an image, or use an audio model"
                )
            if item.kind == "image" and VISION not in self.capabilities:
                raise InvalidMedia(
                    f"{self._name}'s projector takes audio, not images", hint="send audio, or use a vision model"
                )
            if item.kind not in ("image", "audio"):
                raise InvalidMedia(f"unknown media kind {item.kind!r}", hint="send an image or an audio clip")

    def prompt(self, text: str, media: Sequence[Media], *, add_special: bool, max_chunk: int) -> MediaPrompt:
        """Decode ``media`` and tokenize them with ``text`` (one marker per item, in order).

        ``max_chunk``: the most tokens one non-causal chunk may have (the context's ubatch)."""
        self.check(media)
        found = text.count(MEDIA_MARKER)
        if found != len(media):
            raise InvalidMedia(
                f"the prompt places {found} media items but {len(media)} were sent",
                hint="the chat template dropped or repeated a message that carries an image",
            )
        projector = cast("Projector", self.projector)  # check() refused media without one
        pieces = text.split(MEDIA_MARKER)
        prompt, seen = projector.new_prompt(), dict[str, int]()
        decoded = 0
        try:
            # One item at a time: decoded, made a bitmap, tokenized with the text before its marker, and
            # its pixels freed before the next is decoded (mtmd's chunk keeps its own preprocessed copy).
            for k, item in enumerate(media):
                bitmap, size = self._bitmap(projector, item, decoded, k, len(media))
                decoded += size
                before = len(prompt.spans)
                projector.tokenize_into(prompt, pieces[k] + MEDIA_MARKER, [bitmap], add_special=False, seen=seen)
                _fits_a_batch(prompt.spans[before:], max_chunk)  # refused before the next item is decoded
            projector.tokenize_into(prompt, pieces[-1], [], add_special=False, seen=seen)
            if add_special:
                projector.add_specials(prompt)
        except BaseException:
            prompt.close()
            raise
        return prompt

    def _bitmap(self, projector: Projector, item: Media, spent: int, k: int, n: int) -> tuple[object, int]:
        """Item ``k`` of ``n`` decoded (in the child) into a bitmap, and its decoded bytes (within the budget)."""
        decoder = self._decoder_now()
        if item.kind == "image":
            img = decoder.image(item.data, self.fit_pixels)
            size = self._spend(spent, len(img.rgb), k, n)
            return projector.image_bitmap(img.nx, img.ny, img.rgb, img.digest), size
        clip = decoder.audio(item.data, projector.sample_rate)
        size = self._spend(spent, len(clip.samples), k, n)
        return projector.audio_bitmap(clip.samples, clip.digest), size

    def _spend(self, spent: int, size: int, k: int, n: int) -> int:
        """``size`` more decoded bytes for this request, or the 400 naming the budget."""
        if spent + size > self.budget_bytes:
            raise InvalidMedia(
                f"the request's media decode to more than {self.budget_bytes:,} bytes by item {k + 1} of {n} "
                f"({spent + size:,} bytes of pixels and samples), the budget of one request",
                hint="send fewer or smaller images, or shorter audio clips, in one request",
            )
        return size

    def _decoder_now(self) -> MediaDecoder:
        with self._lock:
            if self._decoder is None:
                from localrun.runtimes.llamacpp.media.decoder import MediaDecoder

                self._decoder = MediaDecoder()
            return self._decoder

    def close(self) -> None:
        """Stop the decoder process and free the projector (after the scheduler stopped)."""
        with self._lock:
            decoder, self._decoder = self._decoder, None
        if decoder is not None:
            decoder.close()
        if self.projector is not None:
            self.projector.close()


def _fits_a_batch(spans: Sequence[MediaSpan], max_chunk: int) -> None:
    big = next((s for s in spans if s.non_causal and s.n_tokens > max_chunk), None)
    if big is not None:
        raise InvalidMedia(
            f"this {big.kind} takes {big.n_tokens} tokens, more than the {max_chunk} one batch of this model's "
            "context holds (it must be decoded in one)",
            hint="send a smaller image, or load the model with a larger step_tokens",
        )


def completion_text(prompt: str, media: Sequence[Media]) -> str:
    """A completion prompt with one marker per item: those the client placed, else appended."""
    if media and MEDIA_MARKER not in prompt:
        return prompt + "".join(MEDIA_MARKER for _ in media)
    return prompt
