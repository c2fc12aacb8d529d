"""Refs: the ways people already name a model on the hub, and which files each one means.

    org/repo                      GGUF: Q4_K_M, then Q8_0, then the first model file
    org/repo:Q5_K_M               a quant, case-insensitive (also hf.co/org/repo:Q5_K_M)
    org/repo/path/file.gguf       one exact file
    …-00001-of-00003.gguf         split GGUF: every part is fetched, the first is loaded

MLX repos (``config.json`` + safetensors) and MLC repos (``mlc-chat-config.json`` +
``tensor-cache.json``/``ndarray-cache.json`` + ``params_shard_*.bin``) are recognised by
their files. The rules follow llama.cpp's ``-hf`` (common/download.cpp) so a ref means
the same file here as there. Parsing and selection are pure functions over names; the
caller decides what to do with code and native libraries they flag. Draft models for
speculative decoding: :func:`find_draft_sibling` (names), :func:`find_draft_file` (disk).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from localrun.errors import ConfigError, InvalidName, ModelNotFound
from localrun.modelstore.names import (
    model_name_from_filename,
    safe_relpath,
    shard_name,
    split_shard_name,
    validate_model_name,
)
from localrun.types import Format

logger = logging.getLogger(__name__)

HUB_PREFIXES = (
    "https://huggingface.co/",
    "http://huggingface.co/",
    "https://hf.co/",
    "huggingface.co/",
    "hf.co/",
    "hf://",
)
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
#: Basenames containing these are sidecars, never the model (llama.cpp's list).
SIDECAR_MARKERS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
MLX_PATTERNS = (
    "*.json",
    "model*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
)
MLC_PATTERNS = ("*.json", "params_shard_*.bin", "tokenizer.model", "*.tiktoken", "*.txt")
CODE_PATTERNS = ("*.py",)
NATIVE_SUFFIXES = (".so", ".dylib", ".dll")

_SEGMENT = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_RE = re.compile(rf"^{_SEGMENT}/{_SEGMENT}$")
_QUANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
_QUANT_LABEL_RE = re.compile(
    r"(?:^|[-._])((?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|B?F16|F32|BF16|FP16|FP8|MXFP4(?:_MOE)?|TQ[12]_0))$", re.IGNORECASE
)


@dataclass(frozen=True)
class HubRef:
    """A parsed hub ref. ``quant`` and ``file`` are exclusive; both None means the default."""

    repo: str
    quant: str | None = None
    file: str | None = None
    revision: str | None = None

    def __str__(self) -> str:
        tail = f"/{self.file}" if self.file else (f":{self.quant}" if self.quant else "")
        return f"{self.repo}{tail}" + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class Selection:
    """What a ref picks from a repo listing."""

    format: Format
    files: tuple[str, ...]  # repo paths to fetch, in order
    primary: str  # the file a runtime loads (first shard); "" for folder formats
    quant: str | None = None
    code_files: tuple[str, ...] = ()  # *.py shipped with an MLX repo (fetched only if trusted)
    native_files: tuple[str, ...] = ()  # native libraries shipped with an MLC repo


def validate_repo_id(repo: object) -> str:
    if not isinstance(repo, str) or not _REPO_RE.match(repo) or "--" in repo or ".." in repo:
        raise InvalidName(
            f"invalid hub repo id {str(repo)[:120]!r}",
            hint="write it as org/name, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF",
        )
    return repo


def validate_revision(revision: object) -> str:
    if not isinstance(revision, str) or not _REVISION_RE.match(revision):
        raise InvalidName(f"invalid revision {str(revision)[:80]!r}", hint="use a branch, a tag or a commit hash")
    safe_relpath(revision)  # it names refs/<revision> in the cache
    return revision


def parse_ref(text: str, *, revision: str | None = None) -> HubRef:
    """Parse a hub ref; raise InvalidName saying what is wrong with it."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidName("empty model ref", hint="write org/repo, org/repo:QUANT or org/repo/file.gguf")
    ref = text.strip()
    for prefix in HUB_PREFIXES:
        if ref.lower().startswith(prefix):
            ref = ref[len(prefix) :]
            break
    quant = None
    if ":" in ref:
        ref, quant = ref.rsplit(":", 1)
        if not _QUANT_RE.match(quant):
            raise InvalidName(f"invalid quant {quant!r} in ref {text!r}", hint="e.g. org/repo:Q4_K_M")
    parts = ref.split("/")
    if len(parts) < 2:
        raise InvalidName(
            f"{text!r} is not a hub ref", hint="write org/repo, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF"
        )
    repo = validate_repo_id("/".join(parts[:2]))
    file = None
    if len(parts) > 2:
        if quant:
            raise InvalidName(
                f"ref {text!r} names both a file and a quant", hint="use org/repo:QUANT or org/repo/file.gguf"
            )
        file = str(safe_relpath("/".join(parts[2:])))
    return HubRef(repo=repo, quant=quant, file=file, revision=validate_revision(revision) if revision else None)


