"""llama.cpp's native log, captured: the session and the draft model both read why a load failed.

Its own module so both import it from below; it once lived in session.py, which the draft
model then had to import back at call time.
"""

from __future__ import annotations

import collections
import ctypes
import logging
from typing import Any

log = logging.getLogger(__name__)


class NativeLog:
    """Routes llama.cpp's log lines to :mod:`logging` at debug level instead of stderr,
    and remembers the last warnings and errors so a failed load can say why. Holds the
    ctypes callback: if it were collected, llama.cpp would call freed memory."""

    def __init__(self) -> None:
        self.recent: collections.deque[str] = collections.deque(maxlen=6)
        self.callback: Any = None

    def install(self, llama: Any) -> None:
        last_level = [0]

        def on_log(level: int, text: bytes, _user_data: Any) -> None:
            # ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line)
            if level == 5:
                level = last_level[0]
            last_level[0] = level
            line = (text or b"").decode("utf-8", errors="replace").rstrip()
            if line:
                log.debug("%s", line)
                if level >= 3:
                    self.recent.append(line)

        self.callback = llama.llama_log_callback(on_log)
        llama.llama_log_set(self.callback, ctypes.c_void_p(0))

    def take_recent(self) -> str:
        lines = "; ".join(self.recent)
        self.recent.clear()
        return lines


#: The one capture per process: llama.cpp has a single log callback.
NATIVE_LOG = NativeLog()
