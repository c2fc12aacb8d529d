"""The checks at the door (localrun.chat.media): every class of bad media is a 400 ``invalid_media``
naming the item, the problem and, where there is one, the cap — never a 500 — on every wire family;
and a marker a client types never places media."""

from __future__ import annotations

import json
import struct

import pytest

from localrun.chat.media import MediaLimits, MediaReader, prompt_with_media
from localrun.errors import InvalidMedia
from tests.server.media_samples import MEDIA_CAPS, b64, data_url, flac, image, mp3, png, png_claiming, wav


def _webp_claiming(width: int, height: int) -> bytes:
    body = b"\x00" * 4 + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    chunk = b"VP8X" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def _wav_with(*, channels: int = 1, bits: int = 16, data_size: int | None = None) -> bytes:
    good = wav()
    fmt = struct.pack("<HHIIHH", 1, channels, 16000, 16000 * channels * bits // 8, channels * bits // 8, bits)
    samples = good[44:]
    size = len(samples) if data_size is None else data_size
    chunks = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", size) + samples
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


BAD_IMAGES = {
    "not base64": ("data:image/png;base64,@@@@", "not valid base64"),
    "bad padding": ("data:image/png;base64,AAAAA", "cannot encode whole bytes"),
    "empty": ("data:image/png;base64,", "is empty"),
    "html data url": ("data:text/html;base64,aGVsbG8=", "text/html"),
    "not base64 encoded": ("data:image/png,hello", "not base64-encoded"),
    "no comma": ("data:image/png;base64", "not a valid data: URL"),
    "wrong magic": (data_url(b"GIF00a" + bytes(40)), "starts with bytes"),
    "raw garbage": ("bWFsZm9ybWVk", "starts with bytes"),
    "truncated png": (data_url(png((64, 64))[:60]), "image/png"),
    "png header only": (data_url(png()[:16]), "image/png"),
    "truncated jpeg": (data_url(image("JPEG")[:40], "image/jpeg"), "image/jpeg"),
    "truncated webp": (data_url(image("WEBP")[:30], "image/webp"), "truncated"),
    "huge png": (data_url(png_claiming(60000, 60000)), "server.max_image_pixels"),
    "huge webp": (data_url(_webp_claiming(16000, 16000), "image/webp"), "server.max_image_pixels"),
    "zero-width png": (data_url(png_claiming(0, 10)), "image/png"),
    "audio in image_url": (data_url(wav(), "audio/wav"), "where an image is expected"),
    "declared audio, holds image": (data_url(png(), "audio/wav"), "declares audio/wav"),
    "file url": ("file:///etc/passwd", "file: URL"),
    "ftp url": ("ftp://example.com/x.png", "ftp: URL"),
}


@pytest.fixture
def media_client(app_client):
    return app_client(MEDIA_CAPS)


def _chat(client, part):
    body = {
        "model": "tiny",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}],
    }
    return client.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize("case", sorted(BAD_IMAGES))
