"""Ollama's model store as a source: ``$OLLAMA_MODELS`` or ``~/.ollama/models``.

JSON manifests live under ``manifests/<host>/<namespace>/<model>/<tag>``; a model whose
weights are exactly one ``application/vnd.ollama.image.model`` layer is a plain GGUF at
``blobs/sha256-<hex>``, and an ``application/vnd.ollama.image.projector`` layer is its
projector. Manifest digests are validated strictly (Probllama was a digest turned into a
path), and a blob must be a regular file inside the blobs folder, of the manifest's size.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path
from typing import Any

from localrun.errors import InvalidName
from localrun.modelstore.names import validate_model_name
from localrun.types import FileEntry, Format, ModelRecord, Source

from .common import StoreSource, attach, gguf_facts, small_json, subdirs

logger = logging.getLogger(__name__)

OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR_MEDIA = "application/vnd.ollama.image.projector"
_DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})$")


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


def _config_facts(data: dict[str, Any], root: Path, where: str, meta: dict[str, Any]) -> None:
    """The quant and family Ollama's config blob records, over what the GGUF header says."""
    config = data.get("config")
    if not isinstance(config, dict):
        return
    try:
        cfg = small_json(_ollama_layer(config, root, where)[0])
    except InvalidName as exc:
        logger.info("%s", exc)
        return
    if cfg is not None:
        meta["quant"] = cfg.get("file_type") if isinstance(cfg.get("file_type"), str) else meta.get("quant")
        meta["family"] = cfg.get("model_family") if isinstance(cfg.get("model_family"), str) else None


def _layers(layers: list[Any], media: str) -> list[dict[str, Any]]:
    return [layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == media]


def _ollama_record(manifest: Path, parts: tuple[str, str, str, str], root: Path, read_metadata: bool) -> ModelRecord:
    where = f"Ollama manifest {'/'.join(parts)}"
    data = small_json(manifest)
    if data is None or not isinstance(data.get("layers"), list):
        raise InvalidName(f"{where}: not a manifest")
    models = _layers(data["layers"], OLLAMA_MODEL_MEDIA)
    if len(models) != 1:
        raise InvalidName(f"{where}: {len(models)} model layers (only single-GGUF models are used in place)")
    blob, digest, size = _ollama_layer(models[0], root, where)
    meta = gguf_facts(blob, read_metadata)
    if meta is None:
        raise InvalidName(f"{where}: the model blob is not a valid GGUF")
    _config_facts(data, root, where, meta)
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
    projectors = _layers(data["layers"], OLLAMA_PROJECTOR_MEDIA)
    if len(projectors) == 1:  # Ollama's vision models: one projector layer beside the weights
        try:
            proj, proj_digest, _ = _ollama_layer(projectors[0], root, where)
        except InvalidName as exc:
            logger.info("%s (the model is listed without it)", exc)
            return record
        record = attach(record, proj, proj_digest, read_metadata, where)
    return record


def _manifests(root: Path) -> list[tuple[Path, tuple[str, str, str, str]]]:
    """Every ``manifests/<host>/<namespace>/<model>/<tag>`` file (no symlinks) with its four parts."""
    out = []
    for host in subdirs(root / "manifests"):
        for namespace in subdirs(host):
            for model in subdirs(namespace):
                try:
                    tags = sorted(model.iterdir())
                except OSError:
                    continue
                out += [
                    (tag, (host.name, namespace.name, model.name, tag.name))
                    for tag in tags
                    if not tag.is_symlink() and tag.is_file()
                ]
    return out


def discover_ollama(
    models_dir: str | os.PathLike[str] | None = None, *, read_metadata: bool = True
) -> list[ModelRecord]:
    """One record per manifest whose model is a single GGUF blob; anything else is skipped, said in the log."""
    root = Path(models_dir) if models_dir else ollama_models_dir()
    out = []
    for manifest, parts in _manifests(root):
        try:
            out.append(_ollama_record(manifest, parts, root, read_metadata))
        except InvalidName as exc:
            logger.info("Ollama: skipping %s: %s", manifest, exc)
    return out


SOURCE = StoreSource(Source.OLLAMA, discover_ollama)