def quant_label(path: str) -> str | None:
    """``Model-Q4_K_M.gguf`` → ``Q4_K_M``; split suffixes ignored; None if nothing quant-like."""
    base = PurePosixPath(path).name
    split = split_shard_name(base)
    stem = split[0] if split else re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE)
    m = _QUANT_LABEL_RE.search(stem)
    return m.group(1).upper() if m else None


def _is_sidecar(path: str) -> bool:
    base = PurePosixPath(path).name.lower()
    return any(marker in base for marker in SIDECAR_MARKERS)


def _shard_group(path: str) -> tuple[str, ...]:
    """All parts of the split set ``path`` belongs to (expected names, present or not)."""
    p = PurePosixPath(path)
    split = split_shard_name(p.name)
    if not split:
        return (path,)
    prefix, _, count = split
    return tuple(str(p.with_name(shard_name(prefix, i, count))) for i in range(1, count + 1))


def gguf_candidates(paths: Iterable[str]) -> list[str]:
    """The files a ref may load: GGUFs that are not sidecars, first split parts only. Draft
    models (:data:`DRAFT_KEYWORD`) only when the repo holds nothing else: ``org/repo`` with
    ``Model-Q4_0.gguf`` and ``Model-DRAFT-0.5B-Q4_0.gguf`` means the model, not its draft
    (llama.cpp would take the draft here, first in name order), while a repo of drafts
    alone still pulls."""
    out = []
    for path in sorted(paths):
        if not path.lower().endswith(".gguf") or _is_sidecar(path):
            continue
        split = split_shard_name(PurePosixPath(path).name)
        if split and split[1] != 1:
            continue
        out.append(path)
    return [p for p in out if not is_draft_file(p)] or out


def _tag_matches(tag: str, path: str) -> bool:
    pattern = re.compile(rf"(?:^|[-._/]){re.escape(tag)}[-./]", re.IGNORECASE)
    return bool(pattern.search(PurePosixPath(path).name)) or bool(pattern.search(path))


def describe_offer(paths: Iterable[str]) -> str:
    """A short, human list of what a repo offers, for 'no match' errors."""
    paths = list(paths)
    fmt = detect_format(paths)
    if fmt is Format.GGUF:
        cands = gguf_candidates(paths)
        quants = sorted({q for q in map(quant_label, cands) if q})
        files = ", ".join(cands[:8]) + (" …" if len(cands) > 8 else "")
        drafts = [p for p in gguf_candidates(p for p in paths if is_draft_file(p)) if p not in cands]
        extra = f"; draft models: {', '.join(drafts[:4])}" + (" …" if len(drafts) > 4 else "") if drafts else ""
        return f"quants {', '.join(quants) or '(unlabelled)'}; files: {files}{extra}"
    if fmt is not None:
        return f"one {fmt.value.upper()} model (no quant variants: pull the repo itself)"
    shown = ", ".join(sorted(paths)[:10]) + (" …" if len(paths) > 10 else "")
    return f"no GGUF, MLX or MLC model; files: {shown or '(none)'}"


def detect_format(paths: Iterable[str]) -> Format | None:
    paths = set(paths)
    if gguf_candidates(paths):
        return Format.GGUF
    if "mlc-chat-config.json" in paths and ({"tensor-cache.json", "ndarray-cache.json"} & paths):
        return Format.MLC
    if "config.json" in paths and any(fnmatch.fnmatchcase(p, "model*.safetensors") for p in paths):
        return Format.MLX
    return None


def _matching(paths: Iterable[str], patterns: Iterable[str]) -> list[str]:
    patterns = tuple(patterns)
    return sorted(p for p in paths if any(fnmatch.fnmatchcase(p, pat) for pat in patterns))


