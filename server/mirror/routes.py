"""``localrun mirror``: the store served as a Hugging Face hub endpoint, read-only.

On another machine ``HF_ENDPOINT=http://HOST:PORT`` then makes huggingface_hub
(``hf_hub_download``, ``snapshot_download``, ``model_info``, ``list_repo_files`` /
``list_repo_tree`` / ``list_repo_refs``, ``list_models``), ``hf download``, llama.cpp's
``-hf`` and ``localrun pull`` / ``search`` work unchanged. The routes (reference A1.2):

    GET       /api/models?search=&author=&filter=&limit=        the store's repos
    GET       /api/models/{ns}/{name}[/revision/{rev}]          id, sha, siblings (?blobs=true: sizes, oids, lfs)
    GET       /api/models/{ns}/{name}/tree/{rev}[/{path}]       files and folders (?recursive=true)
    GET       /api/models/{ns}/{name}/refs                      branches (→ commits), tags, converts
    HEAD/GET  /{ns}/{name}/resolve/{rev}/{path}                 the bytes; Range → 206

Paths are split from the raw request path, segment by segment, so a revision sent as
``refs%2Fpr%2F1`` stays one segment. Every answer comes from :mod:`localrun.modelstore.hub_catalog`;
a HEAD is a catalog lookup and a stat. Errors carry ``X-Error-Code`` (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``) and ``X-Repo-Commit`` where the commit is known,
which huggingface_hub turns into its typed errors. No Xet header is ever sent.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localrun.errors import InvalidName, LocalrunError, VerificationFailed
from localrun.modelstore.hub_catalog import (
    MirrorCommit,
    MirrorFile,
    MirrorRepo,
    etag_of,
    valid_repo_part,
)
from localrun.modelstore.names import safe_relpath
from localrun.server.errors import SHAPES_KEY, error_response, shapes_of
from localrun.server.mirror import answers
from localrun.server.mirror.errors import HUB, LISTING, RESOLVING, hub_error, owns_file, owns_listing
from localrun.server.mirror.files import FileSlice, GrowingFile, RangeNotSatisfiable, parse_range
from localrun.server.mirror.listing import Mirror, info, list_models, refs, tree, with_upstream_hits
from localrun.server.openapi import documented

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from localrun.modelstore.store import ModelStore
    from localrun.server.mirror.pull_through import Upstream
    from localrun.settings import Settings

logger = logging.getLogger(__name__)

DEFAULT_MIRROR_PORT = 8740


def _segments(request: Request) -> list[str]:
    """The raw path's segments, each percent-decoded on its own (``%2F`` stays inside one)."""
    raw = request.scope.get("raw_path") or quote(request.scope.get("path", "")).encode()
    try:
        return [unquote(s.decode("ascii"), errors="strict") for s in raw.split(b"/")[1:]]
    except UnicodeError:
        raise InvalidName(
            "the request path is not valid percent-encoded UTF-8", hint="quote file names as UTF-8"
        ) from None


def _repo_id(ns: str, name: str) -> str:
    if not (valid_repo_part(ns) and valid_repo_part(name)):
        raise InvalidName(
            f"invalid repo id {(ns + '/' + name)[:120]!r}",
            hint="a repo id is namespace/name: letters, digits, '-', '_' and '.'",
        )
    return f"{ns}/{name}"


def _relpath(parts: list[str]) -> str:
    joined = "/".join(parts)
    return str(safe_relpath(joined)) if joined else ""


async def _resolved(mirror: Mirror, repo_id: str, revision: str) -> tuple[MirrorRepo, MirrorCommit] | Response:
    repo, commit = await mirror.lookup(repo_id, revision)
    if repo is None:
        return hub_error(404, f"Repository {repo_id} not found on this mirror", code="RepoNotFound")
    if commit is None:
        return hub_error(404, f"Revision {revision!r} not found in {repo_id} on this mirror", code="RevisionNotFound")
    return repo, commit


def _flag(request: Request, name: str) -> bool:
    return (request.query_params.get(name) or "").lower() in ("1", "true", "yes")


