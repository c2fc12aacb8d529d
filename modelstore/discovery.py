"""Models other tools already downloaded, found in place and never copied or touched.

Three stores (facts in shared/reference/ecosystem.md §1.2, §3.1–3.2, §4):

* the Hugging Face cache — via ``huggingface_hub.scan_cache_dir`` (llama.cpp ``-hf``
  downloads live there too);
* Ollama — ``$OLLAMA_MODELS`` or ``~/.ollama/models``: JSON manifests under
  ``manifests/<host>/<namespace>/<model>/<tag>``; a model whose weights are exactly one
  ``application/vnd.ollama.image.model`` layer is a plain GGUF at ``blobs/sha256-<hex>``;
* LM Studio — ``~/.lmstudio-home-pointer`` → home (else ``~/.cache/lm-studio``, else
  ``~/.lmstudio``); its ``settings.json`` ``downloadsFolder`` or ``<home>/models``; files at
  ``<models>/<publisher>/<repo>/*.gguf``.

A projector goes with its model everywhere (:mod:`.projector`): an ``mmproj*.gguf`` beside
the model in an HF snapshot or an LM Studio folder (llama.cpp's ``-hf`` pairing rules), the
``application/vnd.ollama.image.projector`` layer of an Ollama manifest. A projector is
never a model of its own: names with "mmproj" are no candidates, and a file whose header
says ``general.architecture == "clip"`` is skipped whatever it is called.

Each scanner returns :class:`ModelRecord` candidates with ``owned=False`` (localrun must
never delete them) and skips, with a log line, anything malformed: another tool's store is
input like any other. Manifest digests are validated strictly (Probllama was a digest
turned into a path), and a blob must be a regular file inside the blobs folder.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import stat
from pathlib import Path

from localrun.errors import InvalidModelFile, InvalidName, ModelNotFound
from localrun.modelstore.names import validate_model_name
from localrun.modelstore.projector import CLIP_ARCH, find_projector_sibling, pair_found
from localrun.modelstore.refs import HubRef, gguf_candidates, model_name_for, select_files
from localrun.types import META_PROJECTOR, FileEntry, Format, ModelRecord, Source

logger = logging.getLogger(__name__)

OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR_MEDIA = "application/vnd.ollama.image.projector"
_DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})$")
_MAX_JSON = 1024 * 1024


def _gguf_meta(path: Path, read_metadata: bool) -> dict | None:
    """GGUF header as a dict; None (and a log line) if the file is not a valid GGUF or is a
    projector under another name (a projector never runs alone)."""
    if not read_metadata:
        return {}
    from localrun.modelstore.gguf_meta import read_gguf_metadata

    try:
        meta = read_gguf_metadata(path).as_dict()
    except InvalidModelFile as exc:
        logger.warning("skipping %s: %s", path, exc)
        return None
    if meta.get("architecture") == CLIP_ARCH:
        logger.info("skipping %s: a multimodal projector, not a model", path)
        return None
    return meta


def _with_sibling(record: ModelRecord, listing, primary: str, locate, read_metadata: bool, where: str) -> ModelRecord:
    """Pair the projector llama.cpp's rules pick from ``listing`` (names relative to the repo
    folder, ``primary`` among them); ``locate(name)`` → (its path on disk, its sha256 or None)."""
    found = find_projector_sibling(listing, primary) if record.format is Format.GGUF else None
    if found is None:
        return record
    path, sha256 = locate(found)
    return _attach(record, path, sha256, read_metadata, where)


def _attach(record: ModelRecord, path: Path, sha256: str | None, read_metadata: bool, where: str) -> ModelRecord:
    if read_metadata:
        return pair_found(record, path, sha256=sha256, where=where)
    # a quick scan (no headers read): the pair is recorded unchecked, as the model itself is
    meta = dict(record.metadata, **{META_PROJECTOR: str(path)})
    entry = FileEntry(str(path), path.stat().st_size, sha256)
    return dataclasses.replace(record, files=record.files + (entry,), metadata=meta)


def _small_json(path: Path) -> object | None:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_JSON:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


# --- Hugging Face cache ------------------------------------------------------------------


def discover_hf_cache(
    cache_dir: str | os.PathLike[str] | None = None, *, read_metadata: bool = True
) -> list[ModelRecord]:
    """One record per GGUF model file (split sets count once) and per MLX/MLC snapshot."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    from localrun.modelstore.hub import hub_cache_dir

    root = Path(cache_dir) if cache_dir else hub_cache_dir()
    try:
        info = scan_cache_dir(root)
    except CacheNotFound:
        return []
    for warning in info.warnings:
        logger.info("HF cache: %s", warning)
    found: dict[str, tuple[bool, float, ModelRecord]] = {}
    for repo in info.repos:
        if repo.repo_type != "model" or "/" not in repo.repo_id:
            continue
        for rev in repo.revisions:
            files = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}
            for record in _hf_records(repo.repo_id, rev, files, read_metadata):
                rank = ("main" in rev.refs, rev.last_modified)
                if record.name not in found or rank > found[record.name][:2]:
                    found[record.name] = (*rank, record)
    return [entry[2] for entry in found.values()]


