"""GGUF metadata, read with bounds checks before any native loader sees the file.

A model file is untrusted input: llama.cpp's loader has shipped overflows on counts,
lengths, shapes and offsets (CVE-2025-53630, CVE-2026-27940, CVE-2026-33298), and the
``gguf`` package's own reader accepts a tensor offset of 2^64-64 (the addition wraps with
only a warning). So the header is walked here with Python integers — which cannot wrap —
reading through a file object in bounded chunks and trusting no count, length or offset
until it is checked against what the file can actually hold.

Why not ``gguf.GGUFReader`` for the values too: it builds a numpy view per string, which
takes ~9 s on Gemma 3's 262k-token vocabulary, while this walk takes a fraction of a
second and must stay under 2 s for any input. The ``gguf`` package still supplies the
format's tables (value types, block sizes, file types), and :func:`open_gguf_reader` hands
out a ``GGUFReader`` only for a file that passed these checks.

Every failure, whatever the bytes, is :class:`~localrun.errors.InvalidModelFile` naming the
file and the problem.
"""

from __future__ import annotations

import logging
import math
import os
import stat
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from localrun.errors import InvalidModelFile

logger = logging.getLogger(__name__)

SUPPORTED_VERSIONS = (2, 3)
MAX_KV_COUNT = 1 << 16
MAX_TENSOR_COUNT = 1 << 17
MAX_KEY_BYTES = 1024
MAX_TENSOR_NAME_BYTES = 63  # ggml's GGML_MAX_NAME is 64 including the NUL
MAX_STRING_BYTES = 16 << 20
MAX_ARRAY_LEN = 1 << 24
MAX_TOTAL_ARRAY_STRINGS = 1 << 21  # bounds the per-string walk; real vocab + merges stay far below
MAX_ALIGNMENT = 1 << 16
MAX_DIMS = 4
INT64_MAX = (1 << 63) - 1
_CHUNK = 1 << 20
_SMALL_ARRAY = 1024  # numeric arrays up to this length keep their values (per-layer head counts)
_SMALL_STRING_ARRAY = 64  # string arrays up to this length are decoded (general.tags)

# GGUF value types: (struct code, byte width); 8 = string, 9 = array.
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
    6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8),
}
_INT_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_U32 = 4
_TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32",
               7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64"}


def _type_name(t: int) -> str:
    """Our packed type code (arrays are ``ARRAY << 8 | element``) as a word."""
    return f"ARRAY[{_TYPE_NAMES[t & 0xFF]}]" if t >> 8 == _ARRAY else _TYPE_NAMES.get(t, str(t))


