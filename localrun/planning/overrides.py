"""Per-model overrides of what a GGUF says: the embedding pooling and the chat template.

A GGUF may lack pooling (a generative model such as Gemma cannot embed without it) or carry
a broken or missing chat template. Overrides come from three places, the later winning:
what ``localrun import … --pooling/--chat-template`` recorded in the model's index entry,
``[models."*"]`` then ``[models."NAME"]`` in config.toml, and ``localrun serve --pooling``
(which lands in the same settings). They reach the runtime as plan options (``pooling``,
``chat_template``) with a reason line, so ``localrun plan`` shows them; /props says where
the template came from.

A template override is checked when it is read: it must render a sample conversation in
the same sandbox and budget as any GGUF template (:mod:`localrun.chat.template`).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from localrun.errors import ConfigError, TemplateError
from localrun.types import ModelRecord, Plan

log = logging.getLogger(__name__)

POOLING = ("mean", "cls", "last", "none", "rank")
#: Keys in ``ModelRecord.metadata`` that ``localrun import`` writes.
META_POOLING = "localrun.pooling"
META_TEMPLATE = "localrun.chat_template"
META_TEMPLATE_FILE = "localrun.chat_template_file"


def check_pooling(name: str) -> str:
    if name not in POOLING:
        raise ConfigError(f"unknown pooling {name!r}", hint="use one of: " + ", ".join(POOLING))
    return name


def read_chat_template(path: str | Path) -> str:
    """The template text of ``path``, after a sample conversation renders with it in the sandbox.

    Raises:
        ConfigError: the file is missing, too large, not UTF-8, or the template does not render.
    """
    from localrun.chat.template import MAX_TEMPLATE_CHARS, try_render

    p = Path(path).expanduser()
    try:
        if p.stat().st_size > 4 * MAX_TEMPLATE_CHARS:
            raise ConfigError(
                f"the chat template {p} is {p.stat().st_size} bytes", hint="a template is a small text file"
            )
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the chat template {p}: {exc}", hint="give a readable UTF-8 Jinja file") from exc
    try:
        try_render(text)
    except TemplateError as exc:
        raise ConfigError(
            f"the chat template {p} does not render: {exc.message}",
            hint="fix the template (it runs in localrun's Jinja sandbox)",
        ) from exc
    return text


def model_overrides(record: ModelRecord, settings: Any) -> tuple[dict[str, Any], list[str]]:
    """(plan options, reason lines) for ``record``'s overrides."""
    meta = record.metadata
    pooling, template, source = meta.get(META_POOLING), meta.get(META_TEMPLATE), meta.get(META_TEMPLATE_FILE)
    configured = getattr(settings, "models", {}) or {}
    for key in ("*", record.name):
        entry = configured.get(key)
        if entry is None:
            continue
        if entry.pooling is not None:
            pooling = entry.pooling
        if entry.chat_template_file is not None:
            template, source = read_chat_template(entry.chat_template_file), str(entry.chat_template_file)
    options: dict[str, Any] = {}
    reasons: list[str] = []
    if pooling is not None:
        options["pooling"] = check_pooling(pooling)
        reasons.append(f"embeddings pool by {pooling} (override)")
    if template is not None:
        options["chat_template"] = template
        reasons.append(f"chat template from {source or 'the import'} (override)")
    return options, reasons


def with_overrides(plan: Plan, record: ModelRecord, settings: Any) -> Plan:
    options, reasons = model_overrides(record, settings)
    if not options:
        return plan
    return dataclasses.replace(plan, options={**plan.options, **options}, reasons=(*plan.reasons, *reasons))
