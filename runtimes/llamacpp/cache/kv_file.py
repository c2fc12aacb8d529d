"""The on-disk format of one cached state blob (the disk tier, kv_disk.py).

One file holds one entry: a fixed header, the token ids whose state it is, then the blob
``llama_state_seq_get_data`` returned. Every field a wrong restore could come from is checked
before a blob reaches llama.cpp, and a file that fails any check is reported as :class:`BadFile`
(the tier deletes it and prefills instead):

* ``magic`` and ``version``: not ours, or a format this code does not know (older or newer);
* ``digest``: the :class:`~.kv_disk.StateKey` the blob was made under, so another model's file
  renamed into this folder is refused even though its checksums are good;
* ``header_crc`` over every header byte before it, ``tokens_crc`` over the token ids and
  ``blob_crc`` over the blob: a byte flipped anywhere fails one of the three;
* the file's size must equal header + tokens + blob exactly: a truncated or extended file fails
  before anything is read past the header.

The header and token checksums are CRC-32 (``zlib.crc32``); the blob's is XXH3-64 (``xxhash``),
about 9 GB/s on one core here against CRC-32's 1.6: checking a 57 MB state (16k tokens of
Gemma 3 270M) costs 6 ms instead of 36, on the path of a restart's first request. Both guard
against torn writes and bit rot, not an adversary: the cache folder is the user's own. A blob is
checked and restored from the file mapped copy-on-write, the page cache's own pages, with no
copy before llama.cpp's (:func:`read_blob`, slots.state_source).
Token ids are signed 32-bit: media chunks sit in prompts as negative pseudo-ids (media/prompt.py).
"""

from __future__ import annotations

import mmap
import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

import xxhash

MAGIC = b"LRKVSTAT"
#: Bump on any change to the layout below; files of any other version are refused.
FORMAT_VERSION = 2  # 2: the blob's checksum is XXH3-64 (1: CRC-32)
KINDS = ("prefix", "checkpoint")
#: magic, version, kind, reserved, key digest (32 bytes), token count, blob length, created
#: (unix time), tokens crc, blob checksum (XXH3-64); then the header crc over all of that.
_HEAD = struct.Struct("<8sHBB32sIQdIQ")
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEAD.size + _CRC.size
#: The most token ids a file may list: far past any context llama.cpp takes (4 Mi ids, 16 MiB),
#: and checked before they are read, so a header claiming 4 billion is refused, not read.
MAX_TOKENS = 1 << 22
#: Blobs are checksummed, written and read in pieces of this size, so the GIL is let go often
#: and a decode step never waits behind one long call.
CHUNK = 4 << 20


class BadFile(Exception):
    """A file that must not be loaded; the message says which check it failed."""


@dataclass(frozen=True)
class Header:
    """What a file's first bytes say about it (the tokens follow, then the blob)."""

    digest: bytes
    kind: str
    n_tokens: int
    blob_len: int
    created: float
    tokens_crc: int
    blob_crc: int

    @property
    def file_size(self) -> int:
        return HEADER_SIZE + 4 * self.n_tokens + self.blob_len


def blob_crc(blob: bytes | bytearray | memoryview | mmap.mmap) -> int:
    """XXH3-64 of a blob, a chunk at a time (no one call holds the GIL for long)."""
    view = memoryview(blob).cast("B")
    h = xxhash.xxh3_64()
    for i in range(0, len(view), CHUNK):
        h.update(view[i : i + CHUNK])
    return h.intdigest()


#: A state blob as the cache holds it: bytes or a view of a file read back (:func:`read_blob`), or
#: the memory llama.cpp wrote it into.
Blob = bytes | bytearray | memoryview | mmap.mmap