@documented(answer=answers.HubListing, tag="mirror", query=answers.HUB_QUERY)
async def api_models(request: Request) -> Response:
    """Every ``/api/models…`` route, dispatched on raw path segments."""
    mirror: Mirror = request.app.state.mirror
    try:
        segs = _segments(request)[2:]
        if not segs or segs == [""]:
            hits = list_models(mirror, request)
            if mirror.upstream is not None:
                hits = await with_upstream_hits(mirror.upstream, request, hits)
            return JSONResponse(hits)
        if len(segs) < 2:
            return hub_error(404, "no such route on this mirror")
        repo_id, rest = _repo_id(segs[0], segs[1]), segs[2:]
        if rest == ["refs"]:
            repo, _ = await mirror.lookup(repo_id, "main")
            if repo is None:
                return hub_error(404, f"Repository {repo_id} not found on this mirror", code="RepoNotFound")
            return JSONResponse(refs(repo, _flag(request, "include_prs")))
        if not rest or (len(rest) == 2 and rest[0] == "revision"):
            found = await _resolved(mirror, repo_id, rest[1] if rest else "main")
            if isinstance(found, Response):
                return found
            return JSONResponse(await info(mirror, *found, blobs=_flag(request, "blobs")), headers=_warning(found[0]))
        if len(rest) >= 2 and rest[0] == "tree":
            found = await _resolved(mirror, repo_id, rest[1])
            if isinstance(found, Response):
                return found
            prefix = _relpath(rest[2:])
            entries = await tree(mirror, found[1], prefix, _flag(request, "recursive"))
            if entries is None:
                return hub_error(
                    404, f"{prefix!r} is not a folder of {repo_id}", code="EntryNotFound", commit=found[1].commit
                )
            return JSONResponse(entries, headers=_warning(found[0]))
        return hub_error(404, "no such route on this mirror")
    except LocalrunError as exc:
        return error_response(exc, HUB)


def _warning(repo: MirrorRepo) -> dict[str, str]:
    """``X-HF-Warning`` (logged once per topic by huggingface_hub) when serving a stale copy."""
    return {"X-HF-Warning": f"localrun-mirror; {repo.warning}"} if repo.warning else {}


def _file_headers(f: MirrorFile, commit: str, etag: str | None) -> dict[str, str]:
    return {
        "X-Repo-Commit": commit,
        "ETag": f'"{etag}"',
        "X-Linked-Etag": f'"{etag}"',
        "X-Linked-Size": str(f.size),
        "Accept-Ranges": "bytes",
        "Content-Type": "application/octet-stream",
        "Cache-Control": "no-transform",
    }


@documented(media="application/octet-stream", tag="mirror")
async def resolve(request: Request) -> Response | FileSlice | GrowingFile:
    """HEAD/GET ``/{ns}/{name}/resolve/{rev}/{path}``: a verified file, whole or a Range of it."""
    mirror: Mirror = request.app.state.mirror
    try:
        segs = _segments(request)
        if len(segs) < 5 or segs[2] != "resolve":
            return hub_error(404, "no such route on this mirror")
        repo_id, revision, path = _repo_id(segs[0], segs[1]), segs[3], _relpath(segs[4:])
        found = await _resolved(mirror, repo_id, revision)
        if isinstance(found, Response):
            return found
        repo, commit = found
        f = commit.files.get(path)
        if f is None and mirror.upstream is not None:  # the store holds this commit, but not this file
            up = await mirror.upstream.lookup(repo_id, revision)
            if up is not None and up[1].commit == commit.commit:
                f = up[1].files.get(path)
        if f is None:
            return hub_error(
                404, f"{path!r} is not in {repo_id} at {commit.commit[:12]}", code="EntryNotFound", commit=commit.commit
            )
        if (
            mirror.upstream is not None
            and mirror.upstream.pending(f)
            and (request.method == "HEAD" or "range" not in request.headers)
        ):
            return _not_fetched_yet(mirror, mirror.upstream, request, (repo, commit, f))
        key = await mirror.verified(f)
        etag = etag_of(f, mirror.verifier.sha256(f))
        headers = {**_file_headers(f, commit.commit, etag), **_warning(repo)}
        try:
            span = parse_range(request.headers.get("range"), f.size)
        except RangeNotSatisfiable as exc:
            return Response(
                str(exc),
                status_code=416,
                headers={**headers, "Content-Range": f"bytes */{f.size}", "Content-Type": "text/plain"},
            )
        start, end = span or (0, f.size)
        headers["Content-Length"] = str(end - start)
        if span:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"

        def refuse() -> Response:
            return hub_error(
                409,
                f"{path} changed on the mirror host just now; it is checked again on the next request",
                commit=commit.commit,
            )

        return FileSlice(
            f.disk,
            start,
            end,
            status=206 if span else 200,
            headers=headers,
            good_key=key,
            on_changed=lambda: mirror.verifier.forget(f),
            refuse=refuse,
        )
    except VerificationFailed as exc:
        logger.warning("mirror: refusing %s: %s", request.url.path[:200], exc.message)
        return error_response(exc, HUB)
    except LocalrunError as exc:
        return error_response(exc, HUB)
    except OSError as exc:  # the store's disk, not the request: say so rather than a bare 500
        logger.warning("mirror: cannot read for %s: %s", request.url.path[:200], exc)
        return hub_error(503, f"the mirror cannot read this file right now ({exc.strerror or type(exc).__name__})")


