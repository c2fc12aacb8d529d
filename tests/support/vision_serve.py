"""A real server on Gemma 3 270M + a fixture projector, and each API family's request with one
image or clip in it: what the fuzz, the parity tests, the client tests and the vision benchmark
share, so each spells a family's media shape the same way.

The pair is put into the server's store the way any import ends (``inspect_path`` then
``register``), with the projector as one of the record's files and named by ``META_PROJECTOR``:
the shared contract of issue 19, independent of how ``localrun import --mmproj`` spells it.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

from tests.support import servers
from tests.support.launch import REPO, launch_env

MODEL = "gemma-vision"
FAMILIES = ("openai", "anthropic", "responses", "ollama_chat", "ollama_generate", "completion")
"""Every API family that takes media: OpenAI chat, Anthropic messages, Responses, Ollama chat and
generate, llama-server's /completion."""
MIME_FAMILIES = ("openai", "anthropic", "responses")  # where a declared MIME travels with the bytes
AUDIO_SLOT_FAMILIES = ("openai",)  # where an API has a field for audio (OpenAI's input_audio)

_IMPORT_PAIR = """
import dataclasses, sys
from pathlib import Path
from localrun.modelstore.store import ModelStore
from localrun.settings import Settings
from localrun.types import META_PROJECTOR, FileEntry
model, projector, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
store = ModelStore(Settings())
rec = store.inspect_path(model, name=name)
files = (*rec.files, FileEntry(str(projector), projector.stat().st_size))
rec = dataclasses.replace(rec, files=files, metadata={**rec.metadata, META_PROJECTOR: str(projector)})
store.register(rec, replace=True)
"""


def import_pair(home: Path, model: Path, projector: Path, name: str = MODEL) -> None:
    """Register ``model`` with ``projector`` in the store under ``home`` (in a child with that home)."""
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-c", _IMPORT_PAIR, str(model), str(projector), name],
        env=launch_env(home),
        check=True,
        cwd=REPO,
    )


def start_vision_server(
    home: Path,
    model: Path,
    projector: Path,
    *,
    name: str = MODEL,
    plan: dict | None = None,
    env_extra: dict | None = None,
    **options,
) -> servers.ServerProcess:
    """A real llama.cpp server (the test launcher) on the pair, 2 threads unless ``plan`` says;
    ``env_extra`` adds to its environment (``LOCALRUN_SERVER__...`` settings)."""
    import_pair(home, model, projector, name)
    spec = servers.gemma(servers.free_port(), home=home, plan={"n_threads": 2, **(plan or {})}, **options)
    spec.env.update(env_extra or {})
    return servers.start(spec, home / "server.log")


def good_image(fmt: str = "PNG", size: tuple[int, int] = (32, 32), seed: int = 1) -> bytes:
    """A small valid image whose pixels depend on ``seed`` (two seeds: two different images)."""
    import io
    import random

    from PIL import Image

    rng = random.Random(seed)
    img = Image.new("RGB", size)
    img.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(size[0] * size[1])])
    out = io.BytesIO()
    img.save(out, format=fmt)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def request(
    family: str,
    *,
    b64_data: str,
    mime: str,
    url: str | None = None,
    audio: bool = False,
    text: str = "Describe it.",
    model: str = MODEL,
    max_tokens: int = 2,
    stream: bool = False,
    before: tuple[tuple[str, str], ...] = (),
) -> tuple[str, dict]:
    """(path, JSON body) of one request carrying ``before`` (good (b64, mime) images) then one item.

    ``url`` replaces the data URL where a family takes URLs (and the base64 where it takes only
    base64); ``audio`` puts the item in the family's audio field where it has one (OpenAI's
    ``input_audio``; elsewhere the item goes where images go).
    """
    items = [*(dict(b64_data=b, mime=m, url=None, audio=False) for b, m in before)]
    items.append(dict(b64_data=b64_data, mime=mime, url=url, audio=audio))
    if family == "openai":
        parts: list[dict] = [{"type": "text", "text": text}]
        for it in items:
            if it["audio"]:
                fmt = "mp3" if it["mime"] == "audio/mpeg" else "wav"
                parts.append({"type": "input_audio", "input_audio": {"data": it["b64_data"], "format": fmt}})
            else:
                parts.append({"type": "image_url", "image_url": {"url": _data_url(it)}})
        body = {"model": model, "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens}
        return "/v1/chat/completions", {**body, "stream": stream, "temperature": 0}
    if family == "anthropic":
        blocks: list[dict] = []
        for it in items:
            if it["url"] is not None:
                blocks.append({"type": "image", "source": {"type": "url", "url": it["url"]}})
            else:
                source = {"type": "base64", "media_type": it["mime"], "data": it["b64_data"]}
                blocks.append({"type": "image", "source": source})
        blocks.append({"type": "text", "text": text})
        body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": blocks}]}
        return "/v1/messages", {**body, "stream": stream, "temperature": 0}
    if family == "responses":
        content = [{"type": "input_text", "text": text}]
        content += [{"type": "input_image", "image_url": _data_url(it)} for it in items]
        body = {"model": model, "input": [{"role": "user", "content": content}], "max_output_tokens": max_tokens}
        return "/v1/responses", {**body, "stream": stream, "temperature": 0, "store": False}
    raw = [it["url"] if it["url"] is not None else it["b64_data"] for it in items]
    options = {"num_predict": max_tokens, "temperature": 0}
    if family == "ollama_chat":
        message = {"role": "user", "content": text, "images": raw}
        return "/api/chat", {"model": model, "messages": [message], "stream": stream, "options": options}
    if family == "ollama_generate":
        return "/api/generate", {"model": model, "prompt": text, "images": raw, "stream": stream, "options": options}
    if family == "completion":
        prompt = {"prompt_string": text + " <__media__>" * len(raw), "multimodal_data": raw}
        return "/completion", {"prompt": prompt, "n_predict": max_tokens, "stream": stream, "temperature": 0}
    raise ValueError(family)


def _data_url(item: dict) -> str:
    return item["url"] if item["url"] is not None else f"data:{item['mime']};base64,{item['b64_data']}"


def error_message(body: object) -> str:
    """The human message in any family's error body ('' when there is none)."""
    if isinstance(body, dict):
        for key in ("message", "error", "detail"):
            value = body.get(key)
            if isinstance(value, str) and value.strip():
                return value
            if isinstance(value, (dict, list)):
                found = error_message(value)
                if found:
                    return found
    if isinstance(body, list):
        for value in body:
            found = error_message(value)
            if found:
                return found
    return ""
