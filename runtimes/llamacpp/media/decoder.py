"""Decode a request's image and audio files into what mtmd's bitmaps take, in a sacrificial process.

API (the llama.cpp engine codes against this; keep it stable)::

    decoder = MediaDecoder(max_bytes=64 << 20, max_pixels=64_000_000, max_audio_s=300.0, timeout_s=10.0)
    img = decoder.image(data)             # -> DecodedImage(nx, ny, rgb: bytes (nx*ny*3, row-major RGB), digest)
    clip = decoder.audio(data, 16000)     # -> DecodedAudio(samples: bytes (float32 LE mono), n, digest)
    decoder.close()

``digest`` is the sha256 hex of the decoded pixels (with nx, ny) or samples (with the rate): what
the prefix cache keys a media chunk on, so the same picture sent as PNG or as a lossless WebP
hits the same entry, and two pictures never share one.

Every refusal raises :class:`localrun.errors.InvalidMedia` naming the problem (and the cap, when
a cap is what refused it). A decoder that crashes the child process fails only the request it was
decoding (``InvalidMedia``); the child is restarted for the next one.

Why a child process: Pillow's and miniaudio's parsers are C, and they read whatever a client
sends. In the worker a segfault on one hostile PNG would kill the loaded model and every request
on it. The child is long-lived (one start, ~0.3 s, not one per image) and single-minded: one file
at a time, so a crash names its culprit. ``processes`` children decode in parallel; a caller past
them waits its turn. The per-decode timeout kills a child stuck in a parser, and that request alone
fails. What crosses the pipe: a JSON header and the raw bytes, each way, in the frames of
:mod:`localrun.frames` (the worker pipe's own framing), each frame's lengths bounded before a
byte is read: the file by what the parent sent (``max_bytes``), the answer by the caps it asked
for (``max_pixels`` × 3 bytes of RGB, ``max_audio_s`` of float32 samples).

Test hooks: with ``LOCALRUN_MEDIA_TEST_HOOKS=1`` in the child's environment a payload starting
with ``TEST_ABORT`` makes the child ``os.abort()`` and one starting with ``TEST_HANG`` makes it
sleep, so tests can prove crash isolation and the timeout on the real process.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, cast

from localrun.errors import InvalidMedia, RuntimeUnavailable
from localrun.frames import MAX_PAYLOAD_BYTES, FrameWriter, read_frame
from localrun.proc import describe_exit
from localrun.types import MAX_AUDIO_SECONDS, MAX_IMAGE_PIXELS

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = MAX_PAYLOAD_BYTES  # what one worker frame carries: the door's caps (settings) decide below it
DEFAULT_MAX_PIXELS = MAX_IMAGE_PIXELS  # the door's cap too (server.max_image_pixels may only lower it)
DEFAULT_MAX_AUDIO_S = MAX_AUDIO_SECONDS  # the door's cap too
DEFAULT_TIMEOUT_S = 10.0  # of the child's CPU time, per decode
#: The wall-clock backstop, as a multiple of the CPU cap: a child that sleeps (or is stopped) uses no
#: CPU, and a loaded machine may give a decode a fifth of a core; past this it is stopped anyway.
WALL_FACTOR = 5.0
START_TIMEOUT_S = 60.0  # the child's imports, on a busy machine; not counted in a decode's timeout

TEST_HOOKS_ENV = "LOCALRUN_MEDIA_TEST_HOOKS"
TEST_ABORT = b"\x00LOCALRUN-TEST-ABORT"
TEST_HANG = b"\x00LOCALRUN-TEST-HANG"
TEST_SPIN = b"\x00LOCALRUN-TEST-SPIN"  # burns CPU until the cap stops it
TEST_IDLE = b"\x00LOCALRUN-TEST-IDLE"  # waits 1.5 s without CPU (a loaded machine), then decodes the rest

_SIGXCPU = getattr(signal, "SIGXCPU", 24)  # Windows has none (nor the limit that sends it)
#: The most bytes of a file the child reads in one frame: the parent sends none over ``max_bytes``
#: (a setting, so not known here), and a frame claiming more than this is not the parent's.
_MAX_FILE_BYTES = 1 << 31


def _answer_bytes(header: dict[str, Any]) -> int:
    """The largest answer the caps in ``header`` allow: a longer frame is a protocol error."""
    if header["op"] == "image":
        fit = int(header.get("fit_pixels") or 0)
        # Scaled to about ``fit`` pixels: each side rounds down, so the product never passes it.
        return min(int(header["max_pixels"]), fit or int(header["max_pixels"])) * 3
    return (int(float(header["max_audio_s"]) * int(header["rate"])) + int(header["rate"])) * 4


@dataclass(frozen=True)
class DecodedImage:
    nx: int
    ny: int
    rgb: bytes
    digest: str


@dataclass(frozen=True)
class DecodedAudio:
    samples: bytes
    n: int
    digest: str


class _ChildDied(Exception):
    pass


class _OverCpu(_ChildDied):
    """The kernel stopped the child (SIGXCPU) at the decode's CPU-time cap."""


