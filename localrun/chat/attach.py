"""Images and audio attached from files, for ``localrun run`` (``--image``, ``--audio``) and the
TUI's ``/image``: a file on disk becomes a :class:`~localrun.types.Media` placed in the prompt by
a marker, and a model that cannot take it is refused before anything is sent, with the way to
give it a projector.

The bytes go to the runtime as read: decoding is the runtime's job (inside the worker, where a
malformed file can only hurt a sacrificial process), so a bad picture is the runtime's
:class:`~localrun.errors.InvalidMedia`, as it is for the server.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Iterable, Sequence
from pathlib import Path

from localrun.errors import InvalidMedia, UnsupportedFeature
from localrun.types import AUDIO, MEDIA_MARKER, VISION, Media, strip_media_markers

#: Larger than any picture or clip a projector takes; past it the file is refused before reading
#: it whole (a typo naming a disk image must not fill the memory).
MAX_FILE_BYTES = 64 * 1024 * 1024
KIND_CAPABILITY = {"image": VISION, "audio": AUDIO}


def read_media(kind: str, path: str | Path) -> Media:
    """The file at ``path`` as one ``kind`` ("image" | "audio") item.

    Raises:
        InvalidMedia: the file is missing, not a regular file, unreadable, empty or too large.
    """
    p = Path(path).expanduser()
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise InvalidMedia(f"{kind} {str(path)!r} is not a file", hint=f"name a {kind} file", param=kind)
        if size > MAX_FILE_BYTES:
            raise InvalidMedia(
                f"{kind} {str(path)!r} is {size:,} bytes, over the {MAX_FILE_BYTES // 2**20} MiB a file may be",
                hint=f"send a smaller {kind}",
                param=kind,
            )
        data = p.read_bytes()
    except FileNotFoundError:
        raise InvalidMedia(f"{kind} {str(path)!r} does not exist", hint="check the path", param=kind) from None
    except OSError as exc:
        raise InvalidMedia(
            f"cannot read {kind} {str(path)!r}: {exc.strerror or exc}", hint="check the file's permissions", param=kind
        ) from None
    if not data:
        raise InvalidMedia(f"{kind} {str(path)!r} is empty", hint=f"name a {kind} file", param=kind)
    return Media(kind=kind, data=data, mime=mimetypes.guess_type(p.name)[0])


def read_all(images: Iterable[str], audios: Iterable[str] = ()) -> tuple[Media, ...]:
    """Every ``--image`` then every ``--audio``, in the order given."""
    return tuple(read_media("image", p) for p in images) + tuple(read_media("audio", p) for p in audios)


def place(text: str, media: Sequence[Media]) -> str:
    """``text`` with one marker per item. A prompt that already holds exactly one marker per item
    keeps them where the user put them; otherwise the media come first, as llama.cpp's own
    ``mtmd-cli`` places them, and any stray marker in the text is defused."""
    if not media:
        return strip_media_markers(text)
    if text.count(MEDIA_MARKER) == len(media):
        return text
    return MEDIA_MARKER * len(media) + "\n" + strip_media_markers(text)


def require_media_support(
    media: Sequence[Media], capabilities: Iterable[str], *, model: str, has_projector: bool
) -> None:
    """Refuse media the loaded model cannot take, before the request is sent.

    Raises:
        UnsupportedFeature: an image for a model without ``vision``, audio without ``audio``.
    """
    caps = frozenset(capabilities)
    for kind in dict.fromkeys(m.kind for m in media):
        if KIND_CAPABILITY.get(kind, kind) in caps:
            continue
        if not has_projector and not (caps & {VISION, AUDIO}):
            hint = (
                f"{model} has no projector (mmproj): pair one with `localrun import MODEL.gguf --mmproj FILE`, "
                "or pull a repo that has one, such as ggml-org/gemma-3-4b-it-GGUF"
            )
        else:
            takes = "images" if VISION in caps else "audio" if AUDIO in caps else "no media on this runtime"
            hint = f"{model}'s projector takes {takes}: leave the {kind} out"
        raise UnsupportedFeature(f"{model} cannot take {kind} input", hint=hint, param=kind)
