"""The malformed-media corpus: several hundred deterministic images and audio clips that no
server should accept, each tagged with what is wrong with it.

Built from a handful of small valid files made here with Pillow and :mod:`wave` (no file is
committed); every case is derived from them by a fixed rule or a seeded generator, so the corpus
is the same list on every machine and every run. Damage that a lenient decoder could still read
(cutting a PNG after its last IDAT, flipping bytes inside JPEG scan data) is dropped: each image
case that claims to be undecodable is checked against Pillow at build time, so a test that sees
one accepted has found a real hole rather than a corpus mistake.

A case says where it goes (``slot``: the image or the audio field of a request) and what must
travel for it to be wrong (``needs``): a valid PNG declared ``text/html`` is only bad where a MIME
is sent (OpenAI/Responses data URLs, Anthropic's ``media_type``), and a valid image in an audio
field only where an API has an audio field (OpenAI's ``input_audio``).
"""

from __future__ import annotations

import base64
import io
import random
import struct
import wave
import zlib
from dataclasses import dataclass
from functools import cache

IMAGE, AUDIO = "image", "audio"
NEEDS_MIME, NEEDS_AUDIO_SLOT = "mime", "audio_slot"


@dataclass(frozen=True)
class Case:
    """One malformed item as a request carries it."""

    tag: str  # unique, "<format>/<what>[@detail]"
    group: str  # truncated, wrong_magic, corrupt_body, huge_dims, empty, base64, data_url, wrong_kind, wav, mp3
    slot: str  # IMAGE or AUDIO: the request field it is sent in
    b64: str  # what goes on the wire as the base64 payload (may be no base64 at all)
    mime: str  # the MIME a data URL / media_type declares
    url: str | None = None  # a whole URL to send instead of data:{mime};base64,{b64}
    needs: str | None = None  # None: bad everywhere; NEEDS_MIME / NEEDS_AUDIO_SLOT: only where that travels

    @property
    def data_url(self) -> str:
        return self.url if self.url is not None else f"data:{self.mime};base64,{self.b64}"

    @property
    def audio_format(self) -> str:
        """OpenAI ``input_audio.format``: what the clip claims to be."""
        return "mp3" if self.mime == "audio/mpeg" else "wav"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# The valid sources every damaged case starts from.


def _picture(size: tuple[int, int] = (24, 16)):
    from PIL import Image

    img = Image.new("RGB", size)
    img.putdata([((x * 11) % 256, (y * 17) % 256, ((x + y) * 5) % 256) for y in range(size[1]) for x in range(size[0])])
    return img


