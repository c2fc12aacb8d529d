"""The file formats behind :mod:`.decoder`: image and audio bytes to pixels and samples.

Runs inside the decoder's child process (``python -m localrun.runtimes.llamacpp.media.decoder``),
never in the worker: Pillow's and miniaudio's C parsers read whatever a client sends, and a
crash here must cost one request, not a loaded model. Every refusal is :class:`BadMedia`, whose
message goes back to the client as an ``InvalidMedia`` 400.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import re
import struct
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from localrun.types import MAX_AUDIO_CHANNELS

if TYPE_CHECKING:
    from PIL import Image

log = logging.getLogger(__name__)

#: Pillow format names taken, in the words a refusal uses.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
IMAGE_FORMATS_TEXT = "PNG, JPEG, WebP, GIF or BMP"
AUDIO_FORMATS_TEXT = "WAV, MP3, FLAC or Ogg Vorbis"

# Formats worth naming when refused: (magic at offset, name). Sniffed, never parsed.
_KNOWN_IMAGE_MAGIC = (
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (4, b"ftypheic", "HEIC"),
    (4, b"ftypheix", "HEIC"),
    (4, b"ftypmif1", "HEIF"),
    (4, b"ftypavif", "AVIF"),
    (0, b"\x00\x00\x01\x00", "ICO"),
    (0, b"8BPS", "PSD"),
    (0, b"%PDF", "PDF"),
    (0, b"<svg", "SVG"),
    (0, b"<?xml", "SVG/XML"),
    (0, b"\xff\x0a", "JPEG XL"),
    (0, b"\x00\x00\x00\x0cJXL ", "JPEG XL"),
    (0, b"qoif", "QOI"),
)


class BadMedia(ValueError):
    """The file cannot be used; the message says why (and the cap, when a cap refused it)."""


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"


def image_digest(nx: int, ny: int, rgb: bytes) -> str:
    return hashlib.sha256(b"rgb:%dx%d:" % (nx, ny) + rgb).hexdigest()


def audio_digest(rate: int, samples: bytes) -> str:
    return hashlib.sha256(b"f32le:%d:" % rate + samples).hexdigest()


_TAKEN_IMAGE_MAGIC = (
    (0, b"\x89PNG", "PNG"),
    (0, b"\xff\xd8\xff", "JPEG"),
    (0, b"GIF8", "GIF"),
    (0, b"BM", "BMP"),
    (8, b"WEBP", "WebP"),
)


def _taken_name(data: bytes) -> str | None:
    for offset, magic, name in _TAKEN_IMAGE_MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return name
    return None


def _name_unknown_image(data: bytes) -> str:
    head = data[:32]
    taken = _taken_name(head)
    if taken:
        return f"corrupt {taken}: its header cannot be read"
    for offset, magic, name in _KNOWN_IMAGE_MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return f"{name} images are not taken: send {IMAGE_FORMATS_TEXT}"
    return f"not an image in a known format ({IMAGE_FORMATS_TEXT} are taken)"


def decode_image(data: bytes, max_pixels: int, fit_pixels: int = 0) -> tuple[int, int, bytes]:
    """Pixels of the first frame, upright (EXIF orientation applied), alpha over white, RGB8.

    ``fit_pixels`` (0: none): a larger picture is scaled down, its shape kept, to about that many
    pixels — what the projector consumes — before anything else is done with it. A JPEG is decoded
    at a reduced scale to begin with (its DCT can), so a 64-MP photo never exists at full size; the
    conversions to RGB and the bytes sent back are of the small picture."""
    from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

    ImageFile.LOAD_TRUNCATED_IMAGES = False
    # Two header checks, both before any pixel is allocated: Pillow's decompression-bomb guard at
    # open (its warning above the limit made an error, like its own error above 2×), and ours on
    # img.size after it, for any format whose plugin skips the guard.
    Image.MAX_IMAGE_PIXELS = max_pixels
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img: Image.Image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        except UnidentifiedImageError:
            raise BadMedia(_name_unknown_image(data)) from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise BadMedia(_over_cap(exc, max_pixels)) from None
        except (OSError, ValueError, SyntaxError, struct.error, EOFError) as exc:
            raise BadMedia(f"corrupt {_taken_name(data[:32]) or 'image'} header: {exc}") from None
        with img:
            nx, ny = img.size
            if nx <= 0 or ny <= 0:
                raise BadMedia(f"image has no pixels ({nx}×{ny})")
            if nx * ny > max_pixels:  # from the header: nothing is allocated yet
                raise BadMedia(f"image is {nx}×{ny} = {nx * ny} pixels, over the {max_pixels}-pixel cap")
            try:
                img.seek(0)  # GIF / animated WebP: the first frame
                img = _fit(img, fit_pixels)
                img = ImageOps.exif_transpose(img) or img
                rgb = _to_rgb(img)
            except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
                raise BadMedia(_over_cap(exc, max_pixels)) from None
            except (OSError, ValueError, SyntaxError, struct.error, EOFError, IndexError) as exc:
                raise BadMedia(f"corrupt or truncated {img.format or 'image'}: {exc}") from None
    return rgb.size[0], rgb.size[1], rgb.tobytes()


def _fit(img: Image.Image, fit_pixels: int) -> Image.Image:
    """``img`` loaded, and scaled down to about ``fit_pixels`` when it has more (its shape kept)."""
    from PIL import Image

    nx, ny = img.size
    if not fit_pixels or nx * ny <= fit_pixels:
        img.load()
        return img
    scale = math.sqrt(fit_pixels / (nx * ny))
    size = (max(1, int(nx * scale)), max(1, int(ny * scale)))
    img.draft("RGB", size)  # JPEG: decode at 1/2, 1/4 or 1/8 scale, no smaller than ``size``
    img.load()
    if img.mode in ("P", "1", "CMYK", "YCbCr", "LAB", "HSV", "PA"):  # resize takes these poorly or not at all
        img = img.convert("RGBA" if img.mode in ("P", "PA") else "RGB")
    exif = img.getexif()
    small = img.resize(size, Image.Resampling.BICUBIC, reducing_gap=2.0)
    small.info = dict(img.info)
    if exif:
        small.info["exif"] = exif.tobytes()  # exif_transpose reads the orientation from here
    return small


def _over_cap(exc: Exception, max_pixels: int) -> str:
    """Pillow's guard refused the header's size before anything was allocated; say it our way."""
    found = re.search(r"\((\d+) pixels\)", str(exc))
    claimed = f"{found.group(1)} pixels" if found else "more pixels"
    return f"image header claims {claimed}, over the {max_pixels}-pixel cap"


def _to_rgb(img: Image.Image) -> Image.Image:
    from PIL import Image

    has_alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (img.mode == "P" and "transparency" in img.info)
    if has_alpha:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if img.mode.startswith("I;16") or img.mode == "I":
        # 16-bit greyscale PNGs: scale to 8 bits (convert("RGB") would clip everything above 255),
        # in place on the decoded array's own width: no int64 copy of a 64-MP picture.
        grey = np.asarray(img)
        if grey.dtype.kind == "u":
            grey = (grey // 257).astype(np.uint8)
        else:
            grey = np.clip(grey // 257, 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    return img.convert("RGB")


# --- audio ---------------------------------------------------------------------------------------


def sniff_audio(data: bytes) -> str:
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    raise BadMedia(f"not audio in a known format ({AUDIO_FORMATS_TEXT} are taken)")


def decode_audio(data: bytes, rate: int, max_seconds: float) -> np.ndarray:
    """Mono float32 samples at ``rate``; the duration is checked before any sample is decoded."""
    kind = sniff_audio(data)
    if kind == "wav":
        samples, src_rate = _decode_wav(data, max_seconds)
        samples = resample(samples, src_rate, rate)
    else:
        samples = _decode_compressed(data, kind, rate, max_seconds)
    if samples.size == 0:
        raise BadMedia("audio clip holds no samples")
    if not np.isfinite(samples).all():
        raise BadMedia("audio clip holds non-finite samples (NaN or infinity)")
    return np.ascontiguousarray(samples, dtype="<f4")


def _check_duration(frames: int, rate: int, max_seconds: float) -> None:
    if rate <= 0:
        raise BadMedia(f"audio sample rate {rate} is not valid")
    seconds = frames / rate
    if seconds > max_seconds:
        raise BadMedia(f"audio clip is {seconds:.1f} s long, over the {max_seconds:g}-second cap")


#: A data chunk size streaming writers leave when they do not know the length yet: the samples run
#: to the end of the file (the door takes these too).
_UNKNOWN_SIZES = (0, 0xFFFFFFFF)


def _riff_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if cid == b"data" and size in _UNKNOWN_SIZES:
            size = len(data) - pos - 8
        body = data[pos + 8 : pos + 8 + size]
        yield cid, body
        pos += 8 + size + (size & 1)


def _decode_wav(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    """PCM 8/16/24/32-bit and IEEE float 32/64, plain or WAVE_FORMAT_EXTENSIBLE. Python 3.11's
    ``wave`` refuses float and extensible files, so the two chunks that matter are read here."""
    fmt = None
    pcm = None
    for cid, body in _riff_chunks(data):
        if cid == b"fmt ":
            if len(body) < 16:
                raise BadMedia("corrupt WAV: fmt chunk is too short")
            fmt = struct.unpack_from("<HHIIHH", body)
            if fmt[0] == 0xFFFE and len(body) >= 26:  # extensible: the real tag opens the subformat GUID
                fmt = (struct.unpack_from("<H", body, 24)[0], *fmt[1:])
        elif cid == b"data":
            pcm = body  # a truncated data chunk is cut at a whole frame below, as players do
            break
    if fmt is None or pcm is None:
        raise BadMedia("corrupt WAV: no fmt or data chunk")
    tag, channels, rate, _, block, bits = fmt
    if not 1 <= channels <= MAX_AUDIO_CHANNELS:  # the door's bound too
        raise BadMedia(f"WAV has {channels} channels (1 to {MAX_AUDIO_CHANNELS} are taken)")
    kinds = {(1, 8): "u1", (1, 16): "<i2", (1, 24): "i3", (1, 32): "<i4", (3, 32): "<f4", (3, 64): "<f8"}
    kind = kinds.get((tag, bits))
    if kind is None:
        raise BadMedia(f"WAV encoding (format {tag}, {bits}-bit) is not taken: send PCM 8/16/24/32-bit or float")
    width = bits // 8
    frames = len(pcm) // (width * channels)
    _check_duration(frames, rate, max_seconds)
    pcm = pcm[: frames * width * channels]
    if kind == "i3":
        raw = np.frombuffer(pcm, dtype=np.uint8).reshape(-1, 3)
        ints = raw[:, 0].astype(np.int32) | raw[:, 1].astype(np.int32) << 8 | raw[:, 2].astype(np.int32) << 16
        values = np.where(ints >= 1 << 23, ints - (1 << 24), ints).astype(np.float32) / float(1 << 23)
    elif kind == "u1":
        values = (np.frombuffer(pcm, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif kind.startswith("<i"):
        values = np.frombuffer(pcm, dtype=kind).astype(np.float32) / float(1 << (bits - 1))
    else:
        values = np.frombuffer(pcm, dtype=kind).astype(np.float32)
    return values.reshape(-1, channels).mean(axis=1, dtype=np.float32), rate


def _decode_compressed(data: bytes, kind: str, rate: int, max_seconds: float) -> np.ndarray:
    try:
        import miniaudio
    except ImportError:
        raise BadMedia(f"{kind.upper()} audio needs the miniaudio package here: send WAV") from None
    info = {"mp3": miniaudio.mp3_get_info, "flac": miniaudio.flac_get_info, "ogg": miniaudio.vorbis_get_info}[kind]
    try:
        meta = info(data)
        _check_duration(meta.num_frames, meta.sample_rate, max_seconds)
        decoded = miniaudio.decode(data, output_format=miniaudio.SampleFormat.FLOAT32, nchannels=1, sample_rate=rate)
    except miniaudio.DecodeError as exc:
        raise BadMedia(f"corrupt or truncated {kind.upper()}: {exc}") from None
    return np.frombuffer(decoded.samples, dtype=np.float32)


def resample(samples: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Band-limited resampling by FFT (the spectrum cut or zero-padded to the new length): no
    aliasing when going down from 44.1/48 kHz to a projector's 16 kHz, unlike linear interpolation."""
    if src == dst or samples.size == 0:
        return samples.astype(np.float32, copy=False)
    n_out = max(1, round(samples.size * dst / src))
    spectrum = np.fft.rfft(samples.astype(np.float64))
    keep = n_out // 2 + 1
    if keep <= spectrum.size:
        spectrum = spectrum[:keep]
    else:
        spectrum = np.concatenate([spectrum, np.zeros(keep - spectrum.size, dtype=spectrum.dtype)])
    return (np.fft.irfft(spectrum, n_out) * (n_out / samples.size)).astype(np.float32)
