"""Entry point of a worker process: ``python -m localrun.worker``.

The protocol runs over the original stdin/stdout. Before anything native loads, fd 1 is
pointed at stderr so a stray print from a C library can never corrupt a frame.
"""

from __future__ import annotations

import os
import sys
from typing import BinaryIO


def _protocol_streams() -> tuple[BinaryIO, BinaryIO]:
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # native stdout noise goes to stderr from here on
    sys.stdout = sys.stderr
    return sys.stdin.buffer, proto_out


if __name__ == "__main__":
    stdin, stdout = _protocol_streams()
    from localrun.worker.main import serve

    sys.exit(serve(stdin, stdout))
