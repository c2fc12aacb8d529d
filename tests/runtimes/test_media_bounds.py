"""The decoder child is bounded by what its work becomes: pictures scaled to what the projector
consumes, 16-bit pictures not widened, a cap of CPU time (not wall-clock), and the limits the
server's door uses (one set of constants), so what the door admits the child decodes."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from localrun.chat.media import MediaReader
from localrun.errors import InvalidMedia
from localrun.runtimes.llamacpp.media.decoder import TEST_HOOKS_ENV, TEST_IDLE, TEST_SPIN, MediaDecoder
from localrun.settings import ServerSettings
from localrun.types import MAX_IMAGE_PIXELS
from tests.server.media_samples import png_claiming
from tests.support import vision as V


@pytest.fixture(scope="module")
def decoder():
    with MediaDecoder(timeout_s=20.0) as d:
        yield d


def _png(size: tuple[int, int], mode: str = "RGB", fill: object = (200, 10, 10)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size, fill).save(buf, "PNG")  # type: ignore[arg-type]
    return buf.getvalue()


def _jpeg(size: tuple[int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 10)).save(buf, "JPEG")
    return buf.getvalue()


def test_a_large_picture_comes_back_scaled_to_the_fit_keeping_its_shape(decoder):
    for data in (_png((4000, 2000)), _jpeg((4000, 2000)), _png((3000, 1500), "P", 3)):
        img = decoder.image(data, fit_pixels=2 * 896 * 896)
        assert img.nx * img.ny <= 2 * 896 * 896
        assert img.nx * img.ny > 0.9 * 2 * 896 * 896  # not smaller than asked: the projector gets its detail
        assert abs(img.nx / img.ny - 2.0) < 0.01
        assert len(img.rgb) == img.nx * img.ny * 3
    small = decoder.image(_png((300, 200)), fit_pixels=2 * 896 * 896)
    assert (small.nx, small.ny) == (300, 200)  # never scaled up


def test_a_16_bit_picture_is_scaled_and_still_8_bit_grey(decoder):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((1200, 1000), 65535, np.uint16)).save(buf, "PNG")
    img = decoder.image(buf.getvalue(), fit_pixels=100_000)
    assert img.nx * img.ny <= 100_000
    assert set(np.frombuffer(img.rgb, np.uint8).tolist()) == {255}


def test_exif_orientation_survives_the_scaling(decoder):
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° CW to view"
    buf = io.BytesIO()
    Image.new("RGB", (2000, 1000)).save(buf, "JPEG", exif=exif)
    img = decoder.image(buf.getvalue(), fit_pixels=200_000)
    assert img.ny > img.nx  # upright: taller than wide


def test_the_cap_counts_cpu_time_not_a_loaded_machines_wall_clock(monkeypatch):
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    with MediaDecoder(timeout_s=1.0, wall_factor=60.0) as d:  # the backstop far off: the CPU cap must act
        d.image(V.image_bytes("PNG"))  # the child is up
        # 1.5 s without CPU (the machine gave the child none) is not 1.5 s of decoding.
        assert d.image(TEST_IDLE + V.image_bytes("PNG")).nx == 64
        with pytest.raises(InvalidMedia, match="1-second cap of CPU time"):
            d.image(TEST_SPIN)
        assert d.image(V.image_bytes("PNG")).nx == 64  # a fresh child took over
        assert d.restarts == 1


def _wav(channels: int, data_size: int | None = None) -> bytes:
    frames = 1600
    pcm = b"\x00\x10" * frames * channels
    fmt = struct.pack("<HHIIHH", 1, channels, 16000, 16000 * channels * 2, channels * 2, 16)
    size = len(pcm) if data_size is None else data_size
    chunks = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", size) + pcm
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


@pytest.mark.parametrize(
    "data", [_wav(1, 0), _wav(1, 0xFFFFFFFF), _wav(17), _wav(32)], ids=["size 0", "size -1", "17 ch", "32 ch"]
)
def test_audio_the_door_admits_the_child_decodes(decoder, data):
    MediaReader().check(data, "input_audio")  # the door takes it…
    assert decoder.audio(data, 16000).n == 1600  # …and so does the child


def test_the_door_and_the_child_share_one_pixel_cap(decoder):
    assert ServerSettings().max_image_pixels == MAX_IMAGE_PIXELS == decoder.max_pixels
    with pytest.raises(ValueError):
        ServerSettings(max_image_pixels=MAX_IMAGE_PIXELS + 1)
    # 8192×8000 = 65.5 MP: under the door's old 64 MiB, over the child's 64,000,000.
    with pytest.raises(InvalidMedia, match="server.max_image_pixels"):
        MediaReader().check(png_claiming(8192, 8000), "image")


def test_a_clip_over_the_shared_duration_cap_is_refused_at_the_door_as_in_the_child(decoder):
    fmt = struct.pack("<HHIIHH", 1, 1, 1000, 1000, 1, 8)  # 8-bit mono at 1 kHz: 1,000 bytes a second
    pcm = b"\x80" * 301_000
    chunks = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(pcm)) + pcm
    long_wav = b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks
    with pytest.raises(InvalidMedia, match="300-second cap"):
        MediaReader().check(long_wav, "input_audio")
    with pytest.raises(InvalidMedia, match="over the 300-second cap"):
        decoder.audio(long_wav, 16000)
    MediaReader().check(_wav(1), "input_audio")  # a short one passes
