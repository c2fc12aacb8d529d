"""``localrun run MODEL "What is in this picture?" --image cat.png`` (issue 19): the files reach the
runtime as media of the user's message, one marker each in its text; a missing or unreadable file
is refused before anything loads, and a model that cannot see is refused with the way to give it
a projector. The fake runtime plays a model that sees (``fake_capabilities``); a recording
manager shows what reached it."""

from __future__ import annotations

import dataclasses
import os

import pytest
from click.testing import CliRunner

from localrun.cli import main
from localrun.types import MEDIA_MARKER, ChatRequest, CompletionRequest

pytestmark = pytest.mark.timeout(120)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32  # the runtime decodes; the CLI only carries the bytes


@pytest.fixture
def model(tmp_path, monkeypatch, tiny_gguf):
    """ "tiny" in the store, run by the fake runtime with the capabilities ``caps`` names; every request
    it is sent lands in ``sent``."""
    from localrun.cli import run as run_cmd

    assert CliRunner().invoke(main, ["import", str(tiny_gguf), "--name", "tiny"]).exit_code == 0
    state = {"caps": ["vision"], "sent": []}

    def make_manager(settings, store, overrides=None):
        from localrun.manager import ModelManager
        from localrun.planning.facts import default_plan

        def plan(record):
            p = default_plan(record, settings, overrides)
            return dataclasses.replace(p, options={**p.options, "fake_capabilities": state["caps"]})

        manager = ModelManager(settings, store, planner=plan)
        stream = manager.stream

        def recording(name, req, cancel=None):
            state["sent"].append(req)
            return stream(name, req, cancel)

        manager.stream = recording
        return manager

    monkeypatch.setattr(run_cmd, "make_manager", make_manager)
    return state


def _run(*args: str, input: str | None = None):
    result = CliRunner().invoke(main, ["run", "tiny", *args, "--runtime", "fake", "--temperature", "0"], input=input)
    result.said = " ".join(result.stderr.split())  # the error console wraps long lines
    return result


def test_images_reach_the_model_as_media_of_the_message(model, tmp_path):
    cat, dog = tmp_path / "cat.png", tmp_path / "dog.jpg"
    cat.write_bytes(PNG)
    dog.write_bytes(b"\xff\xd8\xff\xe0 a jpeg")
    result = _run("What is in this picture?", "--image", str(cat), "--image", str(dog), "--max-tokens", "4")
    assert result.exit_code == 0, result.output + result.stderr
    (req,) = model["sent"]
    assert isinstance(req, ChatRequest)
    (user,) = req.messages
    assert [(m.kind, m.data, m.mime) for m in user.media] == [
        ("image", PNG, "image/png"),
        ("image", b"\xff\xd8\xff\xe0 a jpeg", "image/jpeg"),
    ]
    assert user.content == MEDIA_MARKER * 2 + "\nWhat is in this picture?"


def test_audio_and_raw_completion_carry_media_too(model, tmp_path):
    model["caps"] = ["vision", "audio"]
    clip = tmp_path / "clip.wav"
    clip.write_bytes(b"RIFF\x00\x00\x00\x00WAVE")
    result = _run("Transcribe:", "--audio", str(clip), "--raw", "--max-tokens", "2")
    assert result.exit_code == 0, result.output + result.stderr
    (req,) = model["sent"]
    assert isinstance(req, CompletionRequest)
    assert [(m.kind, m.mime) for m in req.media] == [("audio", "audio/x-wav")]
    assert req.prompt == MEDIA_MARKER + "\nTranscribe:"


def test_markers_the_user_placed_stay_and_a_stray_one_is_defused(model, tmp_path):
    cat = tmp_path / "cat.png"
    cat.write_bytes(PNG)
    assert _run(f"Before {MEDIA_MARKER} after", "--image", str(cat), "--max-tokens", "2").exit_code == 0
    assert _run(f"No picture {MEDIA_MARKER} here", "--max-tokens", "2").exit_code == 0
    placed, stray = model["sent"]
    assert placed.messages[-1].content == f"Before {MEDIA_MARKER} after"
    assert MEDIA_MARKER not in stray.messages[-1].content and not stray.messages[-1].media


def test_interactive_chat_attaches_the_files_to_the_first_turn(model, tmp_path):
    cat = tmp_path / "cat.png"
    cat.write_bytes(PNG)
    result = _run("--image", str(cat), "--max-tokens", "2", input="what is this?\nand now?\n/bye\n")
    assert result.exit_code == 0, result.output + result.stderr
    first, second = model["sent"]
    assert len(first.messages[0].media) == 1
    assert [len(m.media) for m in second.messages] == [1, 0, 0]  # history keeps the picture, the new turn has none


def test_a_missing_file_is_refused_before_anything_loads(model, tmp_path):
    result = _run("hi", "--image", str(tmp_path / "nope.png"))
    assert result.exit_code == 2
    assert "nope.png" in result.said and "does not exist" in result.said
    assert model["sent"] == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_refused_with_why(model, tmp_path):
    locked = tmp_path / "locked.png"
    locked.write_bytes(PNG)
    locked.chmod(0)
    result = _run("hi", "--image", str(locked))
    assert result.exit_code == 2 and "cannot read image" in result.said and "permission" in result.said.lower()


def test_an_empty_file_and_a_folder_are_refused(model, tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    assert "is empty" in _run("hi", "--image", str(tmp_path / "empty.png")).said
    assert "is not a file" in _run("hi", "--image", str(tmp_path)).said
    assert model["sent"] == []


def test_a_text_only_model_is_refused_with_the_hint(model, tmp_path):
    model["caps"] = []
    cat = tmp_path / "cat.png"
    cat.write_bytes(PNG)
    result = _run("What is this?", "--image", str(cat))
    assert result.exit_code == 2
    assert "tiny cannot take image input" in result.said
    assert "--mmproj" in result.said and "gemma-3-4b-it-GGUF" in result.said
    assert model["sent"] == []


def test_audio_to_a_model_that_only_sees_is_refused(model, tmp_path):
    clip = tmp_path / "clip.wav"
    clip.write_bytes(b"RIFF\x00\x00\x00\x00WAVE")
    result = _run("hi", "--audio", str(clip))
    assert result.exit_code == 2
    assert "cannot take audio input" in result.said and "takes images" in result.said
