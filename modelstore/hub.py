"""Talking to the hub: where it is, who we are, what a repo holds, and search.

Listing and search go through :mod:`localrun.modelstore.hub_http` (every request under a
connect, first-byte and stall deadline; huggingface_hub's ``HfApi`` has none). Everything
that arrives from the network is validated here, where it is parsed: file names with
:func:`~localrun.modelstore.names.safe_relpath`, commit hashes and hashes by shape. A
listing with one bad name is refused whole, because a hub that sends such a name is not
one to take bytes from.

huggingface_hub reads its environment once, at import; localrun reads ``HF_ENDPOINT``,
``HF_TOKEN``, ``HF_HUB_OFFLINE`` and the cache location on every call instead, and passes
endpoint and token explicitly, so settings and tests that change them take effect.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localrun.errors import AccessDenied, DownloadFailed, InvalidName, ModelNotFound
from localrun.modelstore.names import safe_relpath
from localrun.types import Format

if TYPE_CHECKING:
    import httpx

    from localrun.modelstore.hub_http import Params
    from localrun.settings import Settings

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_TRUE = {"1", "on", "yes", "true"}
#: What `search(format=…)` filters on: the hub tag each format's repos carry.
FORMAT_TAGS = {Format.GGUF: "gguf", Format.MLX: "mlx", Format.MLC: "mlc-llm"}


def hub_endpoint(settings: Settings | None = None) -> str:
    """settings.hub.endpoint, else HF_ENDPOINT, else huggingface.co (no trailing slash)."""
    configured = getattr(getattr(settings, "hub", None), "endpoint", None)
    return (configured or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_offline(settings: Settings | None = None, offline: bool = False) -> bool:
    if offline or getattr(getattr(settings, "hub", None), "offline", False):
        return True
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _env_path(value: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(value)))


def shared_hf_home() -> Path:
    """huggingface_hub's own rule (its ``constants.py``): HF_HOME, else XDG_CACHE_HOME/huggingface,
    else ~/.cache/huggingface; read at each call because huggingface_hub freezes it at import."""
    if os.environ.get("HF_HOME"):
        return _env_path(os.environ["HF_HOME"])
    return _env_path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"


def hf_home() -> Path:
    """Where localrun keeps the HF cache it writes: HF_HOME when set; else, when LOCALRUN_HOME is
    set, ``$LOCALRUN_HOME/huggingface`` (LOCALRUN_HOME holds everything: a portable install or a
    test writes nothing outside it); else the cache huggingface_hub and llama.cpp share."""
    home = os.environ.get("LOCALRUN_HOME")
    if home and not os.environ.get("HF_HOME"):
        return _env_path(home) / "huggingface"
    return shared_hf_home()


def _hub_dir(home: Path) -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return _env_path(os.environ[var])
    return home / "hub"


def hub_cache_dir() -> Path:
    """The one HF cache locator, where pulls and bundles write: HF_HUB_CACHE → HUGGINGFACE_HUB_CACHE
    (its old name) → :func:`hf_home`/hub."""
    return _hub_dir(hf_home())


def hub_cache_dirs() -> list[Path]:
    """Where discovery looks: localrun's HF cache, then the one huggingface_hub shares (the same
    folder unless LOCALRUN_HOME moved localrun's), so `ls --all` still finds what `hf download` fetched."""
    return list(dict.fromkeys([hub_cache_dir(), _hub_dir(shared_hf_home())]))


