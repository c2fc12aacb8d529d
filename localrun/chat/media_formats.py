"""What an image or audio clip is, from its first bytes: magic-byte sniffing and the header
facts the door checks (an image's dimensions, an audio clip's stream format), read without
decoding a pixel or a sample.

Everything here parses by hand with :mod:`struct` but the PNG, JPEG, GIF and BMP headers, which
Pillow reads (``Image.open`` parses the header only; ``load()`` is never called). WebP is read by
hand too: Pillow opens it through libwebp's animation decoder, which allocates the whole canvas
(width × height × 4 bytes) before any size check, so a 300-byte file claiming 16383×16383 would
cost a gigabyte in the server process. The full decode happens later, in the runtime's
sacrificial decoder process.

Each function raises :class:`HeaderProblem` with a sentence naming what is wrong; the caller
(:mod:`localrun.chat.media`) turns it into an ``InvalidMedia`` naming the item.
"""

from __future__ import annotations

import io
import logging
import re
import struct
import warnings

from localrun.types import MAX_AUDIO_CHANNELS, MAX_AUDIO_SECONDS

log = logging.getLogger(__name__)

IMAGE, AUDIO = "image", "audio"

#: The types localrun takes, by MIME type: (kind, Pillow's format name or None).
TYPES: dict[str, tuple[str, str | None]] = {
    "image/png": (IMAGE, "PNG"),
    "image/jpeg": (IMAGE, "JPEG"),
    "image/webp": (IMAGE, None),
    "image/gif": (IMAGE, "GIF"),
    "image/bmp": (IMAGE, "BMP"),
    "audio/wav": (AUDIO, None),
    "audio/mpeg": (AUDIO, None),
    "audio/flac": (AUDIO, None),
}
#: What clients write for those types besides their registered names (and OpenAI's input_audio formats).
ALIASES = {
    "image/jpg": "image/jpeg",
    "image/pjpeg": "image/jpeg",
    "image/x-ms-bmp": "image/bmp",
    "image/x-bmp": "image/bmp",
    "audio/x-wav": "audio/wav",
    "audio/wave": "audio/wav",
    "audio/vnd.wave": "audio/wav",
    "audio/mp3": "audio/mpeg",
    "audio/mpeg3": "audio/mpeg",
    "audio/x-mpeg-3": "audio/mpeg",
    "audio/x-flac": "audio/flac",
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
}
#: How a refusal lists what is taken.
TAKEN = "PNG, JPEG, WebP, GIF, BMP images; WAV, MP3, FLAC audio"


class HeaderProblem(ValueError):
    """A header that is not what it claims, or over a cap (the message says which)."""


class TooManyPixels(HeaderProblem):
    """A header claiming more pixels than Pillow's own guard opens (the caller names its cap)."""

    def __init__(self, pixels: int | None):
        super().__init__(f"its header claims {pixels or 'too many'} pixels")
        self.pixels = pixels


def normal_mime(declared: str | None) -> str | None:
    """A declared type in its registered spelling (``image/jpg`` → ``image/jpeg``), lower case, no parameters."""
    if not declared:
        return None
    mime = declared.split(";", 1)[0].strip().lower()
    return ALIASES.get(mime, mime)


