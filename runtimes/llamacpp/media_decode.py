"""Decode a request's image and audio files into what mtmd's bitmaps take, in a sacrificial process.

API (the llama.cpp engine codes against this; keep it stable)::

    decoder = MediaDecoder(max_bytes=20 << 20, max_pixels=50_000_000, max_audio_s=600.0, timeout_s=10.0)
    img = decoder.image(data)             # -> DecodedImage(nx, ny, rgb: bytes (nx*ny*3, row-major RGB), digest)
    clip = decoder.audio(data, 16000)     # -> DecodedAudio(samples: bytes (float32 LE mono), n, digest)
    decoder.close()

``digest`` is the sha256 hex of the decoded pixels (with nx, ny) or samples (with the rate): what
the prefix cache keys a media chunk on, so the same picture re-encoded as PNG or JPEG-quality-100
is not confused with another and the same bytes always hit.

Every refusal raises :class:`localrun.errors.InvalidMedia` naming the problem (and the cap, when
a cap is what refused it). A decoder that crashes the child process fails only the request it was
decoding (``InvalidMedia``); the child is restarted for the next one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodedImage:
    nx: int
    ny: int
    rgb: bytes
    digest: str


@dataclass(frozen=True)
class DecodedAudio:
    samples: bytes
    n: int
    digest: str
