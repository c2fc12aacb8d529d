"""`localrun pull`: a ref → a plan (files, sizes, quant) → verified files → an index record.

:func:`plan_pull` lists the repo and decides, so a front end can show what will come down
(and how much) before a byte moves; :func:`pull` carries a plan out. Files go to the
standard Hugging Face cache (see :mod:`localrun.modelstore.download`), so other tools see
them and what they fetched is reused. Offline (``HF_HUB_OFFLINE=1`` or ``offline=True``)
the same refs resolve against the cache alone, and anything missing is named.

Code never rides along silently: an MLX repo with ``*.py`` files or a ``model_file`` /
``auto_map`` key in ``config.json`` is refused unless ``trust_remote_code``; an MLC repo's
native libraries (``.so``/``.dylib``/``.dll``) unless ``allow_native``.

A GGUF model's multimodal projector (``mmproj*.gguf``) comes with it, chosen by llama.cpp's
``-hf`` rules (:func:`~localrun.modelstore.projector.find_projector_sibling`), unless
``mmproj=False`` (``--no-mmproj``); it is verified like the model's own files, proven to be
a clip GGUF of the model's width, and recorded as the model's projector.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localrun.errors import DownloadFailed, InvalidModelFile, ModelNotFound
from localrun.jsonfile import NotAJsonObject, read_json_object
from localrun.modelstore.describe import as_download
from localrun.modelstore.download import FetchResult, ProgressCallback, check_disk_space, fetch_file, hash_file
from localrun.modelstore.hfcache import CacheLayout, listing_from_cache
from localrun.modelstore.hub import HubClient, RemoteFile, RepoListing, hub_cache_dir, hub_offline
from localrun.modelstore.refs import HubRef, Selection, model_name_for, parse_ref, select_files
from localrun.types import FileEntry, Format, ModelRecord, Source

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

logger = logging.getLogger(__name__)

CONFIG_FILES = ("config.json", "mlc-chat-config.json")
MAX_CONFIG_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class PlannedFile:
    path: str
    size: int
    sha256: str | None
    cached: bool  # a blob with this hash is already in the cache (it is re-hashed before use)
    partial: int  # bytes of an interrupted download already on disk


@dataclass(frozen=True)
class PullPlan:
    """Everything decided before downloading; pass it to :func:`pull` to carry it out."""

    ref: HubRef
    name: str
    repo: str
    revision: str
    commit: str
    format: Format
    quant: str | None
    primary: str  # repo path a runtime loads; "" for MLX/MLC (the snapshot folder)
    files: tuple[PlannedFile, ...]
    endpoint: str
    cache_dir: str
    offline: bool
    trust_remote_code: bool = False
    allow_native: bool = False
    listing: RepoListing | None = None
    projector: str | None = None  # repo path of the projector fetched with the model (also in files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def download_bytes(self) -> int:
        return sum(f.size - f.partial for f in self.files if not f.cached)

    def describe(self) -> list[str]:
        """Lines a CLI or TUI can print before asking to go ahead."""
        head = f"{self.repo}@{self.commit[:10]} → {self.name} ({self.format.value}" + (
            f", {self.quant})" if self.quant else ")"
        )
        lines = [head]
        for f in self.files:
            role = "  (projector)" if f.path == self.projector else ""
            state = "cached" if f.cached else (f"resume at {human_size(f.partial)}" if f.partial else "new")
            lines.append(f"  {f.path}  {human_size(f.size)}  [{state}]{role}")
        lines.append(f"  total {human_size(self.total_bytes)}, to download {human_size(self.download_bytes)}")
        return lines


def human_size(n: float) -> str:
    """Binary units (MiB, GiB), as the CLI gives every size and memory figure."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"  # pragma: no cover - the loop always returns


def _refuse_code(ref: HubRef, sel: Selection, trust_remote_code: bool, allow_native: bool) -> None:
    if sel.code_files and not trust_remote_code:
        raise InvalidModelFile(
            f"{ref.repo} ships Python code ({', '.join(sel.code_files[:5])}); refusing to download it",
            hint="pass trust_remote_code (--trust-remote-code) only if you trust the publisher",
        )
    if sel.native_files and not allow_native:
        raise InvalidModelFile(
            f"{ref.repo} ships native libraries ({', '.join(sel.native_files[:5])}); refusing to download them",
            hint=(
                "MLC compiles its own library on first use; pass allow_native (--allow-native) only if you trust "
                "the publisher"
            ),
        )


