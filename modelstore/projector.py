"""A model's multimodal projector (``mmproj*.gguf``): which file it is, what it takes, the pair.

A vision or audio model in GGUF form is two files: the language model and a projector (a
CLIP-style encoder that turns an image or a clip into embeddings the model reads). The
store keeps them as one model: the projector is one of ``ModelRecord.files`` (so it is
hashed, verified, removed, bundled and mirrored with the model) and
``metadata[META_PROJECTOR]`` is its absolute path. ``metadata[PROJECTOR_INFO]`` caches what
its header says (vision, audio, width, size), so ``ls`` does not reopen the file.

Which projector goes with a model follows llama.cpp's ``-hf`` downloader
(``find_best_mmproj`` → ``find_best_sibling`` in common/download.cpp), so ``localrun pull``
and ``llama-server -hf`` pair the same files: see :func:`find_projector_sibling`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from localrun.errors import InvalidModelFile
from localrun.modelstore.names import shard_name, split_shard_name
from localrun.modelstore.refs import best_sibling, quant_bits
from localrun.types import AUDIO, META_PROJECTOR, VISION, FileEntry, ModelRecord

logger = logging.getLogger(__name__)

#: The word that marks a projector file (llama.cpp's keyword for ``find_best_mmproj``).
PROJECTOR_KEYWORD = "mmproj"
#: ``ModelRecord.metadata`` key: what the projector's header says (see :meth:`ProjectorInfo.as_meta`).
PROJECTOR_INFO = "localrun.projector_info"
CLIP_ARCH = "clip"


@dataclass(frozen=True)
class ProjectorInfo:
    """What a projector's GGUF header says, checked: a clip file that takes images and/or audio."""

    path: str
    size_bytes: int
    vision: bool
    audio: bool
    projector_type: str | None = None
    vision_projection_dim: int | None = None
    audio_projection_dim: int | None = None
    n_params: int = 0
    quant: str | None = None

    @property
    def capabilities(self) -> tuple[str, ...]:
        return tuple(c for c, on in ((VISION, self.vision), (AUDIO, self.audio)) if on)

    def as_meta(self, *, owned: bool) -> dict[str, Any]:
        """The record's cached copy. ``owned`` False: a file paired by hand that `rm` must leave."""
        d = dataclasses.asdict(self)
        d.pop("path")
        d["owned"] = owned
        return d


def is_projector_name(path: str) -> bool:
    return PROJECTOR_KEYWORD in PurePosixPath(path).name.lower()


def _shards_of(path: str) -> set[str]:
    p = PurePosixPath(path)
    split = split_shard_name(p.name)
    if not split:
        return {path}
    prefix, _, count = split
    return {str(p.with_name(shard_name(prefix, k, count))) for k in range(1, count + 1)}


def find_projector_sibling(paths: Iterable[str], primary: str) -> str | None:
    """The projector that goes with the model file ``primary`` among a repo's ``paths``, or None.

    llama.cpp's rules (``find_best_sibling(files, model, "mmproj")``, common/download.cpp):
    a ``.gguf`` whose name holds "mmproj", in the model's folder or a folder above it (never
    a sibling or a child folder); the deepest such folder wins; then the quant whose bit count
    (:func:`~localrun.modelstore.refs.quant_bits`: the number in the name's last ``-``/``.``
    tag) is closest to the model's — a Q4_K_M model takes ``mmproj-Q8_0`` over ``mmproj-F16``,
    an F16 or BF16 model the 16-bit one; ties go to the first name in sorted order.

    Unlike llama.cpp: the word is looked for in the file name only, in any case (the same
    test that keeps a projector from ever being picked as a model), and a split projector's
    non-first parts and the model's own shards are never chosen.
    """
    model_bits = quant_bits(primary)
    own = _shards_of(primary)
    return best_sibling(
        paths,
        primary,
        lambda path: is_projector_name(path) and path not in own,
        lambda path, _stem: (-abs(quant_bits(path) - model_bits),),
    )


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_projector(path: str | os.PathLike[str]) -> ProjectorInfo:
    """Walk a projector's header (bounds-checked like any model file) and prove it is one.

    Raises InvalidModelFile: not a valid GGUF, not ``general.architecture == "clip"``, or a
    clip file with neither a vision nor an audio encoder (llama.cpp's mtmd would refuse it).
    """
    from localrun.modelstore.gguf_meta import read_gguf_metadata

    info = read_gguf_metadata(path)
    if info.architecture != CLIP_ARCH:
        raise InvalidModelFile(
            f"{path}: not a multimodal projector (general.architecture is {info.architecture!r}, not 'clip')",
            hint="pass the mmproj*.gguf file that comes with the model",
        )
    s = info.scalars
    vision, audio = s.get("clip.has_vision_encoder") is True, s.get("clip.has_audio_encoder") is True
    if not (vision or audio):
        raise InvalidModelFile(
            f"{path}: this projector has neither a vision nor an audio encoder",
            hint="it may be an audio-generation or text-only clip file; use the model's mmproj for input",
        )
    ptype = s.get("clip.projector_type") or s.get("clip.vision.projector_type") or s.get("clip.audio.projector_type")
    return ProjectorInfo(
        path=str(path),
        size_bytes=info.size_bytes,
        vision=vision,
        audio=audio,
        projector_type=ptype if isinstance(ptype, str) else None,
        vision_projection_dim=_positive(s.get("clip.vision.projection_dim")) if vision else None,
        audio_projection_dim=_positive(s.get("clip.audio.projection_dim")) if audio else None,
        n_params=info.n_params,
        quant=info.quant,
    )


