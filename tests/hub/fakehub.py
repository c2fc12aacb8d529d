"""A fake Hugging Face hub: a real HTTP server on 127.0.0.1 in a thread.

It serves the routes huggingface_hub 2.4 and localrun's downloader call (model info and
revision, tree listing with LFS sha256 and sizes, resolve with ETag / X-Repo-Commit /
Content-Length, HEAD and Range, search), so tests never touch the network. Faults are
knobs on :attr:`FakeHub.faults`: throttle, drop the connection at a byte offset, ignore
Range, answer 403 with an HTML body, redirect to another host. Every request is logged
(:attr:`FakeHub.requests`) so tests can count the bytes a pull really fetched.

    hub = FakeHub().start()
    hub.add_repo("org/model-GGUF", {"model-Q4_K_M.gguf": data}, tags=("gguf",))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

#: Files stored through Git LFS on the fake hub (the others are plain git blobs).
LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".so", ".dylib", ".dll", ".pt", ".pth")

_RESOLVE = re.compile(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")
_API_REPO = re.compile(r"^/api/models/([^/]+)/([^/]+)(?:/(revision|tree)/([^/]+)(?:/(.*))?)?$")


def git_blob_oid(data: bytes) -> str:
    """The git sha1 of a blob: what the hub calls ``oid`` and uses as ETag for non-LFS files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fake_commit(*parts: str) -> str:
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()


@dataclass
class FakeFile:
    """A file of a commit. Hashes are computed once: a test that later swaps ``data``
    gets a hub whose listing still promises the old bytes (a tampering hub)."""

    path: str
    data: bytes
    lfs: bool

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @functools.cached_property
    def oid(self) -> str:
        return git_blob_oid(self.data)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.oid

    def tree_entry(self) -> dict:
        entry = {"type": "file", "path": self.path, "size": len(self.data), "oid": self.oid}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": len(self.data), "pointerSize": 134}
        return entry


