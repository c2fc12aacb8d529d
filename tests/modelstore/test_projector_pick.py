"""Which projector goes with which model file, and what makes a file a projector.

The picking cases follow llama.cpp's ``find_best_sibling(files, model, "mmproj")``
(common/download.cpp in the vendored llama.cpp): the deepest folder shared with the model
(never a sibling or child folder), then the bit count closest to the model's, then the first
name. The header checks run on real GGUF files written with the ``gguf`` writer.
"""

from __future__ import annotations

import pytest

from localrun.errors import InvalidModelFile, ModelNotFound
from localrun.modelstore.capabilities import media as capabilities
from localrun.modelstore.projector import (
    PROJECTOR_INFO,
    check_fits,
    find_projector_sibling,
    pair,
    read_projector,
)
from localrun.modelstore.refs import HubRef, select_files
from localrun.types import AUDIO, META_PROJECTOR, VISION, FileEntry, Format, ModelRecord
from tests.hub.repos import make_gguf
from tests.support.projectors import make_projector

TWO = ["gemma-3-4b-it-Q4_K_M.gguf", "gemma-3-4b-it-Q8_0.gguf", "mmproj-model-f16.gguf", "mmproj-Q8_0.gguf"]


@pytest.mark.parametrize(
    "paths, primary, expected",
    [
        # the bit count closest to the model's: 4-bit model → the 8-bit projector, 8-bit → 8-bit
        (TWO, "gemma-3-4b-it-Q4_K_M.gguf", "mmproj-Q8_0.gguf"),
        (TWO, "gemma-3-4b-it-Q8_0.gguf", "mmproj-Q8_0.gguf"),
        (TWO + ["gemma-3-4b-it-F16.gguf"], "gemma-3-4b-it-F16.gguf", "mmproj-model-f16.gguf"),
        # equal distance: the first name in sorted order (BF16 < model-f16)
        (["m-Q8_0.gguf", "mmproj-model-f16.gguf", "mmproj-BF16.gguf"], "m-Q8_0.gguf", "mmproj-BF16.gguf"),
        # an unlabelled projector (0 bits) is still taken when it is the only one
        (["m-Q4_K_M.gguf", "mmproj.gguf"], "m-Q4_K_M.gguf", "mmproj.gguf"),
        # the model's own folder beats the root; a root projector serves a model in a subfolder
        (["Q4/m-Q4_K_M.gguf", "Q4/mmproj-F16.gguf", "mmproj-Q4_0.gguf"], "Q4/m-Q4_K_M.gguf", "Q4/mmproj-F16.gguf"),
        (["Q4/m-Q4_K_M.gguf", "mmproj-F16.gguf"], "Q4/m-Q4_K_M.gguf", "mmproj-F16.gguf"),
        # a projector in a sibling or child folder is not this model's
        (["m-Q4_K_M.gguf", "extras/mmproj-F16.gguf"], "m-Q4_K_M.gguf", None),
        (["a/m-Q4_K_M.gguf", "b/mmproj-F16.gguf"], "a/m-Q4_K_M.gguf", None),
        # any case; only .gguf files; not an imatrix; split projector: its first part only
        (["m-Q4_K_M.gguf", "MMPROJ-F16.gguf", "mmproj-F16.bin"], "m-Q4_K_M.gguf", "MMPROJ-F16.gguf"),
        (["m-Q4_K_M.gguf", "m.imatrix.gguf", "README.md"], "m-Q4_K_M.gguf", None),
        (
            ["m-Q4_K_M.gguf", "mmproj-F16-00001-of-00002.gguf", "mmproj-F16-00002-of-00002.gguf"],
            "m-Q4_K_M.gguf",
            "mmproj-F16-00001-of-00002.gguf",
        ),
    ],
)
def test_projector_sibling_by_llamacpp_rules(paths, primary, expected):
    assert find_projector_sibling(paths, primary) == expected


def test_a_projector_is_never_the_model():
    files = ["mmproj-Tiny-F16.gguf", "Tiny-F16.gguf", "Tiny-Q4_K_M.gguf"]
    assert select_files(HubRef("o/r", quant="F16"), files).primary == "Tiny-F16.gguf"
    with pytest.raises(ModelNotFound, match="holds no model"):  # a repo of projectors alone has no model
        select_files(HubRef("o/r"), ["mmproj-Tiny-F16.gguf", "README.md"])
    with pytest.raises(ModelNotFound, match="multimodal projector, not a model"):  # named exactly, still refused
        select_files(HubRef("o/r", file="mmproj-Tiny-F16.gguf"), files)


def _model(tmp_path, **kw) -> ModelRecord:
    path = tmp_path / "tiny-Q4_K_M.gguf"
    path.write_bytes(make_gguf(**kw))
    return ModelRecord(
        "tiny", Format.GGUF, str(path), (FileEntry(str(path), path.stat().st_size),), metadata={"embedding_length": 16}
    )


def test_header_says_vision_audio_and_width(tmp_path):
    both = tmp_path / "mmproj-omni.gguf"
    both.write_bytes(make_projector(vision=True, audio=True))
    info = read_projector(both)
    assert (info.vision, info.audio, info.vision_projection_dim, info.audio_projection_dim) == (True, True, 16, 16)
    assert info.capabilities == (VISION, AUDIO) and info.quant == "F16" and info.size_bytes == both.stat().st_size


@pytest.mark.parametrize(
    "content, problem",
    [
        (lambda: make_gguf(name="mmproj"), "not a multimodal projector"),  # a llama model named like one
        (lambda: make_projector(vision=False, audio=False), "neither a vision nor an audio encoder"),
        (lambda: make_projector()[:100], "truncated|not a valid GGUF|past the end|cannot|beyond"),
        (lambda: b"", "GGUF|empty|small|short"),
    ],
)
def test_not_a_projector_is_named(tmp_path, content, problem):
    path = tmp_path / "mmproj-x.gguf"
    path.write_bytes(content())
    with pytest.raises(InvalidModelFile, match=problem):
        read_projector(path)


def test_pair_records_the_file_and_checks_the_width(tmp_path):
    model = _model(tmp_path)
    proj = tmp_path / "mmproj-F16.gguf"
    proj.write_bytes(make_projector())
    paired = pair(model, proj, owned=False)
    assert paired.metadata[META_PROJECTOR] == str(proj) and paired.files[-1].path == str(proj)
    assert paired.files[-1].size == proj.stat().st_size and paired.metadata[PROJECTOR_INFO]["owned"] is False
    assert capabilities(paired) == (VISION,) and capabilities(model) == ()
    again = pair(paired, proj, owned=False)  # pairing twice keeps one entry
    assert again.files == paired.files
    wide = tmp_path / "mmproj-wide.gguf"
    wide.write_bytes(make_projector(n_embd=2560))
    with pytest.raises(InvalidModelFile, match=r"2560 wide but tiny .* 16-wide"):
        check_fits(model, read_projector(wide))
    with pytest.raises(InvalidModelFile, match="the model itself"):
        pair(model, model.path, owned=False)
    with pytest.raises(InvalidModelFile, match="no such projector"):
        pair(model, tmp_path / "missing.gguf", owned=False)
