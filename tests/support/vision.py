"""Projector fixtures for issue 19: random-weight mmproj GGUFs that pair with the real Gemma 3 270M.

No vision GGUF is reachable from a package registry here, so the tests build their own projector
in set-up, straight from the ``gguf`` writer (no torch), and cache it in the test cache beside the
Gemma file. Its answers are noise, but everything measurable is real: mtmd loads it against the
text model (``n_embd`` must match), reports vision/audio support, tokenizes an image into
``<start_of_image>`` + image tokens + ``<end_of_image>``, and encodes it through the real graph.

What ``tools/mtmd/clip.cpp`` needs, and so what is written here:

* vision, projector type ``gemma3`` (``models/siglip.cpp``): the SigLIP ViT (``v.patch_embd`` conv
  + bias, learned ``v.position_embd``, per block ``ln1``/``ln2`` LayerNorms with bias, separate
  ``attn_q/k/v/out`` with bias, ``ffn_up``/``ffn_down`` with bias; ``v.post_ln``) then Gemma 3's
  projector: an avg pool of ``n_merge``×``n_merge`` patches, RMS norm × ``mm.soft_emb_norm`` and
  ``mm.input_projection`` (shape [vision n_embd, text n_embd]; F16 because the graph transposes
  it). Keys: ``clip.has_vision_encoder``, ``clip.projector_type``, ``clip.vision.{image_size,
  patch_size, embedding_length, feed_forward_length, block_count, attention.head_count,
  attention.layer_norm_epsilon, projection_dim, image_mean, image_std}``, ``clip.use_gelu``, and
  ``clip.vision.projector.scale_factor`` when the pool is not the default 4.
* audio, projector type ``qwen2a`` (``models/whisper-enc.cpp``): the simplest audio type mtmd
  takes without a frame stack: Whisper's two conv1d (kernel 3, the second stride 2), a learned
  ``a.position_embd`` of 1500 rows (30 s of 10 ms mel frames, halved by the conv), the same ViT
  blocks (no bias on ``attn_k``), ``a.post_ln``, a 2× avg pool and ``mm.a.fc``. mtmd computes the
  128-bin log-mel itself at 16 kHz; one 30 s chunk of audio becomes 750 embeddings.

Shapes here are numpy's, the reverse of ggml's ``ne``.
"""

from __future__ import annotations

import io
import logging
import math
import os
import struct
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

log = logging.getLogger(__name__)

TEST_CACHE = Path(os.environ.get("LOCALRUN_TEST_CACHE", Path.home() / ".cache" / "localrun-test"))
VISION_CACHE = TEST_CACHE / "vision"
GEMMA3_270M_N_EMBD = 640
"""Gemma 3 270M's ``gemma3.embedding_length``: a projector's output width must equal it."""

# SigLIP's preprocessing for Gemma 3 (preprocessor_config.json of google/gemma-3-4b-it).
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)
FORMAT_VERSION = 2
"""Bumped when what a builder writes changes, so a stale cached file is rebuilt, not reused."""


@dataclass(frozen=True)
class VisionShape:
    """The shape of a Gemma-3-layout vision projector; tokens per image = (image/patch/merge)²."""

    name: str
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_merge: int
    quant: str  # "f32" | "f16" | "q8_0": the block matrices' type

    @property
    def tokens_per_image(self) -> int:
        side = self.image_size // self.patch_size // self.n_merge
        return side * side


TINY = VisionShape(
    "tiny", image_size=64, patch_size=8, n_embd=64, n_ff=128, n_layer=2, n_head=4, n_merge=2, quant="f32"
)
"""8×8 patches pooled 2×2: 16 image tokens, encoded in milliseconds."""
SIGLIP400M = VisionShape(
    "siglip400m", image_size=896, patch_size=14, n_embd=1152, n_ff=4304, n_layer=27, n_head=16, n_merge=4, quant="q8_0"
)
"""SigLIP-so400m as Gemma 3 4B–27B use it: 64×64 patches pooled 4×4, 256 image tokens."""
VISION_SHAPES = {s.name: s for s in (TINY, SIGLIP400M)}