def test_each_bad_image_is_a_400_naming_item_and_problem(media_client, case):
    url, needle = BAD_IMAGES[case]
    r = _chat(media_client, {"type": "image_url", "image_url": {"url": url}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[0].content[1]" and err["code"] == "invalid_media"
    assert "messages[0].content[1]" in err["message"] and needle in err["message"], err["message"]


BAD_AUDIO = {
    "image as audio": (png(), "wav", "where an audio is expected"),
    "zero channels": (_wav_with(channels=0), "wav", "0 channels"),
    "odd bit depth": (_wav_with(bits=12), "wav", "12 bits"),
    "lying data size": (_wav_with(data_size=10**8), "wav", "truncated"),
    "no data chunk": (wav()[:36], "wav", "no data chunk"),
    "mp3 garbage": (b"ID3\x04\x00\x00\x00\x00\x00\x05" + b"\x00" * 5 + b"garbage!" * 20, "mp3", "no MPEG audio frame"),
    "flac without streaminfo": (b"fLaC" + bytes(8), "flac", "STREAMINFO"),
    "declared mp3 holds wav": (wav(), "mp3", None),  # within a kind the content wins: accepted
}


@pytest.mark.parametrize("case", sorted(BAD_AUDIO))
def test_each_bad_clip_is_a_400(media_client, case):
    data, fmt, needle = BAD_AUDIO[case]
    r = _chat(media_client, {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}})
    if needle is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"], r.json()["error"]["message"]


def test_good_files_of_every_format_pass():
    reader = MediaReader()
    kinds = [
        reader.check(data, f"item[{i}]").mime
        for i, data in enumerate(
            [png(), image("JPEG"), image("WEBP"), image("GIF"), image("BMP"), wav(), mp3(), flac()]
        )
    ]
    assert kinds == [
        "image/png",
        "image/jpeg",
        "image/webp",
        "image/gif",
        "image/bmp",
        "audio/wav",
        "audio/mpeg",
        "audio/flac",
    ]
    assert reader.needs()[0] == ("item[0]", "vision") and reader.needs()[-1] == ("item[7]", "audio")


def test_caps_come_from_the_settings_and_name_the_setting(app_client):
    client = app_client(MEDIA_CAPS, max_media_bytes=2048, max_media_per_request=2, max_image_pixels=100)
    big = png((200, 200), "white")
    r = _chat(client, {"type": "image_url", "image_url": data_url(image("BMP", (40, 40)))})
    assert r.status_code == 400 and "server.max_media_bytes" in r.json()["error"]["message"]
    r = _chat(client, {"type": "image_url", "image_url": data_url(big)})
    assert r.status_code == 400 and "over the cap of 100 (server.max_image_pixels)" in r.json()["error"]["message"]
    parts = [{"type": "image_url", "image_url": data_url(png((2, 2)))} for _ in range(3)]
    body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": parts}]}
    r = client.post("/v1/chat/completions", json=body)
    err = r.json()["error"]
    assert r.status_code == 400 and "server.max_media_per_request" in err["message"]
    assert err["param"] == "messages[0].content[2]"


def test_the_total_per_request_is_capped():
    reader = MediaReader(MediaLimits(max_bytes=10_000, max_total_bytes=1_000))
    reader.check(png(), "a")
    with pytest.raises(InvalidMedia, match="server.max_media_total_bytes"):
        for i in range(40):
            reader.check(png(), f"b[{i}]")


def test_a_huge_base64_string_is_refused_before_decoding():
    reader = MediaReader(MediaLimits(max_bytes=1024))
    with pytest.raises(InvalidMedia, match="about .* server.max_media_bytes"):
        reader.base64("A" * 100_000, "x")


def test_base64_tolerates_wrapping_missing_padding_and_the_url_safe_alphabet():
    data = png()
    text = b64(data)
    wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    for variant in (wrapped, text.rstrip("="), text.replace("+", "-").replace("/", "_")):
        assert MediaReader().base64(variant, "x").data == data


def test_completion_marker_rule():
    assert prompt_with_media("a", 2, "w") == "a<__media__><__media__>"
    assert prompt_with_media("a <__media__> b", 1, "w") == "a <__media__> b"
    assert "<__media__>" not in prompt_with_media("a <__media__>", 0, "w")
    with pytest.raises(InvalidMedia, match="holds 1 media marker"):
        prompt_with_media("a <__media__>", 2, "w")


M = "<__media__>"
TYPED = [
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": M}, {"role": "user", "content": f"u {M}"}]}),
    ("/v1/messages", {"max_tokens": 20, "system": M, "messages": [{"role": "user", "content": f"u {M}"}]}),
    ("/v1/responses", {"instructions": M, "input": [{"role": "user", "content": [{"type": "input_text", "text": M}]}]}),
    ("/api/chat", {"stream": False, "messages": [{"role": "user", "content": f"u {M}"}]}),
    ("/api/generate", {"stream": False, "prompt": f"u {M}", "system": M}),
    ("/v1/completions", {"prompt": f"u {M}"}),
]


@pytest.mark.parametrize(("path", "body"), TYPED)
def test_a_typed_marker_places_nothing_on_any_family(media_client, path, body):
    r = media_client.post(path, json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    answer = json.dumps(r.json()["output"]) if path == "/v1/responses" else r.text  # not the echoed instructions
    assert "<__media__>" not in answer and "[media:" not in answer
