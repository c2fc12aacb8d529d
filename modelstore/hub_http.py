"""Every request localrun makes to a hub, bounded in time: connect, first byte, stall, overall.

A hub endpoint can fail in three silent ways, and each gets its own deadline
(``[hub]`` in config.toml, or ``LOCALRUN_HUB__…``):

* ``connect_timeout_s`` — the TCP (and TLS) connection does not open;
* ``first_byte_timeout_s`` — the connection opens but the answer's headers never come
  (a wedged proxy, a mirror that accepts and hangs, a firewall that swallows packets);
* ``stall_timeout_s`` — headers came, then the body stops arriving mid-way;
* overall — a listing page within ``listing_timeout_s``; a file download at least
  ``min_download_rate`` bytes/s over each ``download_rate_window_s`` (:class:`RateFloor`), so a
  hub that drips a byte just inside the stall deadline is cut in time that scales with the size.

httpx has one ``read`` timeout for the wait before the headers and the gaps in the body
alike, so requests start with ``read = first_byte_timeout_s`` and :func:`after_headers`
switches the same request to ``stall_timeout_s`` once the headers are in (httpcore reads
the request's ``timeout`` extension when the body is first iterated).

Why not huggingface_hub's ``HfApi`` for listing and search: its shared client has no
timeout (``timeout=None``), and its paginated calls retry a timeout five times with
back-off, so a silent endpoint held ``localrun pull`` and ``search`` for minutes. The
three JSON routes localrun needs are small; here they are bounded, and a timeout is
reported once, naming the endpoint and what to do.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from localrun.errors import DownloadFailed

if TYPE_CHECKING:
    import httpx

    from localrun.settings import Settings

logger = logging.getLogger(__name__)

USER_AGENT = "localrun/0.1; hf_hub-compatible"
#: The most a listing or search page may weigh: a hostile hub cannot fill memory.
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_PAGES = 1000
#: The most elements one listing page and a whole listing may hold (the hub pages a repo's tree a
#: thousand files at a time and advises fewer than 100k files a repo). Checked page by page, so a
#: page that links to itself stops here, not after a thousand pages in memory.
MAX_PAGE_ITEMS = 10_000
MAX_ITEMS = 100_000
#: JSON values one page may open (``[`` and ``{``) and separate (``,``), counted in the raw bytes
#: before parsing: 64 MiB of ``[],`` parses into 21 million lists (1.75 GB); a real page of a
#: thousand files opens a few thousand.
_MAX_CONTAINERS = 20 * MAX_PAGE_ITEMS
_MAX_COMMAS = 50 * MAX_PAGE_ITEMS
#: A request's query: a dict, or pairs where a key repeats (``expand`` in a search).
Params = dict[str, str] | tuple[tuple[str, str], ...]
_STATUS_RETRIES = 2  # 429/5xx on a metadata call: the hub's own back-off, kept short


@dataclass(frozen=True)
class Deadlines:
    connect_s: float = 10.0
    first_byte_s: float = 30.0
    stall_s: float = 60.0
    total_s: float = 300.0  # one JSON page in all: a drip-feeding hub is cut here
    min_rate: float = 1024.0  # bytes/s a file download averages over each window, or it is cut
    rate_window_s: float = 120.0

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Deadlines:
        hub = getattr(settings, "hub", None)
        default = cls()
        return cls(
            float(getattr(hub, "connect_timeout_s", default.connect_s)),
            float(getattr(hub, "first_byte_timeout_s", default.first_byte_s)),
            float(getattr(hub, "stall_timeout_s", default.stall_s)),
            float(getattr(hub, "listing_timeout_s", default.total_s)),
            float(getattr(hub, "min_download_rate", default.min_rate)),
            float(getattr(hub, "download_rate_window_s", default.rate_window_s)),
        )

    def timeout(self) -> httpx.Timeout:
        import httpx

        return httpx.Timeout(
            connect=self.connect_s, read=self.first_byte_s, write=self.first_byte_s, pool=self.connect_s
        )

    def client(self, **kwargs: Any) -> httpx.Client:
        """An httpx client whose every request carries these deadlines."""
        import httpx

        headers = {"User-Agent": USER_AGENT, **kwargs.pop("headers", {})}
        return httpx.Client(follow_redirects=True, timeout=self.timeout(), headers=headers, **kwargs)


def after_headers(resp: httpx.Response, deadlines: Deadlines) -> None:
    """The headers are in: from here on the read timeout bounds the gaps in the body."""
    timeouts = resp.request.extensions.get("timeout") if resp.request is not None else None
    if isinstance(timeouts, dict):
        timeouts["read"] = deadlines.stall_s


class RateFloor:
    """The overall bound of a file download: the bytes of each ``rate_window_s`` must average at least
    ``min_rate`` per second. The stall deadline restarts with every byte, so a hub sending one byte
    every few seconds was never cut; here it is, within a window (or the gap to its next byte), and a
    real link of any speed above the floor never is, however large the file."""

    def __init__(self, deadlines: Deadlines, now: float, received: int) -> None:
        self.deadlines, self.since, self.at = deadlines, now, received

    def too_slow(self, now: float, received: int) -> str | None:
        """What the window just ended carried when it falls under the floor; None starts the next one."""
        elapsed = now - self.since
        if self.deadlines.min_rate <= 0 or elapsed < self.deadlines.rate_window_s:
            return None
        got = received - self.at
        if got < self.deadlines.min_rate * elapsed:
            return (
                f"sent {got:,} bytes in {elapsed:.0f} s, under the floor of {self.deadlines.min_rate:,.0f} bytes/s "
                f"averaged over {self.deadlines.rate_window_s:g} s"
            )
        self.since, self.at = now, received
        return None


RATE_HINT = (
    "run the pull again: it resumes from the bytes kept; on a link this slow lower hub.min_download_rate in "
    "config.toml (LOCALRUN_HUB__MIN_DOWNLOAD_RATE; 0 turns the floor off) or widen hub.download_rate_window_s"
)


_HINT = (
    "check that HF_ENDPOINT (or hub.endpoint in config.toml) names a working hub or mirror, "
    "or use --offline / HF_HUB_OFFLINE=1 for models already downloaded"
)


def timeout_error(exc: Exception, endpoint: str, deadlines: Deadlines, *, body: bool = False) -> DownloadFailed:
    """A timeout as a person can act on it: which endpoint, which deadline, what to check."""
    import httpx

    if isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout)):
        what, secs, knob = "did not accept a connection", deadlines.connect_s, "connect_timeout_s"
    elif body:
        what, secs, knob = "stopped sending mid-way", deadlines.stall_s, "stall_timeout_s"
    else:
        what, secs, knob = "accepted the connection but sent no answer", deadlines.first_byte_s, "first_byte_timeout_s"
    return DownloadFailed(
        f"the hub at {endpoint} {what} within {secs:g} s",
        hint=f"{_HINT}; hub.{knob} in config.toml (LOCALRUN_HUB__{knob.upper()}) sets this deadline",
    )


class HubStatus(Exception):
    """A hub answer that is not 2xx, with what the hub said about it (untrusted, trimmed)."""

    def __init__(self, status: int, code: str | None, message: str | None, url: str) -> None:
        self.status, self.code, self.url = status, code, url
        self.message = _printable(message or "")
        super().__init__(f"{status} {code or ''} {self.message}".strip())


def _printable(text: str, limit: int = 200) -> str:
    text = "".join(c if c.isprintable() else " " for c in text)
    return text[:limit] + ("…" if len(text) > limit else "")


def _same_origin(url: str, endpoint: str) -> bool:
    a, b = urlsplit(url), urlsplit(endpoint)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)


def get_json(
    client: httpx.Client,
    url: str,
    *,
    endpoint: str,
    deadlines: Deadlines,
    params: Params | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[Any, httpx.Response]:
    """GET one JSON document; returns (value, response). Raises HubStatus or DownloadFailed.

    A timeout fails at once (never retried: retrying a silent endpoint only multiplies the
    wait); a 429 or 5xx is retried twice with a short back-off, as the hub asks.
    """
    import httpx

    attempt = 0
    started = time.monotonic()
    while True:
        got_headers = False
        try:
            with client.stream("GET", url, params=params, headers=headers) as resp:
                got_headers = True
                after_headers(resp, deadlines)
                if resp.status_code >= 400:
                    if (resp.status_code == 429 or resp.status_code >= 500) and attempt < _STATUS_RETRIES:
                        attempt += 1
                        logger.info("%s answered %d; retrying (%d/%d)", url, resp.status_code, attempt, _STATUS_RETRIES)
                        time.sleep(0.5 * attempt)
                        continue
                    raise HubStatus(
                        resp.status_code,
                        resp.headers.get("X-Error-Code"),
                        resp.headers.get("X-Error-Message") or _error_field(resp.headers, _head(resp)),
                        str(resp.url),
                    )
                return _parse(_body(resp, endpoint, deadlines, started), endpoint, resp), resp
        except httpx.TimeoutException as exc:
            raise timeout_error(exc, endpoint, deadlines, body=got_headers) from exc
        except httpx.TooManyRedirects as exc:
            raise DownloadFailed(
                f"the hub at {endpoint} redirected {url[:120]} in a loop (or more than 20 times)",
                hint="check that HF_ENDPOINT points at a Hugging Face hub or mirror",
            ) from exc
        except httpx.RequestError as exc:  # transport failures, and a body it could not decode
            raise DownloadFailed(
                f"cannot reach the hub at {endpoint}: {exc or type(exc).__name__}", hint=_HINT
            ) from exc


def _body(resp: httpx.Response, endpoint: str, deadlines: Deadlines, started: float) -> bytes:
    """The answer's bytes, within the size cap and the page's overall deadline."""
    body, size = [], 0
    for chunk in resp.iter_bytes():
        size += len(chunk)
        if size > MAX_JSON_BYTES:
            raise DownloadFailed(
                f"the hub at {endpoint} sent more than {MAX_JSON_BYTES >> 20} MiB for one listing page", hint=_HINT
            )
        if time.monotonic() - started > deadlines.total_s:
            raise DownloadFailed(
                f"the hub at {endpoint} took more than {deadlines.total_s:g} s to send one listing page "
                f"({size:,} bytes had come)",
                hint=f"{_HINT}; hub.listing_timeout_s in config.toml (LOCALRUN_HUB__LISTING_TIMEOUT_S) sets this",
            )
        body.append(chunk)
    return b"".join(body)


def _parse(raw: bytes, endpoint: str, resp: httpx.Response) -> Any:
    """The page's JSON, if its size in values is a listing's: counted before it is parsed."""
    opened = raw.count(b"[") + raw.count(b"{")
    if opened > _MAX_CONTAINERS or raw.count(b",") > _MAX_COMMAS:
        raise DownloadFailed(
            f"the hub at {endpoint} sent a page for {resp.url.path} with more values than a listing page has "
            f"({opened:,} lists and objects)",
            hint="check that HF_ENDPOINT points at a Hugging Face hub or mirror",
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser's stack
        raise DownloadFailed(
            f"the hub at {endpoint} sent something that is not JSON (or nests too deeply) for {resp.url.path}",
            hint="check that HF_ENDPOINT points at a Hugging Face hub or mirror",
        ) from exc


def get_pages(
    client: httpx.Client,
    url: str,
    *,
    endpoint: str,
    deadlines: Deadlines,
    params: Params | None = None,
    headers: dict[str, str] | None = None,
    limit: int | None = None,
) -> list[Any]:
    """Every item of a paginated JSON list (the hub's ``Link: rel="next"``), up to ``limit``."""
    items: list[Any] = []
    for _ in range(MAX_PAGES):
        page, resp = get_json(client, url, endpoint=endpoint, deadlines=deadlines, params=params, headers=headers)
        if not isinstance(page, list) or len(page) > MAX_PAGE_ITEMS or len(items) + len(page) > MAX_ITEMS:
            what = (
                "not a list"
                if not isinstance(page, list)
                else f"{len(page):,} entries on one page, over {MAX_PAGE_ITEMS:,}"
                if len(page) > MAX_PAGE_ITEMS
                else f"more than {MAX_ITEMS:,} entries in all"
            )
            raise DownloadFailed(
                f"the hub at {endpoint} sent a malformed answer for {resp.url.path} ({what})",
                hint="check that HF_ENDPOINT points at a Hugging Face hub or mirror",
            )
        items.extend(page)
        if limit is not None and len(items) >= limit:
            return items[:limit]
        nxt = resp.links.get("next", {}).get("url")
        if not nxt:
            return items
        if not _same_origin(nxt, endpoint):  # the token goes only where the user pointed it
            raise DownloadFailed(f"the hub at {endpoint} sent a next page on another host ({nxt[:120]})", hint=_HINT)
        url, params = nxt, None
    raise DownloadFailed(f"the hub at {endpoint} sent more than {MAX_PAGES} pages", hint=_HINT)


def _head(resp: httpx.Response, limit: int = 64 * 1024) -> bytes:
    """The start of an error body (enough for the hub's ``{"error": …}``), never more."""
    out = b""
    for chunk in resp.iter_bytes():
        out += chunk
        if len(out) >= limit:
            break
    return out[:limit]


def _error_field(headers: httpx.Headers, body: bytes) -> str | None:
    if "json" not in headers.get("Content-Type", ""):
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return data.get("error") if isinstance(data, dict) and isinstance(data.get("error"), str) else None