class _Bad(Exception):
    """A problem found while walking; becomes InvalidModelFile with the path prepended."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] is the innermost (row) dimension
    ggml_type: int
    offset: int  # relative to the data section
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFInfo:
    """What localrun needs to know about a GGUF file, all checked against the file's size."""

    path: str
    version: int
    byte_order: str
    size_bytes: int
    tensor_count: int
    kv_count: int
    alignment: int
    data_offset: int
    architecture: str | None = None
    name: str | None = None
    file_type: int | None = None
    quant: str | None = None
    n_params: int = 0
    context_length: int | None = None
    block_count: int | None = None
    embedding_length: int | None = None
    feed_forward_length: int | None = None
    head_count: int | None = None
    head_count_kv: int | None = None
    """The largest per-layer KV head count (the value itself when it is a scalar)."""
    head_count_kv_per_layer: tuple[int, ...] | None = None
    key_length: int | None = None
    value_length: int | None = None
    vocab_size: int | None = None
    sliding_window: int | None = None
    expert_count: int | None = None
    expert_used_count: int | None = None
    tokenizer_model: str | None = None
    chat_template: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    split_no: int | None = None
    split_count: int | None = None
    split_tensors_count: int | None = None
    tensor_types: dict[str, int] = field(default_factory=dict)
    """ggml type name -> number of tensors of that type."""
    scalars: dict[str, Any] = field(default_factory=dict)
    """Every scalar metadata value (strings over 4 KiB left out), for keys not named above."""
    tensors: tuple[TensorInfo, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable form for the index: no tensor list, no token arrays."""
        d = asdict(self)
        del d["tensors"]
        if d["head_count_kv_per_layer"] is not None:
            d["head_count_kv_per_layer"] = list(d["head_count_kv_per_layer"])
        return d


class _Walker:
    """Reads a GGUF header through a file object in bounded chunks, checking every size."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size
        self.pos = 0
        self.buf = b""
        self.buf_pos = 0
        self.e = "<"
        self.strings_seen = 0

    def _fill(self, n: int, what: str) -> int:
        """Make bytes [pos, pos+n) available in ``buf``; return their offset in it."""
        if self.pos + n > self.size:
            raise _Bad(f"truncated: {what} at offset {self.pos} needs {n} bytes, file has {self.size}")
        off = self.pos - self.buf_pos
        if 0 <= off and off + n <= len(self.buf):
            return off
        self.f.seek(self.pos)
        self.buf = self.f.read(min(max(n, _CHUNK), self.size - self.pos))
        self.buf_pos = self.pos
        if len(self.buf) < n:
            raise _Bad(f"truncated: file shrank while reading {what} at offset {self.pos}")
        return 0

    def scalar(self, vtype: int, what: str) -> Any:
        code, width = _SCALARS[vtype]
        off = self._fill(width, what)
        self.pos += width
        return struct.unpack_from(self.e + code, self.buf, off)[0]

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def raw_string(self, what: str, limit: int = MAX_STRING_BYTES) -> bytes:
        n = self.u64(f"length of {what}")
        if n > limit:
            raise _Bad(f"{what} claims {n} bytes (limit {limit})")
        off = self._fill(n, what)
        self.pos += n
        return self.buf[off : off + n]

    def text(self, what: str, limit: int = MAX_STRING_BYTES, *, strict: bool = True) -> str:
        """A string; names must be UTF-8, values are decoded leniently (llama.cpp does not check)."""
        raw = self.raw_string(what, limit)
        try:
            return raw.decode("utf-8", "strict" if strict else "replace")
        except UnicodeDecodeError:
            raise _Bad(f"{what} is not valid UTF-8") from None

    def skip_strings(self, count: int, what: str) -> None:
        """Walk ``count`` length-prefixed strings without decoding them (token lists)."""
        unpack = struct.Struct(self.e + "Q").unpack_from
        left = count
        while left:
            off = self._fill(8, what)
            buf, base, p, end = self.buf, self.buf_pos, off, len(self.buf) - 8
            while left and p <= end:
                p += 8 + unpack(buf, p)[0]
                left -= 1
            self.pos = base + p
            if self.pos > self.size:
                raise _Bad(f"truncated: a string of {what} runs past the end of the file")

    def array(self, key: str) -> tuple[int, Any]:
        """Returns (element type, values or None when too long to keep)."""
        sub = self.u32(f"element type of {key!r}")
        count = self.u64(f"length of {key!r}")
        if sub == _ARRAY:
            raise _Bad(f"metadata {key!r} is a nested array (not supported)")
        if sub != _STRING and sub not in _SCALARS:
            raise _Bad(f"metadata {key!r} has invalid element type {sub}")
        if count > MAX_ARRAY_LEN:
            raise _Bad(f"metadata {key!r} claims {count} elements (limit {MAX_ARRAY_LEN})")
        if sub == _STRING:
            if count * 8 > self.size - self.pos:
                raise _Bad(f"metadata {key!r} claims {count} strings, more than the file can hold")
            self.strings_seen += count
            if self.strings_seen > MAX_TOTAL_ARRAY_STRINGS:
                raise _Bad(f"more than {MAX_TOTAL_ARRAY_STRINGS} strings in metadata arrays")
            if count <= _SMALL_STRING_ARRAY:
                return sub, [self.raw_string(f"element of {key!r}").decode("utf-8", "replace") for _ in range(count)]
            self.skip_strings(count, repr(key))
            return sub, count
        code, width = _SCALARS[sub]
        nbytes = count * width
        if nbytes > self.size - self.pos:
            raise _Bad(f"metadata {key!r} claims {count} elements, more than the file can hold")
        if count <= _SMALL_ARRAY:
            off = self._fill(nbytes, repr(key))
            values = list(struct.unpack_from(f"{self.e}{count}{code}", self.buf, off))
            self.pos += nbytes
            return sub, values
        self.pos += nbytes
        return sub, count


def _open_regular(path: Path) -> tuple[BinaryIO, int]:
    """Open without blocking on a FIFO or device, and refuse anything but a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InvalidModelFile(f"{path}: no such file", hint="check the path") from None
    except OSError as exc:
        raise InvalidModelFile(f"{path}: cannot open: {exc.strerror or exc}", hint="check the path and its permissions") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InvalidModelFile(f"{path}: not a regular file", hint="point at the .gguf file itself")
    return os.fdopen(fd, "rb", buffering=0), st.st_size


def _header(w: _Walker) -> tuple[int, int, int]:
    off = w._fill(min(w.size, 24), "header")
    magic = w.buf[off : off + 4]
    if magic != b"GGUF"[: len(magic)] or not magic:
        raise _Bad(f"not a GGUF file (bad magic {magic!r})")
    if w.size < 24:
        raise _Bad(f"truncated: {w.size} bytes is shorter than a GGUF header (24)")
    version = struct.unpack_from("<I", w.buf, off + 4)[0]
    if version not in SUPPORTED_VERSIONS:
        be = struct.unpack_from(">I", w.buf, off + 4)[0]
        if be in SUPPORTED_VERSIONS:
            w.e, version = ">", be
        elif version == 1:
            raise _Bad("GGUF version 1 is not supported (re-convert the model)")
        else:
            raise _Bad(f"unsupported GGUF version {version}")
    w.pos = 8
    n_tensors = w.u64("tensor count")
    n_kv = w.u64("metadata count")
    remaining = w.size - w.pos
    # Smallest possible entries: a kv is key length 8 + 1 byte + type 4 + a u8 value;
    # a tensor is name length 8 + 1 byte + n_dims 4 + one dim 8 + type 4 + offset 8.
    if n_kv > MAX_KV_COUNT or n_kv * 14 > remaining:
        raise _Bad(f"metadata count {n_kv} is more than the file can hold")
    if n_tensors > MAX_TENSOR_COUNT or n_kv * 14 + n_tensors * 33 > remaining:
        raise _Bad(f"tensor count {n_tensors} is more than the file can hold")
    return version, n_tensors, n_kv


def _metadata(w: _Walker, n_kv: int) -> tuple[dict[str, Any], dict[str, int]]:
    values: dict[str, Any] = {}
    types: dict[str, int] = {}
    for i in range(n_kv):
        raw = w.raw_string(f"key #{i}", MAX_KEY_BYTES)
        if not raw:
            raise _Bad(f"metadata key #{i} is empty")
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad(f"metadata key #{i} is not valid UTF-8") from None
        if key in values:
            raise _Bad(f"duplicate metadata key {key!r}")
        vtype = w.u32(f"type of {key!r}")
        if vtype == _STRING:
            values[key] = w.text(f"value of {key!r}", strict=False)
        elif vtype == _ARRAY:
            sub, values[key] = w.array(key)
            vtype = (_ARRAY << 8) | sub
        elif vtype in _SCALARS:
            values[key] = w.scalar(vtype, f"value of {key!r}")
        else:
            raise _Bad(f"metadata {key!r} has invalid value type {vtype}")
        types[key] = vtype
    return values, types


def _tensor_infos(w: _Walker, n_tensors: int) -> list[tuple[str, tuple[int, ...], int, int, int, int]]:
    """(name, shape, ggml type, offset, elements, bytes) per tensor, shapes checked."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    out = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = w.text(f"tensor #{i} name", MAX_TENSOR_NAME_BYTES)
        if not name:
            raise _Bad(f"tensor #{i} has an empty name")
        if name in seen:
            raise _Bad(f"duplicate tensor {name!r}")
        seen.add(name)
        n_dims = w.u32(f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _Bad(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        shape = tuple(w.u64(f"shape of {name!r}") for _ in range(n_dims))
        n = 1
        for d in shape:
            n *= d
            if d > INT64_MAX or n > INT64_MAX:
                raise _Bad(f"tensor {name!r} shape {list(shape)} overflows 64-bit element counts")
        ttype = w.u32(f"type of {name!r}")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise _Bad(f"tensor {name!r} has unknown ggml type {ttype}") from None
        if shape[0] % block:
            raise _Bad(f"tensor {name!r} row of {shape[0]} is not a multiple of its block size {block}")
        offset = w.u64(f"offset of {name!r}")
        out.append((name, shape, ttype, offset, n, n // block * type_size))
    return out


def _check_layout(w: _Walker, infos: list, alignment: int) -> tuple[int, tuple[TensorInfo, ...]]:
    data_offset = -(-w.pos // alignment) * alignment
    if infos and data_offset > w.size:
        raise _Bad(f"truncated: tensor data would start at {data_offset}, past the end of the file ({w.size})")
    tensors = []
    for name, shape, ttype, offset, n, nbytes in infos:
        if offset % alignment:
            raise _Bad(f"tensor {name!r} offset {offset} is not a multiple of the alignment {alignment}")
        end = data_offset + offset + nbytes
        if end > w.size:
            raise _Bad(f"tensor {name!r} data ends at byte {end}, past the end of the file ({w.size})")
        tensors.append(TensorInfo(name, shape, ttype, offset, n, nbytes))
    last_end, last_name = 0, None
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.offset < last_end:
            raise _Bad(f"tensor {t.name!r} overlaps tensor {last_name!r}")
        if t.n_bytes:
            last_end, last_name = t.offset + t.n_bytes, t.name
    return data_offset, tuple(tensors)


def _int_field(values: dict, types: dict, key: str) -> int | None:
    if key not in values:
        return None
    if types[key] not in _INT_TYPES:
        raise _Bad(f"metadata {key!r} has type {_type_name(types[key])}, expected an integer")
    if values[key] < 0:
        raise _Bad(f"metadata {key!r} is negative ({values[key]})")
    return values[key]


def _str_field(values: dict, types: dict, key: str) -> str | None:
    if key not in values:
        return None
    if types[key] != _STRING:
        raise _Bad(f"metadata {key!r} has type {_type_name(types[key])}, expected a string")
    return values[key]


def quant_label(file_type: int | None, tensors: tuple[TensorInfo, ...] = ()) -> str | None:
    """``15`` -> ``"Q4_K_M"``; without a known file type, the ggml type holding most bytes
    among matrices (e.g. ``"Q4_K"``)."""
    from gguf import GGMLQuantizationType, LlamaFileType

    if file_type is not None:
        try:
            ft = LlamaFileType(file_type)
        except ValueError:
            ft = None
        if ft is not None and ft != LlamaFileType.GUESSED:
            return "F32" if ft == LlamaFileType.ALL_F32 else ft.name.removeprefix("MOSTLY_")
    by_bytes: dict[int, int] = {}
    for t in tensors:
        if len(t.shape) >= 2 or len(tensors) == 1:
            by_bytes[t.ggml_type] = by_bytes.get(t.ggml_type, 0) + t.n_bytes
    if not by_bytes:
        return None
    return GGMLQuantizationType(max(by_bytes, key=by_bytes.__getitem__)).name


def _build_info(path: Path, w: _Walker, version: int, n_kv: int, values: dict, types: dict,
                alignment: int, data_offset: int, tensors: tuple[TensorInfo, ...]) -> GGUFInfo:
    from gguf import GGMLQuantizationType

    arch = _str_field(values, types, "general.architecture")
    p = f"{arch}." if arch else "\x00"  # no arch: no architecture keys can match

    def arch_int(suffix: str) -> int | None:
        return _int_field(values, types, p + suffix)

    hkv_key = p + "attention.head_count_kv"
    head_kv, per_layer = None, None
    if hkv_key in values and types[hkv_key] >> 8 == _ARRAY:
        layers = values[hkv_key]
        if types[hkv_key] & 0xFF not in _INT_TYPES or not isinstance(layers, list) or not layers:
            raise _Bad(f"metadata {hkv_key!r} must be a non-empty list of integers")
        if min(layers) < 0:
            raise _Bad(f"metadata {hkv_key!r} has a negative head count")
        per_layer, head_kv = tuple(layers), max(layers)
    else:
        head_kv = arch_int("attention.head_count_kv")

    vocab = arch_int("vocab_size")
    tok_key = "tokenizer.ggml.tokens"
    if vocab is None and tok_key in values:
        vocab = values[tok_key] if isinstance(values[tok_key], int) else len(values[tok_key])
    file_type = _int_field(values, types, "general.file_type")
    template = _str_field(values, types, "tokenizer.chat_template")
    named = {k for k in values if k in {
        "general.architecture", "general.name", "general.file_type", "general.alignment",
        "tokenizer.chat_template", "tokenizer.ggml.model", "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id", "split.no", "split.count", "split.tensors.count"}}
    scalars = {k: v for k, v in values.items()
               if k not in named and types[k] >> 8 != _ARRAY and not (isinstance(v, str) and len(v) > 4096)}
    scalars = {k: (v if math.isfinite(v) else None) if isinstance(v, float) else v for k, v in scalars.items()}
    type_counts: dict[str, int] = {}
    for t in tensors:
        tname = GGMLQuantizationType(t.ggml_type).name
        type_counts[tname] = type_counts.get(tname, 0) + 1
    return GGUFInfo(
        path=str(path), version=version, byte_order="big" if w.e == ">" else "little", size_bytes=w.size,
        tensor_count=len(tensors), kv_count=n_kv, alignment=alignment, data_offset=data_offset,
        architecture=arch, name=_str_field(values, types, "general.name"),
        file_type=file_type, quant=quant_label(file_type, tensors), n_params=sum(t.n_elements for t in tensors),
        context_length=arch_int("context_length"), block_count=arch_int("block_count"),
        embedding_length=arch_int("embedding_length"), feed_forward_length=arch_int("feed_forward_length"),
        head_count=arch_int("attention.head_count"), head_count_kv=head_kv, head_count_kv_per_layer=per_layer,
        key_length=arch_int("attention.key_length"), value_length=arch_int("attention.value_length"),
        vocab_size=vocab, sliding_window=arch_int("attention.sliding_window"),
        expert_count=arch_int("expert_count"), expert_used_count=arch_int("expert_used_count"),
        tokenizer_model=_str_field(values, types, "tokenizer.ggml.model"), chat_template=template,
        bos_token_id=_int_field(values, types, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_int_field(values, types, "tokenizer.ggml.eos_token_id"),
        split_no=_int_field(values, types, "split.no"), split_count=_int_field(values, types, "split.count"),
        split_tensors_count=_int_field(values, types, "split.tensors.count"),
        tensor_types=type_counts, scalars=scalars, tensors=tensors,
    )


def _walk(path: Path, f: BinaryIO, size: int) -> GGUFInfo:
    w = _Walker(f, size)
    version, n_tensors, n_kv = _header(w)
    values, types = _metadata(w, n_kv)
    alignment = 32
    if "general.alignment" in values:
        if types["general.alignment"] != _U32:
            raise _Bad("metadata 'general.alignment' must be a UINT32")  # llama.cpp asserts on any other type
        alignment = values["general.alignment"]
        if alignment == 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
            raise _Bad(f"alignment {alignment} is not a power of two up to {MAX_ALIGNMENT}")
    infos = _tensor_infos(w, n_tensors)
    data_offset, tensors = _check_layout(w, infos, alignment)
    return _build_info(path, w, version, n_kv, values, types, alignment, data_offset, tensors)


_HINT = "the file is not a valid GGUF model (truncated download or corrupt); download it again"


def read_gguf_metadata(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read and validate a GGUF header. Raises only InvalidModelFile, for any file content."""
    path = Path(path)
    f, size = _open_regular(path)
    try:
        with f:
            return _walk(path, f, size)
    except _Bad as exc:
        raise InvalidModelFile(f"{path}: {exc}", hint=_HINT) from None
    except (OSError, MemoryError) as exc:
        raise InvalidModelFile(f"{path}: cannot read: {exc}", hint="check the file and free memory") from None
    except Exception as exc:  # a parser bug must not escape as a crash; say so loudly
        logger.exception("internal error while validating %s", path)
        raise InvalidModelFile(f"{path}: internal error while validating: {exc!r}", hint=_HINT) from exc


def open_gguf_reader(path: str | os.PathLike[str]):
    """A ``gguf.GGUFReader`` for a file that first passed :func:`read_gguf_metadata`."""
    read_gguf_metadata(path)
    from gguf import GGUFReader

    try:
        return GGUFReader(path, "r")
    except (ValueError, OSError, IndexError, KeyError, TypeError) as exc:
        raise InvalidModelFile(f"{path}: the gguf package cannot read it: {exc}", hint=_HINT) from None
