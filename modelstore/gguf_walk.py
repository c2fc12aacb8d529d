"""The bounds-checked walk over a GGUF header (the format: ggml docs/gguf.md).

Everything here is arithmetic on Python integers, which cannot wrap, over bytes read from
a file object in bounded chunks. No count, length, shape or offset is used before it is
checked against what the rest of the file can hold, and each loop is capped so that any
input — valid, truncated or hostile — is walked in well under two seconds. The public
face is :func:`localrun.modelstore.gguf_meta.read_gguf_metadata`; this module raises only
:class:`GGUFFormatError` for bad bytes.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

logger = logging.getLogger(__name__)

SUPPORTED_VERSIONS = (2, 3)
MAX_KV_COUNT = 1 << 14  # real files hold tens to a few hundred
MAX_TENSOR_COUNT = 1 << 16  # unmerged-expert MoE files reach ~15k
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
_SMALL_STRING_ARRAY = 64  # string arrays up to this length are decoded (general.tags) …
_DECODE_BUDGET = 4096  # … until this many strings were decoded in the file; the rest are skipped

# GGUF value types: (struct code, byte width); 8 = string, 9 = array.
STRING, ARRAY = 8, 9
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("B", 1),
    1: ("b", 1),
    2: ("H", 2),
    3: ("h", 2),
    4: ("I", 4),
    5: ("i", 4),
    6: ("f", 4),
    7: ("?", 1),
    10: ("Q", 8),
    11: ("q", 8),
    12: ("d", 8),
}
INT_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_U32 = 4
_TYPE_NAMES = {
    0: "UINT8",
    1: "INT8",
    2: "UINT16",
    3: "INT16",
    4: "UINT32",
    5: "INT32",
    6: "FLOAT32",
    7: "BOOL",
    8: "STRING",
    9: "ARRAY",
    10: "UINT64",
    11: "INT64",
    12: "FLOAT64",
}


def type_name(t: int) -> str:
    """Our packed type code (arrays are ``ARRAY << 8 | element``) as a word."""
    return f"ARRAY[{_TYPE_NAMES[t & 0xFF]}]" if t >> 8 == ARRAY else _TYPE_NAMES.get(t, str(t))


class GGUFFormatError(Exception):
    """A problem found while walking; the caller turns it into InvalidModelFile naming the file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] is the innermost (row) dimension
    ggml_type: int
    offset: int  # relative to the data section
    n_elements: int
    n_bytes: int


