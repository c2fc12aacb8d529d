"""MLX model folders (config.json + safetensors), checked before anything loads them.

A folder is untrusted like a GGUF file, and it can also carry code: mlx-lm imported the
Python file named by ``model_file`` in config.json (CVE-2026-5843), ``auto_map`` points
transformers at repo code, and ``*.bin``/``*.pt`` weights are pickles. All of that is
refused here. Each safetensors header is checked (length, JSON, every tensor's data range
inside the file) and its parameters counted; config.json gives the facts the planner needs.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Any

from localrun.errors import InvalidModelFile
from localrun.jsonfile import NotAJsonObject, read_json_object
from localrun.types import FileEntry

logger = logging.getLogger(__name__)

# Files that carry code or pickles: refused in a model folder (mlx-lm CVE-2026-5843, pickle RCE).
_CODE_SUFFIXES = frozenset(
    {".py", ".pyc", ".pyd", ".so", ".dylib", ".dll", ".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}
)
_CODE_CONFIG_KEYS = ("model_file", "auto_map")
_MAX_JSON_BYTES = 16 << 20
_MAX_SAFETENSORS_HEADER = 100 << 20


def inspect_mlx_folder(
    folder: Path, *, trust_remote_code: bool = False
) -> tuple[tuple[FileEntry, ...], dict[str, Any]]:
    """Validate an MLX model folder; return its files and GGUF-like metadata.

    ``trust_remote_code``: the folder may carry code (a pull the user allowed to fetch it);
    the weights' headers are checked all the same.

    Raises:
        InvalidModelFile: not a model folder, code or pickles inside, or a bad header.
    """
    config_path = folder / "config.json"
    weights = sorted(folder.glob("*.safetensors"))
    if not config_path.is_file() or not weights:
        raise InvalidModelFile(
            f"{folder}: not a model folder (an MLX model needs config.json and *.safetensors)",
            hint="point at a .gguf file or an MLX model folder",
        )
    config = _read_json(config_path)
    if not trust_remote_code:
        _refuse_code(folder, config_path, config)
    n_params = sum(_safetensors_params(w) for w in weights)
    entries = tuple(FileEntry(path=str(p), size=p.stat().st_size) for p in sorted(folder.iterdir()) if p.is_file())
    meta = _mlx_metadata(folder, config)
    meta.update(n_params=n_params, size_bytes=sum(e.size for e in entries))
    return entries, meta


def _refuse_code(folder: Path, config_path: Path, config: dict[str, Any]) -> None:
    code = sorted(p.name for p in folder.rglob("*") if p.suffix.lower() in _CODE_SUFFIXES)
    if code:
        raise InvalidModelFile(
            f"{folder}: contains code or pickled weights ({', '.join(code[:3])}), which localrun does not load",
            hint="use a folder with only config, tokenizer and safetensors files",
        )
    for key in _CODE_CONFIG_KEYS:
        if key in config:
            raise InvalidModelFile(
                f"{config_path}: {key!r} asks to run code shipped with the model; refused",
                hint="use a model that runs with the stock mlx-lm architectures",
            )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return read_json_object(path, max_bytes=_MAX_JSON_BYTES)
    except NotAJsonObject as exc:
        raise InvalidModelFile(str(exc), hint="the model folder is incomplete or corrupt") from None


def _safetensors_params(path: Path) -> int:
    """Check a safetensors header (length, JSON, every data range inside the file) and
    return its parameter count."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 2 <= n <= min(_MAX_SAFETENSORS_HEADER, size - 8):
                raise InvalidModelFile(
                    f"{path}: bad safetensors header length {n}", hint="the file is truncated or corrupt"
                )
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidModelFile(
            f"{path}: unreadable safetensors header ({exc})", hint="the file is truncated or corrupt"
        ) from None
    data_len, total = size - 8 - n, 0
    if not isinstance(header, dict):
        raise InvalidModelFile(f"{path}: safetensors header is not an object", hint="the file is corrupt")
    for key, t in header.items():
        if key == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in t["data_offsets"])
            count = 1
            for d in t["shape"]:
                count *= int(d)
        except (KeyError, TypeError, ValueError):
            raise InvalidModelFile(
                f"{path}: tensor {key!r} has a malformed entry", hint="the file is corrupt"
            ) from None
        if not 0 <= begin <= end <= data_len:
            raise InvalidModelFile(
                f"{path}: tensor {key!r} data lies outside the file", hint="the file is truncated or corrupt"
            )
        total += count
    return total


def _mlx_metadata(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The GGUF-like facts the planner needs, from an HF/MLX config.json."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config

    def num(key: str) -> int | None:
        v = text.get(key, config.get(key))
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    quant = config.get("quantization") or config.get("quantization_config") or {}
    bits = quant.get("bits") if isinstance(quant, dict) else None
    archs = config.get("architectures")
    template = None
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8", errors="replace")
    elif (folder / "tokenizer_config.json").is_file():
        t = _read_json(folder / "tokenizer_config.json").get("chat_template")
        template = t if isinstance(t, str) else None
    return {
        "architecture": str(config.get("model_type") or "") or None,
        "architectures": [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else [],
        "quant": f"{bits}bit" if isinstance(bits, int) else None,
        "context_length": num("max_position_embeddings"),
        "block_count": num("num_hidden_layers"),
        "embedding_length": num("hidden_size"),
        "feed_forward_length": num("intermediate_size"),
        "head_count": num("num_attention_heads"),
        "head_count_kv": num("num_key_value_heads") or num("num_attention_heads"),
        "key_length": num("head_dim"),
        "value_length": num("head_dim"),
        "vocab_size": num("vocab_size"),
        "chat_template": template,
    }