def hub_token() -> str | None:
    """HF_TOKEN > HUGGING_FACE_HUB_TOKEN > the token file `hf auth login` writes (HF_TOKEN_PATH, else
    under localrun's HF home, else huggingface_hub's: a token is the person's, wherever data lives)."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        value = os.environ.get(var, "").strip()
        if value:
            return value
    path = os.environ.get("HF_TOKEN_PATH")
    files = [_env_path(path)] if path else [hf_home() / "token", shared_hf_home() / "token"]
    for token_file in files:
        try:
            return token_file.read_text().strip() or None
        except OSError:
            continue
    return None


#: How long the reachability probe may take in all (DNS, then TCP connect): the bound on
#: "say offline" when there is no network, instead of huggingface_hub's ~24 s of retries.
PROBE_TIMEOUT_S = 1.5
_PROBE_OK_TTL_S = 30.0
_PROBE_FAIL_TTL_S = 3.0
_probe_cache: dict[tuple[str, int], tuple[float, str | None]] = {}
_probe_lock = threading.Lock()


def _probe(host: str, port: int, timeout: float) -> str | None:
    """None when a TCP connection to host:port opens within ``timeout``, else why not.

    getaddrinfo has no timeout (a dead resolver can hold it for 5 s per attempt), so it
    runs on a daemon thread that is simply not waited for past the deadline.
    """
    deadline = time.monotonic() + timeout
    box: dict[str, Any] = {}

    def resolve() -> None:
        try:
            box["addrs"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            box["error"] = exc

    t = threading.Thread(target=resolve, name="localrun-hub-dns", daemon=True)
    t.start()
    t.join(timeout)
    if "error" in box:
        return f"cannot resolve {host} ({box['error'].strerror or box['error']})"
    if "addrs" not in box:
        return f"no answer resolving {host} within {timeout:.1f} s"
    last = None
    for family, kind, proto, _, addr in box["addrs"]:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(left)
                sock.connect(addr)
                return None
        except OSError as exc:
            last = exc
    return f"cannot connect to {host}:{port} ({getattr(last, 'strerror', None) or last or 'timed out'})"


def check_reachable(endpoint: str, *, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise DownloadFailed saying "offline" unless ``endpoint`` accepts a connection now.

    Cached briefly (a success for 30 s, a failure for 3 s) so a burst of calls costs one
    probe. Called before every listing or search: with no network the answer comes within
    ``timeout`` instead of after huggingface_hub's connect retries.
    """
    from urllib.parse import urlsplit

    u = urlsplit(endpoint)
    host, port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
    key, now = (host, port), time.monotonic()
    with _probe_lock:
        hit = _probe_cache.get(key)
    if hit and now - hit[0] < (_PROBE_OK_TTL_S if hit[1] is None else _PROBE_FAIL_TTL_S):
        problem = hit[1]
    else:
        problem = _probe(host, port, timeout)
        with _probe_lock:
            _probe_cache[key] = (time.monotonic(), problem)
    if problem:
        raise DownloadFailed(
            f"offline: cannot reach the hub at {endpoint} ({problem})",
            hint="connect to the network, point HF_ENDPOINT at a mirror (`localrun mirror` on another machine), "
            "or set HF_HUB_OFFLINE=1 to use only the models on disk",
        )


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo listing. ``sha256`` is set for LFS files, ``oid`` (git sha1) always."""

    path: str
    size: int
    sha256: str | None
    oid: str | None

    @property
    def etag(self) -> str:
        """The name the HF cache gives this file's blob: sha256 for LFS, else the git oid."""
        return self.sha256 or self.oid or ""


