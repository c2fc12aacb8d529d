"""The MLC runtime: the ``mlc_llm serve`` command line, model folder checks, and the
server's life (start, readiness, streaming, crash, restart, stop) against a stand-in
process that takes MLC's arguments and speaks its OpenAI-compatible API. Real MLC is not
run here: it ships from mlc.ai's own wheel index and needs TVM."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from localrun.errors import ContextOverflow, InvalidModelFile, ModelNotFound, RuntimeUnavailable, WorkerCrashed
from localrun.runtimes.mlc import (
    COMMAND_ENV,
    FIX,
    MlcRuntime,
    build_serve_command,
    check_model_folder,
    mlc_command,
    mlc_device,
)
from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling, fold
from tests.runtimes.conftest import mlc_plan


def _record(path, **metadata) -> ModelRecord:
    return ModelRecord(name="tiny-mlc", format=Format.MLC, path=str(path), metadata=metadata)


def _chat(**sampling) -> ChatRequest:
    return ChatRequest(messages=(Message("user", "hi"),), sampling=Sampling(**sampling))


# --- the command line ----------------------------------------------------------------


def test_build_serve_command_for_a_local_folder(tmp_path):
    plan = Plan(runtime="mlc", device="cuda:1", n_ctx=8192, options={"mlc_command": "mlc_llm"})
    cmd = build_serve_command(_record(tmp_path / "M-MLC"), plan, 41234)
    assert cmd == [
        "mlc_llm",
        "serve",
        str(tmp_path / "M-MLC"),
        "--device",
        "cuda:1",
        "--host",
        "127.0.0.1",
        "--port",
        "41234",
        "--mode",
        "local",
        "--allow-origins",
        "[]",
        "--overrides",
        "context_window_size=8192",
    ]


def test_build_serve_command_options(tmp_path):
    plan = Plan(
        runtime="mlc",
        device="cpu",
        n_ctx=0,
        options={"mlc_command": ["python3", "-m", "mlc_llm"], "mlc_mode": "server", "model_lib": "/l/x.so"},
    )
    cmd = build_serve_command(_record(tmp_path), plan, 1)
    assert cmd[:4] == ["python3", "-m", "mlc_llm", "serve"]
    assert cmd[cmd.index("--device") + 1] == "auto"  # MLC has no "cpu" device
    assert cmd[cmd.index("--mode") + 1] == "server"
    assert cmd[cmd.index("--model-lib") + 1] == "/l/x.so"
    assert "--overrides" not in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"


@pytest.mark.parametrize(
    "device,expected",
    [("cpu", "auto"), ("metal", "metal"), ("cuda", "cuda"), ("vulkan:0", "vulkan:0"), ("", "auto"), ("tpu", "auto")],
)
def test_mlc_device(device, expected):
    assert mlc_device(Plan(runtime="mlc", device=device)) == expected


def test_mlc_command_resolution(monkeypatch, tmp_path):
    plan = Plan(runtime="mlc", options={"mlc_command": "/opt/mlc/bin/mlc_llm --verbose"})
    assert mlc_command(plan, env={}) == ["/opt/mlc/bin/mlc_llm", "--verbose"]
    assert mlc_command(Plan(runtime="mlc"), env={COMMAND_ENV: "conda run -n mlc mlc_llm"}) == [
        "conda",
        "run",
        "-n",
        "mlc",
        "mlc_llm",
    ]
    exe = tmp_path / "bin" / "mlc_llm"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(exe.parent))
    assert mlc_command(Plan(runtime="mlc"), env={}) == [str(exe)]


def test_without_mlc_probe_and_load_give_the_wheel_index_command(monkeypatch, tmp_path, mlc_dir):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(COMMAND_ENV, raising=False)
    status = MlcRuntime().probe()
    assert not status.available and status.fix == FIX and "mlc.ai" in status.fix
    with pytest.raises(RuntimeUnavailable) as info:
        MlcRuntime().load(_record(mlc_dir), Plan(runtime="mlc", options={"log_dir": str(tmp_path)}))
    assert info.value.hint == FIX


def test_probe_with_a_configured_command(monkeypatch, tmp_path):
    monkeypatch.setenv(COMMAND_ENV, f"{sys.executable} /x/mlc_llm")
    status = MlcRuntime().probe()
    assert status.available and status.details["command"].endswith("/x/mlc_llm")
    monkeypatch.setenv(COMMAND_ENV, str(tmp_path / "no-such-mlc"))
    status = MlcRuntime().probe()
    assert not status.available and "no-such-mlc" in status.reason and COMMAND_ENV in status.fix


# --- the model folder ----------------------------------------------------------------


def test_missing_folder_is_model_not_found(tmp_path):
    with pytest.raises(ModelNotFound):
        MlcRuntime().load(_record(tmp_path / "gone"), mlc_plan(tmp_path))


def test_folder_checks(mlc_dir, tmp_path):
    assert check_model_folder(mlc_dir)["quantization"] == "q4f16_1"
    (mlc_dir / "tensor-cache.json").rename(mlc_dir / "ndarray-cache.json")  # repos made before the rename
    check_model_folder(mlc_dir)
    (mlc_dir / "ndarray-cache.json").unlink()
    with pytest.raises(InvalidModelFile, match="tensor-cache"):
        check_model_folder(mlc_dir)
    (mlc_dir / "mlc-chat-config.json").unlink()
    with pytest.raises(InvalidModelFile, match="mlc-chat-config.json"):
        check_model_folder(mlc_dir)


@pytest.mark.parametrize("lib", ["Tiny-cuda.so", "lib/Tiny-metal.dylib", "Tiny.DLL"])
def test_native_libraries_are_refused_unless_allowed(mlc_dir, tmp_path, lib, monkeypatch):
    (mlc_dir / lib).parent.mkdir(parents=True, exist_ok=True)
    (mlc_dir / lib).write_bytes(b"\x7fELF")
    argv_file = tmp_path / "argv.json"
    monkeypatch.setenv("FAKE_MLC_ARGV_FILE", str(argv_file))
    with pytest.raises(InvalidModelFile, match="native library") as info:
        MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path))
    assert "allow_native" in info.value.hint
    assert not argv_file.exists()  # nothing was started
    MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path, allow_native=True)).close()
    assert argv_file.exists()


def test_a_prebuilt_model_library_needs_allow_native(mlc_dir, tmp_path):
    with pytest.raises(InvalidModelFile, match="native code"):
        MlcRuntime().load(_record(mlc_dir, model_lib="/somewhere/lib.so"), mlc_plan(tmp_path))


# --- the server's life ---------------------------------------------------------------


def test_load_starts_mlc_serve_with_the_planned_arguments_and_close_stops_it(mlc_dir, tmp_path, monkeypatch):
    argv_file = tmp_path / "argv.json"
    monkeypatch.setenv("FAKE_MLC_ARGV_FILE", str(argv_file))
    session = MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path))
    argv = json.loads(argv_file.read_text())
    assert argv[:2] == ["serve", str(mlc_dir)]
    assert argv[argv.index("--overrides") + 1] == "context_window_size=512"
    assert argv[argv.index("--allow-origins") + 1] == "[]"
    assert session.alive
    proc = session._server.proc
    session.close()
    assert proc.poll() is not None and not session.alive
    with pytest.raises(RuntimeUnavailable, match="unloaded"):
        session.chat(_chat(), Cancel())


def test_a_server_that_exits_at_start_reports_its_log(mlc_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MLC_FAIL", "TVMError: cannot find a CUDA device")
    with pytest.raises(RuntimeUnavailable) as info:
        MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path))
    assert "exited (1) before it was ready" in info.value.message
    assert "TVMError: cannot find a CUDA device" in info.value.message
    assert str(tmp_path / "logs") in info.value.hint


def test_a_server_that_never_answers_times_out_and_is_stopped(mlc_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MLC_STARTUP_S", "30")
    started = time.monotonic()
    with pytest.raises(RuntimeUnavailable, match="did not answer within 1 s") as info:
        MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path, mlc_start_timeout_s=1.0))
    assert time.monotonic() - started < 10
    assert "mlc_start_timeout_s" in info.value.hint
    log_text = next((tmp_path / "logs").glob("mlc-*.log")).read_text()
    assert any(line.startswith("--- ") and "serve" in line for line in log_text.splitlines())  # the command is logged


def test_chat_and_completion_stream_through_the_openai_api(mlc_dir, tmp_path):
    session = MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path))
    try:
        text, finish, usage = fold(session.chat(_chat(max_tokens=5, seed=3), Cancel()))
        assert len(text.split()) == 5 and finish == "length"
        assert usage.completion_tokens == 5 and usage.prompt_tokens == 2  # "user: hi"
        text2, finish2, _ = fold(session.complete(CompletionRequest("tell", Sampling(max_tokens=3)), Cancel()))
        assert len(text2.split()) == 3 and finish2 == "length"
    finally:
        session.close()


def test_a_prompt_over_the_context_is_context_overflow(mlc_dir, tmp_path):
    session = MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path))
    try:
        with pytest.raises(ContextOverflow, match="larger than the model input length limit 512"):
            list(session.complete(CompletionRequest("word " * 600, Sampling(max_tokens=3)), Cancel()))
    finally:
        session.close()


def test_a_crash_mid_stream_is_worker_crashed_and_the_next_request_restarts(mlc_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MLC_CRASH_AFTER", "3")
    session = MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path))
    try:
        got = []
        with pytest.raises(WorkerCrashed) as info:
            for chunk in session.chat(_chat(max_tokens=50), Cancel()):
                got.append(chunk)
        assert len([c for c in got if c.text]) == 3
        assert "exit code 7" in info.value.message and "simulated crash in the engine" in info.value.message
        assert not session.alive
        monkeypatch.delenv("FAKE_MLC_CRASH_AFTER")
        old_pid = session._server.proc.pid
        assert fold(session.chat(_chat(max_tokens=4), Cancel()))[1] == "length"
        assert session._server.proc.pid != old_pid and session.alive
    finally:
        session.close()


@pytest.mark.skipif(os.name != "posix", reason="kills a process group")
def test_a_server_killed_between_requests_is_restarted(mlc_dir, tmp_path):
    session = MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path))
    try:
        os.killpg(session._server.proc.pid, signal.SIGKILL)
        session._server.proc.wait()
        assert fold(session.chat(_chat(max_tokens=2), Cancel()))[1] == "length"
    finally:
        session.close()


def test_cancel_disconnects_and_the_server_sees_it(mlc_dir, tmp_path, monkeypatch):
    events = tmp_path / "events"
    monkeypatch.setenv("FAKE_MLC_EVENTS_FILE", str(events))
    monkeypatch.setenv("FAKE_MLC_TOKEN_DELAY_S", "0.3")
    session = MlcRuntime().load(_record(mlc_dir), mlc_plan(tmp_path))
    try:
        cancel = Cancel()
        stream = session.chat(_chat(), cancel)
        assert next(stream).text
        cancel.set()
        started = time.monotonic()
        rest = list(stream)
        assert time.monotonic() - started < 0.25
        assert [c.finish_reason for c in rest] == ["cancelled"]
        deadline = time.monotonic() + 3
        while not events.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert events.read_text().splitlines() == ["disconnect"]
    finally:
        session.close()
