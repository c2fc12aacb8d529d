"""The model store: import, resolve, verify, remove, split GGUF, MLX folders, built-in model."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import time
import types

import pytest

from localrun.errors import (
    DownloadFailed,
    InvalidModelFile,
    InvalidName,
    ModelExists,
    ModelNotFound,
    VerificationFailed,
)
from localrun.modelstore.builtins import DEFAULT_MODEL_NAME, DEFAULT_MODEL_PACKAGE
from localrun.modelstore.gguf_meta import read_gguf_metadata
from localrun.modelstore.store import ModelStore
from localrun.settings import load_settings
from localrun.types import FileEntry, Format, ModelRecord, Source
from tests.factories import RawGGUF, write_tiny_llama_gguf


@pytest.fixture
def store():
    return ModelStore(load_settings())


@pytest.fixture
def model_file(tmp_path):
    return write_tiny_llama_gguf(tmp_path / "models" / "Tiny-Llama-F32.gguf", n_layer=3)


def test_import_registers_in_place(store, model_file):
    rec = store.import_path(model_file)
    info = read_gguf_metadata(model_file)
    assert rec.name == "tiny-llama-f32"
    assert rec.format == Format.GGUF and rec.source == Source.IMPORTED and not rec.owned
    assert rec.path == str(model_file.resolve())
    assert rec.files == (FileEntry(str(model_file.resolve()), model_file.stat().st_size, None),)
    assert rec.metadata["architecture"] == "llama" and rec.metadata["block_count"] == 3
    assert rec.metadata["n_params"] == info.n_params and rec.metadata["quant"] == "F32"
    assert rec.metadata["mtimes"] == [model_file.stat().st_mtime_ns]
    json.dumps(rec.metadata)
    assert store.index.get("tiny-llama-f32") == rec == store.resolve("tiny-llama-f32")
    assert store.list() == [rec]


def test_import_name_rules(store, model_file, tmp_path):
    assert store.import_path(model_file, name="My-Model").name == "my-model"
    with pytest.raises(InvalidName):
        store.import_path(model_file, name="../evil")
    assert store.import_path(model_file, name="my-model") == store.index.get("my-model")  # same file again: no error
    other = write_tiny_llama_gguf(tmp_path / "other.gguf", seed=1)
    with pytest.raises(ModelExists) as ei:
        store.import_path(other, name="my-model")
    assert "--replace" in ei.value.hint or "--name" in ei.value.hint
    assert store.import_path(other, name="my-model", replace=True).path == str(other.resolve())
    assert [r.name for r in store.list()] == ["my-model"]


def test_corrupt_or_missing_file_registers_nothing(store, tmp_path, model_file):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(model_file.read_bytes()[:5000])
    with pytest.raises(InvalidModelFile) as ei:
        store.import_path(bad)
    assert str(bad.resolve()) in ei.value.message
    wrap = RawGGUF(tensors=[("t", (8,), 0, 2**64 - 64)], data=bytes(64)).write(tmp_path / "wrap.gguf")
    with pytest.raises(InvalidModelFile):
        store.import_path(wrap)
    with pytest.raises(ModelNotFound):
        store.import_path(tmp_path / "nope.gguf")
    text = tmp_path / "readme.txt"
    text.write_text("hello")
    with pytest.raises(InvalidModelFile, match="not a GGUF"):
        store.import_path(text)
    assert store.list() == []


def test_split_gguf(store, tmp_path):
    first = write_tiny_llama_gguf(tmp_path / "split" / "Tiny.gguf", split_max_tensors=8)
    shards = sorted(first.parent.iterdir())
    assert len(shards) == 3 and first == shards[0]
    whole = read_gguf_metadata(write_tiny_llama_gguf(tmp_path / "whole.gguf"))
    rec = store.import_path(shards[1])  # any shard: the first is used
    assert rec.name == "tiny" and rec.path == str(shards[0].resolve())
    assert [f.path for f in rec.files] == [str(s.resolve()) for s in shards]
    assert rec.metadata["n_params"] == whole.n_params and rec.metadata["tensor_count"] == whole.tensor_count
    assert rec.metadata["shards"] == 3 and rec.size == sum(s.stat().st_size for s in shards)


def test_split_gguf_missing_corrupt_or_renamed_shard(store, tmp_path):
    first = write_tiny_llama_gguf(tmp_path / "s" / "m.gguf", split_max_tensors=8)
    shards = sorted(first.parent.iterdir())
    keep = shards[2].read_bytes()
    shards[2].unlink()
    with pytest.raises(InvalidModelFile, match="missing 1 of 3 shards"):
        store.import_path(first)
    shards[2].write_bytes(keep[:-10])
    with pytest.raises(InvalidModelFile, match="m-00003-of-00003.gguf"):
        store.import_path(first)
    shards[2].write_bytes(keep)
    lone = tmp_path / "lone.gguf"  # a shard renamed so its name no longer says so
    shutil.copy(shards[0], lone)
    with pytest.raises(InvalidModelFile, match="says part 1 of 3, its name says an unsplit file"):
        store.import_path(lone)
    assert store.list() == []


def test_resolve_paths_only_when_allowed(store, model_file):
    with pytest.raises(ModelNotFound) as ei:
        store.resolve(str(model_file))
    assert "localrun ls" in ei.value.hint
    rec = store.resolve(str(model_file), allow_path=True)
    assert rec.path == str(model_file.resolve()) and store.list() == []  # transient, not stored
    with pytest.raises(ModelNotFound):
        store.resolve("/no/such/file.gguf", allow_path=True)


def test_resolve_notices_missing_or_changed_files(store, model_file):
    store.import_path(model_file, name="m")
    with open(model_file, "ab") as f:
        f.write(b"\0" * 10)
    with pytest.raises(VerificationFailed, match="bytes"):
        store.resolve("m")
    model_file.unlink()
    with pytest.raises(ModelNotFound, match="missing"):
        store.resolve("m")


def test_verify_learns_then_checks_sha256(store, model_file):
    store.import_path(model_file, name="m")
    rec = store.verify("m")
    assert rec.files[0].sha256 == hashlib.sha256(model_file.read_bytes()).hexdigest()
    assert store.index.get("m").files[0].sha256 == rec.files[0].sha256
    data = bytearray(model_file.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte flipped
    model_file.write_bytes(bytes(data))
    with pytest.raises(VerificationFailed) as ei:
        store.verify("m")  # the hash names the file …
    assert str(model_file.resolve()) in ei.value.message
    with pytest.raises(VerificationFailed, match="no longer matches"):
        store.resolve("m")  # … and so does loading: it was touched since it last matched


def test_untouched_verified_file_is_not_rehashed_on_resolve(store, model_file, monkeypatch):
    store.import_path(model_file, name="m")
    store.verify("m")
    calls = []
    monkeypatch.setattr("localrun.modelstore.store.sha256_of", lambda p: calls.append(p) or "x")
    store.resolve("m")
    assert calls == []


def _owned_record(name: str, path, **kw) -> ModelRecord:
    return ModelRecord(
        name=name,
        format=Format.GGUF,
        path=str(path),
        files=(FileEntry(str(path), path.stat().st_size),),
        source=Source.HUB,
        owned=True,
        **kw,
    )


def test_register_replaces_the_same_repo_and_keeps_a_strangers_name(store, model_file, tmp_path):
    first = store.register(_owned_record("m", model_file, repo="org/a", revision="1" * 40))
    again = store.register(_owned_record("m", model_file, repo="org/a", revision="2" * 40))  # a re-pull
    assert store.index.get("m").revision == again.revision != first.revision
    with pytest.raises(ModelExists, match="taken by org/a"):
        store.register(_owned_record("m", model_file, repo="org/b"))
    assert store.index.get("m").repo == "org/a"
    store.register(_owned_record("m", model_file, repo="org/b"), replace=True)
    assert store.index.get("m").repo == "org/b"
    store.import_path(model_file, name="mine")  # an imported file has no repo: a hub model may not take its name
    with pytest.raises(ModelExists, match="taken by"):
        store.register(_owned_record("mine", model_file, repo="org/a"))


def test_remove_never_deletes_imported_files(store, model_file):
    store.import_path(model_file, name="m")
    assert store.remove("m").name == "m"
    assert model_file.exists() and store.list() == []
    with pytest.raises(ModelNotFound):
        store.remove("m")


def test_remove_deletes_owned_files_unless_shared_or_outside(store, tmp_path):
    data_dir = store.settings.data_dir
    owned = write_tiny_llama_gguf(data_dir / "pulled" / "a.gguf")
    shared = write_tiny_llama_gguf(data_dir / "pulled" / "b.gguf")
    outside = write_tiny_llama_gguf(tmp_path / "elsewhere" / "c.gguf")
    store.index.add(_owned_record("a", owned))
    store.index.add(_owned_record("b1", shared))
    store.index.add(_owned_record("b2", shared))
    store.index.add(_owned_record("c", outside))
    store.remove("a")
    assert not owned.exists()
    store.remove("b1")
    assert shared.exists()  # b2 still uses it
    store.remove("b2")
    assert not shared.exists()
    store.remove("c")
    assert outside.exists()  # owned but outside the data dir and HF cache: kept
    assert store.list() == []


def _fake_gemma(monkeypatch, tmp_path, calls: list, *, fail: bool = False):
    """A stand-in for the Gemma chunk package that 'assembles' a tiny model."""
    source = write_tiny_llama_gguf(tmp_path / "fake-gemma-src.gguf")
    mod = types.ModuleType(DEFAULT_MODEL_PACKAGE)
    mod.EXPECTED_SHA256 = hashlib.sha256(source.read_bytes()).hexdigest()
    mod.chunk_paths = lambda: [source]

    def assemble(output_path=None, overwrite=False):
        calls.append(output_path)
        if fail:
            with open(output_path, "wb") as f:
                f.write(b"half")
            raise ValueError("Assembled file sha256 did not match expected value")
        shutil.copy(source, output_path)
        return output_path

    mod.assemble = assemble
    monkeypatch.setitem(sys.modules, DEFAULT_MODEL_PACKAGE, mod)
    return mod


def test_ensure_default_model_assembles_once(store, monkeypatch, tmp_path):
    calls: list = []
    mod = _fake_gemma(monkeypatch, tmp_path, calls)
    rec = store.ensure_default_model()
    target = store.settings.data_dir / "builtin" / "gemma-3-270m-Q4_K_M.gguf"
    assert rec.name == DEFAULT_MODEL_NAME and rec.source == Source.BUILTIN and rec.owned
    assert rec.path == str(target) and target.is_file() and rec.files[0].sha256 == mod.EXPECTED_SHA256
    assert len(calls) == 1 and str(calls[0]).endswith(".partial")
    assert not list(target.parent.glob("*.partial"))
    t0 = time.perf_counter()
    again = ModelStore(load_settings()).ensure_default_model()
    assert time.perf_counter() - t0 < 0.5
    assert again == rec and len(calls) == 1
    target.unlink()  # deleted behind our back: assembled again
    assert store.ensure_default_model().path == str(target) and len(calls) == 2


def test_ensure_default_model_absent_package_or_taken_name(store, monkeypatch, tmp_path, model_file):
    monkeypatch.setitem(sys.modules, DEFAULT_MODEL_PACKAGE, None)  # import raises ImportError
    assert store.ensure_default_model() is None
    calls: list = []
    _fake_gemma(monkeypatch, tmp_path, calls)
    mine = store.import_path(model_file, name=DEFAULT_MODEL_NAME)
    assert store.ensure_default_model() == mine and calls == []


def test_ensure_default_model_failure_leaves_nothing(store, monkeypatch, tmp_path):
    _fake_gemma(monkeypatch, tmp_path, [], fail=True)
    with pytest.raises(DownloadFailed, match="corrupt"):
        store.ensure_default_model()
    builtin = store.settings.data_dir / "builtin"
    assert [p.name for p in builtin.iterdir() if not p.name.startswith(".")] == []
    assert store.list() == []


@pytest.mark.gemma
def test_real_builtin_gemma(store, gemma_gguf):
    pytest.importorskip(DEFAULT_MODEL_PACKAGE)
    rec = store.ensure_default_model()
    try:
        assert rec.metadata["architecture"] == "gemma3" and rec.metadata["quant"] == "Q4_K_M"
        assert rec.size == gemma_gguf.stat().st_size
        assert store.resolve(DEFAULT_MODEL_NAME) == rec
    finally:
        store.remove(DEFAULT_MODEL_NAME)  # owned and in the data dir: the 253 MB copy goes
    assert not os.path.exists(rec.path)


def _write_safetensors(path, tensors: dict[str, tuple[list[int], int]], *, lie: bool = False) -> None:
    header, offset = {}, 0
    for name, (shape, nbytes) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + nbytes + (999 if lie else 0)]}
        offset += nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def _mlx_folder(root, **config_extra):
    root.mkdir(parents=True)
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 512,
        "vocab_size": 32,
        "quantization": {"group_size": 64, "bits": 4},
        **config_extra,
    }
    (root / "config.json").write_text(json.dumps(config))
    _write_safetensors(root / "model.safetensors", {"a": ([4, 8], 128), "b": ([8], 32)})
    (root / "chat_template.jinja").write_text("{{ messages }}")
    return root


def test_mlx_folder_import(store, tmp_path):
    rec = store.import_path(_mlx_folder(tmp_path / "Tiny-MLX-4bit"))
    assert rec.format == Format.MLX and rec.name == "tiny-mlx-4bit"
    m = rec.metadata
    assert (m["architecture"], m["block_count"], m["head_count_kv"], m["context_length"]) == ("llama", 2, 1, 512)
    assert m["n_params"] == 4 * 8 + 8 and m["quant"] == "4bit" and m["chat_template"] == "{{ messages }}"
    assert {os.path.basename(f.path) for f in rec.files} == {"config.json", "model.safetensors", "chat_template.jinja"}


@pytest.mark.parametrize(
    "problem",
    [
        "python file",
        "native lib",
        "pickle",
        "auto_map",
        "model_file",
        "bad header",
        "data outside",
        "no weights",
        "bad json",
    ],
)
def test_mlx_folder_refusals(store, tmp_path, problem):
    folder = _mlx_folder(
        tmp_path / "m",
        **({"auto_map": {"AutoModel": "x.Y"}} if problem == "auto_map" else {}),
        **({"model_file": "evil.py"} if problem == "model_file" else {}),
    )
    if problem == "python file":
        (folder / "modeling.py").write_text("import os")
    elif problem == "native lib":
        (folder / "sub").mkdir()
        (folder / "sub" / "kernel.so").write_bytes(b"\x7fELF")
    elif problem == "pickle":
        (folder / "pytorch_model.bin").write_bytes(b"\x80\x04")
    elif problem == "bad header":
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2**60) + b"{}")
    elif problem == "data outside":
        _write_safetensors(folder / "model.safetensors", {"a": ([4], 16)}, lie=True)
    elif problem == "no weights":
        (folder / "model.safetensors").unlink()
    elif problem == "bad json":
        (folder / "config.json").write_text("{not json")
    with pytest.raises(InvalidModelFile):
        store.import_path(folder)
    assert store.list() == []


def test_remove_owned_hf_cache_entry_deletes_link_and_unshared_blob(store):
    from localrun.modelstore.hub import hub_cache_dir

    repo = hub_cache_dir() / "models--org--tiny"
    blob = write_tiny_llama_gguf(repo / "blobs" / "aaaa")
    shared_blob = write_tiny_llama_gguf(repo / "blobs" / "bbbb", seed=2)
    for rev in ("rev1", "rev2"):
        (repo / "snapshots" / rev).mkdir(parents=True)
    link = repo / "snapshots" / "rev1" / "m.gguf"
    os.symlink("../../blobs/aaaa", link)
    link2 = repo / "snapshots" / "rev1" / "s.gguf"
    os.symlink("../../blobs/bbbb", link2)
    os.symlink("../../blobs/bbbb", repo / "snapshots" / "rev2" / "s.gguf")  # another revision keeps it
    store.index.add(
        ModelRecord(
            name="m",
            format=Format.GGUF,
            path=str(link),
            source=Source.HUB,
            owned=True,
            files=(FileEntry(str(link), blob.stat().st_size), FileEntry(str(link2), 1)),
        )
    )
    store.remove("m")
    assert not link.exists() and not os.path.lexists(link) and not blob.exists()
    assert not os.path.lexists(link2) and shared_blob.exists()


@pytest.mark.parametrize(
    "kv,tensors,words",
    [
        ({"general.type": "adapter"}, None, "LoRA adapter"),
        ({"general.type": "mmproj"}, None, "projector"),
        ({"general.architecture": "clip"}, None, "projector"),
        ({}, {}, "no tensors"),
    ],
)
def test_non_model_ggufs_refused(store, tmp_path, kv, tensors, words):
    from tests.factories import write_meta_only_gguf

    path = write_meta_only_gguf(tmp_path / "x.gguf", kv, tensors)
    with pytest.raises(InvalidModelFile, match=words):
        store.import_path(path)
    assert store.list() == []


def test_import_through_symlinks_keeps_the_link_name(store, tmp_path):
    """HF cache layout: snapshot links carry the names, blobs only hashes."""
    first = write_tiny_llama_gguf(tmp_path / "src" / "Model-Q8.gguf", split_max_tensors=8)
    snap = tmp_path / "snap"
    snap.mkdir()
    for shard in sorted(first.parent.iterdir()):
        blob = tmp_path / "blobs" / hashlib.sha256(shard.name.encode()).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        shard.rename(blob)
        os.symlink(blob, snap / shard.name)
    rec = store.import_path(snap / first.name)
    assert rec.name == "model-q8" and rec.path == str(snap / first.name)
    assert len(rec.files) == 3 and all(os.path.islink(f.path) for f in rec.files)
