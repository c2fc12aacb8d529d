"""llama-server's slot routes: ``GET /slots`` and ``POST /slots/{id_slot}?action=save|restore|erase``.

Shapes as llama-server's ``tools/server`` answers them (``id``, ``n_ctx``, ``is_processing``…;
``n_saved``/``n_written``, ``n_restored``/``n_read``, ``n_erased``, ``timings``). The session
does the work (``runtimes/llamacpp/slot_api.py``); this module checks what the client sent.

A ``filename`` is a plain name inside the slot folder (``server.slot_save_path``, ``localrun
serve --slot-save-path``; default ``<cache_dir>/slots``), checked here by llama-server's own
rules (``fs_validate_filename``) and once more where the file is opened: a name that holds a
separator, ``..``, a control character, one of ``:*?"<>|``, a leading or trailing space, a
trailing dot, or more than 255 bytes is a 400 naming the rule, and so is a name that resolves
outside the folder through a symlink. No route takes a server path.

Where localrun differs: the slot folder always exists (llama-server answers 501 without
``--slot-save-path``); ``?model=`` (or ``"model"`` in the body) picks among loaded models, as
the other llama-server routes do.
"""

from __future__ import annotations

import asyncio
import logging
import os
import unicodedata
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import RootModel, StringConstraints

from localrun.errors import Overloaded
from localrun.server.answers import Answer
from localrun.server.errors import InvalidRequest
from localrun.server.fields import parse_body
from localrun.server.generation import app_state, session_call
from localrun.server.llama_server.routes import pick_model
from localrun.server.openapi import documented
from localrun.server.schemas import ModelName, Strict
from localrun.settings import Settings

log = logging.getLogger(__name__)

router = APIRouter()

ACTIONS = ("save", "restore", "erase")
#: llama-server's forbidden characters besides the separators and control characters.
FORBIDDEN = frozenset(':*?"<>|')
#: Unicode look-alikes of '.', '/' and '\\', and the marks llama-server refuses in a name.
LOOKALIKES = frozenset("\uff0e\u2215\u2216\ufffd\ufeff")


class SlotFileBody(Strict):
    """``POST /slots/{id_slot}?action=save|restore``'s body (erase takes none)."""

    filename: Annotated[str, StringConstraints(max_length=4096)] | None = None
    model: ModelName | None = None


class SlotActionAnswer(Answer):
    id_slot: int


class SlotRow(Answer):
    """One slot in ``GET /slots``."""

    id: int
    n_ctx: int
    is_processing: bool


class SlotList(RootModel[list[SlotRow]]):
    pass


def slot_folder(settings: Settings) -> Path:
    """The slot folder, made (owner-only) if it is not there yet."""
    folder = Path(settings.server.slot_save_path or Path(settings.cache_dir) / "slots").expanduser()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder.resolve()


def name_problem(name: str) -> str | None:
    """Which of llama-server's file-name rules ``name`` breaks; None for a plain name."""
    if not name:
        return "is empty"
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if len(raw) > 255:
        return f"is {len(raw)} bytes long, more than 255"
    if "/" in name or "\\" in name:
        return "holds a path separator: send a plain file name, no folders"
    if name in (".", ".."):
        return "names a folder, not a file"
    if ".." in name:
        return "holds '..'"
    for ch in name:
        if unicodedata.category(ch) == "Cc":
            return "holds a control character"
        if ch in FORBIDDEN or ch in LOOKALIKES:
            return f"holds {ch!r}, which a file name may not"
    if name[0] == " " or name[-1] == " ":
        return "starts or ends with a space"
    if name[-1] == ".":
        return "ends with a dot"
    return None


def checked_name(folder: Path, name: str | None) -> str:
    """``name`` if it is a plain name whose file stays inside ``folder``; a 400 naming the rule otherwise."""
    if name is None:
        raise InvalidRequest("missing required field 'filename'", param="filename", hint="name the slot file")
    problem = name_problem(name)
    if problem is None and (folder / name).resolve().parent != folder:
        problem = "resolves outside the slot folder (a symlink)"
    if problem is not None:
        raise InvalidRequest(
            f"invalid slot file name {name[:64]!r}: it {problem}",
            param="filename",
            hint="a plain file name inside the slot folder, such as 'slot0.bin'",
        )
    return name


def _slot_id(raw: str) -> int:
    try:
        value = int(raw, 10)
    except ValueError:
        value = None
    if value is None or not -(2**31) <= value < 2**31:
        raise InvalidRequest(f"invalid slot id {raw[:32]!r}", param="id_slot", hint="GET /slots lists the slots")
    if value < 0:
        raise InvalidRequest(f"slot {value} does not exist", param="id_slot", hint="GET /slots lists the slots")
    return value


@documented(answer=SlotList, query=("model", "fail_on_no_slot"))
@router.get("/slots")
async def get_slots(request: Request) -> Any:
    """Each slot of the model (``?model=``), as llama-server lists them; ``?fail_on_no_slot=1``
    answers 503 when none is idle."""
    model = await pick_model(request, request.query_params.get("model"))
    rows = await session_call(request, model, "slots")
    if request.query_params.get("fail_on_no_slot") and all(r.get("is_processing") for r in rows):
        raise Overloaded("no slot available", hint="retry when a request ends")
    return rows


@documented(SlotFileBody, SlotActionAnswer, query=("action=save|restore|erase", "model"))
@router.post("/slots/{id_slot}")
async def post_slot(request: Request, id_slot: str) -> Any:
    """Save, restore or erase slot ``id_slot`` (``?action=``); save and restore name a file."""
    raw = await request.body()  # the body first, as on every route: what is wrong in it is named
    body = await parse_body(request, SlotFileBody) if raw.strip() else SlotFileBody()
    slot = _slot_id(id_slot)
    action = request.query_params.get("action", "")
    if action not in ACTIONS:
        raise InvalidRequest(
            f"invalid slot action {action[:32]!r}", param="action", hint="use ?action=save, restore or erase"
        )
    model = await pick_model(request, request.query_params.get("model") or body.model)
    args: dict[str, Any] = {"id_slot": slot, "action": action}
    if action != "erase":
        folder = await asyncio.to_thread(slot_folder, app_state(request).settings)
        args.update(folder=os.fspath(folder), filename=checked_name(folder, body.filename))
    return await session_call(request, model, "slot_action", args)