def _hf_records(repo_id: str, rev, files: dict, read_metadata: bool) -> list[ModelRecord]:
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
        meta = _gguf_meta(path, read_metadata) if sel.format is Format.GGUF else {}
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
        out.append(_with_sibling(record, files, sel.primary, lambda n: _hf_file(files[n]), read_metadata, where))
    return out


def _hf_file(f) -> tuple[Path, str | None]:
    blob = f.blob_path.name
    return Path(f.file_path), blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None


# --- Ollama -------------------------------------------------------------------------------


def ollama_models_dir() -> Path:
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".ollama" / "models"


def ollama_model_name(host: str, namespace: str, model: str, tag: str) -> str:
    """registry.ollama.ai/library/llama3.2/latest → llama3.2:latest; others keep namespace/model:tag."""
    if host == "registry.ollama.ai" and namespace == "library":
        return validate_model_name(f"{model}:{tag}")
    return validate_model_name(f"{namespace}/{model}:{tag}")


def _ollama_layer(layer: object, root: Path, where: str) -> tuple[Path, str, int]:
    """(blob path, sha256 hex, size) for a manifest layer, or InvalidName if anything is off."""
    if not isinstance(layer, dict):
        raise InvalidName(f"{where}: a layer is not an object")
    m = _DIGEST_RE.match(layer.get("digest", "")) if isinstance(layer.get("digest"), str) else None
    size = layer.get("size")
    if m is None:
        raise InvalidName(f"{where}: invalid digest {str(layer.get('digest'))[:80]!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidName(f"{where}: invalid size {size!r}")
    blob = root / "blobs" / f"sha256-{m[1]}"
    try:
        st = os.lstat(blob)
    except OSError:
        raise InvalidName(f"{where}: blob {blob.name} is missing") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidName(f"{where}: blob {blob.name} is not a regular file")
    if st.st_size != size:
        raise InvalidName(f"{where}: blob {blob.name} is {st.st_size} bytes, manifest says {size}")
    return blob, m[1], size


def _ollama_record(manifest: Path, parts: tuple[str, str, str, str], root: Path, read_metadata: bool) -> ModelRecord:
    where = f"Ollama manifest {'/'.join(parts)}"
    data = _small_json(manifest)
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        raise InvalidName(f"{where}: not a manifest")
    layers = data["layers"]
    models = [layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_MEDIA]
    if len(models) != 1:
        raise InvalidName(f"{where}: {len(models)} model layers (only single-GGUF models are used in place)")
    blob, digest, size = _ollama_layer(models[0], root, where)
    meta = _gguf_meta(blob, read_metadata)
    if meta is None:
        raise InvalidName(f"{where}: the model blob is not a valid GGUF")
    config = data.get("config")
    if isinstance(config, dict):
        try:
            cfg_blob = _ollama_layer(config, root, where)[0]
            cfg = _small_json(cfg_blob)
            if isinstance(cfg, dict):
                meta["quant"] = cfg.get("file_type") if isinstance(cfg.get("file_type"), str) else meta.get("quant")
                meta["family"] = cfg.get("model_family") if isinstance(cfg.get("model_family"), str) else None
        except InvalidName as exc:
            logger.info("%s", exc)
    projectors = [
        layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_PROJECTOR_MEDIA
    ]
    host, namespace, model, tag = parts
    meta["ollama"] = {
        "name": f"{host}/{namespace}/{model}:{tag}",
        "manifest": str(manifest),
        "digest": f"sha256:{digest}",
    }
    record = ModelRecord(
        name=ollama_model_name(*parts),
        format=Format.GGUF,
        path=str(blob),
        files=(FileEntry(str(blob), size, digest),),
        source=Source.OLLAMA,
        owned=False,
        metadata=meta,
        added_at=manifest.stat().st_mtime,
    )
    if len(projectors) == 1:  # Ollama's vision models: one projector layer beside the weights
        try:
            proj, proj_digest, _ = _ollama_layer(projectors[0], root, where)
        except InvalidName as exc:
            logger.info("%s (the model is listed without it)", exc)
            return record
        record = _attach(record, proj, proj_digest, read_metadata, where)
    return record


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(e for e in path.iterdir() if e.is_dir() and not e.is_symlink())
    except OSError:
        return []


def discover_ollama(
    models_dir: str | os.PathLike[str] | None = None, *, read_metadata: bool = True
) -> list[ModelRecord]:
    root = Path(models_dir) if models_dir else ollama_models_dir()
    out = []
    for host in _subdirs(root / "manifests"):
        for namespace in _subdirs(host):
            for model in _subdirs(namespace):
                try:
                    tags = sorted(model.iterdir())
                except OSError:
                    continue
                for tag in tags:
                    if tag.is_symlink() or not tag.is_file():
                        continue
                    try:
                        out.append(
                            _ollama_record(tag, (host.name, namespace.name, model.name, tag.name), root, read_metadata)
                        )
                    except InvalidName as exc:
                        logger.info("Ollama: skipping %s: %s", tag, exc)
    return out


# --- LM Studio ----------------------------------------------------------------------------


def lmstudio_models_dir(home: str | os.PathLike[str] | None = None) -> Path:
    if home is None:
        user = Path.home()
        pointer = user / ".lmstudio-home-pointer"
        try:
            home = Path(pointer.read_text().strip()).expanduser() if pointer.is_file() else None
        except OSError:
            home = None
        if home is None:
            legacy = user / ".cache" / "lm-studio"
            home = legacy if legacy.is_dir() else user / ".lmstudio"
    home = Path(home)
    settings = _small_json(home / "settings.json")
    folder = settings.get("downloadsFolder") if isinstance(settings, dict) else None
    return Path(folder).expanduser() if isinstance(folder, str) and folder.strip() else home / "models"


def discover_lmstudio(home: str | os.PathLike[str] | None = None, *, read_metadata: bool = True) -> list[ModelRecord]:
    """``<models>/<publisher>/<repo>/`` folders; symlinks are ignored, as LM Studio does."""
    models = lmstudio_models_dir(home)
    out = []
    for publisher in _subdirs(models):
        for repo in _subdirs(publisher):
            try:
                names = sorted(e.name for e in repo.iterdir() if e.is_file() and not e.is_symlink())
            except OSError:
                continue
            repo_id = f"{publisher.name}/{repo.name}"
            refs = [HubRef(repo_id, file=p) for p in gguf_candidates(names)] or [HubRef(repo_id)]
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
                meta = _gguf_meta(path, read_metadata) if sel.format is Format.GGUF else {}
                if meta is None:
                    continue
                meta["quant"] = sel.quant or meta.get("quant")
                meta["lmstudio"] = {"publisher": publisher.name, "repo": repo.name}
                files = tuple(FileEntry(str(repo / p), (repo / p).stat().st_size, None) for p in sel.files)
                record = ModelRecord(
                    name=name,
                    format=sel.format,
                    path=str(path),
                    files=files,
                    source=Source.LMSTUDIO,
                    owned=False,
                    metadata=meta,
                    added_at=path.stat().st_mtime,
                )
                locate = lambda n, r=repo: (r / n, None)  # noqa: E731
                out.append(_with_sibling(record, names, sel.primary, locate, read_metadata, str(repo)))
    return out


def discover_all(settings=None, *, read_metadata: bool = True) -> list[ModelRecord]:
    """Every candidate from the three stores, in that order (HF cache, Ollama, LM Studio).

    ``settings`` is accepted like every store entry point takes it; the three locations
    come from the environment each tool itself reads (HF_HUB_CACHE/HF_HOME, OLLAMA_MODELS,
    LM Studio's home pointer), so localrun finds exactly what those tools use.
    """
    return (
        discover_hf_cache(read_metadata=read_metadata)
        + discover_ollama(read_metadata=read_metadata)
        + discover_lmstudio(read_metadata=read_metadata)
    )