class _Walker:
    """Reads a GGUF header through a file object in bounded chunks, checking every size."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size
        self.pos = 0
        self.buf = b""
        self.buf_pos = 0
        self.e = "<"
        self.strings_seen = 0

    def fill(self, n: int, what: str) -> int:
        """Make bytes [pos, pos+n) available in ``buf``; return their offset in it."""
        if self.pos + n > self.size:
            raise GGUFFormatError(f"truncated: {what} at offset {self.pos} needs {n} bytes, file has {self.size}")
        off = self.pos - self.buf_pos
        if 0 <= off and off + n <= len(self.buf):
            return off
        self.f.seek(self.pos)
        self.buf = self.f.read(min(max(n, _CHUNK), self.size - self.pos))
        self.buf_pos = self.pos
        if len(self.buf) < n:
            raise GGUFFormatError(f"truncated: file shrank while reading {what} at offset {self.pos}")
        return 0

    def scalar(self, vtype: int, what: str) -> Any:
        code, width = _SCALARS[vtype]
        off = self.fill(width, what)
        self.pos += width
        return struct.unpack_from(self.e + code, self.buf, off)[0]

    def u32(self, what: str) -> int:
        return int(self.scalar(4, what))

    def u64(self, what: str) -> int:
        return int(self.scalar(10, what))

    def raw_string(self, what: str, limit: int = MAX_STRING_BYTES) -> bytes:
        n = self.u64(f"length of {what}")
        if n > limit:
            raise GGUFFormatError(f"{what} claims {n} bytes (limit {limit})")
        off = self.fill(n, what)
        self.pos += n
        return self.buf[off : off + n]

    def text(self, what: str, limit: int = MAX_STRING_BYTES, *, strict: bool = True) -> str:
        """A string; names must be UTF-8, values are decoded leniently (llama.cpp does not check)."""
        raw = self.raw_string(what, limit)
        try:
            return raw.decode("utf-8", "strict" if strict else "replace")
        except UnicodeDecodeError:
            raise GGUFFormatError(f"{what} is not valid UTF-8") from None

    def skip_strings(self, count: int, what: str) -> None:
        """Walk ``count`` length-prefixed strings without decoding them (token lists)."""
        unpack = struct.Struct(self.e + "Q").unpack_from
        left = count
        while left:
            off = self.fill(8, what)
            buf, base, p, end = self.buf, self.buf_pos, off, len(self.buf) - 8
            while left and p <= end:
                p += 8 + unpack(buf, p)[0]
                left -= 1
            self.pos = base + p
            if self.pos > self.size:
                raise GGUFFormatError(f"truncated: a string of {what} runs past the end of the file")

    def array(self, key: str) -> tuple[int, Any]:
        """(element type, the values) — or, for arrays too long to keep, (type, their length)."""
        sub = self.u32(f"element type of {key!r}")
        count = self.u64(f"length of {key!r}")
        if sub == ARRAY:
            raise GGUFFormatError(f"metadata {key!r} is a nested array (not supported)")
        if sub != STRING and sub not in _SCALARS:
            raise GGUFFormatError(f"metadata {key!r} has invalid element type {sub}")
        if count > MAX_ARRAY_LEN:
            raise GGUFFormatError(f"metadata {key!r} claims {count} elements (limit {MAX_ARRAY_LEN})")
        if sub == STRING:
            if count * 8 > self.size - self.pos:
                raise GGUFFormatError(f"metadata {key!r} claims {count} strings, more than the file can hold")
            self.strings_seen += count
            if self.strings_seen > MAX_TOTAL_ARRAY_STRINGS:
                raise GGUFFormatError(f"more than {MAX_TOTAL_ARRAY_STRINGS} strings in metadata arrays")
            if count <= _SMALL_STRING_ARRAY and self.strings_seen <= _DECODE_BUDGET:
                return sub, [self.raw_string(f"element of {key!r}").decode("utf-8", "replace") for _ in range(count)]
            self.skip_strings(count, repr(key))
            return sub, count
        code, width = _SCALARS[sub]
        nbytes = count * width
        if nbytes > self.size - self.pos:
            raise GGUFFormatError(f"metadata {key!r} claims {count} elements, more than the file can hold")
        if count <= _SMALL_ARRAY:
            off = self.fill(nbytes, repr(key))
            values = list(struct.unpack_from(f"{self.e}{count}{code}", self.buf, off))
            self.pos += nbytes
            return sub, values
        self.pos += nbytes
        return sub, count


#: What a file that is not a GGUF is, by its first bytes: named, so a picture given as a
#: projector is called a picture, not a "truncated download".
_OTHER_FILES = (
    (b"\x89PNG", "it is a PNG image"),
    (b"\xff\xd8\xff", "it is a JPEG image"),
    (b"GIF8", "it is a GIF image"),
    (b"%PDF", "it is a PDF document"),
    (b"PK\x03\x04", "it is a zip archive"),
    (b"fLaC", "it is FLAC audio"),
    (b"ID3", "it is MP3 audio"),
    (b"version https://git-lfs", "it is a Git LFS pointer, not the file it points to"),
    (b"<", "it is text (an HTML or XML page, perhaps an error page saved in its place)"),
    (b"{", "it is JSON text"),
)


def sniff(head: bytes) -> str | None:
    """What a non-GGUF file is, from its first bytes (None when it is nothing known)."""
    if head[:4] == b"RIFF" and head[8:12] in (b"WEBP", b"WAVE"):
        return "it is a WebP image" if head[8:12] == b"WEBP" else "it is WAV audio"
    if len(head) > 9 and head[8:10] in (b'{"', b"{ ") and int.from_bytes(head[:8], "little") < 1 << 30:
        return "it is a safetensors file (an MLX or Transformers weight file: import its folder)"
    return next((what for magic, what in _OTHER_FILES if head.lstrip()[: len(magic)] == magic), None)


def _header(w: _Walker) -> tuple[int, int, int]:
    if w.size == 0:
        raise GGUFFormatError("not a GGUF file (it is empty)")
    off = w.fill(min(w.size, 24), "header")
    magic = w.buf[off : off + 4]
    if magic != b"GGUF"[: len(magic)] or not magic:
        what = sniff(bytes(w.buf[off : off + 24]))
        raise GGUFFormatError(f"not a GGUF file: {what}" if what else f"not a GGUF file (bad magic {magic!r})")
    if w.size < 24:
        raise GGUFFormatError(f"truncated: {w.size} bytes is shorter than a GGUF header (24)")
    version = struct.unpack_from("<I", w.buf, off + 4)[0]
    if version not in SUPPORTED_VERSIONS:
        be = struct.unpack_from(">I", w.buf, off + 4)[0]
        if be in SUPPORTED_VERSIONS:
            w.e, version = ">", be
        elif version == 1:
            raise GGUFFormatError("GGUF version 1 is not supported (re-convert the model)")
        else:
            raise GGUFFormatError(f"unsupported GGUF version {version}")
    w.pos = 8
    n_tensors = w.u64("tensor count")
    n_kv = w.u64("metadata count")
    remaining = w.size - w.pos
    # Smallest possible entries: a kv is key length 8 + 1 byte + type 4 + a u8 value;
    # a tensor is name length 8 + 1 byte + n_dims 4 + one dim 8 + type 4 + offset 8.
    if n_kv > MAX_KV_COUNT or n_kv * 14 > remaining:
        raise GGUFFormatError(f"metadata count {n_kv} is more than the file can hold")
    if n_tensors > MAX_TENSOR_COUNT or n_kv * 14 + n_tensors * 33 > remaining:
        raise GGUFFormatError(f"tensor count {n_tensors} is more than the file can hold")
    return version, n_tensors, n_kv


def _metadata(w: _Walker, n_kv: int) -> tuple[dict[str, Any], dict[str, int]]:
    values: dict[str, Any] = {}
    types: dict[str, int] = {}
    for i in range(n_kv):
        raw = w.raw_string(f"key #{i}", MAX_KEY_BYTES)
        if not raw:
            raise GGUFFormatError(f"metadata key #{i} is empty")
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFFormatError(f"metadata key #{i} is not valid UTF-8") from None
        if key in values:
            raise GGUFFormatError(f"duplicate metadata key {key!r}")
        vtype = w.u32(f"type of {key!r}")
        if vtype == STRING:
            values[key] = w.text(f"value of {key!r}", strict=False)
        elif vtype == ARRAY:
            sub, values[key] = w.array(key)
            vtype = (ARRAY << 8) | sub
        elif vtype in _SCALARS:
            values[key] = w.scalar(vtype, f"value of {key!r}")
        else:
            raise GGUFFormatError(f"metadata {key!r} has invalid value type {vtype}")
        types[key] = vtype
    return values, types


def _tensor_infos(w: _Walker, n_tensors: int) -> list[tuple[str, tuple[int, ...], int, int, int, int]]:
    """(name, shape, ggml type, offset, elements, bytes) per tensor, shapes checked.

    This loop runs up to MAX_TENSOR_COUNT times, so messages are built only on failure."""
    from gguf import GGML_QUANT_SIZES

    sizes = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
    out = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = w.text("a tensor name", MAX_TENSOR_NAME_BYTES)
        try:
            if not name:
                raise GGUFFormatError("has an empty name")
            if name in seen:
                raise GGUFFormatError("is a duplicate")
            seen.add(name)
            n_dims = w.u32("the dimension count")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFFormatError(f"has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
            shape = tuple(w.u64("the shape") for _ in range(n_dims))
            n = 1
            for d in shape:
                n *= d
                if d > INT64_MAX or n > INT64_MAX:
                    raise GGUFFormatError(f"shape {list(shape)} overflows 64-bit element counts")
            ttype = w.u32("the type")
            if ttype not in sizes:
                raise GGUFFormatError(f"has unknown ggml type {ttype}")
            block, type_size = sizes[ttype]
            if shape[0] % block:
                raise GGUFFormatError(f"row of {shape[0]} is not a multiple of its block size {block}")
            offset = w.u64("the offset")
        except GGUFFormatError as exc:
            raise GGUFFormatError(f"tensor #{i} {name!r} {exc}") from None
        out.append((name, shape, ttype, offset, n, n // block * type_size))
    return out


def _check_layout(
    w: _Walker, infos: list[tuple[str, tuple[int, ...], int, int, int, int]], alignment: int
) -> tuple[int, tuple[TensorInfo, ...]]:
    data_offset = -(-w.pos // alignment) * alignment
    if infos and data_offset > w.size:
        raise GGUFFormatError(
            f"truncated: tensor data would start at {data_offset}, past the end of the file ({w.size})"
        )
    tensors = []
    for name, shape, ttype, offset, n, nbytes in infos:
        if offset % alignment:
            raise GGUFFormatError(f"tensor {name!r} offset {offset} is not a multiple of the alignment {alignment}")
        end = data_offset + offset + nbytes
        if end > w.size:
            raise GGUFFormatError(f"tensor {name!r} data ends at byte {end}, past the end of the file ({w.size})")
        tensors.append(TensorInfo(name, shape, ttype, offset, n, nbytes))
    last_end, last_name = 0, None
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.offset < last_end:
            raise GGUFFormatError(f"tensor {t.name!r} overlaps tensor {last_name!r}")
        if t.n_bytes:
            last_end, last_name = t.offset + t.n_bytes, t.name
    return data_offset, tuple(tensors)


@dataclass(frozen=True)
class RawHeader:
    """A GGUF header whose every count, length, shape and offset fits in the file."""

    version: int
    byte_order: str  # "little" | "big"
    size: int
    kv_count: int
    values: dict[str, Any]
    types: dict[str, int]
    """Packed value types: scalars as is, arrays as ``ARRAY << 8 | element type``."""
    alignment: int
    data_offset: int
    tensors: tuple[TensorInfo, ...]


def walk(f: BinaryIO, size: int) -> RawHeader:
    """Walk the header of the ``size``-byte file ``f``. Raises GGUFFormatError."""
    w = _Walker(f, size)
    version, n_tensors, n_kv = _header(w)
    values, types = _metadata(w, n_kv)
    alignment = 32
    if "general.alignment" in values:
        if types["general.alignment"] != _U32:
            raise GGUFFormatError(
                "metadata 'general.alignment' must be a UINT32"
            )  # llama.cpp asserts on any other type
        alignment = values["general.alignment"]
        if alignment == 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
            raise GGUFFormatError(f"alignment {alignment} is not a power of two up to {MAX_ALIGNMENT}")
    infos = _tensor_infos(w, n_tensors)
    data_offset, tensors = _check_layout(w, infos, alignment)
    return RawHeader(
        version, "big" if w.e == ">" else "little", size, n_kv, values, types, alignment, data_offset, tensors
    )
