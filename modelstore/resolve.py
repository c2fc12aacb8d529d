"""The one door from a name a person typed to a model: every spelling of one model finds it.

What a name may be, tried in this order (the first that finds something wins):

1. a registered name or alias, any case (``gemma3-270m``, ``GEMMA3-270M``);
2. Ollama's ``:latest``: ``NAME:latest`` is ``NAME`` and the other way round;
3. a hub reference to what was pulled from it: ``org/repo``, ``org/repo:QUANT``,
   ``org/repo/file.gguf``, each also as ``hf.co/…`` or ``huggingface.co/…`` (Ollama's and the
   hub's spellings), case-insensitive (``acme/x-GGUF`` finds ``acme/x-gguf:q4_k_m``); a repo
   with several quants registered and none asked for takes Q4_K_M, then Q8_0, else says which;
4. the same three for the models other apps keep on disk (``ls --all``: HF cache, Ollama,
   LM Studio), found in place and used without being registered.

A name that finds nothing gets the nearest known names in its message ("did you mean
gemma3-270m?"), so a typo costs one look, in the CLI and in every API's 404 alike.
"""

from __future__ import annotations

import difflib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath

from localrun.errors import InvalidName, ModelNotFound
from localrun.types import ModelRecord

from .identity import other_latest
from .names import validate_model_name
from .refs import DEFAULT_QUANTS, HUB_PREFIXES, parse_ref

logger = logging.getLogger(__name__)

#: How long a scan of the other apps' stores answers for (a 404 storm must not rescan the disk).
DISCOVERY_TTL_S = 10.0
#: Ollama's spelling of "the default tag" in a hub reference (``hf.co/org/repo:latest``).
LATEST_TAG = "latest"


def lookup_names(text: str) -> list[str]:
    """The index keys ``text`` may stand for, exactly: itself and its ``:latest`` twin (valid ones only)."""
    out = []
    for candidate in (text, other_latest(text)):
        try:
            key = validate_model_name(candidate)
        except InvalidName:
            continue
        if key not in out:
            out.append(key)
    return out


def _tag(name: str) -> str | None:
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def _base(name: str) -> str:
    return name.split(":", 1)[0] if _tag(name) is not None else name


def match_reference(text: str, records: Iterable[ModelRecord]) -> list[ModelRecord]:
    """The records a hub reference means, best first; [] when ``text`` is no reference to any.

    A reference matches a record pulled from (or named after) its repo, case-insensitively;
    a quant matches the record's tag or its recorded quant; a file matches the record's file."""
    stripped = text.strip()
    for prefix in HUB_PREFIXES:
        if stripped.lower().startswith(prefix):
            stripped = stripped[len(prefix) :]
            break
    if stripped.lower().endswith(":" + LATEST_TAG):
        stripped = stripped[: -len(LATEST_TAG) - 1]
    try:
        ref = parse_ref(stripped)
    except InvalidName:
        return []
    repo = ref.repo.lower()
    found = [r for r in records if (r.repo or "").lower() == repo or _base(r.name) == repo]
    if ref.quant:
        quant = ref.quant.lower()
        found = [r for r in found if _tag(r.name) == quant or str(r.metadata.get("quant") or "").lower() == quant]
    if ref.file:
        leaf = PurePosixPath(ref.file).name.lower()
        found = [r for r in found if PurePosixPath(r.path.replace("\\", "/")).name.lower() == leaf]
    defaults = [q.lower() for q in DEFAULT_QUANTS]

    def rank(r: ModelRecord) -> tuple[int, str]:
        tag = _tag(r.name) or ""
        return (defaults.index(tag) if tag in defaults else len(defaults), r.name)

    return sorted(found, key=rank)


def pick_reference(text: str, records: list[ModelRecord]) -> ModelRecord | None:
    """The one record a reference means, or None; several equally good ones are a question back."""
    found = match_reference(text, records)
    if len(found) <= 1:
        return found[0] if found else None
    defaults = [q.lower() for q in DEFAULT_QUANTS]
    if (_tag(found[0].name) or "") in defaults:
        return found[0]
    names = ", ".join(r.name for r in found[:6])
    raise ModelNotFound(
        f"{text!r} names {len(found)} models: {names}",
        hint=f"say which, e.g. `{found[0].name}`",
    )


def nearest(text: str, names: Iterable[str], *, limit: int = 3) -> list[str]:
    """Known names closest to ``text`` (a typo's likely meaning), best first.

    Compares the whole name, the name without its org and tag, and the name's start as long
    as what was typed, so ``gemmma`` finds ``gemma3-270m`` and ``smolm2`` ``smollm2-135m-instruct``."""
    typed = text.strip().lower()
    if not typed:
        return []
    scored: dict[str, float] = {}
    for name in names:
        short = _base(name).rsplit("/", 1)[-1]
        forms = {name, short, _base(name)}
        if len(typed) >= 3:
            forms |= {short[: len(typed)], name[: len(typed)]}
        score = max(difflib.SequenceMatcher(None, typed, form).ratio() for form in forms)
        if score >= 0.75:
            scored[name] = max(score, scored.get(name, 0.0))
    return sorted(scored, key=lambda n: (-scored[n], len(n), n))[:limit]


def not_found(text: str, known: Iterable[str], *, allow_path: bool = False) -> ModelNotFound:
    """The error for a name that finds nothing: the nearest names in the message, the way on in the hint."""
    close = nearest(text, known)
    message = f"no model named {text!r}" + (" and no such file" if allow_path else "")
    if close:
        message += f" — did you mean {' or '.join(close)}?"
    return ModelNotFound(
        message,
        hint="`localrun ls --all` lists the models; `localrun pull ORG/REPO` or `localrun import PATH` adds one",
    )


class DiscoveredModels:
    """The other apps' models (``ls --all``), scanned at most once per :data:`DISCOVERY_TTL_S`."""

    def __init__(self, scan: Callable[[], list[ModelRecord]] | None = None, ttl_s: float = DISCOVERY_TTL_S) -> None:
        self._scan = scan or _scan_all
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._records: list[ModelRecord] = []

    def records(self) -> list[ModelRecord]:
        with self._lock:
            if time.monotonic() - self._at > self._ttl_s:
                self._records = self._scan()
                self._at = time.monotonic()
            return list(self._records)

    def find(self, text: str) -> ModelRecord | None:
        """The discovered model ``text`` names (by name, ``:latest`` twin or hub reference), or None."""
        records = self.records()
        by_name = {r.name: r for r in records}
        for key in lookup_names(text):
            if key in by_name:
                return by_name[key]
        return pick_reference(text, records)


def _scan_all() -> list[ModelRecord]:
    from .sources import discover_all

    try:
        return discover_all()
    except OSError as exc:  # an unreadable store of another app is not this name's problem
        logger.info("could not scan other apps' models: %s", exc)
        return []
