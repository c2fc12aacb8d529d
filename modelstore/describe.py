"""What a model file or folder is: the one door every way in goes through.

`localrun import`, `pull` and `bundle import` all describe what they register here, so a
model reads the same whichever way it came: a GGUF's header walked with bounds checks on
every shard (the split set proven to be one model, adapters and projectors refused), an
MLX folder's config.json read into the 14 facts the planner needs, an MLC folder's
mlc-chat-config.json. :func:`describe_path` says what a path holds (a record, not stored);
:func:`as_download` makes of what it said the record of files localrun itself wrote
(pull, bundle import).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from localrun.errors import InvalidModelFile, ModelNotFound
from localrun.jsonfile import NotAJsonObject, read_json_object
from localrun.types import FileEntry, Format, ModelRecord, Source

from .gguf_meta import GGUFInfo, read_gguf_metadata
from .mlx_folder import inspect_mlx_folder
from .names import model_name_from_filename, shard_name, split_shard_name, validate_model_name

logger = logging.getLogger(__name__)

MLC_CONFIG = "mlc-chat-config.json"
_MAX_CONFIG_BYTES = 4 << 20


def describe_path(
    path: str | Path, *, name: str | None = None, fmt: Format | None = None, trust_remote_code: bool = False
) -> ModelRecord:
    """Validate what is at ``path`` and describe it as an imported record, without registering it.

    ``fmt``: what the caller knows the path holds (a pull, a bundle); unset, a folder is
    MLX and a file GGUF, as `localrun import` takes them. ``trust_remote_code``: an MLX
    folder may carry code (a pull the user allowed to fetch it).

    Raises:
        ModelNotFound: nothing at ``path``.
        InvalidModelFile: the file, a shard or the folder fails validation.
        InvalidName: ``name`` is not a valid model name.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelNotFound(f"{p}: no such file or folder", hint="check the path")
    # Absolute but symlinks kept: an HF snapshot link is named model-00001-of-00002.gguf,
    # its blob only by a hash, and the name is what finds shards and names the model.
    p = Path(os.path.abspath(p))
    if fmt is Format.MLC:
        return _describe_mlc(p, name)
    if p.is_dir():
        entries, meta = inspect_mlx_folder(p, trust_remote_code=trust_remote_code)
        return _imported(name, p, Format.MLX, entries, meta)
    return _describe_gguf(p, name)


def as_download(
    described: ModelRecord,
    *,
    path: Path,
    files: Iterable[FileEntry],
    source: Source,
    repo: str,
    revision: str,
    quant: str | None,
    hub: Mapping[str, Any],
) -> ModelRecord:
    """What :func:`describe_path` said of a model, as the record of files localrun itself wrote
    into the HF cache (pull, bundle import): owned, at ``path``, from ``repo`` at ``revision``.

    ``files`` are the entries the caller verified (each with its sha256 and mtime, so the
    metadata's per-file ``mtimes`` are dropped); ``quant`` is the one the ref or the lock
    chose, if any; ``hub`` says where the files came from."""
    meta = dict(described.metadata)
    meta.pop("mtimes", None)
    meta["quant"] = quant or meta.get("quant")
    meta["hub"] = dict(hub)
    return dataclasses.replace(
        described,
        path=str(path),
        files=tuple(files),
        source=source,
        owned=True,
        repo=repo,
        revision=revision,
        metadata=meta,
        added_at=time.time(),
    )


def _imported(
    name: str | None, path: Path, fmt: Format, files: tuple[FileEntry, ...], meta: dict[str, Any]
) -> ModelRecord:
    return ModelRecord(
        name=validate_model_name(name) if name else model_name_from_filename(path.name),
        format=fmt,
        path=str(path),
        files=files,
        source=Source.IMPORTED,
        owned=False,
        metadata=meta,
        added_at=time.time(),
    )


# --- GGUF -----------------------------------------------------------------------------------