def blob_buffer(size: int) -> bytearray | mmap.mmap:
    """Writable memory for a state blob of ``size`` bytes that llama.cpp writes (a save):
    anonymous pages advised onto huge pages where the OS has them (far fewer page faults)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if size < CHUNK or advice is None:
        return bytearray(size)
    mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared memory gets no huge pages
    try:
        mem.madvise(advice)
    except OSError:  # a kernel without transparent huge pages: plain pages
        pass
    return mem


def token_bytes(tokens: Sequence[int]) -> bytes:
    arr = array("i", tokens)
    if arr.itemsize != 4:  # pragma: no cover - every platform localrun runs on has a 32-bit C int
        raise RuntimeError("C int is not 32 bits here")
    if struct.pack("=i", 1) != struct.pack("<i", 1):  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return arr.tobytes()


def _tokens_from(raw: bytes) -> tuple[int, ...]:
    arr = array("i")
    arr.frombytes(raw)
    if struct.pack("=i", 1) != struct.pack("<i", 1):  # pragma: no cover
        arr.byteswap()
    return tuple(arr)


def encode_header(digest: bytes, kind: str, toks: bytes, blob_len: int, crc: int, created: float) -> bytes:
    """The header and token bytes of a file whose blob (``blob_len`` bytes, CRC ``crc``) follows."""
    if len(digest) != 32:
        raise ValueError("the key digest is 32 bytes")
    head = _HEAD.pack(
        MAGIC, FORMAT_VERSION, KINDS.index(kind), 0, digest, len(toks) // 4, blob_len, created, zlib.crc32(toks), crc
    )
    return head + _CRC.pack(zlib.crc32(head)) + toks


def read_header(
    f: BinaryIO, *, size: int, digest: bytes, max_tokens: int = MAX_TOKENS
) -> tuple[Header, tuple[int, ...]]:
    """Read and check a file's header and tokens (not its blob). ``size`` is the file's size;
    more than ``max_tokens`` token ids are refused before any is read.

    Raises:
        BadFile: any check failed; the message names it.
    """
    raw = f.read(HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        raise BadFile(f"shorter than a header ({size} bytes)")
    magic, version, kind, _reserved, key, n_tokens, blob_len, created, tcrc, bcrc = _HEAD.unpack_from(raw)
    if magic != MAGIC:
        raise BadFile("not a localrun state file (bad magic)")
    if version != FORMAT_VERSION:  # before the checksum: another version may lay its header out otherwise
        raise BadFile(f"format version {version}, this localrun reads {FORMAT_VERSION}")
    if _CRC.unpack_from(raw, _HEAD.size)[0] != zlib.crc32(raw[: _HEAD.size]):
        raise BadFile("header checksum mismatch")
    if kind >= len(KINDS):
        raise BadFile(f"unknown entry kind {kind}")
    if key != digest:
        raise BadFile("made under another model, runtime or context (key digest differs)")
    if n_tokens > max_tokens:  # the header's checksum guards against rot, not against a made-up file
        raise BadFile(f"claims {n_tokens:,} tokens, more than the {max_tokens:,} a state file may hold")
    header = Header(key, KINDS[kind], n_tokens, blob_len, created, tcrc, bcrc)
    if size != header.file_size:
        raise BadFile(f"{size} bytes where the header promises {header.file_size} (truncated or extended)")
    toks = f.read(4 * n_tokens)
    if len(toks) != 4 * n_tokens or zlib.crc32(toks) != tcrc:
        raise BadFile("token checksum mismatch")
    return header, _tokens_from(toks)


def read_blob(f: BinaryIO, header: Header) -> memoryview:
    """The blob that follows the tokens, checked against the header: a view of the file mapped
    copy-on-write, so the page cache's pages are checksummed and handed to llama.cpp with no read
    into other memory (a restart's first request: 4 ms for 48 MB, against 17-110 ms for a read
    into fresh memory, where the OS may compact memory for huge pages first). The file must not
    shrink while the view lives (a mapping past a file's end faults): the tier never rewrites a
    file in place, it renames a new one over it or unlinks it, and the mapping keeps those pages.

    Raises:
        BadFile: short file or checksum mismatch.
    """
    offset = HEADER_SIZE + 4 * header.n_tokens
    try:
        mem = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as exc:  # empty, or a file system that cannot map
        raise BadFile(f"cannot map the blob: {exc}") from exc
    if len(mem) != offset + header.blob_len:
        mem.close()
        raise BadFile("blob shorter than its header says")
    view = memoryview(mem)[offset:]
    if blob_crc(view) != header.blob_crc:
        view.release()
        mem.close()
        raise BadFile("blob checksum mismatch")
    return view
