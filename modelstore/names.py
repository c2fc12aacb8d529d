"""Names that come from people and from the network, validated once where they are parsed.

Two kinds:

* **Model names** — the keys of the index (``gemma3-270m``, ``bartowski/llama-3.2-1b:q4_k_m``).
  Case-insensitive: stored lowercased. Grammar::

      name    = segment [ "/" segment ] [ ":" tag ]        at most 128 characters
      segment = [a-z0-9] [a-z0-9._-]*                      no "..", not ending in "."
      tag     = [a-z0-9] [a-z0-9._-]*

  One optional namespace (``org/name``) because hub repos and Ollama names have one; an
  optional ``:tag`` because people write quants that way. A model name is never used as a
  filesystem path, but it is kept path-safe anyway so nobody is tempted.

* **Relative file names** from a hub listing, a bundle or a manifest. :func:`safe_relpath`
  accepts only plain POSIX relative paths that mean the same thing on Linux, macOS and
  Windows, and :func:`safe_join` resolves one under a root and proves it stays inside
  (symlinks and sibling prefixes such as ``store-evil`` included). Both raise
  :class:`~localrun.errors.InvalidName`; their results cannot hold a bad name.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path, PurePosixPath

from localrun.errors import InvalidName

logger = logging.getLogger(__name__)

MAX_MODEL_NAME = 128
MAX_RELPATH = 1024
MAX_COMPONENT_BYTES = 255
MAX_DEPTH = 32

_SEGMENT = r"[a-z0-9][a-z0-9._-]*"
_MODEL_NAME_RE = re.compile(rf"^{_SEGMENT}(?:/{_SEGMENT})?(?::{_SEGMENT})?$")
_DRIVE_RE = re.compile(r"^[A-Za-z]:")
_WINDOWS_RESERVED = frozenset(
    ["con", "prn", "aux", "nul", "conin$", "conout$"]
    + [f"com{i}" for i in range(10)]
    + [f"lpt{i}" for i in range(10)]
    + ["com\u00b9", "com\u00b2", "com\u00b3", "lpt\u00b9", "lpt\u00b2", "lpt\u00b3"]
)
# Control, format (bidi overrides, zero-width joiners) and lone surrogates.
_BAD_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})


class ModelName(str):
    """A model name that passed :func:`validate_model_name`; always lowercase."""

    __slots__ = ()

    def __new__(cls, value: str) -> ModelName:
        return str.__new__(cls, validate_model_name(value))


def validate_model_name(name: object) -> str:
    """Return ``name`` lowercased and stripped, or raise InvalidName saying what is wrong."""
    if isinstance(name, ModelName):
        return str(name)
    if not isinstance(name, str):
        raise InvalidName(f"a model name must be text, not {type(name).__name__}")
    norm = name.strip().lower()
    shown = repr(name[:80])
    hint = "use letters, digits, '.', '_' and '-', one optional 'org/' prefix and ':tag'; e.g. gemma3-270m"
    if not norm:
        raise InvalidName("empty model name", hint=hint)
    if len(norm) > MAX_MODEL_NAME:
        raise InvalidName(f"model name {shown} is longer than {MAX_MODEL_NAME} characters", hint=hint)
    if not _MODEL_NAME_RE.match(norm):
        raise InvalidName(f"invalid model name {shown}", hint=hint)
    base = norm.split(":", 1)[0]
    for seg in base.split("/"):
        if ".." in seg or seg.endswith("."):
            raise InvalidName(f"invalid model name {shown}: a part contains '..' or ends with '.'", hint=hint)
    return norm


def model_name_from_filename(filename: str) -> str:
    """Derive a valid default model name from a file or folder name.

    ``Gemma-3-270M-Q4_K_M.gguf`` -> ``gemma-3-270m-q4_k_m``; split suffixes
    (``-00001-of-00003``) are dropped; anything outside the name alphabet becomes ``-``.
    """
    stem = filename
    for suffix in (".gguf", ".GGUF"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", stem)
    norm = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode().lower()
    norm = re.sub(r"[^a-z0-9._-]+", "-", norm)
    norm = re.sub(r"\.{2,}", ".", norm)
    norm = re.sub(r"-{2,}", "-", norm)
    norm = norm.lstrip("._-")[:MAX_MODEL_NAME].rstrip(".-_")
    if not norm:
        norm = "model"
    return validate_model_name(norm)


def _check_component(comp: str, shown: str) -> None:
    if comp in ("", ".", ".."):
        what = "an empty part ('//' or a trailing '/')" if comp == "" else f"a {comp!r} part"
        raise InvalidName(f"unsafe file name {shown}: {what}")
    if len(comp.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
        raise InvalidName(f"unsafe file name {shown}: a part is longer than {MAX_COMPONENT_BYTES} bytes")
    if comp.endswith((".", " ")):
        # Windows strips these, so ".. " and "x." would name something else there.
        raise InvalidName(f"unsafe file name {shown}: a part ends with '.' or a space")
    if comp.startswith("~"):
        raise InvalidName(f"unsafe file name {shown}: a part starts with '~' (home-directory expansion)")
    if comp.split(".", 1)[0].strip().lower() in _WINDOWS_RESERVED:
        raise InvalidName(f"unsafe file name {shown}: {comp!r} is a reserved device name on Windows")
    folded = unicodedata.normalize("NFKC", comp)
    if folded in (".", "..") or "/" in folded or "\\" in folded or ":" in folded:
        raise InvalidName(f"unsafe file name {shown}: a part folds to a path separator or '..' under Unicode NFKC")


def safe_relpath(name: object) -> PurePosixPath:
    """Validate a relative file name from untrusted input and return it as a PurePosixPath.

    Refused: non-text, empty, absolute (``/x``), drive (``C:x``), UNC and device paths
    (``\\\\host``, ``\\\\?\\``), any backslash or colon, NUL and other control or
    invisible format characters, ``.``/``..``/empty parts, ``~`` prefixes, Windows device
    names, parts ending in a dot or space, over-long names and deep nesting.
    """
    if not isinstance(name, str):
        raise InvalidName(f"a file name must be text, not {type(name).__name__}")
    shown = repr(name[:120])
    if not name:
        raise InvalidName("empty file name")
    if len(name) > MAX_RELPATH:
        raise InvalidName(f"unsafe file name {shown}: longer than {MAX_RELPATH} characters")
    for ch in name:
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            raise InvalidName(f"unsafe file name {shown}: contains control or invisible character U+{ord(ch):04X}")
    if "\\" in name:
        raise InvalidName(f"unsafe file name {shown}: contains a backslash (a Windows separator)")
    if _DRIVE_RE.match(name) or ":" in name:
        raise InvalidName(f"unsafe file name {shown}: contains ':' (drive letter or alternate stream)")
    if name.startswith("/"):
        raise InvalidName(f"unsafe file name {shown}: absolute path")
    parts = name.split("/")
    if len(parts) > MAX_DEPTH:
        raise InvalidName(f"unsafe file name {shown}: nested deeper than {MAX_DEPTH} folders")
    for comp in parts:
        _check_component(comp, shown)
    return PurePosixPath(*parts)


def safe_join(root: str | Path, name: object) -> Path:
    """``root / safe_relpath(name)``, proven to stay inside ``root`` after resolving symlinks.

    The comparison is by path components (``Path.is_relative_to``), never by string prefix,
    so ``/store-evil`` is not inside ``/store``. A symlink planted anywhere on the way that
    points out of the root is refused.
    """
    rel = safe_relpath(name)
    root_resolved = Path(root).resolve()
    target = root_resolved.joinpath(*rel.parts)
    resolved = target.resolve()
    if not resolved.is_relative_to(root_resolved):
        raise InvalidName(
            f"unsafe file name {str(name)[:120]!r}: resolves to {resolved}, outside {root_resolved}",
            hint="a symlink inside the store points elsewhere; remove it",
        )
    return target


def split_shard_name(filename: str) -> tuple[str, int, int] | None:
    """``model-00002-of-00003.gguf`` -> ``("model", 2, 3)``; None for an unsplit name."""
    m = re.match(r"^(.+)-(\d{5})-of-(\d{5})\.gguf$", filename, re.IGNORECASE)
    if not m:
        return None
    no, count = int(m.group(2)), int(m.group(3))
    if not 1 <= no <= count:
        return None
    return m.group(1), no, count


def shard_name(prefix: str, no: int, count: int) -> str:
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"