def _shard_files(path: Path) -> tuple[list[Path], bool]:
    """Every shard of the split set ``path`` belongs to (by name), or ``path`` alone."""
    split = split_shard_name(path.name)
    if not split:
        return [path], False
    prefix, no, count = split
    files = [path.with_name(shard_name(prefix, k, count)) for k in range(1, count + 1)]
    if no != 1:
        logger.info("%s is shard %d of %d; using the first shard", path.name, no, count)
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise InvalidModelFile(
            f"{path}: split model is missing {len(missing)} of {count} shards ({', '.join(missing[:3])})",
            hint="download every shard into the same folder",
        )
    return files, True


def _check_shards(files: list[Path], infos: list[GGUFInfo], split: bool) -> None:
    """Each shard's header agrees with its name, and the set holds the tensors the first says."""
    expected_count = len(files) if split else 1
    for k, (f, info) in enumerate(zip(files, infos)):
        if (info.split_count or 1) != expected_count or (info.split_no is not None and info.split_no != k):
            said = f"part {(info.split_no or 0) + 1} of {info.split_count}" if info.split_count else "an unsplit file"
            named = f"part {k + 1} of {expected_count}" if split else "an unsplit file"
            raise InvalidModelFile(
                f"{f}: its metadata says {said}, its name says {named}",
                hint="keep split files under their original -0000k-of-0000N.gguf names",
            )
    first, total_tensors = infos[0], sum(i.tensor_count for i in infos)
    _refuse_non_model(files[0], first.scalars.get("general.type"), first.architecture, total_tensors)
    if split and first.split_tensors_count is not None and first.split_tensors_count != total_tensors:
        raise InvalidModelFile(
            f"{files[0]}: the shards hold {total_tensors} tensors, the first shard says {first.split_tensors_count}",
            hint="a shard is from another model or another version; download them together",
        )


def _describe_gguf(path: Path, name: str | None) -> ModelRecord:
    files, split = _shard_files(path)
    infos = [read_gguf_metadata(f) for f in files]
    _check_shards(files, infos, split)
    meta = infos[0].as_dict()
    meta.update(
        n_params=sum(i.n_params for i in infos),
        size_bytes=sum(i.size_bytes for i in infos),
        tensor_count=sum(i.tensor_count for i in infos),
        shards=len(files),
        mtimes=[f.stat().st_mtime_ns for f in files],
    )
    entries = tuple(FileEntry(path=str(f), size=i.size_bytes) for f, i in zip(files, infos))
    return _imported(name, files[0], Format.GGUF, entries, meta)


def _refuse_non_model(path: Path, gguf_type: Any, arch: str | None, n_tensors: int) -> None:
    """GGUF also carries adapters, projectors and vocabularies; none of them runs alone."""
    if gguf_type in ("adapter", "mmproj") or arch == "clip":
        kind = "a LoRA adapter" if gguf_type == "adapter" else "a multimodal projector (mmproj)"
        raise InvalidModelFile(f"{path}: this is {kind}, not a model", hint="import the base model's .gguf instead")
    if n_tensors == 0:
        raise InvalidModelFile(f"{path}: has no tensors (a vocabulary-only file?)", hint="import a full model file")


# --- MLC ------------------------------------------------------------------------------------


def _describe_mlc(folder: Path, name: str | None) -> ModelRecord:
    """An MLC folder: its config says the architecture, quantisation and context window
    (the weights are MLC's own shards, checked by the runtime when it loads them)."""
    try:
        config = read_json_object(folder / MLC_CONFIG, max_bytes=_MAX_CONFIG_BYTES)
    except NotAJsonObject as exc:
        raise InvalidModelFile(str(exc), hint="the repo is broken; try another") from None
    meta: dict[str, Any] = {
        "architecture": config.get("model_type"),
        "quant": config.get("quantization"),
        "context_length": config.get("context_window_size"),
    }
    entries = tuple(FileEntry(path=str(p), size=p.stat().st_size) for p in sorted(folder.iterdir()) if p.is_file())
    return _imported(name, folder, Format.MLC, entries, meta)