def plan_pull(
    ref: str | HubRef,
    *,
    settings: Settings | None = None,
    revision: str | None = None,
    offline: bool = False,
    trust_remote_code: bool = False,
    allow_native: bool = False,
    hub: HubClient | None = None,
    mmproj: bool = True,
) -> PullPlan:
    """List the repo (or the cache, offline) and choose the files; downloads nothing.

    ``mmproj``: also take the GGUF model's projector when the repo (or, offline, the cache)
    holds one; offline, a projector that was never fetched is simply not there."""
    if isinstance(ref, str):
        ref = parse_ref(ref, revision=revision)
    elif revision:
        ref = HubRef(ref.repo, ref.quant, ref.file, revision)
    offline = hub_offline(settings, offline)
    cache_dir = hub_cache_dir()
    layout = CacheLayout(cache_dir, ref.repo)
    client = hub or HubClient(settings=settings)
    listing = listing_from_cache(layout, ref.revision) if offline else client.list_repo(ref.repo, ref.revision)
    try:
        sel = select_files(ref, listing.paths, include_code=trust_remote_code, include_native=allow_native)
    except ModelNotFound as exc:
        if not offline:
            raise
        raise ModelNotFound(
            f"offline: {exc.message}", hint="connect and pull it, or unset HF_HUB_OFFLINE / drop --offline"
        ) from None
    _refuse_code(ref, sel, trust_remote_code, allow_native)
    projector = None
    if mmproj and sel.format is Format.GGUF:
        from localrun.modelstore.projector import find_projector_sibling

        projector = find_projector_sibling(listing.paths, sel.primary)
    wanted = sel.files + ((projector,) if projector else ())
    planned = []
    for path in sorted(wanted, key=lambda p: (p not in CONFIG_FILES, p == projector, p)):
        rf = listing.file(path)
        blob = layout.blob(rf.etag) if rf.etag else None
        partial = blob.with_name(blob.name + ".incomplete") if blob else None
        planned.append(
            PlannedFile(
                path,
                rf.size,
                rf.sha256,
                bool(blob and os.path.exists(blob)),
                partial.stat().st_size if partial and partial.exists() else 0,
            )
        )
    return PullPlan(
        ref=ref,
        name=model_name_for(ref.repo, sel),
        repo=ref.repo,
        revision=listing.revision,
        commit=listing.commit,
        format=sel.format,
        quant=sel.quant,
        primary=sel.primary,
        files=tuple(planned),
        endpoint=client.endpoint,
        cache_dir=str(cache_dir),
        offline=offline,
        trust_remote_code=trust_remote_code,
        allow_native=allow_native,
        listing=listing,
        projector=projector,
    )


def _read_config(path: Path, what: str) -> dict[str, Any]:
    try:
        return read_json_object(path, max_bytes=MAX_CONFIG_BYTES)
    except NotAJsonObject as exc:
        raise InvalidModelFile(f"{what}: {exc.why}", hint="the repo is broken; try another") from None


def _check_config(plan: PullPlan, path: Path) -> None:
    """Refuse an MLX config that makes the loader import code, before any weight is fetched."""
    if plan.format is not Format.MLX or plan.trust_remote_code:
        return
    config = _read_config(path, f"{plan.repo}/config.json")
    keys = [k for k in ("model_file", "auto_map") if k in config]
    if keys:
        raise InvalidModelFile(
            f"{plan.repo}/config.json sets {', '.join(keys)}, which makes the loader import Python code; refusing",
            hint="pass trust_remote_code (--trust-remote-code) only if you trust the publisher",
        )


def _fetch_offline(layout: CacheLayout, commit: str, rf: RemoteFile) -> FetchResult:
    from localrun.errors import VerificationFailed

    snap = layout.snapshot(commit, rf.path)
    digest, size = hash_file(snap, rf, None, None)
    problem = digest.mismatch() if size == rf.size else f"{size} bytes, expected {rf.size}"
    if problem:
        raise VerificationFailed(
            f"{layout.repo}/{rf.path} in the cache does not match its hash ({problem})",
            hint="delete it and pull again when online",
        )
    return FetchResult(snap, Path(os.path.realpath(snap)), digest.sha256.hexdigest(), size, 0, True)


