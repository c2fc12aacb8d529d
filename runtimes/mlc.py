"""MLC runtime: ``mlc_llm serve`` as a supervised subprocess, spoken to over its
OpenAI-compatible API.

MLC ships from its own wheel index and pulls in TVM, so localrun never imports it: it
runs the ``mlc_llm`` command (or ``python -m mlc_llm``) on a free loopback port, waits
until ``/v1/models`` answers, and streams chat and completions over SSE. The server is
one process per loaded model, so a crash in TVM takes down only that model; the request
it was serving gets :class:`~localrun.errors.WorkerCrashed` and the next request starts
the server again (a few times, then the model is reported unavailable).

An MLC model folder is weights plus ``mlc-chat-config.json``; compiled model libraries
(``.so``/``.dylib``/``.dll``) are native code and are refused unless the plan says
``allow_native``. Without one, MLC compiles the model's library itself (JIT) on first use.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from localrun.errors import InvalidModelFile, ModelNotFound, RuntimeUnavailable
from localrun.jsonfile import NotAJsonObject, read_json_object
from localrun.runtimes.base import RuntimeStatus
from localrun.runtimes.openai_compat.supervisor import SupervisedServer, SupervisedSession
from localrun.runtimes.openai_compat.wire import refuse_media, sampling_to_openai
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, Format, ModelRecord, Plan

if TYPE_CHECKING:
    from localrun.planning.hardware import HardwareProfile

log = logging.getLogger(__name__)

FIX = "pip install --pre -U -f https://mlc.ai/wheels mlc-llm-nightly-cpu mlc-ai-nightly-cpu"
COMMAND_ENV = "LOCALRUN_MLC_COMMAND"
NATIVE_SUFFIXES = (".so", ".dylib", ".dll")
#: Devices ``mlc_llm serve --device`` knows; anything else (our "cpu") becomes "auto".
MLC_DEVICES = ("auto", "cuda", "metal", "vulkan", "rocm", "opencl")
DEFAULT_START_TIMEOUT_S = 300.0  # a first run JIT-compiles the model library


def _dist_version() -> str | None:
    for dist in ("mlc-llm", "mlc-llm-nightly-cpu", "mlc-llm-nightly", "mlc-llm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def mlc_command(plan: Plan | None = None, *, env: Mapping[str, str] | None = None) -> list[str]:
    """The command that runs MLC's CLI: the plan's ``mlc_command``, ``$LOCALRUN_MLC_COMMAND``,
    ``mlc_llm`` on PATH, or ``python -m mlc_llm`` when only the package is installed.

    Raises:
        RuntimeUnavailable: MLC is not installed.
    """
    env = os.environ if env is None else env  # a Mapping either way
    configured = (plan.options.get("mlc_command") if plan else None) or env.get(COMMAND_ENV)
    if configured:
        return list(configured) if isinstance(configured, (list, tuple)) else shlex.split(str(configured))
    on_path = shutil.which("mlc_llm")
    if on_path:
        return [on_path]
    if importlib.util.find_spec("mlc_llm") is not None:
        return [sys.executable, "-m", "mlc_llm"]
    raise RuntimeUnavailable("MLC LLM is not installed (it ships from mlc.ai's wheel index, not PyPI)", hint=FIX)


def mlc_device(plan: Plan) -> str:
    """``plan.device`` as MLC spells it: ``cuda:1`` stays, ``cpu`` (no MLC backend) is ``auto``."""
    device = str(plan.options.get("mlc_device") or plan.device or "auto")
    return device if device.split(":", 1)[0] in MLC_DEVICES else "auto"


def build_serve_command(
    record: ModelRecord, plan: Plan, port: int, *, command: Sequence[str] | None = None
) -> list[str]:
    """The full ``mlc_llm serve`` command line for ``record`` on ``127.0.0.1:port``.

    CORS is switched off (``--allow-origins []``; MLC's default is ``*``): only localrun
    talks to this server, and a web page must not.
    """
    cmd = [
        *(command if command is not None else mlc_command(plan)),
        "serve",
        str(record.path),
        "--device",
        mlc_device(plan),
        "--host",
        "127.0.0.1",
        "--port",
        str(int(port)),
        "--mode",
        str(plan.options.get("mlc_mode", "local")),
        "--allow-origins",
        "[]",
    ]
    model_lib = plan.options.get("model_lib") or record.metadata.get("model_lib")
    if model_lib:
        cmd += ["--model-lib", str(model_lib)]
    if plan.n_ctx:
        cmd += ["--overrides", f"context_window_size={int(plan.n_ctx)}"]
    return cmd


def check_model_folder(folder: Path, *, allow_native: bool = False) -> dict[str, Any]:
    """Validate an MLC weight folder; return its ``mlc-chat-config.json``.

    Raises:
        ModelNotFound: the folder does not exist.
        InvalidModelFile: no ``mlc-chat-config.json``, no tensor cache, or native
            libraries without ``allow_native``.
    """
    if not folder.exists():
        raise ModelNotFound(f"no MLC model folder at {folder}", hint="pull or import the model again")
    config_path = folder / "mlc-chat-config.json"
    if not folder.is_dir() or not config_path.is_file():
        raise InvalidModelFile(f"{folder} is not an MLC model folder (no mlc-chat-config.json)")
    try:
        config = read_json_object(config_path)
    except NotAJsonObject as exc:
        raise InvalidModelFile(str(exc)) from exc
    if not ((folder / "tensor-cache.json").is_file() or (folder / "ndarray-cache.json").is_file()):
        raise InvalidModelFile(f"{folder} has no tensor-cache.json: the weights are missing")
    if not allow_native:
        for path in folder.rglob("*"):
            if path.suffix.lower() in NATIVE_SUFFIXES:
                raise InvalidModelFile(
                    f"{path} is a native library: loading it runs its code",
                    hint="only if you trust its author: set allow_native for this model (else MLC compiles its own)",
                )
    return config


class MlcServer(SupervisedServer):
    """One ``mlc_llm serve`` process."""

    label: ClassVar[str] = "mlc_llm serve"
    timeout_option: ClassVar[str] = "mlc_start_timeout_s"
    default_start_timeout_s: ClassVar[float] = DEFAULT_START_TIMEOUT_S

    def serve_command(self, port: int) -> list[str]:
        return build_serve_command(self.record, self.plan, port, command=mlc_command(self.plan))


class MlcRuntime:
    name: ClassVar[str] = "mlc"
    formats: ClassVar[frozenset[Format]] = frozenset({Format.MLC})
    in_worker: ClassVar[bool] = False

    def probe(
        self,
        hw: HardwareProfile | None = None,
        *,
        env: Mapping[str, str] | None = None,
        find_spec: Callable[[str], Any] | None = None,
        which: Callable[[str], str | None] | None = None,
    ) -> RuntimeStatus:
        """Installed is enough: importing mlc_llm loads TVM, slow and sometimes toolchain-bound.

        Looks where :func:`mlc_command` looks, in its order (the configured command, ``mlc_llm``
        on PATH, the Python package), so the probe reports what a load would run; ``env``,
        ``find_spec`` and ``which`` replay a machine in tests.
        """
        env = os.environ if env is None else env
        find_spec = find_spec or importlib.util.find_spec
        which = which or shutil.which
        configured = env.get(COMMAND_ENV)
        if configured:
            command = shlex.split(configured)
            if which(command[0]) is None:
                return RuntimeStatus(
                    self.name,
                    False,
                    reason=f"the configured MLC command {command[0]!r} is not there",
                    fix=f"fix {COMMAND_ENV} or the model's mlc_command, or: {FIX}",
                )
            return RuntimeStatus(
                self.name,
                True,
                version=_dist_version(),
                devices=("auto",),
                details={"via": "configured", "command": shlex.join(command)},
            )
        cli = which("mlc_llm")
        if cli:
            return RuntimeStatus(
                self.name,
                True,
                version=_dist_version(),
                devices=("auto",),
                details={"via": "cli", "path": cli, "command": cli},
            )
        try:
            spec = find_spec("mlc_llm")
        except (ImportError, ValueError) as exc:
            log.debug("looking for mlc_llm: %s", exc)
            spec = None
        if spec is not None:
            return RuntimeStatus(
                self.name,
                True,
                version=_dist_version(),
                devices=("auto",),
                details={"via": "python", "command": shlex.join([sys.executable, "-m", "mlc_llm"])},
            )
        return RuntimeStatus(
            self.name, False, fix=FIX, reason="MLC LLM is not installed (it ships from mlc.ai's wheel index, not PyPI)"
        )

    def load(self, model: ModelRecord, plan: Plan) -> MlcSession:
        check_model_folder(Path(model.path), allow_native=bool(plan.options.get("allow_native")))
        if (plan.options.get("model_lib") or model.metadata.get("model_lib")) and not plan.options.get("allow_native"):
            raise InvalidModelFile(
                f"{model.name}: a prebuilt model library is native code",
                hint="set allow_native for this model, or let MLC compile its own",
            )
        from localrun.settings import default_data_dir

        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model.name)
        log_dir = Path(plan.options.get("log_dir") or default_data_dir() / "logs")
        server = MlcServer(model, plan, log_path=log_dir / f"mlc-{safe}.log")
        server.start()
        return MlcSession(server)


class MlcSession(SupervisedSession):
    """One model behind one ``mlc_llm serve``; MLC batches concurrent requests itself.

    No ``vision``: MLC's server takes ``image_url`` parts only for the few vision models it
    compiles (Phi-3-vision, LLaVA) and localrun cannot tell them from a weight folder, so
    media are refused with a 400 rather than sent to be dropped.
    """

    concurrent = True
    capabilities: frozenset[str] = frozenset()

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        refuse_media(req, runtime="mlc", model=self._server.record.name, why="MLC serves text models here")
        body = {
            "messages": [{"role": m.role, "content": m.content} for m in req.messages],
            **sampling_to_openai(req.sampling),
        }
        return self._stream("/v1/chat/completions", body, req.sampling.stop, cancel)

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        refuse_media(req, runtime="mlc", model=self._server.record.name, why="MLC serves text models here")
        body = {"prompt": req.prompt, **sampling_to_openai(req.sampling)}
        return self._stream("/v1/completions", body, req.sampling.stop, cancel)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        from localrun.errors import UnsupportedFeature

        raise UnsupportedFeature(
            f"{self._server.record.name}: MLC serves embeddings only from a separate embedding model", param="input"
        )
