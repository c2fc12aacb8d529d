"""The door for a request's images and audio: every wire family's converter hands each media
item it finds to one :class:`MediaReader`, which turns it into a :class:`~localrun.types.Media`
or refuses it with an :class:`~localrun.errors.InvalidMedia` (a 400) naming the item
(``messages[2].content[1]``), the problem and the cap.

What is checked here, cheaply and without decoding a pixel (the decode happens in the
runtime's sacrificial decoder process, where a hostile file can only kill that process):

* base64 validity (whitespace allowed, as MIME-wrapped clients send it; padding may be left
  off), and ``data:`` URLs (``data:<type>;base64,<data>``);
* the content's type by its magic bytes (:mod:`.media_formats`): PNG, JPEG, WebP, GIF, BMP;
  WAV, MP3, FLAC. A declared type (a data URL's, Anthropic's ``media_type``, ``input_audio``'s
  ``format``) must name one of them and agree with the content in kind: an image declared as
  audio, or ``text/html``, is refused. Within a kind the content wins (clients label every
  upload ``image/jpeg``; OpenAI accepts that too): :attr:`Media.mime` is the sniffed type;
* a size cap per item, a total per request and a count per request;
* an image's dimensions from its header against a pixel cap (a 1 KB PNG claiming
  60000×60000 is refused here); an audio clip's header (sane WAV ``fmt``, an MPEG frame,
  FLAC's STREAMINFO).

``http(s)://`` URLs are not fetched here: the reader records a :class:`RemoteMedia`
placeholder, which the server resolves (``localrun.server.media_fetch``) under its host
policy and then passes back through :meth:`MediaReader.check` — the same checks as inline data.

The capability each item needs (``vision``, ``audio``) follows what it *is*, not which field
carried it (Ollama's ``images`` and llama-server's ``multimodal_data`` may hold audio):
:meth:`MediaReader.needs` lists them for the server's capability rule.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from dataclasses import dataclass
from typing import Any

from localrun.chat.media_formats import (
    AUDIO,
    IMAGE,
    TAKEN,
    TYPES,
    HeaderProblem,
    TooManyPixels,
    audio_facts,
    image_size,
    normal_mime,
    sniff,
)
from localrun.errors import InvalidMedia
from localrun.types import AUDIO as AUDIO_CAPABILITY
from localrun.types import MAX_IMAGE_PIXELS, MEDIA_MARKER, VISION, Media

log = logging.getLogger(__name__)

MiB = 1024 * 1024
CAPABILITY = {IMAGE: VISION, AUDIO: AUDIO_CAPABILITY}


@dataclass(frozen=True)
class MediaLimits:
    """The caps of one request's media (``server.max_media_*``, ``server.max_image_pixels``)."""

    max_bytes: int = 20 * MiB
    max_items: int = 32
    max_total_bytes: int = 32 * MiB
    max_pixels: int = MAX_IMAGE_PIXELS

    @classmethod
    def of(cls, server: Any) -> MediaLimits:
        """The limits a server's settings section sets (defaults where it has none)."""
        d = cls()
        return cls(
            max_bytes=getattr(server, "max_media_bytes", d.max_bytes),
            max_items=getattr(server, "max_media_per_request", d.max_items),
            max_total_bytes=getattr(server, "max_media_total_bytes", d.max_total_bytes),
            max_pixels=getattr(server, "max_image_pixels", d.max_pixels),
        )


@dataclass(frozen=True)
class RemoteMedia(Media):
    """A placeholder for an ``http(s)://`` media URL, until the server fetches it (or refuses to)."""

    url: str = ""
    where: str = ""


_DATA_URL = re.compile(r"^data:([^,;]*)((?:;[^,;]*)*),", re.IGNORECASE)


def shown(url: str, limit: int = 80) -> str:
    """A URL short enough for an error message."""
    return url if len(url) <= limit else url[: limit - 3] + "..."