def select_files(
    ref: HubRef, paths: Iterable[str], *, include_code: bool = False, include_native: bool = False
) -> Selection:
    """Pick the files ``ref`` means from a repo's file names; ModelNotFound lists the offer."""
    paths = sorted(set(paths))
    if ref.file is not None:
        return _select_exact(ref, paths)
    fmt = detect_format(paths)
    if fmt is Format.GGUF:
        return _select_gguf(ref, paths)
    if fmt is None:
        raise ModelNotFound(
            f"{ref.repo} holds no model localrun can run: {describe_offer(paths)}",
            hint="localrun runs GGUF, MLX and MLC repos; try one with -GGUF in its name",
        )
    if ref.quant:
        raise ModelNotFound(
            f"{ref.repo} has no quant {ref.quant!r}: it holds {describe_offer(paths)}", hint=f"pull {ref.repo}"
        )
    if fmt is Format.MLX:
        code = _matching(paths, CODE_PATTERNS)
        files = _matching(paths, MLX_PATTERNS + (CODE_PATTERNS if include_code else ()))
        return Selection(Format.MLX, tuple(files), "", None, code_files=tuple(code))
    native = tuple(p for p in paths if p.lower().endswith(NATIVE_SUFFIXES))
    files = _matching(paths, MLC_PATTERNS) + (list(native) if include_native else [])
    return Selection(Format.MLC, tuple(sorted(files)), "", None, native_files=native)


def _gguf_selection(ref: HubRef, primary: str, paths: list[str]) -> Selection:
    group = _shard_group(primary)
    missing = [p for p in group if p not in paths]
    if missing:
        raise ModelNotFound(
            f"{ref.repo}: split model {group[0]} is incomplete, missing {', '.join(missing)}",
            hint="the repo lacks parts of this model; pick another quant",
        )
    return Selection(Format.GGUF, group, group[0], quant_label(primary))


def _select_exact(ref: HubRef, paths: list[str]) -> Selection:
    if ref.file not in paths:
        raise ModelNotFound(
            f"{ref.repo} has no file {ref.file!r}; it offers {describe_offer(paths)}",
            hint="check the file name (it is case-sensitive)",
        )
    if not ref.file.lower().endswith(".gguf"):
        raise ModelNotFound(
            f"{ref.file!r} is not a GGUF file", hint=f"name a .gguf file, or pull {ref.repo} itself for MLX/MLC repos"
        )
    if "mmproj" in PurePosixPath(ref.file).name.lower():
        raise ModelNotFound(
            f"{ref.file!r} is a multimodal projector, not a model",
            hint=f"pull the model file; a projector comes with it (e.g. {ref.repo}:Q4_K_M)",
        )
    return _gguf_selection(ref, _shard_group(ref.file)[0], paths)


def _select_gguf(ref: HubRef, paths: list[str]) -> Selection:
    candidates = gguf_candidates(paths)
    wanted = (ref.quant,) if ref.quant else DEFAULT_QUANTS
    for tag in wanted:
        by_name = [c for c in candidates if _tag_matches(tag, PurePosixPath(c).name)]
        hits = by_name or [c for c in candidates if _tag_matches(tag, c)]
        if hits:
            return _gguf_selection(ref, hits[0], paths)
    if ref.quant:
        raise ModelNotFound(
            f"{ref.repo} has no {ref.quant} file; it offers {describe_offer(paths)}",
            hint=f"pick one of those, e.g. {ref.repo}:{quant_label(candidates[0]) or candidates[0]}",
        )
    logger.info("%s: no Q4_K_M or Q8_0 file, taking %s", ref.repo, candidates[0])
    return _gguf_selection(ref, candidates[0], paths)


def model_name_for(repo: str, selection: Selection) -> str:
    """The index name of a pulled model: ``org/repo:q4_k_m`` (GGUF) or ``org/repo`` (MLX, MLC)."""
    tag = None
    if selection.format is Format.GGUF:
        tag = (selection.quant or model_name_from_filename(PurePosixPath(selection.primary).name)).lower()
    org, name = repo.lower().split("/")
    for candidate in (f"{org}/{name}", name):
        full = f"{candidate}:{tag}" if tag else candidate
        try:
            return validate_model_name(full)
        except InvalidName:
            continue
    return model_name_from_filename(f"{name}-{tag}" if tag else name)


# --- draft models: a smaller GGUF beside the model, for speculative decoding -------------

#: A file whose name holds this word (any case) is a draft model for its siblings.
DRAFT_KEYWORD = "draft"
_LAST_TAG_RE = re.compile(r"[-.]([A-Za-z0-9_]+)$")


def is_draft_file(path: str) -> bool:
    return DRAFT_KEYWORD in PurePosixPath(path).name.lower()


def quant_bits(path: str) -> int:
    """The bit count llama.cpp's downloader reads from a file name: the first number in the
    last ``-``/``.`` segment of the name (split suffix and ``.gguf`` removed), 0 if none.
    ``Model-Q4_K_M.gguf`` → 4, ``Model-F16.gguf`` → 16, ``Model.gguf`` → 0."""
    name = PurePosixPath(path).name
    split = split_shard_name(name)
    stem = split[0] if split else re.sub(r"\.gguf$", "", name, flags=re.IGNORECASE)
    tail = _LAST_TAG_RE.search(stem)
    digits = re.search(r"\d+", tail.group(1)) if tail else None
    return int(digits.group()) if digits else 0