class _StartFailed(Exception):
    """The child never said it was ready: this machine's problem, not the client's file."""


class _Deadline:
    """The child's stdout as :func:`read_frame` reads it: every read against one deadline."""

    def __init__(self, read: Callable[[int, float], bytes], deadline: float) -> None:
        self._read, self._deadline = read, deadline

    def read(self, n: int) -> bytes:
        return self._read(n, self._deadline)


class _Child:
    """One decoder process and its two pipes. Used by one thread at a time (the pool sees to it)."""

    command = (sys.executable, "-m", "localrun.runtimes.llamacpp.media.decoder")

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            list(self.command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=os.environ.copy(),
            close_fds=True,
        )
        self.ready = False

    def _read(self, n: int, deadline: float) -> bytes:
        fd = cast(IO[bytes], self.proc.stdout).fileno()  # a PIPE
        parts: list[bytes] = []
        while n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                rc = self.proc.wait(timeout=5)
                raise (_OverCpu if rc == -_SIGXCPU else _ChildDied)(describe_exit(rc))
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def _frame(self, deadline: float, bound: int = 0) -> tuple[dict[str, Any], bytes]:
        frame = read_frame(_Deadline(self._read, deadline), max_payload_bytes=bound)
        if frame is None:  # not reached: _read raises at the end of the stream
            raise _ChildDied("its pipe ended")
        header, payloads = frame
        return header, payloads[0] if payloads else b""

    def call(self, header: dict[str, Any], data: bytes, wall_s: float) -> tuple[dict[str, Any], bytes]:
        if not self.ready:
            try:
                hello, _ = self._frame(time.monotonic() + START_TIMEOUT_S)
            except TimeoutError:
                raise _StartFailed(f"no answer in {START_TIMEOUT_S:g} s") from None
            except (_ChildDied, OSError, ValueError, struct.error) as exc:
                raise _StartFailed(str(exc) or type(exc).__name__) from None
            if not hello.get("ready"):
                raise _StartFailed(f"unexpected greeting {hello!r}")
            self.ready = True
        try:
            FrameWriter(cast(IO[bytes], self.proc.stdin), max_payload_bytes=_MAX_FILE_BYTES).send(header, [data])
        except (BrokenPipeError, OSError):
            raise _ChildDied(describe_exit(self.proc.wait(timeout=5))) from None
        return self._frame(time.monotonic() + wall_s, _answer_bytes(header))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        for pipe in cast("tuple[IO[bytes], IO[bytes]]", (self.proc.stdin, self.proc.stdout)):  # both PIPEs
            try:
                pipe.close()
            except OSError as exc:  # a pipe to a dead process may fail to flush; it is gone either way
                log.debug("closing a decoder pipe: %s", exc)

    def close(self) -> None:
        """Ask it to leave (EOF on its stdin); kill it if it does not."""
        try:
            cast(IO[bytes], self.proc.stdin).close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("decoder child did not leave when asked (%s); killing it", exc)
        self.kill()


