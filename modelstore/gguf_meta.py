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
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from localrun.errors import InvalidModelFile, LocalrunError

from .gguf_walk import (
    ARRAY,
    INT_TYPES,
    STRING,
    GGUFFormatError,
    RawHeader,
    TensorInfo,
    type_name,
    walk,
)

if TYPE_CHECKING:
    from gguf import GGUFReader

logger = logging.getLogger(__name__)


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
    expert_bytes: int = 0
    """Bytes of the MoE routed-expert tensors (``blk.N.ffn_*_exps``) here: what the planner keeps in RAM first."""
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


def _open_regular(path: Path) -> tuple[BinaryIO, int]:
    """Open without blocking on a FIFO or device, and refuse anything but a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InvalidModelFile(f"{path}: no such file", hint="check the path") from None
    except OSError as exc:
        raise InvalidModelFile(
            f"{path}: cannot open: {exc.strerror or exc}", hint="check the path and its permissions"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InvalidModelFile(f"{path}: not a regular file", hint="point at the .gguf file itself")
    return os.fdopen(fd, "rb", buffering=0), st.st_size


def _int_field(values: dict[str, Any], types: dict[str, int], key: str) -> int | None:
    if key not in values:
        return None
    if types[key] not in INT_TYPES:
        raise GGUFFormatError(f"metadata {key!r} has type {type_name(types[key])}, expected an integer")
    if values[key] < 0:
        raise GGUFFormatError(f"metadata {key!r} is negative ({values[key]})")
    return int(values[key])


def _str_field(values: dict[str, Any], types: dict[str, int], key: str) -> str | None:
    if key not in values:
        return None
    if types[key] != STRING:
        raise GGUFFormatError(f"metadata {key!r} has type {type_name(types[key])}, expected a string")
    return str(values[key])


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


def _build_info(path: Path, raw: RawHeader) -> GGUFInfo:
    """Pick out the keys localrun uses, checking that each has a sensible type."""
    from gguf import GGMLQuantizationType

    values, types, tensors = raw.values, raw.types, raw.tensors
    arch = _str_field(values, types, "general.architecture")
    p = f"{arch}." if arch else "\x00"  # no arch: no architecture keys can match

    def arch_int(suffix: str) -> int | None:
        return _int_field(values, types, p + suffix)

    hkv_key = p + "attention.head_count_kv"
    head_kv, per_layer = None, None
    if hkv_key in values and types[hkv_key] >> 8 == ARRAY:
        layers = values[hkv_key]
        if types[hkv_key] & 0xFF not in INT_TYPES or not isinstance(layers, list) or not layers:
            raise GGUFFormatError(f"metadata {hkv_key!r} must be a non-empty list of integers")
        if min(layers) < 0:
            raise GGUFFormatError(f"metadata {hkv_key!r} has a negative head count")
        per_layer, head_kv = tuple(layers), max(layers)
    else:
        head_kv = arch_int("attention.head_count_kv")

    vocab = arch_int("vocab_size")
    tok_key = "tokenizer.ggml.tokens"
    if vocab is None and tok_key in values:
        vocab = values[tok_key] if isinstance(values[tok_key], int) else len(values[tok_key])
    file_type = _int_field(values, types, "general.file_type")
    template = _str_field(values, types, "tokenizer.chat_template")
    named = {
        k
        for k in values
        if k
        in {
            "general.architecture",
            "general.name",
            "general.file_type",
            "general.alignment",
            "tokenizer.chat_template",
            "tokenizer.ggml.model",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "split.no",
            "split.count",
            "split.tensors.count",
        }
    }
    scalars = {
        k: v
        for k, v in values.items()
        if k not in named and types[k] >> 8 != ARRAY and not (isinstance(v, str) and len(v) > 4096)
    }
    scalars = {k: (v if math.isfinite(v) else None) if isinstance(v, float) else v for k, v in scalars.items()}
    type_counts: dict[str, int] = {}
    for t in tensors:
        tname = GGMLQuantizationType(t.ggml_type).name
        type_counts[tname] = type_counts.get(tname, 0) + 1
    return GGUFInfo(
        path=str(path),
        version=raw.version,
        byte_order=raw.byte_order,
        size_bytes=raw.size,
        tensor_count=len(tensors),
        kv_count=raw.kv_count,
        alignment=raw.alignment,
        data_offset=raw.data_offset,
        architecture=arch,
        name=_str_field(values, types, "general.name"),
        file_type=file_type,
        quant=quant_label(file_type, tensors),
        n_params=sum(t.n_elements for t in tensors),
        context_length=arch_int("context_length"),
        block_count=arch_int("block_count"),
        embedding_length=arch_int("embedding_length"),
        feed_forward_length=arch_int("feed_forward_length"),
        head_count=arch_int("attention.head_count"),
        head_count_kv=head_kv,
        head_count_kv_per_layer=per_layer,
        key_length=arch_int("attention.key_length"),
        value_length=arch_int("attention.value_length"),
        vocab_size=vocab,
        sliding_window=arch_int("attention.sliding_window"),
        expert_count=arch_int("expert_count"),
        expert_used_count=arch_int("expert_used_count"),
        expert_bytes=sum(t.n_bytes for t in tensors if _EXPERT_TENSOR.search(t.name)),
        tokenizer_model=_str_field(values, types, "tokenizer.ggml.model"),
        chat_template=template,
        bos_token_id=_int_field(values, types, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_int_field(values, types, "tokenizer.ggml.eos_token_id"),
        split_no=_int_field(values, types, "split.no"),
        split_count=_int_field(values, types, "split.count"),
        split_tensors_count=_int_field(values, types, "split.tensors.count"),
        tensor_types=type_counts,
        scalars=scalars,
        tensors=tensors,
    )


#: The tensors llama.cpp's --cpu-moe keeps in RAM (LLM_FFN_EXPS_REGEX, common/common.h).
_EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")

_HINT = "the file is not a valid GGUF model (truncated download or corrupt); download it again"
_WRONG_FILE_HINT = "give the path of a .gguf file (a projector is an mmproj*.gguf beside the model)"


def read_gguf_metadata(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read and validate a GGUF header. Raises only InvalidModelFile, for any file content."""
    path = Path(path)
    f, size = _open_regular(path)
    with f:
        return read_gguf_header(f, size, path)