class MediaReader:
    """Reads one request's media items, counting them against the request's caps."""

    def __init__(self, limits: MediaLimits | None = None):
        self.limits = limits or MediaLimits()
        self.items = 0
        self.total = 0
        self.found: list[tuple[str, str]] = []
        self.remote: list[RemoteMedia] = []

    def needs(self) -> list[tuple[str, str]]:
        """(where, capability) for each item read: the server refuses those the runtime lacks."""
        return list(self.found)

    # --- the shapes items arrive in -------------------------------------------------------------

    def url(self, url: Any, where: str, *, expect: str | None = IMAGE, declared: str | None = None) -> Media:
        """An item given as a URL: ``data:``, ``http(s)://`` (a placeholder), or bare base64 (llama-server takes it)."""
        if not isinstance(url, str) or not url:
            raise self._bad(where, "has no URL: send a data: URL with the base64 file, or an http(s):// URL")
        head = url[:16].lower()
        if head.startswith("data:"):
            return self.data_url(url, where, expect=expect)
        if head.startswith(("http://", "https://")):
            self._count(where, 0)
            item = RemoteMedia(kind=expect or IMAGE, data=b"", mime=normal_mime(declared), url=url, where=where)
            self.remote.append(item)
            return item
        scheme = url.split(":", 1)[0] if ":" in url[:32] else ""
        if scheme and scheme.isalpha() and len(scheme) > 1:
            raise self._bad(
                where,
                f"is a {scheme}: URL, which localrun does not open (no route reads the server's files)",
                hint="send the file inline as a data: URL (data:image/png;base64,...)",
            )
        return self.base64(url, where, expect=expect, declared=declared)

    def data_url(self, url: str, where: str, *, expect: str | None = IMAGE) -> Media:
        m = _DATA_URL.match(url[:512])
        if m is None:
            raise self._bad(where, f"is not a valid data: URL ({shown(url, 40)!r}): it needs a comma before its data")
        declared, params = m.group(1).strip(), m.group(2).lower()
        if "base64" not in [p.strip() for p in params.split(";")]:
            raise self._bad(where, "is a data: URL that is not base64-encoded", hint="send data:<type>;base64,<data>")
        return self.base64(url[m.end() :], where, expect=expect, declared=declared or None)

    def base64(self, text: Any, where: str, *, expect: str | None = None, declared: str | None = None) -> Media:
        if not isinstance(text, str):
            raise self._bad(where, f"must be a base64 string, not {type(text).__name__}")
        limit = self.limits.max_bytes
        if len(text) // 4 * 3 > limit + 3 and _non_space(text) // 4 * 3 > limit + 3:
            raise self._over(where, len(text) // 4 * 3, limit, "server.max_media_bytes", about=True)
        return self.check(decode_base64(text, where), where, expect=expect, declared=declared)

    # --- the checks -----------------------------------------------------------------------------

    def check(self, data: bytes, where: str, *, expect: str | None = None, declared: str | None = None) -> Media:
        """``data`` as a Media after every check of the module doc; counts it against the request."""
        if not data:
            raise self._bad(where, "is empty (0 bytes)")
        if len(data) > self.limits.max_bytes:
            raise self._over(where, len(data), self.limits.max_bytes, "server.max_media_bytes")
        name = normal_mime(declared)
        if name is not None and name not in TYPES:
            what = f"declares type {(declared or '')[:64]!r}"
            raise self._bad(where, f"{what}: not an image or audio type localrun reads")
        mime = sniff(data)
        if mime is None:
            raise self._bad(
                where, f"is not an image or audio clip localrun reads (it starts with bytes {data[:8].hex()})"
            )
        kind = TYPES[mime][0]
        if expect is not None and kind != expect:
            raise self._bad(where, f"holds {kind} ({mime}) where {_article(expect)} {expect} is expected")
        if name is not None and TYPES[name][0] != kind:
            raise self._bad(where, f"declares {name} but holds {kind} ({mime})")
        if name not in (None, mime):
            log.debug("%s: declared %s, the content is %s: read as %s", where, name, mime, mime)
        try:
            facts = self._header(data, mime)
        except HeaderProblem as exc:
            raise self._bad(where, f"is not a valid {mime} file: {exc}") from None
        self._count(where, len(data), kind)
        log.debug("%s: %s, %d bytes (%s)", where, mime, len(data), facts)
        return Media(kind=kind, data=data, mime=mime)

    def _header(self, data: bytes, mime: str) -> str:
        if TYPES[mime][0] == AUDIO:
            return audio_facts(data, mime)
        cap = f"over the cap of {self.limits.max_pixels:,} (server.max_image_pixels)"
        try:
            width, height = image_size(data, mime)
        except TooManyPixels as exc:
            raise HeaderProblem(f"it claims {exc.pixels or 'more'} pixels, {cap}") from None
        if width * height > self.limits.max_pixels:
            raise HeaderProblem(f"it is {width}×{height} = {width * height:,} pixels, {cap}")
        return f"{width}×{height}"

    def _count(self, where: str, size: int, kind: str | None = None) -> None:
        self.items += 1
        if self.items > self.limits.max_items:
            raise InvalidMedia(
                f"{where}: the request holds more than {self.limits.max_items} images and audio clips, "
                "the cap per request (server.max_media_per_request)",
                hint="send fewer media items, or raise server.max_media_per_request",
                param=where,
            )
        self.total += size
        if self.total > self.limits.max_total_bytes:
            raise self._over(where, self.total, self.limits.max_total_bytes, "server.max_media_total_bytes", whole=True)
        if kind is not None:
            self.found.append((where, CAPABILITY[kind]))

    def resolved(self, item: RemoteMedia, data: bytes, mime: str | None) -> Media:
        """A fetched placeholder's bytes under the same checks as inline data (its count was taken already)."""
        self.items -= 1
        return self.check(data, item.where, expect=item.kind, declared=mime or item.mime)

    # --- errors ---------------------------------------------------------------------------------

    @staticmethod
    def _bad(where: str, problem: str, *, hint: str | None = None) -> InvalidMedia:
        return InvalidMedia(
            f"{where} {problem}", hint=hint or f"send a whole, valid file; localrun takes {TAKEN}", param=where
        )

    @staticmethod
    def _over(
        where: str, size: int, cap: int, setting: str, *, about: bool = False, whole: bool = False
    ) -> InvalidMedia:
        what = "the request's media come to" if whole else "is"
        approx = "about " if about else ""
        return InvalidMedia(
            f"{where} {what} {approx}{size:,} bytes, over the cap of {cap:,} bytes ({setting})",
            hint=f"send a smaller file (scale the image down, or cut the clip), or raise {setting}",
            param=where,
        )


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


#: How much base64 one C call handles: the door runs in a thread, and each call holds the GIL, so a
#: 40 MB item is cut in pieces of a few milliseconds that let the event loop's thread in between.
_PIECE = 1 << 20
_WHITESPACE = b" \t\n\r\x0b\x0c"  # what base64 in MIME lines may hold between its characters


def _non_space(text: str) -> int:
    """How many characters of ``text`` are not base64 whitespace (counted in C, piece by piece)."""
    return len(text) - sum(text.count(c) for c in _WHITESPACE.decode())


def decode_base64(text: str, where: str) -> bytes:
    """Strict base64 (standard or URL-safe alphabet), whitespace ignored, missing padding restored."""
    raw = b"".join(
        text[i : i + _PIECE].encode("ascii", errors="replace").translate(None, _WHITESPACE)
        for i in range(0, len(text), _PIECE)
    )
    if b"-" in raw or b"_" in raw:
        raw = raw.replace(b"-", b"+").replace(b"_", b"/")
    if len(raw) % 4 == 1:
        raise InvalidMedia(
            f"{where} is not valid base64: {len(raw)} characters cannot encode whole bytes",
            hint="send the file's bytes base64-encoded",
            param=where,
        )
    raw += b"=" * (-len(raw) % 4)
    if b"=" in raw[:-4]:  # the pieces below would each accept padding at their end
        raise InvalidMedia(
            f"{where} is not valid base64: it has padding ('=') before its end",
            hint="send the file's bytes base64-encoded",
            param=where,
        )
    try:
        # Pieces of a multiple of 4 characters decode alone; padding inside the data still fails.
        return b"".join(base64.b64decode(raw[i : i + _PIECE], validate=True) for i in range(0, len(raw), _PIECE))
    except (binascii.Error, ValueError) as exc:
        raise InvalidMedia(
            f"{where} is not valid base64 ({exc})", hint="send the file's bytes base64-encoded", param=where
        ) from None


# --- where the markers go -------------------------------------------------------------------------


def markers(n: int) -> str:
    return MEDIA_MARKER * n


def prompt_with_media(prompt: str, n: int, where: str) -> str:
    """A completion prompt (llama-server's ``prompt_string``) for ``n`` media items.

    llama-server's rule (tools/server README, ``multimodal_data``): the prompt holds one
    ``<__media__>`` marker per item, and the n-th marker takes the n-th item; a different
    count is its 400, and localrun's too. Where the prompt holds none, localrun appends them
    after the text instead of refusing (llama-server refuses), so a client that only sends
    ``multimodal_data`` still works. Without media, a marker in the text is plain text.
    """
    if n == 0:
        return prompt.replace(MEDIA_MARKER, "<__media_>") if MEDIA_MARKER in prompt else prompt
    count = prompt.count(MEDIA_MARKER)
    if count == 0:
        return prompt + markers(n)
    if count != n:
        raise InvalidMedia(
            f"the prompt holds {count} media marker{'s' if count != 1 else ''} ({MEDIA_MARKER}) but {where} has {n} "
            f"item{'s' if n != 1 else ''}: each marker takes one item, in order",
            hint=f"put one {MEDIA_MARKER} per item in the prompt, or none (then they follow the text)",
            param=where,
        )
    return prompt


#: Ollama's placeholder for an image in a message's text (server/prompt.go imageTaggedMessages).
OLLAMA_TAG = "[img]"


def ollama_placement(content: str, media: list[Media]) -> tuple[str, tuple[Media, ...]]:
    """Ollama's rule for a message's ``images``: each image in turn takes the next ``[img]`` tag in
    the text, and an image finding none is put before the text. Returns the text with markers and
    the media in the order their markers appear (the n-th marker takes ``media[n]``)."""
    front: list[Media] = []
    tagged: list[Media] = []
    text = content
    for item in media:
        if OLLAMA_TAG in text:
            text = text.replace(OLLAMA_TAG, MEDIA_MARKER, 1)
            tagged.append(item)
        else:
            front.append(item)
    return markers(len(front)) + text, tuple(front + tagged)
