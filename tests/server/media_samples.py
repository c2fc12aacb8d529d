"""Small, valid media files made in memory for the wire tests (Pillow for images, stdlib ``wave``
for WAV; an MP3 frame and a FLAC header written by hand: the door reads headers only), and the
fake runtime's capabilities with media."""

from __future__ import annotations

import base64
import io
import struct
import wave

from tests.support.capabilities import ALL

#: The fake runtime declaring everything, images and audio included.
MEDIA_CAPS = (*ALL, "vision", "audio")


def image(fmt: str = "PNG", size: tuple[int, int] = (4, 3), color: str = "red") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


def png(size: tuple[int, int] = (4, 3), color: str = "red") -> bytes:
    return image("PNG", size, color)


def wav(seconds: float = 0.05, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x00" * int(seconds * rate))
    return buf.getvalue()


def mp3() -> bytes:
    """An MPEG-1 layer III frame header (128 kbit/s, 44.1 kHz, mono) and a silent frame body."""
    return b"\xff\xfb\x90\xc4" + bytes(413)


def flac() -> bytes:
    """fLaC and a STREAMINFO block saying 16 kHz mono."""
    info = bytearray(34)
    info[10:13] = bytes([(16000 >> 12) & 0xFF, (16000 >> 4) & 0xFF, ((16000 & 0xF) << 4) | (0 << 1)])
    return b"fLaC" + bytes([0x80]) + (34).to_bytes(3, "big") + bytes(info)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width``×``height`` with one tiny IDAT: a decompression bomb's header."""
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00")) + chunk(b"IEND", b"")


def note(*items: tuple[str, bytes]) -> str:
    """The fake runtime's media note for these (mime, data) items."""
    return "[media: " + ", ".join(f"{mime} {len(data)}B" for mime, data in items) + "]"
