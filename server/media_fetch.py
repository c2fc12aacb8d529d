"""Fetching the ``http(s)://`` image URLs of a request (OpenAI ``image_url``, Anthropic's ``url``
source, Responses ``input_image``), only from hosts ``server.fetch_image_urls`` allows.

A server that fetches whatever URL it is sent lets every client reach what the server can:
cloud metadata endpoints, the LAN, other services on loopback (server-side request forgery).
So the list is empty by default and a remote URL is a 400 saying how to allow its host or to
send the image inline. When a host is allowed, each fetch has:

* a host check before the first byte, and again on every redirect (followed by hand, at most
  :data:`MAX_REDIRECTS`, never to a host the list does not allow, never to another scheme);
* one deadline for the whole fetch (``server.fetch_timeout_s``, redirects included), so a
  server that drips a byte at a time cannot hold the request;
* the size cap of inline media (``server.max_media_bytes``), from ``Content-Length`` when the
  server sends one, else counted as the body arrives (``Accept-Encoding: identity``, so a
  compressed body cannot inflate past it);
* no credentials (``trust_env=False``: no ``.netrc``, no proxy settings from the environment)
  and no cookies;
* then the same checks as inline data (:meth:`localrun.chat.media.MediaReader.resolved`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import logging
from urllib.parse import urljoin, urlsplit

import httpx
from starlette.requests import Request

from localrun import __version__
from localrun.chat.media import MediaLimits, MediaReader, RemoteMedia, shown
from localrun.errors import InvalidMedia
from localrun.settings import ServerSettings
from localrun.types import Media, Message

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5


def reader_for(request: Request) -> MediaReader:
    """A reader for one request's media under the app's caps (``server.max_media_*``)."""
    return MediaReader(MediaLimits.of(request.app.state.settings.server))


def host_allowed(url: str, patterns: list[str]) -> bool:
    """Whether ``url`` is http(s) and its host matches one of ``patterns`` (``*.example.com`` style)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    if parts.scheme not in ("http", "https") or not host:
        return False
    return any(fnmatch.fnmatchcase(host, p.strip().lower().strip("[]").rstrip(".")) for p in patterns if p.strip())


def _host(url: str) -> str:
    return urlsplit(url).hostname or "?"


def refuse_unallowed(item: RemoteMedia, patterns: list[str]) -> None:
    """The 400 for a URL whose host the settings do not allow (every URL, when they allow none)."""
    if host_allowed(item.url, patterns):
        return
    host = _host(item.url)
    why = (
        "this server fetches no image URLs (server.fetch_image_urls is empty)"
        if not patterns
        else f"its host {host!r} is not in server.fetch_image_urls"
    )
    raise InvalidMedia(
        f"{item.where} is a remote URL ({shown(item.url)}), and {why}",
        hint=(
            "send the image inline as a data: URL (data:image/png;base64,...), or allow the host: "
            f'server.fetch_image_urls = ["{host}"] in config.toml (LOCALRUN_SERVER__FETCH_IMAGE_URLS=\'["{host}"]\')'
        ),
        param=item.where,
    )


async def resolve_remote(
    reader: MediaReader, messages: tuple[Message, ...], server: ServerSettings
) -> tuple[Message, ...]:
    """``messages`` with every :class:`RemoteMedia` placeholder replaced by its fetched, checked file.

    Every URL's host is checked before anything is fetched; the fetches run concurrently.
    """
    if not reader.remote:
        return messages
    patterns = list(getattr(server, "fetch_image_urls", None) or [])
    for item in reader.remote:
        refuse_unallowed(item, patterns)
    timeout_s = float(getattr(server, "fetch_timeout_s", 10.0))
    async with httpx.AsyncClient(
        trust_env=False,
        follow_redirects=False,
        timeout=httpx.Timeout(timeout_s),
        headers={"User-Agent": f"localrun/{__version__}", "Accept": "image/*", "Accept-Encoding": "identity"},
    ) as client:
        fetched = await asyncio.gather(
            *(_fetch(client, item, patterns, reader.limits.max_bytes, timeout_s) for item in reader.remote)
        )
    done: list[tuple[RemoteMedia, Media]] = [  # their headers are read off the event loop, as inline media's
        (item, await asyncio.to_thread(reader.resolved, item, data, mime))
        for item, (data, mime) in zip(reader.remote, fetched)
    ]
    reader.remote = []

    def swap(item: Media) -> Media:
        return next((media for placeholder, media in done if placeholder is item), item)

    return tuple(
        dataclasses.replace(m, media=tuple(swap(x) for x in m.media))
        if any(isinstance(x, RemoteMedia) for x in m.media)
        else m
        for m in messages
    )


async def _fetch(
    client: httpx.AsyncClient, item: RemoteMedia, patterns: list[str], cap: int, timeout_s: float
) -> tuple[bytes, str | None]:
    try:
        async with asyncio.timeout(timeout_s):
            return await _follow(client, item, patterns, cap)
    except TimeoutError:
        raise InvalidMedia(
            f"{item.where}: fetching {shown(item.url)} took longer than {timeout_s:g} s (server.fetch_timeout_s)",
            hint="send the image inline as a data: URL, or raise server.fetch_timeout_s",
            param=item.where,
        ) from None
    except httpx.HTTPError as exc:
        raise InvalidMedia(
            f"{item.where}: fetching {shown(item.url)} failed: {type(exc).__name__}: {str(exc)[:200]}",
            hint="check the URL, or send the image inline as a data: URL",
            param=item.where,
        ) from None


async def _follow(
    client: httpx.AsyncClient, item: RemoteMedia, patterns: list[str], cap: int
) -> tuple[bytes, str | None]:
    url = item.url
    for _ in range(MAX_REDIRECTS + 1):
        async with client.stream("GET", url) as resp:
            if resp.is_redirect:
                target = urljoin(url, resp.headers.get("location", ""))
                if not host_allowed(target, patterns):
                    raise InvalidMedia(
                        f"{item.where}: {shown(url)} redirects to {shown(target)}, whose host "
                        f"{_host(target)!r} server.fetch_image_urls does not allow",
                        hint="use the final URL if its host is allowed, or send the image inline",
                        param=item.where,
                    )
                url = target
                continue
            if not 200 <= resp.status_code < 300:
                raise InvalidMedia(
                    f"{item.where}: fetching {shown(url)} answered HTTP {resp.status_code}",
                    hint="check the URL, or send the image inline as a data: URL",
                    param=item.where,
                )
            data = await _body(resp, item, url, cap)
            declared = resp.headers.get("content-type", "")
            log.info("fetched %s for %s: %d bytes", shown(url), item.where, len(data))
            return data, declared if declared.lower().startswith(("image/", "audio/")) else None
    raise InvalidMedia(
        f"{item.where}: {shown(item.url)} redirects more than {MAX_REDIRECTS} times",
        hint="use the final URL, or send the image inline",
        param=item.where,
    )


async def _body(resp: httpx.Response, item: RemoteMedia, url: str, cap: int) -> bytes:
    def over(size: int, about: str = "") -> InvalidMedia:
        return InvalidMedia(
            f"{item.where}: {shown(url)} is {about}{size:,} bytes, over the cap of {cap:,} bytes "
            "(server.max_media_bytes)",
            hint="use a smaller image, or raise server.max_media_bytes",
            param=item.where,
        )

    length = resp.headers.get("content-length", "")
    if length.isdigit() and int(length) > cap:
        raise over(int(length))
    buf = bytearray()
    async for chunk in resp.aiter_raw():
        buf += chunk
        if len(buf) > cap:
            raise over(len(buf), "more than ")
    return bytes(buf)
