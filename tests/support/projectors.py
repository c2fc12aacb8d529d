"""Tiny header-only projector GGUFs (``general.architecture = "clip"``) for store tests.

They carry the keys localrun's store reads (``clip.has_vision_encoder``,
``clip.has_audio_encoder``, ``clip.vision.projection_dim``…) and one small tensor, and never
load in llama.cpp: pairing, pulling, verifying, bundling and mirroring only read headers and
hash bytes. Loadable projectors for the runtime are built in :mod:`tests.support.vision`.
Built in memory in milliseconds (no cache needed) and kept per arguments.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np

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
