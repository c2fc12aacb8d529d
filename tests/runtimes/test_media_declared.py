"""Runtimes declare the media they honour (issue 19): vLLM a multimodal Hugging Face folder's
images and audio, MLC and MLX none — and a request that carries media anyway (a caller that
skips the server's 400 rule) is refused by name, never sent with its marker as text."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from localrun.errors import UnsupportedFeature
from localrun.runtimes.fake import FakeRuntime
from localrun.runtimes.mlc import MlcSession
from localrun.runtimes.openai_compat.wire import refuse_media
from localrun.runtimes.vllm import VllmSession, folder_media
from localrun.types import (
    AUDIO,
    MEDIA_MARKER,
    VISION,
    Cancel,
    ChatRequest,
    CompletionRequest,
    Format,
    Media,
    Message,
    ModelRecord,
    Plan,
)

IMAGE = Media("image", b"\x89PNG\r\n\x1a\n")


def _folder(tmp_path, config) -> ModelRecord:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return ModelRecord(name="m", format=Format.MLX, path=str(tmp_path))


def test_vllm_declares_what_the_folders_config_has(tmp_path):
    assert folder_media(_folder(tmp_path / "text", {"architectures": ["LlamaForCausalLM"]})) == set()
    gemma = {"architectures": ["Gemma3ForConditionalGeneration"], "vision_config": {"image_size": 896}}
    assert folder_media(_folder(tmp_path / "gemma", gemma)) == {VISION}
    omni = {"vision_config": {"depth": 32}, "audio_config": {"d_model": 1280}}
    assert folder_media(_folder(tmp_path / "omni", omni)) == {VISION, AUDIO}
    assert folder_media(ModelRecord(name="gone", format=Format.MLX, path=str(tmp_path / "nowhere"))) == set()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    assert folder_media(ModelRecord(name="bad", format=Format.MLX, path=str(tmp_path / "bad"))) == set()


def test_a_vllm_session_adds_them_to_its_own(tmp_path):
    record = _folder(tmp_path, {"vision_config": {}, "audio_config": {"n": 1}})
    session = VllmSession(SimpleNamespace(record=record))
    assert session.capabilities == {"json_schema", "logprobs", AUDIO}  # an empty vision_config says nothing


def test_mlc_declares_no_media_and_refuses_them_unsent(monkeypatch):
    session = MlcSession(SimpleNamespace(record=SimpleNamespace(name="phi")))
    assert not {VISION, AUDIO} & session.capabilities
    monkeypatch.setattr(session, "_stream", lambda *a: pytest.fail("sent"))
    chat = ChatRequest((Message("user", MEDIA_MARKER + "what?", media=(IMAGE,)),))
    with pytest.raises(UnsupportedFeature, match="image input is not supported by the mlc runtime serving phi"):
        session.chat(chat, Cancel())
    with pytest.raises(UnsupportedFeature, match="mlc"):
        session.complete(CompletionRequest(MEDIA_MARKER, media=(Media("audio", b"RIFF"),)), Cancel())


def test_refuse_media_names_the_field_and_passes_text():
    refuse_media(ChatRequest((Message("user", "hi"),)), runtime="mlx", model="m", why="text only")
    with pytest.raises(UnsupportedFeature) as info:
        refuse_media(CompletionRequest("x", media=(Media("audio", b"RIFF"),)), runtime="mlx", model="m", why="w")
    assert info.value.param == "audio" and "mlx" in info.value.message and info.value.hint


def test_a_fake_session_subclass_keeps_the_capabilities_it_declares(tmp_path):
    """The agents' scripted runtime declares tools on its session class; the fake's
    constructor must not replace them with the fake's own (the agents' tool step broke so)."""
    from tests.agents.scripted import ScriptedRuntime

    record = ModelRecord(name="tiny", path=str(tmp_path), format=Format.GGUF)
    plan = Plan(runtime="scripted", n_ctx=512)
    assert {"tools", "json_schema"} <= ScriptedRuntime().load(record, plan).capabilities
    assert "tools" not in FakeRuntime().load(record, plan).capabilities