@dataclass
class FakeRepo:
    repo_id: str
    commits: dict[str, dict[str, FakeFile]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    token: str | None = None
    tags: tuple[str, ...] = ()
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2026-11-01T00:00:00.000Z"
    extra_tree: list[dict] = field(default_factory=list)
    """Raw tree entries served as-is (hostile names): a listing no real hub would send."""

    def commit_for(self, rev: str) -> str | None:
        if rev in self.commits:
            return rev
        return self.refs.get(rev)


@dataclass
class Faults:
    """Misbehaviour switches; each applies to resolve GETs (optionally of one path only)."""

    throttle_bps: float | None = None
    drop_at: int | None = None  # cut the connection once this file offset is reached
    drop_times: int = 1  # how many GETs are cut (then the knob disarms itself)
    hold: threading.Event | None = None  # at drop_at, go silent until this is set, then cut (a stall)
    drip_at: int | None = None  # from this file offset send one byte every drip_gap_s (one GET, then disarmed)
    drip_gap_s: float = 0.3
    drip_for_s: float = 30.0  # then cut the connection: a client that never cuts the drip still ends
    ignore_range: bool = False
    forbidden_html: bool = False
    redirect_to: str | None = None  # base URL of another host serving the same repos
    only_path: str | None = None

    def applies(self, path: str) -> bool:
        return self.only_path is None or self.only_path == path


@dataclass
class RequestLog:
    method: str
    path: str
    range: str | None
    authorization: str | None
    status: int = 0
    bytes_sent: int = 0


class FakeHub:
    """The server plus its repos. Use as a context manager or call start()/stop()."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.faults = Faults()
        self.requests: list[RequestLog] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fakehub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "FakeHub not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- content ----------------------------------------------------------------------
    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        gated: bool = False,
        token: str | None = None,
        tags: tuple[str, ...] = (),
        downloads: int = 0,
        likes: int = 0,
    ) -> FakeRepo:
        repo = FakeRepo(repo_id, gated=gated, token=token, tags=tuple(tags), downloads=downloads, likes=likes)
        self.repos[repo_id] = repo
        self.add_revision(repo_id, "main", files)
        return repo

    def add_revision(self, repo_id: str, ref: str, files: dict[str, bytes]) -> str:
        """Add a commit holding ``files`` and point ``ref`` (a branch or tag name) at it."""
        repo = self.repos[repo_id]
        commit = fake_commit(repo_id, ref, *sorted(files))
        repo.commits[commit] = {p: FakeFile(p, d, p.endswith(LFS_SUFFIXES)) for p, d in files.items()}
        repo.refs[ref] = commit
        return commit

    def file(self, repo_id: str, path: str, rev: str = "main") -> FakeFile:
        repo = self.repos[repo_id]
        return repo.commits[repo.commit_for(rev)][path]

    def share_repos_with(self, other: FakeHub) -> FakeHub:
        """Serve the very same repos as ``other`` (a CDN host for redirect tests)."""
        self.repos = other.repos
        return self

    # -- accounting -------------------------------------------------------------------
    def log(self, entry: RequestLog) -> None:
        with self._lock:
            self.requests.append(entry)

    def bytes_served(self, path_suffix: str = "") -> int:
        with self._lock:
            return sum(
                r.bytes_sent
                for r in self.requests
                if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(path_suffix)
            )

    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    fake: FakeHub  # set by FakeHub.start

    def log_message(self, format: str, *args) -> None:  # keep pytest output clean
        return

    # -- plumbing ---------------------------------------------------------------------
    def _entry(self) -> RequestLog:
        entry = RequestLog(
            self.command, urlsplit(self.path).path, self.headers.get("Range"), self.headers.get("Authorization")
        )
        self.fake.log(entry)
        return entry

    def _send(
        self,
        entry: RequestLog,
        status: int,
        body: bytes = b"",
        headers: dict | None = None,
        ctype: str = "application/json",
    ) -> None:
        entry.status = status
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, entry: RequestLog, obj, status: int = 200, headers: dict | None = None) -> None:
        self._send(entry, status, json.dumps(obj).encode(), headers)

    def _error(self, entry: RequestLog, status: int, code: str, message: str) -> None:
        self._json(entry, {"error": message}, status, {"X-Error-Code": code, "X-Error-Message": message})

    def _authorized(self, repo: FakeRepo) -> bool:
        if not repo.gated:
            return True
        return repo.token is not None and self.headers.get("Authorization") == f"Bearer {repo.token}"

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        entry = self._entry()
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        try:
            if url.path == "/api/agent-harnesses":
                return self._json(entry, {"standardEnvVars": [], "harnesses": {}})
            if url.path == "/api/models":
                return self._search(entry, query)
            m = _API_REPO.match(url.path)
            if m:
                return self._api_repo(entry, m, query)
            m = _RESOLVE.match(url.path)
            if m:
                return self._resolve(entry, f"{m[1]}/{m[2]}", unquote(m[3]), unquote(m[4]))
            return self._error(entry, 404, "NotFound", f"no route {url.path}")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- routes -----------------------------------------------------------------------
    def _repo_or_error(self, entry: RequestLog, repo_id: str) -> FakeRepo | None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._error(entry, 404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        if not self._authorized(repo):
            self._error(
                entry,
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access "
                "it.",
            )
            return None
        return repo

    def _search(self, entry: RequestLog, query: dict) -> None:
        text = (query.get("search") or [""])[0].lower()
        wanted_tags = set(query.get("filter") or [])
        repos = [r for r in self.fake.repos.values() if text in r.repo_id.lower() and wanted_tags <= set(r.tags)]
        if (query.get("sort") or [""])[0] in ("downloads", ""):
            repos.sort(key=lambda r: -r.downloads)
        limit = int((query.get("limit") or ["1000"])[0])
        out = [
            {
                "id": r.repo_id,
                "modelId": r.repo_id,
                "downloads": r.downloads,
                "likes": r.likes,
                "lastModified": r.last_modified,
                "tags": list(r.tags),
                "gated": bool(r.gated),
                "private": False,
            }
            for r in repos[:limit]
        ]
        self._json(entry, out)

    def _api_repo(self, entry: RequestLog, m: re.Match, query: dict) -> None:
        repo = self._repo_or_error(entry, f"{m[1]}/{m[2]}")
        if repo is None:
            return
        rev = unquote(m[4]) if m[4] else "main"
        commit = repo.commit_for(rev)
        if commit is None:
            return self._error(entry, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        files = repo.commits[commit]
        if m[3] == "tree":
            recursive = (query.get("recursive") or ["false"])[0].lower() == "true"
            return self._json(entry, _tree(files, repo.extra_tree, (m[5] or "").strip("/"), recursive))
        siblings = []
        for f in files.values():
            s: dict = {"rfilename": f.path}
            if query.get("blobs"):
                s.update(size=len(f.data), blobId=f.oid)
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": 134}
            siblings.append(s)
        self._json(
            entry,
            {
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": commit,
                "siblings": siblings,
                "tags": list(repo.tags),
                "downloads": repo.downloads,
                "likes": repo.likes,
                "lastModified": repo.last_modified,
                "gated": "manual" if repo.gated else False,
                "private": False,
            },
        )

    def _resolve(self, entry: RequestLog, repo_id: str, rev: str, path: str) -> None:
        faults = self.fake.faults
        repo = self._repo_or_error(entry, repo_id)
        if repo is None:
            return
        commit = repo.commit_for(rev)
        if commit is None:
            return self._error(entry, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        f = repo.commits[commit].get(path)
        if f is None:
            return self._error(entry, 404, "EntryNotFound", f"{path} does not exist on {rev}")
        get = self.command == "GET"
        if get and faults.applies(path) and faults.forbidden_html:
            return self._send(
                entry,
                403,
                b"<!DOCTYPE html><html><body><h1>403 Forbidden</h1>Request blocked.</body></html>",
                ctype="text/html",
            )
        if get and faults.applies(path) and faults.redirect_to:
            location = f"{faults.redirect_to}/{repo_id}/resolve/{quote(rev, safe='')}/{quote(path)}"
            return self._send(
                entry,
                302,
                b"",
                {
                    "Location": location,
                    "X-Repo-Commit": commit,
                    "X-Linked-Etag": f'"{f.etag}"',
                    "X-Linked-Size": str(len(f.data)),
                },
            )
        headers = {"X-Repo-Commit": commit, "ETag": f'"{f.etag}"', "Accept-Ranges": "bytes"}
        size = len(f.data)
        start, end = 0, size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng and not (get and faults.applies(path) and faults.ignore_range):
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if m is None or int(m[1]) >= size:
                return self._send(entry, 416, b"", {"Content-Range": f"bytes */{size}"})
            start, end = int(m[1]), min(int(m[2]) if m[2] else size - 1, size - 1)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        entry.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if get:
            self._stream(entry, f, start, end + 1, path)

    def _stream(self, entry: RequestLog, f: FakeFile, start: int, stop: int, path: str) -> None:
        faults = self.fake.faults
        applies = faults.applies(path)
        drop_at = (
            faults.drop_at
            if applies and faults.drop_at is not None and faults.drop_times > 0 and start < faults.drop_at < stop
            else None
        )
        if drop_at is not None:
            faults.drop_times -= 1
            if faults.drop_times <= 0:
                faults.drop_at = None
        drip = faults.drip_at if applies and faults.drip_at is not None and start <= faults.drip_at < stop else None
        if drip is not None:
            faults.drip_at = None
            self._send_body(entry, f, start, drip)
            self._drip(entry, f, drip, stop)
            return
        throttle = faults.throttle_bps if applies else None
        step = 64 * 1024 if throttle else 1024 * 1024
        view = memoryview(f.data)
        began = time.monotonic()
        pos = start
        limit = drop_at if drop_at is not None else stop
        while pos < limit:
            n = min(step, limit - pos)
            self.wfile.write(view[pos : pos + n])
            pos += n
            entry.bytes_sent += n
            if throttle:
                ahead = (pos - start) / throttle - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)
        if drop_at is not None:
            self.wfile.flush()
            if faults.hold is not None:
                faults.hold.wait(120)
            self.close_connection = True
            self.connection.shutdown(2)

    def _send_body(self, entry: RequestLog, f: FakeFile, start: int, stop: int) -> None:
        self.wfile.write(memoryview(f.data)[start:stop])
        entry.bytes_sent += stop - start

    def _drip(self, entry: RequestLog, f: FakeFile, pos: int, stop: int) -> None:
        """One byte every ``drip_gap_s`` (inside any stall deadline), for ``drip_for_s``, then a cut."""
        faults = self.fake.faults
        until = time.monotonic() + faults.drip_for_s
        try:
            while pos < stop and time.monotonic() < until:
                self.wfile.write(f.data[pos : pos + 1])
                self.wfile.flush()
                pos += 1
                entry.bytes_sent += 1
                time.sleep(faults.drip_gap_s)
        except OSError:
            return  # the client cut it
        self.close_connection = True
        self.connection.shutdown(2)


def _tree(files: dict[str, FakeFile], extra: list[dict], under: str, recursive: bool) -> list[dict]:
    prefix = f"{under}/" if under else ""
    out: list[dict] = []
    folders: set[str] = set()
    for f in sorted(files.values(), key=lambda f: f.path):
        if not f.path.startswith(prefix):
            continue
        rest = f.path[len(prefix) :]
        parts = rest.split("/")
        for i in range(1, len(parts)):
            folder = prefix + "/".join(parts[:i])
            if folder not in folders and (recursive or i == 1):
                folders.add(folder)
                out.append({"type": "directory", "path": folder, "oid": fake_commit("tree", folder)})
        if recursive or len(parts) == 1:
            out.append(f.tree_entry())
    return out + list(extra)
