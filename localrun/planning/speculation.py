"""What ``localrun plan`` says about speculative decoding, and the mode a llama.cpp plan carries.

Kept apart from the planner: it is the one rule about drafting the planner needs, and its
words are what ``plan`` prints and the TUI shows.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

from localrun.errors import ConfigError
from localrun.planning.hardware import fmt_bytes
from localrun.planning.placement import Budget, ModelShape, Placement, kv_cache_bytes, weights_bytes
from localrun.types import Format, ModelRecord

log = logging.getLogger(__name__)

SPECULATION_WHY = {
    "auto": "speculative decoding auto: the next few tokens are guessed (from text seen before, or by a draft "
    "model) and checked in one pass, only while that is faster; a greedy answer may differ where two tokens are "
    "nearly tied, and it is off when bit-exact answers are asked for",
    "ngram": "speculative decoding ngram, as asked: guesses from text seen before at every step, faster or not",
    "off": "speculative decoding off, as asked",
    "draft": "speculative decoding with a draft model, as asked: the draft guesses at every step, faster or not",
}


def speculation_plan(asked: str | None, slots: int) -> tuple[str, str]:
    """The ``speculative`` option for a llama.cpp plan, and the reason line that says why.
    Unset means ``auto``: drafts only where they pay (benchmarks/bench_speculative.py: never
    measurably slower on ordinary text, 2-2.6x on copy-heavy text; the issue-13 note).

    Raises:
        ConfigError: an unknown mode.
    """
    mode = (asked or "auto").strip().lower()
    if mode not in SPECULATION_WHY:
        raise ConfigError(
            f"unknown speculative mode {asked!r}", param="speculative", hint="use one of: " + ", ".join(SPECULATION_WHY)
        )
    why = SPECULATION_WHY[mode] if asked else SPECULATION_WHY[mode].replace("auto:", "auto (the default):", 1)
    if mode == "auto" and slots > 1:
        why += "; with other requests running, weighed against their share of each step"
    return mode, why


@dataclass(frozen=True)
class DraftChoice:
    """The draft model a llama.cpp plan loads: its file, the memory it adds, the reason line."""

    path: str
    bytes: int
    why: str

    def beside(self, placement: Placement, budget: Budget) -> Placement:
        """``placement`` with the draft's weights and KV cache on the model's side (the GPU
        when the model is offloaded, else the host), its fill ratio recomputed."""
        on_gpu = placement.n_gpu_layers > 0 and placement.gpu > 0
        host = placement.host + (0 if on_gpu else self.bytes)
        gpu = placement.gpu + (self.bytes if on_gpu else 0)
        return dataclasses.replace(placement, host=host, gpu=gpu, ratio=budget.ratio(host, gpu))


#: ``runtime.draft`` / ``--draft`` values that mean "no draft model, do not look for one".
NO_DRAFT = ("none", "off", "no", "")


def draft_plan(
    record: ModelRecord, mode: str | None, asked: str | None, settings: Any, *, n_ctx: int, kv_type: str = "f16"
) -> DraftChoice | None:
    """The draft model for ``record`` under speculative ``mode``: the one asked for (a model
    in the store or a .gguf path), else a sibling GGUF whose name says "draft" in the model's
    folder (llama.cpp's sidecar rules, modelstore.refs.find_draft_sibling), else none.
    Only modes that use one (auto, draft) look; ``n_ctx`` is every slot's context together.

    Raises:
        ConfigError: ``draft`` mode and no draft model; a draft that is not a GGUF model.
        ModelNotFound: a draft asked for by a name the store lacks and no such file.
    """
    mode = (mode or "").strip().lower() or None
    wanted = mode in ("auto", "draft")
    if asked is not None and asked.strip().lower() in NO_DRAFT:
        if mode == "draft":
            raise ConfigError(
                "speculative mode 'draft' with the draft model turned off (--draft none)",
                param="draft",
                hint="give a draft model, or use --speculative auto or ngram",
            )
        return None
    if not wanted or record.format is not Format.GGUF:
        if asked:
            log.info("draft model %s not loaded: speculative decoding is %s", asked, mode or "off")
        return None
    found = _find_draft(record, mode, asked, settings)
    if found is None:
        return None
    draft, how = found
    kv = kv_cache_bytes(ModelShape.from_metadata(draft.metadata), n_ctx, kv_type)
    size = weights_bytes(draft) + kv
    use = "every draft" if mode == "draft" else "drafts where the prompt has nothing to copy, while they pay"
    why = (
        f"draft model {os.path.basename(draft.path)} ({how}; {fmt_bytes(size)} with its KV cache): {use}; "
        "its vocabulary is checked against the model's at load"
    )
    return DraftChoice(path=str(draft.path), bytes=size, why=why)


def _find_draft(
    record: ModelRecord, mode: str | None, asked: str | None, settings: Any
) -> tuple[ModelRecord, str] | None:
    """The draft asked for, else the one beside the model (none: ``None``), checked to be a GGUF
    other than the model itself, and how it was found, in words.

    Raises:
        ConfigError: ``draft`` mode and no draft beside the model; a draft that is not a GGUF model
            or is the model itself.
        ModelNotFound: a draft asked for by a name the store lacks and no such file.
    """
    from localrun.settings import Settings

    settings = settings or Settings()
    from localrun.modelstore.store import ModelStore

    how = "as asked"
    if asked:
        draft = ModelStore(settings).resolve(asked, allow_path=True)
    else:
        from localrun.modelstore.refs import find_draft_file

        found = find_draft_file(record.path) if record.path else None
        if found is None:
            if mode == "draft":
                raise ConfigError(
                    f"speculative mode 'draft' needs a draft model, and {record.name} has none beside it",
                    param="draft",
                    hint="pass --draft MODEL (a model in the store or a .gguf file), or use --speculative auto",
                )
            return None
        draft = ModelStore(settings).inspect_path(str(found))
        how = "found beside the model"
    if draft.format is not Format.GGUF or not draft.path:
        raise ConfigError(
            f"the draft model {asked or draft.path} is {draft.format.value}, not a GGUF file",
            param="draft",
            hint="llama.cpp drafts with a GGUF model of the target's family",
        )
    if os.path.realpath(draft.path) == os.path.realpath(record.path):
        raise ConfigError(
            f"the draft model is the model itself ({draft.path})",
            param="draft",
            hint="a draft model is a smaller model of the same family",
        )
    return draft, how
