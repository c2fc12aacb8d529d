"""``localrun.lock.json``: the contract a bundle carries, parsed strictly.

A bundle is a folder (or one tar) shaped like a Hugging Face cache under ``hub/`` plus this
lock. The lock says, for every model, its name, format, repo, revision, commit, quant and
architecture, and for every file its path in the repo, size, sha256, git oid and origin.
The importer trusts nothing else in the bundle: paths it writes are derived from the lock
(validated here, once, into types that cannot hold a bad name) and every byte is checked
against it before it becomes visible at a final path.

The ids a lock carries (git oids, LFS pointers, a synthetic repo and commit for a model that
never had a repo) are :mod:`localrun.modelstore.gitids`'s, shared with the mirror's catalog.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, TypeVar

from localrun.errors import InvalidModelFile, InvalidName
from localrun.modelstore.gitids import is_sha1, is_sha256, lfs_git_oid
from localrun.modelstore.hfcache import CacheLayout
from localrun.modelstore.names import safe_relpath, validate_model_name
from localrun.modelstore.refs import validate_repo_id, validate_revision
from localrun.types import Format

_T = TypeVar("_T")

LOCK_NAME = "localrun.lock.json"
SCHEMA_VERSION = 1
HUB_DIR = "hub"
WHEELS_DIR = "wheels"
MAX_LOCK_BYTES = 16 * 1024 * 1024
#: Code never rides along in a bundle (security.md: code that ships with a model).
CODE_SUFFIXES = (".py", ".pyc", ".so", ".dylib", ".dll", ".pyd")


class BundleError(InvalidModelFile):
    """A bundle that cannot be used: names the file and the problem. Nothing was registered."""

    code = "bad_bundle"


@dataclass(frozen=True)
class LockFile:
    path: str  # path in the repo (validated relative POSIX path)
    size: int
    sha256: str
    git_oid: str
    lfs: bool
    origin: str = ""

    @property
    def etag(self) -> str:
        """The blob's name in the HF cache, as huggingface_hub names it."""
        return self.sha256 if self.lfs else self.git_oid


@dataclass(frozen=True)
class LockModel:
    name: str
    format: Format
    repo: str
    synthetic: bool
    revision: str
    commit: str
    primary: str  # the file a runtime loads; "" for a folder model (MLX, MLC)
    files: tuple[LockFile, ...]
    quant: str | None = None
    architecture: str | None = None
    source: str = ""
    origin: str = ""
    projector: str = ""  # the GGUF model's projector (mmproj), one of files; "" for none

    @property
    def layout_folder(self) -> str:
        return CacheLayout("/", self.repo).folder_name

    def blob_relpath(self, f: LockFile) -> str:
        return f"{HUB_DIR}/{self.layout_folder}/blobs/{f.etag}"

    def snapshot_dir_relpath(self) -> str:
        return f"{HUB_DIR}/{self.layout_folder}/snapshots/{self.commit}"

    def snapshot_relpath(self, f: LockFile) -> str:
        return f"{self.snapshot_dir_relpath()}/{f.path}"

    def link_target(self, f: LockFile) -> str:
        """The relative symlink huggingface_hub writes from the snapshot to the blob."""
        depth = len(PurePosixPath(f.path).parts) - 1
        return "../" * (depth + 2) + f"blobs/{f.etag}"

    def ref_relpath(self) -> str | None:
        return None if self.revision == self.commit else f"{HUB_DIR}/{self.layout_folder}/refs/{self.revision}"


@dataclass(frozen=True)
class LockWheel:
    path: str  # under wheels/
    size: int
    sha256: str