def find_draft_sibling(paths: Iterable[str], primary: str, tag: str | None = None) -> str | None:
    """The draft model that goes with ``primary`` among a repo's ``paths``, or None.

    The rules of llama.cpp's downloader for sidecars (``find_best_sibling`` in
    common/download.cpp), so ``-hf`` and localrun pair the same files: a ``.gguf`` whose
    name contains "draft" (any case), in the primary's directory or one above it; the
    deepest such directory wins, then a name carrying ``-TAG.`` (when the ref named a
    quant), then the quant whose bit count (:func:`quant_bits`) is closest to the tag's, or
    to the primary's when there is no tag; ties go to the first name in sorted order.

    Unlike llama.cpp: the word is looked for in the file name only (not in folder names),
    case-insensitively; the primary and its split parts, mmproj/imatrix/… sidecars and the
    non-first parts of a split draft are never chosen (the first part loads the rest); a
    split name's ``-TAG`` counts before its ``-0000k-of-0000n`` suffix.
    """
    own = {primary, *_shard_group(primary)}
    if tag:
        number = re.search(r"\d+", tag)
        want_bits = int(number.group()) if number else 0
    else:
        want_bits = quant_bits(primary)
    mark = f"-{tag.upper()}." if tag else None

    def rank(path: str, stem: str) -> tuple[bool, int]:
        exact = mark is not None and mark in stem.upper() + "."
        return exact, -abs(quant_bits(path) - want_bits)

    return best_sibling(
        paths, primary, lambda path: is_draft_file(path) and path not in own and not _is_sidecar(path), rank
    )


def best_sibling(
    paths: Iterable[str],
    primary: str,
    accept: Callable[[str], bool],
    rank: Callable[[str, str], tuple[Any, ...]],
) -> str | None:
    """llama.cpp's ``find_best_sibling`` walk (common/download.cpp), shared by the draft and the
    projector pick: among ``paths``, the ``.gguf`` files ``accept`` takes, never a split file's
    non-first part, in ``primary``'s folder or one above it; the deepest folder wins, then
    ``rank(path, stem)`` (a tuple, higher is better; ``stem``: the name without the split suffix
    and ``.gguf``); ties go to the first name in sorted order."""
    model_dir = PurePosixPath(primary).parts[:-1]
    best, best_key = None, None
    for path in sorted(set(paths)):
        p = PurePosixPath(path)
        if not p.name.lower().endswith(".gguf") or not accept(path):
            continue
        split = split_shard_name(p.name)
        if split and split[1] != 1:
            continue
        sib_dir = p.parts[:-1]
        if model_dir[: len(sib_dir)] != sib_dir:
            continue  # not the primary's folder nor one above it
        stem = split[0] if split else p.name[: -len(".gguf")]
        key = (len(sib_dir), *rank(path, stem))
        if best_key is None or key > best_key:
            best, best_key = path, key
    return best


def find_draft_file(model_path: str | Path, *, root: str | Path | None = None, tag: str | None = None) -> Path | None:
    """The draft model on disk that goes with ``model_path``, by :func:`find_draft_sibling`'s
    rules, or None: the one function here that reads the disk (folder listings).

    Looks in the model's folder and, when ``root`` (a folder above it: a pulled repo's
    snapshot) is given, in each folder up to ``root``; never below, never above ``root``.
    Paths are not resolved: a hub cache's snapshot files are links to blobs whose names
    mean nothing."""
    model = Path(os.path.abspath(model_path))
    top = Path(os.path.abspath(root)) if root is not None else model.parent
    try:
        rel = model.relative_to(top)
    except ValueError:
        raise ConfigError(
            f"{model} is not inside {top}",
            param="draft",
            hint="give the folder of the pulled repo that holds the model",
        ) from None
    folders = [top.joinpath(*rel.parts[:depth]) for depth in range(len(rel.parts))]
    listing = []
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            logger.debug("no draft lookup in %s: %s", folder, exc)
            continue
        for entry in entries:
            if entry.name.lower().endswith(".gguf") and entry.is_file():
                listing.append(PurePosixPath(*Path(entry.path).relative_to(top).parts).as_posix())
    found = find_draft_sibling(listing, rel.as_posix(), tag)
    return top.joinpath(*PurePosixPath(found).parts) if found else None