def pull(
    store: ModelStore,
    ref: str | HubRef | PullPlan,
    *,
    revision: str | None = None,
    offline: bool = False,
    progress: ProgressCallback | None = None,
    trust_remote_code: bool = False,
    allow_native: bool = False,
    mmproj: bool = True,
) -> ModelRecord:
    """Fetch (or find, offline) a model's files, verify every one and register the model.

    Raises InvalidName, ModelNotFound, AccessDenied, DownloadFailed, VerificationFailed,
    InvalidModelFile; on any of them no unverified file is left at a final path.
    """
    settings = getattr(store, "settings", None)
    plan = (
        ref
        if isinstance(ref, PullPlan)
        else plan_pull(
            ref,
            settings=settings,
            revision=revision,
            offline=offline,
            trust_remote_code=trust_remote_code,
            allow_native=allow_native,
            mmproj=mmproj,
        )
    )
    layout = CacheLayout(plan.cache_dir, plan.repo)
    listing = plan.listing or HubClient(settings=settings).list_repo(plan.repo, plan.commit)
    if not plan.offline:
        check_disk_space(layout.cache_dir, plan.download_bytes, f"{plan.repo} ({len(plan.files)} files)")
        layout.write_ref(plan.revision, plan.commit)
    results: dict[str, FetchResult] = {}
    try:
        return _fetch_and_register(store, plan, layout, listing, results, progress)
    except InvalidModelFile:  # refused after its bytes came: not left in the shared cache for other tools
        store.drop_unregistered(r.path for r in results.values() if not r.reused)
        raise
    except FileNotFoundError as exc:  # a `localrun rm` (or another process) removed a file mid-pull
        raise DownloadFailed(
            f"{plan.repo}: {exc.filename or 'a file'} was removed while it was being pulled",
            hint="another `localrun rm` or clean-up ran at the same time; run the pull again",
        ) from None


def _fetch_and_register(
    store: ModelStore,
    plan: PullPlan,
    layout: CacheLayout,
    listing: RepoListing,
    results: dict[str, FetchResult],
    progress: ProgressCallback | None,
) -> ModelRecord:
    """Fetch every file of ``plan`` into ``results`` (as they come), then describe and register."""
    client = HubClient(settings=getattr(store, "settings", None), endpoint=plan.endpoint)
    with client.deadlines.client() as http:
        for pf in plan.files:
            rf = listing.file(pf.path)
            if plan.offline:
                results[pf.path] = _fetch_offline(layout, plan.commit, rf)
            else:
                results[pf.path] = fetch_file(
                    layout,
                    plan.commit,
                    rf,
                    client.file_url(plan.repo, plan.commit, rf.path),
                    client=http,
                    headers=client.auth_headers(),
                    progress=progress,
                    deadlines=client.deadlines,
                )
            if pf.path == "config.json":
                _check_config(plan, results[pf.path].path)
    fetched = sum(r.fetched for r in results.values())
    logger.info("pulled %s: %d files, %d bytes fetched", plan.name, len(results), fetched)
    primary = results[plan.primary].path if plan.primary else layout.snapshot_dir(plan.commit)
    own = [r for p, r in results.items() if p != plan.projector]
    described = store.inspect_path(primary, name=plan.name, fmt=plan.format, trust_remote_code=plan.trust_remote_code)
    record = as_download(
        described,
        path=primary,
        files=(FileEntry(str(r.path), r.size, r.sha256).matched_at(r.path) for r in own),
        source=Source.HUB,
        repo=plan.repo,
        revision=plan.commit,
        quant=plan.quant,
        hub={"endpoint": plan.endpoint, "revision": plan.revision, "commit": plan.commit},
    )
    if plan.projector:
        record = _with_projector(plan, record, results[plan.projector])
    return store.register(record)


def _with_projector(plan: PullPlan, record: ModelRecord, fetched: FetchResult) -> ModelRecord:
    from localrun.modelstore.projector import pair

    try:
        return pair(record, fetched.path, owned=True, sha256=fetched.sha256)
    except InvalidModelFile as exc:
        raise InvalidModelFile(
            f"{plan.repo}/{plan.projector} cannot be this model's projector: {exc.message}",
            hint=f"pull the model alone with --no-mmproj ({exc.hint})" if exc.hint else "pull it with --no-mmproj",
        ) from None
