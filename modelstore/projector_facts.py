"""What a model's projector (its ``mmproj*.gguf``) says about itself, read from the header alone.

Whether a paired model sees or hears is :func:`localrun.modelstore.capabilities.media` (one
answer for ``localrun ls``, the TUI, ``/api/show`` and ``/v1/models``, from the facts the store
cached when it paired the file). This module reads the rest of the header for the questions asked
without loading the model: how large are the encoder's weights and how many tokens does an image
cost (``localrun plan``), and every scalar key (``/api/show``'s ``projector_info``).
The answers are in the projector's GGUF keys, as llama.cpp's clip loader (tools/mtmd/clip.cpp)
reads them: ``clip.has_vision_encoder`` / ``clip.has_audio_encoder``, ``clip.projector_type``
(or ``clip.vision.projector_type`` / ``clip.audio.projector_type`` for a mixed projector),
``clip.vision.image_size``, ``clip.vision.patch_size`` and the merge factors.

Headers are cached by (path, size, mtime), so a model list reads each projector once.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from localrun.errors import InvalidModelFile
from localrun.modelstore.gguf_meta import read_gguf_metadata
from localrun.modelstore.projector import projector_path
from localrun.types import ModelRecord

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProjectorFacts:
    """One projector file's header facts (``vision``/``audio``: which encoders it holds)."""

    path: str
    vision: bool
    audio: bool
    projector_type: str | None
    vision_type: str | None
    audio_type: str | None
    weights_bytes: int
    n_params: int
    #: Every scalar key of the header, as Ollama's ``projector_info`` shows them.
    keys: dict[str, Any] = field(default_factory=dict)

    def vision_int(self, suffix: str) -> int | None:
        """``clip.vision.SUFFIX`` when it is a positive integer."""
        value = self.keys.get(f"clip.vision.{suffix}")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def projector_facts(record: ModelRecord) -> ProjectorFacts | None:
    """The record's projector facts; None for a text-only model or an unreadable projector
    (logged: the model still serves text, and ``localrun verify`` names the broken file)."""
    path = projector_path(record)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError as exc:
        logger.warning("projector %s of %s cannot be read: %s", path, record.name, exc)
        return None
    return _read(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _read(path: str, size: int, mtime_ns: int) -> ProjectorFacts | None:
    del size, mtime_ns  # the cache key: a replaced file is read again
    try:
        info = read_gguf_metadata(path)
    except InvalidModelFile as exc:
        logger.warning("projector %s is not a valid GGUF: %s", path, exc.message)
        return None
    keys = {"general.architecture": info.architecture, **info.scalars}
    if info.name:
        keys["general.name"] = info.name
    if info.file_type is not None:
        keys["general.file_type"] = info.file_type
    has_vision, has_audio = keys.get("clip.has_vision_encoder"), keys.get("clip.has_audio_encoder")
    proj = keys.get("clip.projector_type")
    # A projector from before the has_*_encoder keys (llava-era files) is a vision encoder.
    vision = bool(has_vision) if has_vision is not None else has_audio is None
    return ProjectorFacts(
        path=path,
        vision=vision,
        audio=bool(has_audio),
        projector_type=proj if isinstance(proj, str) else None,
        vision_type=_str(keys.get("clip.vision.projector_type")) or (_str(proj) if vision else None),
        audio_type=_str(keys.get("clip.audio.projector_type")) or (_str(proj) if has_audio else None),
        weights_bytes=sum(t.n_bytes for t in info.tensors),
        n_params=info.n_params,
        keys=keys,
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
