"""What a hub repo offers, one row per pullable model: a quant (all parts of a split file
together), its size, the ref that pulls exactly it, and a record the planner can judge
before a byte is downloaded. Pure functions over a listing, tested without a hub."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from localrun.types import FileEntry, Format, ModelRecord, Source

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Offer:
    repo: str
    ref: str  # what `pull` gets: org/repo/file.gguf for one quant, org/repo for MLX/MLC
    quant: str
    file: str  # the file shown (first part of a split set), or "(whole repo)"
    size: int
    format: Format
    parts: int = 1

    def record(self) -> ModelRecord:
        """A stand-in record for planning the fit (no metadata yet: sizes and quant only)."""
        return ModelRecord(
            name=self.ref.lower(),
            format=self.format,
            path="",
            files=(FileEntry(self.file, self.size),),
            source=Source.HUB,
            repo=self.repo,
            metadata={"quant": self.quant},
        )


def offers_from_files(repo: str, sizes: dict[str, int]) -> list[Offer]:
    """Offers for a repo whose files (path → size) are known, best-known quants first."""
    from localrun.errors import LocalrunError
    from localrun.modelstore.refs import HubRef, detect_format, gguf_candidates, quant_label, select_files

    paths = list(sizes)
    fmt = detect_format(paths)
    offers = []
    if fmt is Format.GGUF:
        for primary in gguf_candidates(paths):
            try:
                sel = select_files(HubRef(repo, file=primary), paths)
            except LocalrunError as exc:  # an incomplete split set: shown nowhere, logged
                log.info("%s: skipping %s: %s", repo, primary, exc)
                continue
            offers.append(
                Offer(
                    repo,
                    f"{repo}/{primary}",
                    quant_label(primary) or "—",
                    primary,
                    sum(sizes[p] for p in sel.files),
                    Format.GGUF,
                    len(sel.files),
                )
            )
        return sorted(offers, key=_quant_order)
    if fmt is not None:
        try:
            sel = select_files(HubRef(repo), paths)
        except LocalrunError as exc:
            log.info("%s: nothing to offer: %s", repo, exc)
            return []
        size = sum(sizes[p] for p in sel.files)
        return [Offer(repo, repo, fmt.value, "(whole repo)", size, fmt, len(sel.files))]
    return []


#: Quants people reach for first; the rest follow by name.
_PREFERRED = ("Q4_K_M", "Q8_0", "Q5_K_M", "Q4_0", "Q6_K")


def _quant_order(offer: Offer) -> tuple[int, str]:
    q = offer.quant.upper()
    return (_PREFERRED.index(q) if q in _PREFERRED else len(_PREFERRED), q + offer.file)


def cached_repos(records: Iterable[ModelRecord], query: str) -> dict[str, list[ModelRecord]]:
    """Offline search: records found in the local HF cache whose repo matches every word."""
    words = query.lower().split()
    out: dict[str, list[ModelRecord]] = {}
    for r in records:
        repo = r.repo or r.name
        if all(w in repo.lower() for w in words):
            out.setdefault(repo, []).append(r)
    return out


def offers_from_cache(repo: str, records: Iterable[ModelRecord]) -> list[Offer]:
    out = []
    for r in records:
        name = PurePosixPath(r.path).name if r.format is Format.GGUF else "(whole repo)"
        ref = f"{repo}/{_repo_relative(r)}" if r.format is Format.GGUF else repo
        out.append(
            Offer(repo, ref, str(r.metadata.get("quant") or r.format.value), name, r.size, r.format, len(r.files))
        )
    return sorted(out, key=_quant_order)


def _repo_relative(record: ModelRecord) -> str:
    """The path of a cached GGUF inside its snapshot folder (snapshots/<commit>/<path>)."""
    parts = PurePosixPath(record.path).parts
    if "snapshots" in parts:
        i = parts.index("snapshots")
        return "/".join(parts[i + 2 :])
    return PurePosixPath(record.path).name


def pulled_as(records: Iterable[ModelRecord], ref: str) -> str | None:
    """The name under which ``ref`` (``org/repo`` or ``org/repo/file.gguf``, as Discover offers it)
    is already in the store, or None. A repo counts as pulled when any file of it is."""
    for r in records:
        repo = (r.repo or "").lower()
        if not repo or not (ref.lower() == repo or ref.lower().startswith(repo + "/")):
            continue
        file = ref[len(repo) + 1 :]
        if not file or any(PurePosixPath(f.path).name == PurePosixPath(file).name for f in r.files):
            return r.name
    return None