def sniff(data: bytes) -> str | None:
    """The MIME type of ``data``'s content by its magic bytes, or None for anything localrun does not take.

    The same signatures mtmd's helper tests (``is_audio_file``: RIFF/WAVE, ID3 or an MPEG sync
    word, fLaC) and stb_image's / Pillow's image signatures.
    """
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data.startswith(b"BM"):
        return "image/bmp"
    if data.startswith(b"fLaC"):
        return "audio/flac"
    if data.startswith(b"ID3") or (len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "audio/mpeg"
    return None


# --- images ---------------------------------------------------------------------------------


def image_size(data: bytes, mime: str) -> tuple[int, int]:
    """(width, height) from the header; a PNG's chunks are CRC-checked too (cheap, and it finds a
    truncated or corrupt file without inflating a pixel)."""
    if mime == "image/webp":
        width, height = webp_size(data)
    else:
        width, height = _pillow_size(data, mime)
    if width <= 0 or height <= 0:
        raise HeaderProblem(f"its header says {width}×{height} pixels: an image has at least one")
    return width, height


def _pillow_size(data: bytes, mime: str) -> tuple[int, int]:
    from PIL import Image

    name = TYPES[mime][1]
    with warnings.catch_warnings():
        # Pillow warns above 89 MP; the caller's own pixel cap decides, with a message that names it.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            # Every type here has Pillow's name but WebP, which webp_size reads instead.
            with Image.open(io.BytesIO(data), formats=[name] if name is not None else None) as im:
                size = im.size
                if name == "PNG":
                    im.verify()
        except Image.DecompressionBombError as exc:
            found = re.search(r"\((\d+) pixels\)", str(exc))
            raise TooManyPixels(int(found.group(1)) if found else None) from None
        except Exception as exc:  # Pillow's plugins raise SyntaxError, struct.error, EOFError… on a bad header
            raise HeaderProblem(_reason(exc)) from None
    return size


def _reason(exc: Exception) -> str:
    from PIL import UnidentifiedImageError

    if isinstance(exc, UnidentifiedImageError):  # its text names a BytesIO object, which helps nobody
        return "its header is cut short or corrupt"
    text = str(exc).strip() or type(exc).__name__
    return f"it is cut short or corrupt ({text[:200]})"


def webp_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a WebP from its RIFF header: the VP8X canvas, or the first VP8/VP8L frame."""
    if len(data) < 30:
        raise HeaderProblem(f"it is {len(data)} bytes, too short for a WebP header")
    riff_size = struct.unpack_from("<I", data, 4)[0]
    if riff_size + 8 > len(data):
        raise HeaderProblem(f"it is truncated: its RIFF header says {riff_size + 8} bytes, {len(data)} arrived")
    chunk = data[12:16]
    body = data[20:]
    if chunk == b"VP8X":
        width = 1 + int.from_bytes(body[4:7], "little")
        height = 1 + int.from_bytes(body[7:10], "little")
        return width, height
    if chunk == b"VP8 ":
        if body[3:6] != b"\x9d\x01\x2a":
            raise HeaderProblem("its VP8 frame has no start code")
        width, height = struct.unpack_from("<HH", body, 6)
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":
        if body[0] != 0x2F:
            raise HeaderProblem("its VP8L stream has no signature")
        bits = int.from_bytes(body[1:5], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    raise HeaderProblem(f"its first chunk is {chunk!r}, not VP8, VP8L or VP8X")


# --- audio ----------------------------------------------------------------------------------

#: WAV sample formats the decoders take: PCM, IEEE float, and the extensible wrapper of either.
_WAV_FORMATS = {1: "PCM", 3: "float", 0xFFFE: "extensible"}
#: A data chunk size streaming writers leave when they do not know the length yet.
_UNKNOWN_SIZES = (0, 0xFFFFFFFF)


def audio_facts(data: bytes, mime: str) -> str:
    """A short description of the clip's stream (for the log), after checking its header is sane."""
    if mime == "audio/wav":
        return wav_facts(data)
    if mime == "audio/flac":
        return flac_facts(data)
    return mp3_facts(data)


def wav_facts(data: bytes) -> str:
    """Walks the RIFF chunks: a ``fmt `` chunk with sane numbers, then a ``data`` chunk that is all there."""
    fmt = None
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = pos + 8
        if cid == b"fmt ":
            if size < 16 or body + 16 > len(data):
                raise HeaderProblem(f"its fmt chunk is {size} bytes, too short to describe the samples")
            fmt = struct.unpack_from("<HHIIHH", data, body)
        elif cid == b"data":
            if fmt is None:
                raise HeaderProblem("its data chunk comes before any fmt chunk: the samples have no format")
            if size not in _UNKNOWN_SIZES and size > len(data) - body:
                raise HeaderProblem(f"it is truncated: its data chunk says {size} bytes, {len(data) - body} arrived")
            facts = _wav_check(fmt)
            held = len(data) - body if size in _UNKNOWN_SIZES else size
            _check_seconds(held / fmt[4] / fmt[2])  # bytes / block size / rate (both checked above)
            return facts
        pos = body + size + (size & 1)
    raise HeaderProblem("it has no fmt chunk" if fmt is None else "it has no data chunk: there are no samples")


def _wav_check(fmt: tuple[int, int, int, int, int, int]) -> str:
    tag, channels, rate, _byte_rate, align, bits = fmt
    if tag not in _WAV_FORMATS:
        raise HeaderProblem(f"its sample format is {tag:#x}; WAV is taken as PCM or IEEE float")
    if not 1 <= channels <= MAX_AUDIO_CHANNELS:
        raise HeaderProblem(f"it says {channels} channels")
    if not 1000 <= rate <= 768_000:
        raise HeaderProblem(f"it says a sample rate of {rate} Hz")
    if bits not in (8, 16, 24, 32, 64):
        raise HeaderProblem(f"it says {bits} bits per sample; WAV is taken with 8, 16, 24, 32 or 64")
    if align != channels * bits // 8:
        raise HeaderProblem(f"its block size {align} does not match {channels} channels of {bits} bits")
    return f"WAV {_WAV_FORMATS[tag]} {bits}-bit {channels} ch {rate} Hz"


def flac_facts(data: bytes) -> str:
    """The STREAMINFO block FLAC puts first: its sample rate and channels."""
    if len(data) < 42 or data[4] & 0x7F != 0 or int.from_bytes(data[5:8], "big") != 34:
        raise HeaderProblem("it has no FLAC STREAMINFO block after its signature")
    info = data[8:42]
    rate = (info[10] << 12) | (info[11] << 4) | (info[12] >> 4)
    channels = ((info[12] >> 1) & 0x7) + 1
    if rate == 0:
        raise HeaderProblem("its STREAMINFO says a sample rate of 0 Hz")
    total = ((info[13] & 0x0F) << 32) | int.from_bytes(info[14:18], "big")  # 0: not known
    _check_seconds(total / rate)
    return f"FLAC {channels} ch {rate} Hz"


def _check_seconds(seconds: float) -> None:
    if seconds > MAX_AUDIO_SECONDS:
        raise HeaderProblem(f"it is {seconds:,.1f} s long, over the {MAX_AUDIO_SECONDS:g}-second cap of a clip")


#: How far past an ID3 tag the first MPEG frame may start (encoders pad a little).
_MP3_SEARCH = 4096
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mp3_facts(data: bytes) -> str:
    """Skips an ID3v2 tag, then wants a valid MPEG audio frame header near where the tag ends."""
    start = 0
    if data.startswith(b"ID3"):
        if len(data) < 10:
            raise HeaderProblem("its ID3 tag is cut short")
        size = 0
        for b in data[6:10]:
            if b & 0x80:
                raise HeaderProblem("its ID3 tag size is not a syncsafe integer")
            size = (size << 7) | b
        start = 10 + size + (10 if data[5] & 0x10 else 0)
        if start >= len(data):
            raise HeaderProblem("it is an ID3 tag with no audio after it")
    for pos in range(start, min(len(data) - 3, start + _MP3_SEARCH)):
        facts = _mpeg_frame(data[pos : pos + 4])
        if facts:
            return facts
    raise HeaderProblem("no MPEG audio frame header was found where its audio should start")


def _mpeg_frame(head: bytes) -> str | None:
    if head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return None
    version, layer = (head[1] >> 3) & 3, (head[1] >> 1) & 3
    bitrate, rate = head[2] >> 4, (head[2] >> 2) & 3
    if version == 1 or layer == 0 or bitrate == 15 or rate == 3:
        return None
    channels = 1 if head[3] >> 6 == 3 else 2
    return f"MPEG layer {4 - layer} {channels} ch {_MP3_RATES[version][rate]} Hz"
