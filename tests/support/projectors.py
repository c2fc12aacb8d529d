"""Tiny header-only projector GGUFs (``general.architecture = "clip"``) for store tests.

They carry the keys localrun's store reads (``clip.has_vision_encoder``,
``clip.has_audio_encoder``, ``clip.vision.projection_dim``…) and one small tensor, and never
load in llama.cpp: pairing, pulling, verifying, bundling and mirroring only read headers and
hash bytes. Loadable projectors for the runtime are built in :mod:`tests.support.vision`.
Built in memory in milliseconds (no cache needed) and kept per arguments.

And (merged from branch vis-surfaces): header-only projector GGUFs (``mmproj*.gguf``) for the
layers that read a projector without
loading it: capabilities, ``projector_info``, the plan's image-token count and memory. Their
keys are the ones llama.cpp's ``convert_hf_to_gguf.py --mmproj`` writes for each family; their
one tensor stands in for the encoder's weights (its size is what the plan counts).
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path

import numpy as np

from localrun.types import META_PROJECTOR

#: The width of tests.hub.repos.make_gguf's stand-in models (their embedding_length).
TINY_N_EMBD = 16


@functools.lru_cache(maxsize=64)
def make_projector(
    *,
    n_embd: int = TINY_N_EMBD,
    vision: bool = True,
    audio: bool = False,
    file_type: int = 1,
    seed: int = 0,
    arch: str = "clip",
    payload: int = 2048,
) -> bytes:
    """A valid clip GGUF header + one I8 tensor; ``n_embd`` is its projection width."""
    import gguf

    rng = np.random.default_rng(1000 + seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mmproj.gguf"
        w = gguf.GGUFWriter(str(path), arch=arch)
        w.add_name(f"test projector {seed}")
        w.add_file_type(file_type)
        w.add_bool("clip.has_vision_encoder", vision)
        w.add_bool("clip.has_audio_encoder", audio)
        w.add_string("clip.projector_type", "gemma3" if vision and not audio else "qwen2.5o")
        if vision:
            w.add_uint32("clip.vision.projection_dim", n_embd)
            w.add_uint32("clip.vision.embedding_length", 32)
            w.add_uint32("clip.vision.image_size", 64)
        if audio:
            w.add_uint32("clip.audio.projection_dim", n_embd)
        w.add_tensor("v.blob", rng.integers(-128, 128, size=payload, dtype=np.int8))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


#: Gemma 3's SigLIP-So400m encoder at 896 px, patch 14, as the 4B/12B/27B projectors have it.
GEMMA3 = {
    "general.architecture": "clip",
    "clip.projector_type": "gemma3",
    "clip.has_vision_encoder": True,
    "clip.has_audio_encoder": False,
    "clip.vision.image_size": 896,
    "clip.vision.patch_size": 14,
    "clip.vision.embedding_length": 1152,
    "clip.vision.feed_forward_length": 4304,
    "clip.vision.block_count": 27,
    "clip.vision.attention.head_count": 16,
    "clip.vision.projection_dim": 2560,
}
#: An audio-only projector (Ultravox / Qwen2-Audio style): no image encoder.
AUDIO_ONLY = {
    "general.architecture": "clip",
    "clip.projector_type": "ultravox",
    "clip.has_vision_encoder": False,
    "clip.has_audio_encoder": True,
    "clip.audio.embedding_length": 1280,
    "clip.audio.block_count": 32,
    "clip.audio.num_mel_bins": 128,
}
#: A mixed projector (Qwen2.5-Omni): both encoders, each with its own type.
OMNI = {
    "general.architecture": "clip",
    "clip.projector_type": "qwen2.5o",
    "clip.vision.projector_type": "qwen25vl",
    "clip.audio.projector_type": "qwen2a",
    "clip.has_vision_encoder": True,
    "clip.has_audio_encoder": True,
    "clip.vision.image_size": 1024,
    "clip.vision.patch_size": 14,
    "clip.vision.embedding_length": 1280,
    "clip.vision.block_count": 32,
    "clip.vision.attention.head_count": 16,
}
#: A projector type localrun has no token rule for.
UNKNOWN = {**GEMMA3, "clip.projector_type": "someday-vl"}


def write_projector(path: Path, keys: dict, *, weight_floats: int = 4096) -> Path:
    """A well-formed projector GGUF with ``keys`` and one F32 tensor of ``weight_floats`` values."""
    from tests.factories import write_meta_only_gguf

    tensors = {"v.patch_embd.weight": np.zeros(weight_floats, dtype=np.float32)}
    return write_meta_only_gguf(path, keys, tensors)


def pair(store, base_name: str, name: str, projector: Path):
    """Register ``base_name``'s file again as ``name``, paired with ``projector`` (as a pull or
    ``import --mmproj`` records it: the path under META_PROJECTOR and the file among ``files``)."""
    from localrun.types import FileEntry

    base = store.resolve(base_name)
    files = (*base.files, FileEntry(path=str(projector), size=projector.stat().st_size))
    record = dataclasses.replace(
        base, name=name, files=files, metadata={**base.metadata, META_PROJECTOR: str(projector)}
    )
    return store.register(record)