@dataclass(frozen=True)
class Lock:
    models: tuple[LockModel, ...]
    created: str = ""
    localrun: str = ""
    python: dict[str, Any] | None = None
    wheels: tuple[LockWheel, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def blobs(self) -> dict[str, tuple[LockModel, LockFile]]:
        """Bundle path of every blob -> the (first) model and file it belongs to."""
        out: dict[str, tuple[LockModel, LockFile]] = {}
        for m in self.models:
            for f in m.files:
                out.setdefault(m.blob_relpath(f), (m, f))
        return out

    def links(self) -> dict[str, str]:
        """Bundle path of every snapshot symlink -> its expected link text."""
        return {m.snapshot_relpath(f): m.link_target(f) for m in self.models for f in m.files}

    def refs(self) -> dict[str, str]:
        return {p: m.commit for m in self.models if (p := m.ref_relpath())}

    @property
    def total_bytes(self) -> int:
        return sum(f.size for _, f in self.blobs().values())

    def to_json(self) -> bytes:
        doc = {
            "schema_version": SCHEMA_VERSION,
            "kind": "localrun-bundle",
            "created": self.created,
            "localrun": self.localrun,
            "models": [_model_dict(m) for m in self.models],
            "python": self.python,
            "wheels": [{"path": w.path, "size": w.size, "sha256": w.sha256} for w in self.wheels],
        }
        return (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode()


def _model_dict(m: LockModel) -> dict[str, Any]:
    return {
        "name": m.name,
        "format": m.format.value,
        "repo": m.repo,
        "repo_synthetic": m.synthetic,
        "revision": m.revision,
        "commit": m.commit,
        "quant": m.quant,
        "architecture": m.architecture,
        "primary": m.primary,
        "projector": m.projector or None,
        "source": m.source,
        "origin": m.origin,
        "files": [
            {"path": f.path, "size": f.size, "sha256": f.sha256, "git_oid": f.git_oid, "lfs": f.lfs, "origin": f.origin}
            for f in m.files
        ],
    }


# --- parsing ----------------------------------------------------------------------------


def parse_lock(data: bytes, *, where: str = LOCK_NAME) -> Lock:
    """Validate a lock completely; BundleError names the entry and what is wrong with it."""
    if len(data) > MAX_LOCK_BYTES:
        raise BundleError(f"{where}: larger than {MAX_LOCK_BYTES} bytes", hint="this is not a localrun bundle lock")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleError(f"{where}: not valid JSON ({exc})", hint="the bundle is damaged; export it again") from None
    if not isinstance(doc, dict):
        raise BundleError(f"{where}: not a JSON object", hint="the bundle is damaged; export it again")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BundleError(
            f"{where}: unknown schema version {version!r} (this localrun reads version {SCHEMA_VERSION})",
            hint="import it with the localrun version that exported it, or export it again with this one",
        )
    models_raw = doc.get("models")
    if not isinstance(models_raw, list) or not models_raw:
        raise BundleError(f"{where}: 'models' must be a non-empty list", hint="export at least one model")
    models = tuple(_parse_model(m, f"{where}: models[{k}]") for k, m in enumerate(models_raw))
    _check_unique(models, where)
    wheels = tuple(
        _parse_wheel(w, f"{where}: wheels[{k}]") for k, w in enumerate(_list(doc.get("wheels", []), f"{where}: wheels"))
    )
    if len({w.path for w in wheels}) != len(wheels):
        raise BundleError(f"{where}: a wheel is listed twice", hint="the lock is damaged; export it again")
    python = doc.get("python")
    if python is not None and not isinstance(python, dict):
        raise BundleError(f"{where}: 'python' must be an object", hint="the lock is damaged; export it again")
    return Lock(
        models=models,
        created=str(doc.get("created", "")),
        localrun=str(doc.get("localrun", "")),
        python=python,
        wheels=wheels,
    )


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise BundleError(f"{where}: must be a list", hint="the lock is damaged; export it again")
    return value


def _field(d: dict[str, Any], key: str, kind: type, where: str, *, optional: bool = False) -> Any:
    value = d.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BundleError(
            f"{where}: '{key}' must be {kind.__name__}, got {str(value)[:80]!r}",
            hint="the lock is damaged; export it again",
        )
    return value


def _named(check: Callable[[Any], _T], value: Any, where: str) -> _T:
    try:
        return check(value)
    except InvalidName as exc:
        raise BundleError(
            f"{where}: {exc.message}", hint="the bundle names something unsafe; do not import it"
        ) from None


def _parse_model(d: Any, where: str) -> LockModel:
    if not isinstance(d, dict):
        raise BundleError(f"{where}: must be an object", hint="the lock is damaged; export it again")
    name = _named(validate_model_name, d.get("name"), where)
    where = f"{where} ({name})"
    try:
        fmt = Format(d.get("format"))
    except ValueError:
        raise BundleError(
            f"{where}: unknown format {d.get('format')!r}", hint=f"one of: {', '.join(f.value for f in Format)}"
        ) from None
    repo = _named(validate_repo_id, d.get("repo"), where)
    commit = _field(d, "commit", str, where)
    if not is_sha1(commit):
        raise BundleError(
            f"{where}: commit {commit[:80]!r} is not 40 hex digits", hint="the lock is damaged; export it again"
        )
    revision = _named(validate_revision, d.get("revision") or commit, where)
    if revision != commit:
        _named(safe_relpath, revision, where)  # it names refs/<revision> on disk
    files = tuple(
        _parse_file(f, f"{where}: files[{k}]") for k, f in enumerate(_list(d.get("files"), f"{where}: files"))
    )
    if not files:
        raise BundleError(f"{where}: has no files", hint="the lock is damaged; export it again")
    paths = [f.path for f in files]
    dup = next((p for p in paths if paths.count(p) > 1), None)
    if dup is not None:
        raise BundleError(f"{where}: duplicate entry {dup!r}", hint="the lock is damaged; export it again")
    primary = d.get("primary") or ""
    if not isinstance(primary, str) or (primary and primary not in paths):
        raise BundleError(
            f"{where}: primary file {str(primary)[:80]!r} is not among its files",
            hint="the lock is damaged; export it again",
        )
    if fmt is Format.GGUF and not primary:
        raise BundleError(f"{where}: a GGUF model needs a primary file", hint="the lock is damaged; export it again")
    projector = d.get("projector") or ""
    if not isinstance(projector, str) or (
        projector and (fmt is not Format.GGUF or projector not in paths or projector == primary)
    ):
        raise BundleError(
            f"{where}: projector {str(projector)[:80]!r} is not one of this GGUF model's other files",
            hint="the lock is damaged; export it again",
        )
    code = [p for p in paths if p.lower().endswith(CODE_SUFFIXES)]
    if code:
        raise BundleError(
            f"{where}: carries code ({', '.join(code[:3])}); bundles never import code",
            hint="export the model without its code files",
        )
    return LockModel(
        name=name,
        format=fmt,
        repo=repo,
        synthetic=bool(d.get("repo_synthetic")),
        revision=revision,
        commit=commit,
        primary=primary,
        files=files,
        quant=_opt_str(d, "quant", where),
        architecture=_opt_str(d, "architecture", where),
        source=str(d.get("source") or ""),
        origin=str(d.get("origin") or ""),
        projector=projector,
    )


def _opt_str(d: dict[str, Any], key: str, where: str) -> str | None:
    value = _field(d, key, str, where, optional=True)
    return value[:200] if value else None


def _parse_file(d: Any, where: str) -> LockFile:
    if not isinstance(d, dict):
        raise BundleError(f"{where}: must be an object", hint="the lock is damaged; export it again")
    path = str(_named(safe_relpath, d.get("path"), where))
    where = f"{where} ({path})"
    size = _field(d, "size", int, where)
    sha256 = _field(d, "sha256", str, where).lower()
    git_oid = _field(d, "git_oid", str, where).lower()
    lfs = d.get("lfs")
    if size < 0:
        raise BundleError(f"{where}: negative size {size}", hint="the lock is damaged; export it again")
    if not is_sha256(sha256):
        raise BundleError(
            f"{where}: sha256 {sha256[:80]!r} is not 64 hex digits", hint="the lock is damaged; export it again"
        )
    if not is_sha1(git_oid):
        raise BundleError(
            f"{where}: git_oid {git_oid[:80]!r} is not 40 hex digits", hint="the lock is damaged; export it again"
        )
    if not isinstance(lfs, bool):
        raise BundleError(f"{where}: 'lfs' must be true or false", hint="the lock is damaged; export it again")
    if lfs and git_oid != lfs_git_oid(sha256, size):
        raise BundleError(
            f"{where}: git_oid does not match its LFS pointer (sha256 {sha256[:12]}…, {size} bytes)",
            hint="the lock is damaged; export it again",
        )
    return LockFile(
        path=path, size=size, sha256=sha256, git_oid=git_oid, lfs=lfs, origin=str(d.get("origin") or "")[:2000]
    )


def _parse_wheel(d: Any, where: str) -> LockWheel:
    if not isinstance(d, dict):
        raise BundleError(f"{where}: must be an object", hint="the lock is damaged; export it again")
    path = str(_named(safe_relpath, d.get("path"), where))
    if not path.startswith(WHEELS_DIR + "/"):
        raise BundleError(f"{where}: {path!r} is not under {WHEELS_DIR}/", hint="the lock is damaged; export it again")
    sha256 = _field(d, "sha256", str, where).lower()
    if not is_sha256(sha256):
        raise BundleError(
            f"{where}: sha256 {sha256[:80]!r} is not 64 hex digits", hint="the lock is damaged; export it again"
        )
    size = _field(d, "size", int, where)
    if size < 0:
        raise BundleError(f"{where}: negative size", hint="the lock is damaged; export it again")
    return LockWheel(path=path, size=size, sha256=sha256)


def _check_unique(models: tuple[LockModel, ...], where: str) -> None:
    """No name twice; one repo path means one content; a blob name means one content."""
    names: set[str] = set()
    by_repo_path: dict[tuple[str, str, str], LockFile] = {}
    by_blob: dict[str, LockFile] = {}
    for m in models:
        if m.name in names:
            raise BundleError(
                f"{where}: duplicate entry: model {m.name!r} is listed twice",
                hint="the lock is damaged; export it again",
            )
        names.add(m.name)
        for f in m.files:
            key = (m.repo, m.commit, f.path)
            other = by_repo_path.setdefault(key, f)
            blob = by_blob.setdefault(m.blob_relpath(f), f)
            if (other.sha256, other.size) != (f.sha256, f.size) or (blob.sha256, blob.size) != (f.sha256, f.size):
                raise BundleError(
                    f"{where}: duplicate entry {m.repo}/{f.path} with two different contents",
                    hint="the lock is damaged; export it again",
                )