def _encode(fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    _picture().save(out, format=fmt, **kw)
    return out.getvalue()


@cache
def sources() -> dict[str, tuple[bytes, str]]:
    """Valid small images: name -> (bytes, MIME)."""
    return {
        "png": (_encode("PNG"), "image/png"),
        "jpeg": (_encode("JPEG", quality=80), "image/jpeg"),
        "jpeg-progressive": (_encode("JPEG", quality=80, progressive=True), "image/jpeg"),
        "webp": (_encode("WEBP", quality=80), "image/webp"),
        "webp-lossless": (_encode("WEBP", lossless=True), "image/webp"),
        "gif": (_encode("GIF"), "image/gif"),
    }


def wav_bytes(*, seconds: float = 0.05, rate: int = 16000, channels: int = 1, width: int = 2) -> bytes:
    """A valid PCM WAV (a quiet ramp)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        frames = int(seconds * rate)
        w.writeframes(bytes((i * 7) % 256 for i in range(frames * channels * width)))
    return out.getvalue()


def pillow_refuses(data: bytes) -> bool:
    """Whether Pillow cannot fully decode ``data`` as an image (the corpus keeps only those)."""
    import warnings

    from PIL import Image, ImageFile

    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a DecompressionBombWarning counts as refused
            with Image.open(io.BytesIO(data)) as img:
                img.load()
    except Exception:  # noqa: BLE001 - any failure to decode is what "refuses" means here
        return True
    return False


# The groups.


def _cut_points(n: int) -> list[int]:
    """Where to cut an n-byte file: every byte of the first 24 (magic and headers) and 40 points
    spread over the rest (the body and the trailer)."""
    points = set(range(1, min(n, 25)))
    points.update(max(1, (n * k) // 41) for k in range(1, 41))
    points.update({n - 1, n - 2, n - 4, n - 12})
    return sorted(p for p in points if 0 < p < n)


def _truncated() -> list[Case]:
    out = []
    for name, (data, mime) in sources().items():
        for cut in _cut_points(len(data)):
            if pillow_refuses(data[:cut]):
                out.append(Case(f"{name}/truncated@{cut}of{len(data)}", "truncated", IMAGE, _b64(data[:cut]), mime))
    return out


MAGICS = {
    "png": b"\x89PNG\r\n\x1a\n",
    "jpeg": b"\xff\xd8\xff",
    "gif": b"GIF89a",
    "webp": b"RIFF\x00\x00\x00\x00WEBP",
    "bmp": b"BM",
    "tiff": b"II*\x00",
}


def _wrong_magic() -> list[Case]:
    out = []
    rng = random.Random(19)
    for name, (data, mime) in sources().items():
        magic_len = 8 if name == "png" else 12 if name.startswith("webp") else 6 if name == "gif" else 3
        body = data[magic_len:]
        fills = {
            "zeros": bytes(magic_len),
            "random": bytes(rng.randrange(256) for _ in range(magic_len)),
            "lowercase": data[:magic_len].lower() if data[:magic_len].lower() != data[:magic_len] else b"x" * magic_len,
        }
        for label, fill in fills.items():
            out.append(Case(f"{name}/magic-{label}", "wrong_magic", IMAGE, _b64(fill + body), mime))
        for other, magic in MAGICS.items():
            if not name.startswith(other):
                out.append(Case(f"{name}/magic-as-{other}", "wrong_magic", IMAGE, _b64(magic + body), mime))
    # A right magic in front of nothing that follows it.
    for other, magic in MAGICS.items():
        for size in (0, 16, 300):
            junk = bytes(rng.randrange(256) for _ in range(size))
            out.append(Case(f"{other}/magic-then-junk@{size}", "wrong_magic", IMAGE, _b64(magic + junk), "image/png"))
    return [c for c in out if pillow_refuses(base64.b64decode(c.b64))]


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png(width: int, height: int, idat: bytes, *, depth: int = 8, color: int = 2) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return MAGICS["png"] + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def _jpeg_segments(data: bytes):
    """(marker, start, end) of each segment before the scan data."""
    i = 2
    while i + 4 <= len(data):
        marker = data[i + 1]
        length = struct.unpack(">H", data[i + 2 : i + 4])[0]
        yield marker, i, i + 2 + length
        if marker == 0xDA:
            return
        i += 2 + length


def _patch_jpeg(data: bytes, marker: int, offset: int, new: bytes) -> bytes:
    for m, start, _end in _jpeg_segments(data):
        if m == marker:
            at = start + 4 + offset
            return data[:at] + new + data[at + len(new) :]
    raise ValueError(f"no marker {marker:#x}")


def _corrupt_body() -> list[Case]:
    out: list[Case] = []
    png, _ = sources()["png"]
    jpeg, _ = sources()["jpeg"]
    gif, _ = sources()["gif"]
    rng = random.Random(1919)
    # PNG: a good header and CRCs around an IDAT that is not a zlib stream, or is one of the wrong size.
    for i in range(8):
        junk = bytes(rng.randrange(256) for _ in range(20 + 30 * i))
        out.append(Case(f"png/idat-not-zlib#{i}", "corrupt_body", IMAGE, _b64(_png(24, 16, junk)), "image/png"))
    out.append(
        Case("png/idat-too-short", "corrupt_body", IMAGE, _b64(_png(24, 16, zlib.compress(b"\x00" * 10))), "image/png")
    )
    for depth, color in ((3, 2), (16, 3), (7, 0), (8, 1), (8, 5), (1, 6)):
        body = _png(4, 4, zlib.compress(b"\x00" * 80), depth=depth, color=color)
        out.append(Case(f"png/ihdr-depth{depth}-color{color}", "corrupt_body", IMAGE, _b64(body), "image/png"))
    out.append(Case("png/zero-width", "corrupt_body", IMAGE, _b64(_png(0, 16, zlib.compress(b""))), "image/png"))
    out.append(Case("png/zero-height", "corrupt_body", IMAGE, _b64(_png(24, 0, zlib.compress(b""))), "image/png"))
    bad_crc = bytearray(png)
    bad_crc[29] ^= 0xFF  # the IHDR's CRC
    out.append(Case("png/ihdr-bad-crc", "corrupt_body", IMAGE, _b64(bytes(bad_crc)), "image/png"))
    # JPEG: the tables and frame header lie.
    for label, marker, offset, new in (
        ("sof-precision-0", 0xC0, 0, b"\x00"),
        ("sof-precision-16", 0xC0, 0, b"\x10"),
        ("sof-zero-components", 0xC0, 5, b"\x00"),
        ("sof-zero-width", 0xC0, 3, b"\x00\x00"),
        ("sof-zero-height", 0xC0, 1, b"\x00\x00"),
        ("sof-sampling-0", 0xC0, 7, b"\x00"),
        ("dqt-table-id-9", 0xDB, 0, b"\x09"),
        ("dht-class-7", 0xC4, 0, b"\x70"),
        ("dht-counts-overflow", 0xC4, 1, b"\xff" * 16),
        ("sos-component-9", 0xDA, 1, b"\x09"),
        ("sos-zero-components", 0xDA, 0, b"\x00"),
    ):
        out.append(
            Case(f"jpeg/{label}", "corrupt_body", IMAGE, _b64(_patch_jpeg(jpeg, marker, offset, new)), "image/jpeg")
        )
    # GIF: an LZW minimum code size no decoder takes, a descriptor past the screen, no image at all.
    lzw_at = gif.index(b",") + 10
    color_table = gif[lzw_at - 10 + 9] & 0x80
    if color_table:
        lzw_at += 3 * (2 ** ((gif[lzw_at - 10 + 9] & 7) + 1))
    for size in (0, 12, 13, 255):
        out.append(
            Case(
                f"gif/lzw-size-{size}",
                "corrupt_body",
                IMAGE,
                _b64(gif[:lzw_at] + bytes([size]) + gif[lzw_at + 1 :]),
                "image/gif",
            )
        )
    out.append(Case("gif/no-image", "corrupt_body", IMAGE, _b64(gif[: gif.index(b",")] + b";"), "image/gif"))
    # WebP: a RIFF/VP8 wrapper around a bitstream of noise.
    for fourcc in (b"VP8 ", b"VP8L", b"VP8X"):
        for i in range(3):
            junk = bytes(rng.randrange(256) for _ in range(40 + 60 * i))
            chunk = fourcc + struct.pack("<I", len(junk)) + junk
            riff = b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk
            out.append(
                Case(f"webp/{fourcc.decode().strip()}-noise#{i}", "corrupt_body", IMAGE, _b64(riff), "image/webp")
            )
    # Seeded byte flips past each header, kept only where Pillow refuses the result.
    for name, (data, mime) in sources().items():
        kept = 0
        for seed in range(60):
            if kept == 8:
                break
            r = random.Random(seed * 31 + len(name))
            damaged = bytearray(data)
            for _ in range(12):
                damaged[r.randrange(20, len(data))] = r.randrange(256)
            if pillow_refuses(bytes(damaged)):
                out.append(Case(f"{name}/flips#{seed}", "corrupt_body", IMAGE, _b64(bytes(damaged)), mime))
                kept += 1
    return [c for c in out if pillow_refuses(base64.b64decode(c.b64))]


HUGE = ((60000, 60000), (65535, 65535), (30000, 30000), (65535, 3000), (3000, 65535))


def _huge_dims() -> list[Case]:
    """Tiny files whose headers claim billions of pixels: a decoder that allocates first dies."""
    out = []
    jpeg, _ = sources()["jpeg"]
    gif, _ = sources()["gif"]
    webp, _ = sources()["webp"]
    for w, h in HUGE:
        tag = f"{w}x{h}"
        out.append(
            Case(f"png/huge-{tag}", "huge_dims", IMAGE, _b64(_png(w, h, zlib.compress(b"\x00" * 64))), "image/png")
        )
        sof = _patch_jpeg(jpeg, 0xC0, 1, struct.pack(">HH", h, w))
        out.append(Case(f"jpeg/huge-{tag}", "huge_dims", IMAGE, _b64(sof), "image/jpeg"))
        screen = gif[:6] + struct.pack("<HH", w, h) + gif[10:]
        at = screen.index(b",")
        both = screen[: at + 5] + struct.pack("<HH", w, h) + screen[at + 9 :]
        out.append(Case(f"gif/huge-{tag}", "huge_dims", IMAGE, _b64(both), "image/gif"))
        vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00" + (w - 1).to_bytes(3, "little")
        vp8x += (h - 1).to_bytes(3, "little")
        inner = webp[12:]
        riff = b"RIFF" + struct.pack("<I", 4 + len(vp8x) + len(inner)) + b"WEBP" + vp8x + inner
        out.append(Case(f"webp/huge-vp8x-{tag}", "huge_dims", IMAGE, _b64(riff), "image/webp"))
    return out


def _empty() -> list[Case]:
    out = []
    for slot, mime in ((IMAGE, "image/png"), (AUDIO, "audio/wav")):
        for label, data in (
            ("empty", b""),
            ("nul", b"\x00"),
            ("nul16", bytes(16)),
            ("nul4k", bytes(4096)),
            ("ff64", b"\xff" * 64),
        ):
            out.append(Case(f"{slot}/{label}", "empty", slot, _b64(data), mime))
    return out


def _base64() -> list[Case]:
    png, _ = sources()["png"]
    good = _b64(png)
    cases = {
        "spaces-only": "    ",
        "text": "this is not base64 at all",
        "bang": "!!!!",
        "percent": "%%%%%%%%",
        "unicode": "ümläut☃",
        "one-char": "A",
        # Padding merely left off is no case: clients strip it and localrun's door restores it.
        "length-1-mod-4": good + "A",  # no padding makes 4n+1 characters whole bytes
        "pad-in-middle": good[:40] + "==" + good[40:],
        "triple-pad": "QUJD===",
        "only-padding": "====",
        "junk-in-png": good[:20] + "!@#$" + good[20:],
        "html": "<html><body>hi</body></html>",
        "json": '{"image": "png"}',
        "hex-of-png": png.hex(),
        "urlsafe-with-junk": good[:30].replace("+", "-").replace("/", "_") + "*" + good[30:],
        "nul-in-text": good[:16] + "\x00" + good[16:],
        "data-url-twice": "data:image/png;base64," * 2 + good,  # a data URL in a data URL
        "base64-of-base64": _b64(good.encode()),
        "truncated-quad": good[: (len(good) // 2) + 1],
    }
    return [Case(f"base64/{label}", "base64", IMAGE, value, "image/png") for label, value in cases.items()]


def _data_url() -> list[Case]:
    png, _ = sources()["png"]
    good = _b64(png)
    out = []
    # The payload is a good PNG; the URL around it is not one an image may come in.
    for label, mime in (
        ("text-html", "text/html"),
        ("text-plain", "text/plain"),
        ("application-pdf", "application/pdf"),
        ("octet-stream", "application/octet-stream"),
        ("audio-wav", "audio/wav"),
        ("video-mp4", "video/mp4"),
        ("image-svg", "image/svg+xml"),
    ):
        out.append(Case(f"data_url/mime-{label}", "data_url", IMAGE, good, mime, needs=NEEDS_MIME))
    svg = _b64(b'<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"><rect width="9" height="9"/></svg>')
    out.append(Case("data_url/svg-payload", "data_url", IMAGE, svg, "image/svg+xml"))
    html = "aGVsbG8="  # llama-server's own case: data:text/html;base64,aGVsbG8=
    out.append(Case("data_url/llama-server-html", "data_url", IMAGE, html, "text/html"))
    bad = _b64(png[: len(png) // 3])  # a truncated payload, so only the URL's shape is on trial
    for label, url in (
        ("no-mime", f"data:;base64,{bad}"),
        ("no-mime-no-semicolon", f"data:base64,{bad}"),
        ("no-base64-flag", f"data:image/png,{bad}"),
        ("no-comma", f"data:image/png;base64{bad}"),
        ("empty-payload", "data:image/png;base64,"),
        ("bare-data", "data:"),
        ("malformed", "malformed"),  # llama-server's own case
        ("file-scheme", "file:///etc/passwd"),
        ("ftp-scheme", "ftp://127.0.0.1/x.png"),
        ("javascript", "javascript:alert(1)"),
        ("loopback-http", "http://127.0.0.1:9/x.png"),  # URL fetching is off by default
        ("metadata-http", "http://169.254.169.254/latest/meta-data/"),
        ("empty", ""),
    ):
        out.append(Case(f"data_url/{label}", "data_url", IMAGE, bad, "image/png", url=url))
    return out


def _wrong_kind() -> list[Case]:
    out = []
    for name, (data, _mime) in sources().items():
        out.append(Case(f"{name}/as-audio", "wrong_kind", AUDIO, _b64(data), "audio/wav", needs=NEEDS_AUDIO_SLOT))
    for label, clip in (
        ("wav-16k", wav_bytes()),
        ("wav-stereo", wav_bytes(channels=2)),
        ("wav-8bit", wav_bytes(width=1)),
    ):
        out.append(Case(f"{label}/as-image", "wrong_kind", IMAGE, _b64(clip), "image/png"))
    return out


def _riff(fmt: bytes, data: bytes, *, riff_size: int | None = None, wave_id: bytes = b"WAVE") -> bytes:
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    size = 4 + len(chunks) if riff_size is None else riff_size
    return b"RIFF" + struct.pack("<I", size) + wave_id + chunks


def _fmt(tag=1, channels=1, rate=16000, bits=16, byte_rate=None, align=None) -> bytes:
    align = channels * max(bits, 8) // 8 if align is None else align
    byte_rate = rate * align if byte_rate is None else byte_rate
    return struct.pack("<HHIIHH", tag, channels, rate, byte_rate & 0xFFFFFFFF, align & 0xFFFF, bits)


def _wav() -> list[Case]:
    clip = wav_bytes()
    pcm = clip[44:]
    out = []
    for cut in sorted({*range(1, 44, 3), 44, 45, 47}):
        out.append(Case(f"wav/truncated@{cut}of{len(clip)}", "wav", AUDIO, _b64(clip[:cut]), "audio/wav"))
    lies = {
        "riff-size-huge": _riff(_fmt(), pcm, riff_size=0xFFFFFFF0),
        "riff-size-zero": _riff(_fmt(), pcm, riff_size=0),
        "data-size-huge": clip[:40] + struct.pack("<I", 0xFFFFFFF0) + pcm[:64],
        "data-size-odd": clip[:40] + struct.pack("<I", 0x7FFFFFFF) + pcm[:3],
        "channels-0": _riff(_fmt(channels=0), pcm),
        "channels-65535": _riff(_fmt(channels=65535), pcm),
        "bits-0": _riff(_fmt(bits=0), pcm),
        "bits-1": _riff(_fmt(bits=1), pcm),
        "bits-3": _riff(_fmt(bits=3), pcm),
        "bits-7": _riff(_fmt(bits=7), pcm),
        "bits-13": _riff(_fmt(bits=13, align=2), pcm),
        "bits-64-pcm": _riff(_fmt(bits=64), pcm),
        "bits-65535": _riff(_fmt(bits=65535, align=2), pcm),
        "rate-0": _riff(_fmt(rate=0), pcm),
        "align-0": _riff(_fmt(align=0), pcm),
        "format-0": _riff(_fmt(tag=0), pcm),
        "format-mp3-in-wav": _riff(_fmt(tag=0x55), pcm),
        "format-ffff": _riff(_fmt(tag=0xFFFF), pcm),
        "extensible-no-ext": _riff(_fmt(tag=0xFFFE), pcm),
        "fmt-too-short": _riff(_fmt()[:8], pcm),
        "fmt-size-huge": b"RIFF" + struct.pack("<I", 4000) + b"WAVEfmt " + struct.pack("<I", 0x7FFFFFFF) + _fmt(),
        "no-fmt": b"RIFF" + struct.pack("<I", 12 + len(pcm)) + b"WAVE" + b"data" + struct.pack("<I", len(pcm)) + pcm,
        "no-data": b"RIFF" + struct.pack("<I", 28) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + _fmt(),
        "wave-id-wrong": _riff(_fmt(), pcm, wave_id=b"WAVX"),
        "rifx-big-endian-junk": b"RIFX" + clip[4:12] + bytes(reversed(clip[12:60])),
        "riff-avi": _riff(_fmt(), pcm, wave_id=b"AVI "),
    }
    out += [Case(f"wav/{label}", "wav", AUDIO, _b64(data), "audio/wav") for label, data in lies.items()]
    return out


def _mp3() -> list[Case]:
    rng = random.Random(3)
    out = []
    frame_header = b"\xff\xfb\x90\x64"  # MPEG-1 layer III, 128 kbit/s, 44.1 kHz
    for i in range(6):
        junk = bytes(rng.randrange(256) for _ in range(50 + 200 * i))
        out.append(Case(f"mp3/frame-then-noise#{i}", "mp3", AUDIO, _b64(frame_header + junk), "audio/mpeg"))
    out.append(Case("mp3/id3-only", "mp3", AUDIO, _b64(b"ID3\x04\x00\x00\x00\x00\x00\x00"), "audio/mpeg"))
    out.append(
        Case("mp3/id3-size-huge", "mp3", AUDIO, _b64(b"ID3\x04\x00\x00\x7f\x7f\x7f\x7f" + bytes(32)), "audio/mpeg")
    )
    out.append(
        Case(
            "mp3/id3-then-noise",
            "mp3",
            AUDIO,
            _b64(b"ID3\x03\x00\x00\x00\x00\x00\x10" + bytes(16) + bytes(rng.randrange(256) for _ in range(400))),
            "audio/mpeg",
        )
    )
    for label, header in (
        ("bad-layer", b"\xff\xf9\x90\x64"),
        ("bad-bitrate", b"\xff\xfb\xf0\x64"),
        ("bad-rate", b"\xff\xfb\x9c\x64"),
    ):
        out.append(Case(f"mp3/{label}", "mp3", AUDIO, _b64(header * 40), "audio/mpeg"))
    out.append(Case("mp3/sync-only", "mp3", AUDIO, _b64(b"\xff\xe0" * 200), "audio/mpeg"))
    out.append(Case("mp3/noise", "mp3", AUDIO, _b64(bytes(rng.randrange(256) for _ in range(2000))), "audio/mpeg"))
    return out


@cache
def cases() -> tuple[Case, ...]:
    """The whole corpus, in a fixed order."""
    out = [
        *_truncated(),
        *_wrong_magic(),
        *_corrupt_body(),
        *_huge_dims(),
        *_empty(),
        *_base64(),
        *_data_url(),
        *_wrong_kind(),
        *_wav(),
        *_mp3(),
    ]
    tags = [c.tag for c in out]
    assert len(tags) == len(set(tags)), "corpus tags must be unique"
    return tuple(out)