@dataclass(frozen=True)
class RepoListing:
    repo: str
    revision: str  # as asked for: a branch, a tag or a commit
    commit: str  # the 40-hex commit it resolved to
    files: tuple[RemoteFile, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def file(self, path: str) -> RemoteFile:
        """The listed file at ``path``; ModelNotFound when the listing has none."""
        found = next((f for f in self.files if f.path == path), None)
        if found is None:
            raise ModelNotFound(f"{self.repo}@{self.commit[:10]} lists no {path!r}", hint="list the repo again")
        return found


@dataclass(frozen=True)
class RepoSummary:
    """One search hit."""

    name: str
    downloads: int
    likes: int
    updated: datetime | None
    tags: tuple[str, ...] = ()
    gated: bool = False


def validate_commit(value: object, *, where: str) -> str:
    if not isinstance(value, str) or not _COMMIT_RE.match(value):
        raise InvalidName(
            f"{where}: the hub sent an invalid commit hash {str(value)[:80]!r}",
            hint="check HF_ENDPOINT points at a real hub",
        )
    return value


def remote_file_from_listing(path: object, size: object, sha256: object, oid: object, *, repo: str) -> RemoteFile:
    """Validate one listing entry; every field is untrusted."""
    rel = str(safe_relpath(path))
    if rel != path:
        raise InvalidName(f"{repo}: listing has a non-canonical file name {str(path)[:120]!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > 1 << 50:
        raise InvalidName(f"{repo}: listing gives {rel!r} an impossible size {size!r}")
    if sha256 is not None and (not isinstance(sha256, str) or not _SHA256_RE.match(sha256)):
        raise InvalidName(f"{repo}: listing gives {rel!r} an invalid sha256 {str(sha256)[:80]!r}")
    if oid is not None and (not isinstance(oid, str) or not _COMMIT_RE.match(oid)):
        oid = None  # only used to verify small non-LFS files; without it they get size checks
    return RemoteFile(rel, size, sha256, oid)


def _translate(exc: Exception, repo: str, revision: str | None, endpoint: str, token: str | None) -> Exception:
    """A hub status answer or a malformed listing -> a LocalrunError a person can act on."""
    from localrun.modelstore.hub_http import HubStatus

    login = "run `hf auth login` or set HF_TOKEN" + (" (the token sent was refused)" if token else "")
    if isinstance(exc, HubStatus):
        status, code = exc.status, exc.code
        if code == "GatedRepo" or status == 403:
            return AccessDenied(
                f"{repo} is gated or private and this account has no access to it",
                hint=f"accept its terms on the hub, then {login}",
            )
        if status == 401:
            return AccessDenied(
                f"{repo} is not accessible: it does not exist, or it is private or gated",
                hint=f"check the name; if it is private or gated, {login}",
            )
        if code == "RevisionNotFound":
            return ModelNotFound(
                f"{repo} has no revision {revision!r}", hint="check --revision (a branch, tag or commit)"
            )
        if code == "RepoNotFound" or status == 404:
            return ModelNotFound(f"no repo {repo} on {endpoint}", hint="check the name; `localrun search` finds repos")
        return DownloadFailed(
            f"the hub at {endpoint} answered {status} for {repo}" + (f": {exc.message}" if exc.message else ""),
            hint="try again later",
        )
    if isinstance(exc, (KeyError, TypeError, ValueError, AttributeError)):  # what parsing a malformed answer raises
        return DownloadFailed(
            f"the hub at {endpoint} sent a malformed answer for {repo}: {exc!r}",
            hint="check that HF_ENDPOINT points at a Hugging Face hub or mirror",
        )
    return exc


def _listing_entry(e: object, repo: str) -> RemoteFile | None:
    """One tree entry (untrusted JSON) -> a RemoteFile; None for a folder (its name still checked)."""
    if not isinstance(e, dict):
        raise TypeError(f"tree entry is {type(e).__name__}, not an object")
    if e.get("type") == "directory":
        safe_relpath(e["path"])
        return None
    if e.get("type") != "file":
        raise ValueError(f"tree entry of type {e.get('type')!r}")
    lfs = e.get("lfs")
    if lfs is not None and not isinstance(lfs, dict):
        raise TypeError("tree entry's lfs is not an object")
    return remote_file_from_listing(e["path"], e["size"], lfs.get("oid") if lfs else None, e.get("oid"), repo=repo)


def _parse_date(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class HubClient:
    """Listing and search against one endpoint with one token, every request under deadlines."""

    def __init__(
        self, *, endpoint: str | None = None, token: str | None = None, settings: Settings | None = None
    ) -> None:
        from localrun.modelstore.hub_http import Deadlines

        self.endpoint = (endpoint or hub_endpoint(settings)).rstrip("/")
        self.token = token if token is not None else hub_token()
        self.deadlines = Deadlines.from_settings(settings)

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def file_url(self, repo: str, commit: str, path: str) -> str:
        from urllib.parse import quote

        return f"{self.endpoint}/{repo}/resolve/{commit}/{quote(path)}"

    def _get(
        self,
        client: httpx.Client,
        path: str,
        params: Params | None = None,
        *,
        pages: bool = False,
        limit: int | None = None,
    ) -> Any:
        from localrun.modelstore import hub_http

        url, headers = f"{self.endpoint}{path}", self.auth_headers()
        if pages:
            return hub_http.get_pages(
                client,
                url,
                endpoint=self.endpoint,
                deadlines=self.deadlines,
                params=params,
                headers=headers,
                limit=limit,
            )
        return hub_http.get_json(
            client, url, endpoint=self.endpoint, deadlines=self.deadlines, params=params, headers=headers
        )[0]

    def list_repo(self, repo: str, revision: str | None = None) -> RepoListing:
        """Resolve ``revision`` to a commit and list every file at it, with sizes and LFS sha256."""
        from urllib.parse import quote

        rev = revision or "main"
        check_reachable(self.endpoint)
        safe_relpath(repo)  # it goes into the URL path
        try:
            with self.deadlines.client() as http:
                info = self._get(http, f"/api/models/{repo}/revision/{quote(rev, safe='')}")
                if not isinstance(info, dict):
                    raise TypeError("model info is not an object")
                commit = validate_commit(info.get("sha"), where=repo)
                entries = self._get(http, f"/api/models/{repo}/tree/{commit}", {"recursive": "true"}, pages=True)
            files = [f for f in (_listing_entry(e, repo) for e in entries) if f is not None]
        except (InvalidName, DownloadFailed):
            raise
        except Exception as exc:
            translated = _translate(exc, repo, rev, self.endpoint, self.token)
            if translated is exc:
                raise
            raise translated from exc
        seen: set[str] = set()
        for f in files:
            if f.path.lower() in seen:  # would collide on case-insensitive file systems
                raise InvalidName(f"{repo}: listing names {f.path!r} twice (ignoring case)")
            seen.add(f.path.lower())
        logger.debug("listed %s@%s (%s): %d files", repo, rev, commit, len(files))
        return RepoListing(repo, rev, commit, tuple(files))

    def search(self, query: str, *, format: Format | str | None = None, limit: int = 20) -> list[RepoSummary]:
        tag = FORMAT_TAGS.get(Format(format)) if format else None
        check_reachable(self.endpoint)
        params: list[tuple[str, str]] = [("sort", "downloads"), ("limit", str(limit))]
        if query:
            params.append(("search", query))
        if tag:
            params.append(("filter", tag))
        params += [("expand", k) for k in ("downloads", "likes", "lastModified", "tags", "gated")]
        try:
            with self.deadlines.client() as http:
                hits = self._get(http, "/api/models", tuple(params), pages=True, limit=limit)
            return [
                RepoSummary(
                    name=str(m["id"]),
                    downloads=_count(m.get("downloads")),
                    likes=_count(m.get("likes")),
                    updated=_parse_date(m.get("lastModified")),
                    tags=tuple(t for t in (m.get("tags") or ()) if isinstance(t, str)),
                    gated=bool(m.get("gated")),
                )
                for m in hits
            ]
        except DownloadFailed:
            raise
        except Exception as exc:
            translated = _translate(exc, f"search {query!r}", None, self.endpoint, self.token)
            if translated is exc:
                raise
            raise translated from exc


def search(
    query: str, *, format: Format | str | None = None, limit: int = 20, settings: Settings | None = None
) -> list[RepoSummary]:
    """Repos on the hub matching ``query``, most downloaded first; ``format`` narrows by tag."""
    if hub_offline(settings):
        raise DownloadFailed(
            "offline mode: the hub is not searched", hint="unset HF_HUB_OFFLINE (or drop --offline) to search"
        )
    return HubClient(settings=settings).search(query, format=format, limit=limit)
