"""LM Studio's models folder as a source.

``~/.lmstudio-home-pointer`` names LM Studio's home (else ``~/.cache/lm-studio``, else
``~/.lmstudio``); its ``settings.json`` ``downloadsFolder``, else ``<home>/models``, holds
``<publisher>/<repo>/*.gguf`` (or an MLX folder). Symlinks are ignored, as LM Studio does;
an ``mmproj*.gguf`` beside a model is paired by llama.cpp's ``-hf`` rules.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from localrun.errors import InvalidName, ModelNotFound
from localrun.modelstore.refs import HubRef, gguf_candidates, model_name_for, select_files
from localrun.types import FileEntry, Format, ModelRecord, Source

from .common import StoreSource, gguf_facts, small_json, subdirs, with_sibling

logger = logging.getLogger(__name__)


def _lmstudio_home() -> Path:
    user = Path.home()
    pointer = user / ".lmstudio-home-pointer"
    try:
        home = Path(pointer.read_text().strip()).expanduser() if pointer.is_file() else None
    except OSError:
        home = None
    if home is None:
        legacy = user / ".cache" / "lm-studio"
        home = legacy if legacy.is_dir() else user / ".lmstudio"
    return home


def lmstudio_models_dir(home: str | os.PathLike[str] | None = None) -> Path:
    where = Path(home) if home is not None else _lmstudio_home()
    settings = small_json(where / "settings.json")
    folder = settings.get("downloadsFolder") if settings is not None else None
    return Path(folder).expanduser() if isinstance(folder, str) and folder.strip() else where / "models"


def _repo_records(repo: Path, publisher: str, read_metadata: bool) -> list[ModelRecord]:
    """The models in one ``<publisher>/<repo>`` folder: each GGUF quant, or the MLX folder itself."""
    try:
        names = sorted(e.name for e in repo.iterdir() if e.is_file() and not e.is_symlink())
    except OSError:
        return []
    repo_id = f"{publisher}/{repo.name}"
    refs = [HubRef(repo_id, file=p) for p in gguf_candidates(names)] or [HubRef(repo_id)]
    out = []
    for ref in refs:
        try:
            sel = select_files(ref, names)
            name = model_name_for(repo_id, sel)
        except (ModelNotFound, InvalidName) as exc:
            logger.info("LM Studio: skipping %s: %s", repo, exc)
            continue
        if sel.code_files or sel.native_files:
            continue
        path = repo / sel.primary if sel.primary else repo
        meta = gguf_facts(path, read_metadata) if sel.format is Format.GGUF else {}
        if meta is None:
            continue
        meta["quant"] = sel.quant or meta.get("quant")
        meta["lmstudio"] = {"publisher": publisher, "repo": repo.name}
        record = ModelRecord(
            name=name,
            format=sel.format,
            path=str(path),
            files=tuple(FileEntry(str(repo / p), (repo / p).stat().st_size, None) for p in sel.files),
            source=Source.LMSTUDIO,
            owned=False,
            metadata=meta,
            added_at=path.stat().st_mtime,
        )
        out.append(with_sibling(record, names, sel.primary, lambda n: (repo / n, None), read_metadata, str(repo)))
    return out


def discover_lmstudio(home: str | os.PathLike[str] | None = None, *, read_metadata: bool = True) -> list[ModelRecord]:
    """``<models>/<publisher>/<repo>/`` folders under LM Studio's models folder."""
    models = lmstudio_models_dir(home)
    return [
        record
        for publisher in subdirs(models)
        for repo in subdirs(publisher)
        for record in _repo_records(repo, publisher.name, read_metadata)
    ]


SOURCE = StoreSource(Source.LMSTUDIO, discover_lmstudio)