def _not_fetched_yet(
    mirror: Mirror, upstream: Upstream, request: Request, found: tuple[MirrorRepo, MirrorCommit, MirrorFile]
) -> Response | GrowingFile:
    """An upstream file not here yet: HEAD from the listing; GET streams while it is fetched."""
    repo, commit, f = found
    headers = {**_file_headers(f, commit.commit, etag_of(f, f.sha256)), "Content-Length": str(f.size), **_warning(repo)}
    if request.method == "HEAD":
        return Response(b"", headers=headers)
    done = upstream.start_fetch(f)
    done.add_done_callback(
        lambda fut: None if fut.cancelled() or fut.exception() else mirror.verifier.trust(f, fut.result())
    )
    return GrowingFile(f.disk + ".incomplete", f.size, headers=headers, done=done, expect=upstream.expected(f))


async def not_found(request: Request, exc: Exception | None = None) -> Response:
    return hub_error(404, f"no route {request.method} {request.url.path[:200]} on this mirror")


async def root(request: Request) -> Response:
    return Response("localrun mirror: set HF_ENDPOINT to this URL\n", media_type="text/plain")


def install_mirror(app: Starlette, mirror: Mirror) -> None:
    """Add the mirror's routes to ``app`` (a Starlette or FastAPI app): its own, or the server's."""
    from starlette.routing import Route

    app.state.mirror = mirror
    shapes = shapes_of(app).with_family(owns_listing, LISTING).with_family(owns_file, RESOLVING)
    setattr(app.state, SHAPES_KEY, shapes)
    app.router.routes.extend(
        [
            Route("/api/models", api_models, methods=["GET"]),
            Route("/api/models/{rest:path}", api_models, methods=["GET"]),
            Route("/{ns}/{name}/resolve/{rest:path}", resolve, methods=["GET", "HEAD"]),
        ]
    )


def create_mirror_app(settings: Settings, store: ModelStore, *, upstream: Upstream | None = None) -> Starlette:
    """The standalone mirror: its routes behind the server's Host and key guards."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    from localrun.server.metrics import Metrics, Observe
    from localrun.server.security import HostGuard, RequestGuard, allowed_host_names

    app = Starlette(
        routes=[Route("/", root, methods=["GET", "HEAD"])], exception_handlers={404: not_found, 405: not_found}
    )
    install_mirror(app, Mirror(store, upstream=upstream))
    server = settings.server
    key = server.api_key.get_secret_value() if server.api_key else None
    app.add_middleware(RequestGuard, api_key=key, max_body_bytes=server.max_body_bytes)
    app.add_middleware(HostGuard, allowed=allowed_host_names(server.host, server.allowed_hosts))
    app.add_middleware(Observe, metrics=Metrics())  # outermost: one log line per request, refusals too
    app.state.started_at = time.monotonic()
    return app
