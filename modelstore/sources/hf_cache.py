"""The Hugging Face cache as a store source: what huggingface_hub and llama.cpp ``-hf`` downloaded.

Read with ``huggingface_hub.scan_cache_dir`` in :func:`~localrun.modelstore.hub.hub_cache_dirs`
(localrun's HF cache, then huggingface_hub's shared one when LOCALRUN_HOME moved localrun's).
One record per GGUF model file (split sets count once) and per MLX/MLC snapshot; a repo that
ships code is skipped; an ``mmproj*.gguf`` beside a GGUF model is paired by llama.cpp's ``-hf`` rules.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from localrun.errors import InvalidName, ModelNotFound
from localrun.modelstore.refs import HubRef, gguf_candidates, model_name_for, select_files
from localrun.types import FileEntry, Format, ModelRecord, Source

from .common import StoreSource, gguf_facts, with_sibling

if TYPE_CHECKING:
    from huggingface_hub import CachedFileInfo, CachedRevisionInfo

logger = logging.getLogger(__name__)


def discover_hf_cache(
    cache_dir: str | os.PathLike[str] | None = None, *, read_metadata: bool = True
) -> list[ModelRecord]:
    """Every model in the HF caches (:func:`~localrun.modelstore.hub.hub_cache_dirs`, or ``cache_dir``);
    a name found in several revisions is the ``main`` one, else the newest."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    from localrun.modelstore.hub import hub_cache_dirs

    found: dict[str, tuple[bool, float, ModelRecord]] = {}
    for root in [Path(cache_dir)] if cache_dir else hub_cache_dirs():
        try:
            info = scan_cache_dir(root)
        except CacheNotFound:
            continue
        for warning in info.warnings:
            logger.info("HF cache: %s", warning)
        in_root: dict[str, tuple[bool, float, ModelRecord]] = {}
        for repo in info.repos:
            if repo.repo_type != "model" or "/" not in repo.repo_id:
                continue
            for rev in repo.revisions:
                files = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}
                for record in _hf_records(repo.repo_id, rev, files, read_metadata):
                    rank = ("main" in rev.refs, rev.last_modified)
                    if record.name not in in_root or rank > in_root[record.name][:2]:
                        in_root[record.name] = (*rank, record)
        for name, entry in in_root.items():  # localrun's own cache first, then the shared one
            found.setdefault(name, entry)
    return [entry[2] for entry in found.values()]


def _hf_records(
    repo_id: str, rev: CachedRevisionInfo, files: dict[str, CachedFileInfo], read_metadata: bool
) -> list[ModelRecord]:
    refs = [HubRef(repo_id, file=p) for p in gguf_candidates(files)] or [HubRef(repo_id)]
    out = []
    for ref in refs:
        try:
            sel = select_files(ref, files)
        except (ModelNotFound, InvalidName) as exc:
            logger.info("HF cache: skipping %s: %s", ref, exc)
            continue
        if sel.code_files or sel.native_files:
            logger.info(
                "HF cache: skipping %s: it ships code (%s)", repo_id, ", ".join(sel.code_files + sel.native_files)
            )
            continue
        entries = [FileEntry(str(files[p].file_path), files[p].size_on_disk, _hf_file(files[p])[1]) for p in sel.files]
        path = files[sel.primary].file_path if sel.primary else rev.snapshot_path
        meta = gguf_facts(path, read_metadata) if sel.format is Format.GGUF else {}
        if meta is None:
            continue
        meta["quant"] = sel.quant or meta.get("quant")
        record = ModelRecord(
            name=model_name_for(repo_id, sel),
            format=sel.format,
            path=str(path),
            files=tuple(entries),
            source=Source.HF_CACHE,
            owned=False,
            repo=repo_id,
            revision=rev.commit_hash,
            metadata=meta,
            added_at=rev.last_modified,
        )
        where = f"HF cache {repo_id}"
        out.append(with_sibling(record, files, sel.primary, lambda n: _hf_file(files[n]), read_metadata, where))
    return out


def _hf_file(f: CachedFileInfo) -> tuple[Path, str | None]:
    blob = f.blob_path.name
    return Path(f.file_path), blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None


SOURCE = StoreSource(Source.HF_CACHE, discover_hf_cache)