@dataclass(frozen=True)
class AudioShape:
    name: str
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_mel: int = 128
    n_pos: int = 1500


TINY_AUDIO = AudioShape("tiny-audio", n_embd=64, n_ff=128, n_layer=2, n_head=4)
AUDIO_SAMPLE_RATE = 16000
"""What mtmd's whisper preprocessor resamples nothing to: the clip must already be 16 kHz mono."""


def _ggml_type(quant: str):
    from gguf import GGMLQuantizationType as Q

    return {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0}[quant]


class _Weights:
    """Random weights for one writer. Repeating blocks reuse one set of matrices (``pool``): the
    encode does the same arithmetic whatever the values, and a 27-block SigLIP then takes seconds
    to write instead of minutes of random numbers and quantizing."""

    def __init__(self, writer, seed: int, quant: str = "f32") -> None:
        self.w = writer
        self.rng = np.random.default_rng(seed)
        self.quant = quant
        self._cache: dict[tuple, tuple[np.ndarray, object]] = {}

    def _prepare(self, array: np.ndarray, quant: str):
        from gguf import GGMLQuantizationType as Q
        from gguf.quants import quantize

        qtype = _ggml_type(quant)
        if qtype == Q.F32:
            return array.astype(np.float32), None
        if qtype == Q.F16:
            return array.astype(np.float16), None
        return quantize(array.astype(np.float32), qtype), qtype

    def random(self, shape: tuple[int, ...], scale: float = 0.02) -> np.ndarray:
        return (self.rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    def add(self, name: str, array: np.ndarray, quant: str = "f32") -> None:
        data, raw = self._prepare(array, quant)
        if raw is None:
            self.w.add_tensor(name, data)
        else:
            self.w.add_tensor(name, data, raw_dtype=raw)

    def matrix(self, name: str, shape: tuple[int, int], key: tuple | None = None) -> None:
        """A block matrix in the writer's quant, shared across blocks under ``key``."""
        # Q8_0 packs 32 values along a row (numpy's last axis); SigLIP's 4304-wide ffn_down is not a
        # multiple, so that one falls back to F16, as llama-quantize leaves it in real projectors.
        quant = self.quant if self.quant != "q8_0" or shape[-1] % 32 == 0 else "f16"
        cache_key = (key, shape, quant) if key is not None else None
        if cache_key is not None and cache_key in self._cache:
            data, raw = self._cache[cache_key]
        else:
            data, raw = self._prepare(self.random(shape), quant)
            if cache_key is not None:
                self._cache[cache_key] = (data, raw)
        if raw is None:
            self.w.add_tensor(name, data)
        else:
            self.w.add_tensor(name, data, raw_dtype=raw)

    def ones(self, name: str, n: int) -> None:
        self.w.add_tensor(name, np.ones(n, dtype=np.float32))

    def zeros(self, name: str, *shape: int) -> None:
        self.w.add_tensor(name, np.zeros(shape, dtype=np.float32))

    def small(self, name: str, *shape: int) -> None:
        self.w.add_tensor(name, self.random(shape))


def _vit_blocks(wt: _Weights, prefix: str, n_layer: int, n_embd: int, n_ff: int, *, k_bias: bool) -> None:
    for il in range(n_layer):
        blk = f"{prefix}.blk.{il}"
        for norm in ("ln1", "ln2"):
            wt.ones(f"{blk}.{norm}.weight", n_embd)
            wt.zeros(f"{blk}.{norm}.bias", n_embd)
        for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
            wt.matrix(f"{blk}.{proj}.weight", (n_embd, n_embd), key=proj)
            if proj != "attn_k" or k_bias:
                wt.small(f"{blk}.{proj}.bias", n_embd)
        # ffn_down's ne[0] is n_ff: clip.cpp swaps up/down of old gemma3 files when it equals n_embd.
        wt.matrix(f"{blk}.ffn_up.weight", (n_ff, n_embd), key="ffn_up")
        wt.small(f"{blk}.ffn_up.bias", n_ff)
        wt.matrix(f"{blk}.ffn_down.weight", (n_embd, n_ff), key="ffn_down")
        wt.small(f"{blk}.ffn_down.bias", n_embd)
    wt.ones(f"{prefix}.post_ln.weight", n_embd)
    wt.zeros(f"{prefix}.post_ln.bias", n_embd)


def write_gemma3_projector(
    path: str | Path, shape: VisionShape = TINY, *, text_n_embd: int = GEMMA3_270M_N_EMBD, seed: int = 0
) -> Path:
    """Write a Gemma-3-layout vision projector (clip type ``gemma3``) with random weights."""
    from gguf import GGUFType, GGUFWriter, LlamaFileType

    if shape.image_size % (shape.patch_size * shape.n_merge):
        raise ValueError("image_size must divide by patch_size × n_merge")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    n_patches = (shape.image_size // shape.patch_size) ** 2
    w = GGUFWriter(str(tmp), arch="clip")
    w.add_type(GGUFType.MMPROJ)
    w.add_name(f"localrun-test gemma3 projector ({shape.name}, random weights)")
    w.add_file_type(LlamaFileType.MOSTLY_Q8_0 if shape.quant == "q8_0" else LlamaFileType.ALL_F32)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("gemma3")
    w.add_vision_projection_dim(text_n_embd)
    w.add_vision_image_size(shape.image_size)
    w.add_vision_patch_size(shape.patch_size)
    w.add_vision_embedding_length(shape.n_embd)
    w.add_vision_feed_forward_length(shape.n_ff)
    w.add_vision_block_count(shape.n_layer)
    w.add_vision_head_count(shape.n_head)
    w.add_vision_attention_layernorm_eps(1e-6)
    w.add_vision_use_gelu(True)
    w.add_vision_image_mean(list(IMAGE_MEAN))
    w.add_vision_image_std(list(IMAGE_STD))
    if shape.n_merge != 4:
        w.add_vision_projector_scale_factor(shape.n_merge)
    w.add_uint32("localrun.test.format_version", FORMAT_VERSION)

    wt = _Weights(w, seed, shape.quant)
    # The patch conv is F16 as convert_hf_to_gguf writes it (im2col runs in the kernel's type).
    wt.add("v.patch_embd.weight", wt.random((shape.n_embd, 3, shape.patch_size, shape.patch_size)), "f16")
    wt.small("v.patch_embd.bias", shape.n_embd)
    wt.add("v.position_embd.weight", wt.random((n_patches, shape.n_embd)), "f32")
    _vit_blocks(wt, "v", shape.n_layer, shape.n_embd, shape.n_ff, k_bias=True)
    wt.ones("mm.soft_emb_norm.weight", shape.n_embd)
    wt.add("mm.input_projection.weight", wt.random((shape.n_embd, text_n_embd)), "f16")
    _finish(w, tmp, path)
    return path


def write_qwen2a_audio_projector(
    path: str | Path, shape: AudioShape = TINY_AUDIO, *, text_n_embd: int = GEMMA3_270M_N_EMBD, seed: int = 1
) -> Path:
    """Write an audio projector (clip type ``qwen2a``: Whisper encoder + one linear) with random weights."""
    from gguf import GGUFType, GGUFWriter, LlamaFileType

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    w = GGUFWriter(str(tmp), arch="clip")
    w.add_type(GGUFType.MMPROJ)
    w.add_name(f"localrun-test qwen2a audio projector ({shape.name}, random weights)")
    w.add_file_type(LlamaFileType.ALL_F32)
    w.add_clip_has_audio_encoder(True)
    w.add_clip_projector_type("qwen2a")
    w.add_audio_projection_dim(text_n_embd)
    w.add_audio_embedding_length(shape.n_embd)
    w.add_audio_feed_forward_length(shape.n_ff)
    w.add_audio_block_count(shape.n_layer)
    w.add_audio_head_count(shape.n_head)
    w.add_audio_attention_layernorm_eps(1e-5)
    w.add_audio_num_mel_bins(shape.n_mel)
    w.add_uint32("localrun.test.format_version", FORMAT_VERSION)

    wt = _Weights(w, seed)
    # Conv kernels are F16 (ggml_conv_1d's im2col), biases [n_embd, 1] so they broadcast over frames.
    wt.add("a.conv1d.1.weight", wt.random((shape.n_embd, shape.n_mel, 3)), "f16")
    wt.small("a.conv1d.1.bias", shape.n_embd, 1)
    wt.add("a.conv1d.2.weight", wt.random((shape.n_embd, shape.n_embd, 3)), "f16")
    wt.small("a.conv1d.2.bias", shape.n_embd, 1)
    wt.add("a.position_embd.weight", wt.random((shape.n_pos, shape.n_embd)), "f32")
    _vit_blocks(wt, "a", shape.n_layer, shape.n_embd, shape.n_ff, k_bias=False)
    wt.matrix("mm.a.fc.weight", (text_n_embd, shape.n_embd))
    wt.small("mm.a.fc.bias", text_n_embd)
    _finish(w, tmp, path)
    return path


def _finish(w, tmp: Path, path: Path) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)  # a build killed half-way never leaves a file the cache would trust


def _cached(path: Path, build) -> Path:
    """Build ``path`` once; reuse it while it carries this module's FORMAT_VERSION."""
    if path.exists():
        try:
            from gguf import GGUFReader

            field = GGUFReader(str(path)).get_field("localrun.test.format_version")
            if field is not None and int(field.parts[field.data[0]][0]) == FORMAT_VERSION:
                return path
        except (OSError, ValueError, IndexError) as exc:
            log.info("rebuilding %s: %s", path, exc)
    build(path)
    return path


def vision_projector(shape: VisionShape | str = TINY, cache: Path = VISION_CACHE) -> Path:
    """The cached Gemma 3 projector of this shape (``tiny`` or ``siglip400m``), built on first use."""
    shape = VISION_SHAPES[shape] if isinstance(shape, str) else shape
    name = f"mmproj-gemma3-{shape.name}-{shape.quant}.gguf"
    return _cached(cache / name, lambda p: write_gemma3_projector(p, shape))


def audio_projector(shape: AudioShape = TINY_AUDIO, cache: Path = VISION_CACHE) -> Path:
    return _cached(cache / f"mmproj-qwen2a-{shape.name}.gguf", lambda p: write_qwen2a_audio_projector(p, shape))


# --- media made in memory ---------------------------------------------------------------------


def image_bytes(
    fmt: str = "PNG", size: tuple[int, int] = (64, 48), *, seed: int = 0, mode: str = "RGB", **save
) -> bytes:
    """An image file in memory: seeded noise, so two seeds give two different pictures."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    img = Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)
    if fmt.upper() in ("JPEG", "JPG") and mode == "RGBA":
        img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="JPEG" if fmt.upper() == "JPG" else fmt.upper(), **save)
    return buf.getvalue()


def wav_bytes(
    seconds: float = 1.0, rate: int = AUDIO_SAMPLE_RATE, *, freq: float = 440.0, channels: int = 1, sampwidth: int = 2
) -> bytes:
    """A sine tone as a PCM WAV (stdlib ``wave``): 8-, 16-, 24- or 32-bit integer samples."""
    n = int(seconds * rate)
    t = np.arange(n) / rate
    tone = 0.5 * np.sin(2 * math.pi * freq * t)
    frames = np.repeat(tone[:, None], channels, axis=1).reshape(-1)
    if sampwidth == 1:
        raw = ((frames * 127) + 128).astype(np.uint8).tobytes()
    elif sampwidth == 2:
        raw = (frames * 32767).astype("<i2").tobytes()
    elif sampwidth == 3:
        ints = (frames * 8388607).astype("<i4")
        raw = b"".join(struct.pack("<i", int(v))[:3] for v in ints)
    elif sampwidth == 4:
        raw = (frames * 2147483647).astype("<i4").tobytes()
    else:
        raise ValueError("sampwidth must be 1, 2, 3 or 4")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(sampwidth)
        out.setframerate(rate)
        out.writeframes(raw)
    return buf.getvalue()


def mp3_bytes(seconds: float = 1.0, rate: int = AUDIO_SAMPLE_RATE, *, freq: float = 440.0, channels: int = 1) -> bytes:
    """A sine tone as MP3, through the pinned ``lameenc`` (LAME) from the test extra."""
    import lameenc

    n = int(seconds * rate)
    tone = (0.5 * np.sin(2 * math.pi * freq * np.arange(n) / rate) * 32767).astype("<i2")
    enc = lameenc.Encoder()
    enc.set_bit_rate(64)
    enc.set_in_sample_rate(rate)
    enc.set_channels(channels)
    enc.set_quality(7)
    pcm = np.repeat(tone[:, None], channels, axis=1).tobytes()
    return bytes(enc.encode(pcm) + enc.flush())


def float_wav_bytes(seconds: float = 1.0, rate: int = AUDIO_SAMPLE_RATE, *, freq: float = 440.0) -> bytes:
    """A mono IEEE-float32 WAV (format tag 3), which stdlib ``wave`` cannot write, built by hand."""
    n = int(seconds * rate)
    samples = (0.5 * np.sin(2 * math.pi * freq * np.arange(n) / rate)).astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


# --- pytest fixtures (registered as a plugin in tests/conftest.py) ------------------------------


@dataclass(frozen=True)
class VisionPair:
    """A text model and its projector, ready for a ModelRecord (``metadata[META_PROJECTOR]``)."""

    model: Path
    projector: Path

    def record(self, name: str = "gemma-vision"):
        from localrun.types import META_PROJECTOR, FileEntry, Format, ModelRecord

        files = tuple(FileEntry(str(p), p.stat().st_size) for p in (self.model, self.projector))
        return ModelRecord(
            name=name,
            format=Format.GGUF,
            path=str(self.model),
            files=files,
            metadata={META_PROJECTOR: str(self.projector)},
        )


@pytest.fixture(scope="session")
def gemma3_tiny_projector() -> Path:
    """The tiny Gemma 3 vision projector (16 image tokens per image), cached in the test cache."""
    return vision_projector(TINY)


@pytest.fixture(scope="session")
def gemma3_siglip_projector() -> Path:
    """A SigLIP-400M-sized Gemma 3 projector (q8_0, 256 tokens per 896-px image), for benchmarks."""
    return vision_projector(SIGLIP400M)


@pytest.fixture(scope="session")
def gemma3_audio_projector() -> Path:
    """A tiny qwen2a (Whisper-encoder) audio projector that pairs with Gemma 3 270M."""
    return audio_projector(TINY_AUDIO)


@pytest.fixture(scope="session")
def gemma_vision(gemma_gguf, gemma3_tiny_projector) -> VisionPair:
    """Gemma 3 270M + the tiny vision projector."""
    return VisionPair(gemma_gguf, gemma3_tiny_projector)


@pytest.fixture(scope="session")
def gemma_audio(gemma_gguf, gemma3_audio_projector) -> VisionPair:
    """Gemma 3 270M + the tiny audio projector."""
    return VisionPair(gemma_gguf, gemma3_audio_projector)