def check_fits(record: ModelRecord, info: ProjectorInfo) -> None:
    """The projector's output width must be the model's embedding width, when both keys say.

    llama.cpp's converter writes ``clip.{vision,audio}.projection_dim`` as the text model's
    hidden size (conversion/base.py), and mtmd refuses a pair whose widths differ
    (``n_embd_text != n_embd_clip`` in tools/mtmd/mtmd.cpp) — at load time, with the model
    half-loaded. Saying so here names both files while the person is still at the keyboard.
    """
    n_embd = _positive(record.metadata.get("embedding_length"))
    if n_embd is None:
        return
    for what, dim in (("vision", info.vision_projection_dim), ("audio", info.audio_projection_dim)):
        if dim is not None and dim != n_embd:
            raise InvalidModelFile(
                f"{info.path}: its {what} projection is {dim} wide but {record.name} ({record.path}) has "
                f"{n_embd}-wide embeddings: this projector belongs to another model",
                hint="use the mmproj file published with this model (same repo, same model size)",
            )


def pair(
    record: ModelRecord,
    projector: str | os.PathLike[str],
    *,
    owned: bool,
    sha256: str | None = None,
    info: ProjectorInfo | None = None,
) -> ModelRecord:
    """``record`` with ``projector`` as its projector (replacing any earlier one), validated.

    ``owned``: localrun wrote the file (a pull, a bundle import), so `rm` may delete it with
    the model; a file paired by hand or found in another tool's folder is never deleted.
    ``sha256`` is the verified hash when the caller has one (a pull); otherwise the first
    `verify` records it, as for any imported file.
    """
    path = Path(os.path.abspath(Path(projector).expanduser()))
    if not path.is_file():
        raise InvalidModelFile(f"{path}: no such projector file", hint="check the --mmproj path")
    if any(Path(e.path) == path for e in record.files if e.path != record.metadata.get(META_PROJECTOR)):
        raise InvalidModelFile(f"{path} is the model itself, not its projector", hint="pass the mmproj*.gguf file")
    info = info or read_projector(path)
    check_fits(record, info)
    old = record.metadata.get(META_PROJECTOR)
    entry = FileEntry(str(path), info.size_bytes, sha256)
    entry = entry.matched_at(path) if sha256 else entry
    files = tuple(e for e in record.files if e.path != old and Path(e.path) != path) + (entry,)
    meta = dict(record.metadata)
    meta[META_PROJECTOR] = str(path)
    meta[PROJECTOR_INFO] = info.as_meta(owned=owned)
    return dataclasses.replace(record, files=files, metadata=meta)


def projector_path(record: ModelRecord) -> str | None:
    value = record.metadata.get(META_PROJECTOR)
    return value if isinstance(value, str) and value else None


def foreign_projector(record: ModelRecord) -> str | None:
    """The projector's path when localrun must never delete it (paired by hand, another tool's)."""
    info = record.metadata.get(PROJECTOR_INFO)
    path = projector_path(record)
    if path and not (isinstance(info, dict) and info.get("owned") is True and record.owned):
        return path
    return None


def pair_found(
    record: ModelRecord, projector: str | os.PathLike[str], *, sha256: str | None, where: str
) -> ModelRecord:
    """Discovery's pairing: another tool's projector beside its model, never owned; a file that
    is not a projector for this model is logged and left out (the model is still listed)."""
    try:
        return pair(record, projector, owned=False, sha256=sha256)
    except InvalidModelFile as exc:
        logger.info("%s: not pairing %s with %s: %s", where, projector, record.name, exc.message)
        return record