class MediaDecoder:
    """Images and audio clips to pixels and samples, off the caller's process (see the module doc)."""

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        max_audio_s: float = DEFAULT_MAX_AUDIO_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        processes: int = 1,
        wall_factor: float = WALL_FACTOR,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_pixels = max_pixels
        self.max_audio_s = max_audio_s
        self.timeout_s = timeout_s
        self.wall_s = timeout_s * wall_factor
        self.restarts = 0  # children replaced after a crash or a timeout; for logs and tests
        self._idle: queue.Queue[_Child] = queue.Queue()
        self._all: set[_Child] = set()
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(max(1, processes)):  # started now: their imports overlap the model's load
            self._idle.put(self._spawn())

    def _spawn(self) -> _Child:
        child = _Child()
        with self._lock:
            self._all.add(child)
        return child

    def _retire(self, child: _Child) -> None:
        child.kill()
        with self._lock:
            self._all.discard(child)

    def image(self, data: bytes, fit_pixels: int = 0) -> DecodedImage:
        """``data``'s pixels, scaled down to about ``fit_pixels`` (0: kept) in the child when larger."""
        self._check_size(data, "image")
        header = {"op": "image", "max_pixels": self.max_pixels, "fit_pixels": int(fit_pixels)}
        head, rgb = self._run(header, data, "image")
        return DecodedImage(nx=head["nx"], ny=head["ny"], rgb=rgb, digest=head["digest"])

    def audio(self, data: bytes, sample_rate: int) -> DecodedAudio:
        self._check_size(data, "audio clip")
        header = {"op": "audio", "rate": int(sample_rate), "max_audio_s": self.max_audio_s}
        head, samples = self._run(header, data, "audio clip")
        return DecodedAudio(samples=samples, n=head["n"], digest=head["digest"])

    def _check_size(self, data: bytes, what: str) -> None:
        if not data:
            raise InvalidMedia(f"the {what} is empty (0 bytes)")
        if len(data) > self.max_bytes:
            raise InvalidMedia(f"the {what} is {len(data)} bytes, over the {self.max_bytes}-byte cap")

    def _run(self, header: dict[str, Any], data: bytes, what: str) -> tuple[dict[str, Any], bytes]:
        if self._closed:
            raise RuntimeError("the media decoder is closed")
        child = self._idle.get()
        healthy = True
        try:
            head, out = child.call({**header, "cpu_s": self.timeout_s}, data, self.wall_s)
        except _StartFailed as exc:
            healthy = False
            raise RuntimeUnavailable(f"the media decoder process could not start: {exc}") from None
        except _OverCpu:
            healthy = False
            raise InvalidMedia(
                f"decoding the {what} took more than the {self.timeout_s:g}-second cap of CPU time",
                hint="send a smaller or simpler file",
            ) from None
        except TimeoutError:
            healthy = False
            raise InvalidMedia(
                f"decoding the {what} took longer than {self.wall_s:g} seconds (the backstop to its "
                f"{self.timeout_s:g}-second CPU cap) and was stopped",
                hint="send a smaller or simpler file, or try again when the machine is less busy",
            ) from None
        except _ChildDied as exc:
            healthy = False
            log.warning("media decoder child died on a %d-byte %s (%s); restarting it", len(data), what, exc)
            raise InvalidMedia(f"the {what} crashed the decoder ({exc}): it is malformed") from None
        except (OSError, ValueError, struct.error) as exc:  # a garbled frame: never trust that child again
            healthy = False
            raise InvalidMedia(f"the {what} could not be decoded: decoder protocol error ({exc})") from None
        finally:
            if healthy:
                self._idle.put(child)
            else:
                self._retire(child)
                self.restarts += 1
                if not self._closed:
                    self._idle.put(self._spawn())
        if "error" in head:
            raise InvalidMedia(f"invalid {what}: {head['error']}")
        return head, out

    def close(self) -> None:
        self._closed = True
        with self._lock:
            children = list(self._all)
            self._all.clear()
        for child in children:
            child.close()

    def __enter__(self) -> MediaDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the child ---------------------------------------------------------------------------------


def _child_main() -> None:
    """Serve decode requests on stdin/stdout until stdin closes. fd 1 is moved aside first, so a
    stray print or a native library's chatter lands on stderr, never inside a frame."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    hooks = os.environ.get(TEST_HOOKS_ENV) == "1"
    import PIL.Image  # noqa: F401  (imported before "ready": the first decode pays no import)

    from localrun.runtimes.llamacpp.media import formats as F

    writer = FrameWriter(out, max_payload_bytes=sys.maxsize)  # the parent bounds what it reads back

    def send(header: dict[str, Any], data: bytes = b"") -> None:
        writer.send(header, [data] if data else [])

    send({"ready": True})
    while True:
        frame = read_frame(inp, max_payload_bytes=_MAX_FILE_BYTES)
        if frame is None:
            return
        req, payloads = frame
        data = payloads[0] if payloads else b""
        if hooks and data.startswith(TEST_ABORT):
            os.abort()
        if hooks and data.startswith(TEST_HANG):
            time.sleep(3600)
        try:
            with _cpu_cap(float(req.get("cpu_s") or 0)):
                head, payload = _decode(req, data, hooks)
            send(head, payload)
        except F.BadMedia as exc:
            send({"error": str(exc)})
        except MemoryError:
            send({"error": "the file needs more memory to decode than this machine gives it"})
        except Exception as exc:  # a parser bug on hostile input: still this file's fault, and said so
            log.exception("unexpected decoder failure")
            send({"error": f"could not be decoded ({type(exc).__name__}: {exc})"})


@contextlib.contextmanager
def _cpu_cap(seconds: float) -> Iterator[None]:
    """The kernel stops this process (SIGXCPU) once the decode has used ``seconds`` of CPU time:
    a count that a loaded machine does not inflate, as it does a wall-clock deadline. Whole seconds
    (RLIMIT_CPU's unit), rounded up. Where the platform has no such limit, the parent's wall-clock
    backstop alone applies."""
    try:
        import resource
    except ImportError:  # Windows
        yield
        return
    if seconds <= 0:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    limit = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _decode(req: dict[str, Any], data: bytes, hooks: bool) -> tuple[dict[str, Any], bytes]:
    from localrun.runtimes.llamacpp.media import formats as F

    if hooks and data.startswith(TEST_SPIN):
        while True:
            pass
    if hooks and data.startswith(TEST_IDLE):
        time.sleep(1.5)
        data = data[len(TEST_IDLE) :]
    if req["op"] == "image":
        nx, ny, rgb = F.decode_image(data, int(req["max_pixels"]), int(req.get("fit_pixels") or 0))
        return {"nx": nx, "ny": ny, "digest": F.image_digest(nx, ny, rgb)}, rgb
    rate = int(req["rate"])
    samples = F.decode_audio(data, rate, float(req["max_audio_s"])).tobytes()
    return {"n": len(samples) // 4, "digest": F.audio_digest(rate, samples)}, samples


if __name__ == "__main__":
    _child_main()