def read_gguf_header(f: BinaryIO, size: int, path: Path) -> GGUFInfo:
    """The header of the ``size``-byte GGUF that ``f`` reads (a file, or the hub's file by range
    requests), named ``path`` in messages. Raises only InvalidModelFile, for any content."""
    try:
        return _build_info(path, walk(f, size))
    except LocalrunError:  # the reader's own failure (the hub unreachable mid-header) says what it is
        raise
    except GGUFFormatError as exc:
        wrong = str(exc).startswith("not a GGUF file:")  # a known other kind of file, not a broken GGUF
        raise InvalidModelFile(f"{path}: {exc}", hint=_WRONG_FILE_HINT if wrong else _HINT) from None
    except (OSError, MemoryError) as exc:
        raise InvalidModelFile(f"{path}: cannot read: {exc}", hint="check the file and free memory") from None
    except Exception as exc:  # a parser bug must not escape as a crash; say so loudly
        logger.exception("internal error while validating %s", path)
        raise InvalidModelFile(f"{path}: internal error while validating: {exc!r}", hint=_HINT) from exc


def open_gguf_reader(path: str | os.PathLike[str]) -> GGUFReader:
    """A ``gguf.GGUFReader`` for a file that first passed :func:`read_gguf_metadata`."""
    read_gguf_metadata(path)
    from gguf import GGUFReader

    try:
        return GGUFReader(path, "r")
    except (ValueError, OSError, IndexError, KeyError, TypeError) as exc:
        raise InvalidModelFile(f"{path}: the gguf package cannot read it: {exc}", hint=_HINT) from None
