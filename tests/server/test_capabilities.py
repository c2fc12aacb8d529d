"""Vision and audio visible on every listing (issue 19): /api/show's ``capabilities`` and
``projector_info`` from the projector's header without loading the model, /v1/models entries,
and /props' ``modalities`` from the loaded session — for a text-only, a vision, an audio and a
mixed model, on the fake runtime through the app in-process."""

from __future__ import annotations

import pytest

from tests.support.projector_headers import AUDIO_ONLY, GEMMA3, OMNI, pair, write_projector


@pytest.fixture
def paired(stack, tmp_path):
    """The tiny model registered four ways: text-only ("tiny"), vision, audio and both."""
    for name, keys in (("tiny-vision", GEMMA3), ("tiny-audio", AUDIO_ONLY), ("tiny-omni", OMNI)):
        pair(stack.store, "tiny", name, write_projector(tmp_path / f"mmproj-{name}.gguf", keys))
    return stack


def _show(client, name: str) -> dict:
    r = client.post("/api/show", json={"model": name})
    assert r.status_code == 200, r.text
    return r.json()


def test_show_capabilities_follow_the_projector_header(paired, client):
    assert _show(client, "tiny")["capabilities"] == ["completion"]
    assert _show(client, "tiny-vision")["capabilities"] == ["completion", "vision"]
    assert _show(client, "tiny-audio")["capabilities"] == ["completion", "audio"]
    assert _show(client, "tiny-omni")["capabilities"] == ["completion", "vision", "audio"]
    # Read from the header only: nothing was loaded to answer.
    assert paired.manager.loaded() == []


def test_show_projector_info_is_the_projector_header(paired, client):
    assert "projector_info" not in _show(client, "tiny")
    info = _show(client, "tiny-vision")["projector_info"]
    assert info["general.architecture"] == "clip"
    assert info["clip.projector_type"] == "gemma3"
    assert info["clip.vision.image_size"] == 896 and info["clip.vision.patch_size"] == 14
    assert info["clip.has_vision_encoder"] is True and info["clip.has_audio_encoder"] is False
    assert info["general.parameter_count"] == 4096


def test_a_broken_projector_still_says_vision_and_shows_no_header(paired, client, tmp_path):
    bad = tmp_path / "mmproj-bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00 truncated")
    pair(paired.store, "tiny", "tiny-bad", bad)
    shown = _show(client, "tiny-bad")
    assert shown["capabilities"] == ["completion", "vision"]  # the store paired it; loading says more
    assert "projector_info" not in shown


def test_v1_models_entries_say_what_each_model_takes(paired, client):
    r = client.get("/v1/models")
    assert r.status_code == 200
    by_id = {m["id"]: m for m in r.json()["data"]}
    assert by_id["tiny"]["capabilities"] == ["completion"]
    assert by_id["tiny"]["modalities"] == {"vision": False, "audio": False}
    # llama-server's word for a model with a projector, which its clients (and its tests) look for
    assert by_id["tiny-vision"]["capabilities"] == ["completion", "vision", "multimodal"]
    assert by_id["tiny-vision"]["modalities"] == {"vision": True, "audio": False}
    assert by_id["tiny-audio"]["modalities"] == {"vision": False, "audio": True}
    one = client.get("/v1/models/tiny-omni").json()
    assert one["modalities"] == {"vision": True, "audio": True}
    assert "multimodal" in one["capabilities"]


@pytest.mark.parametrize(
    ("caps", "expected"),
    [((), {"vision": False, "audio": False}), (("vision",), {"vision": True, "audio": False})],
)
def test_props_modalities_are_the_loaded_sessions(app_client, caps, expected):
    client = app_client(capabilities=caps)
    r = client.get("/props", params={"model": "tiny"})
    assert r.status_code == 200, r.text
    assert r.json()["modalities"] == expected
    assert r.json()["media_marker"] == "<__media__>"


def test_props_says_audio_for_a_session_that_hears(app_client):
    r = app_client(capabilities=("vision", "audio")).get("/props", params={"model": "tiny"})
    assert r.json()["modalities"] == {"vision": True, "audio": True}


def test_a_gguf_with_its_encoders_inside_says_vision_and_audio(stack, client, tmp_path):
    """Ollama's own converts (Gemma 3n, Gemma 4) carry the encoders in the model file."""
    from tests.factories import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(
        tmp_path / "omni.gguf", extra_kv={"llama.vision.block_count": 2, "llama.audio.block_count": 2}
    )
    stack.store.import_path(path, name="omni")
    assert _show(client, "omni")["capabilities"] == ["completion", "vision", "audio"]


def test_the_official_clients_read_them_from_a_live_server(paired, live_factory):
    """ollama-python's ShowResponse and openai's model objects over real sockets."""
    import ollama
    import openai

    live = live_factory(paired)
    shown = ollama.Client(host=live.url).show("tiny-omni")
    assert shown.capabilities == ["completion", "vision", "audio"]
    assert ollama.Client(host=live.url).show("tiny").capabilities == ["completion"]
    models = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0).models.list().data
    extra = {m.id: m.model_extra for m in models}
    assert extra["tiny-vision"]["modalities"] == {"vision": True, "audio": False}
    assert "multimodal" in extra["tiny-vision"]["capabilities"] and "multimodal" not in extra["tiny"]["capabilities"]


#: A template that reads ``tools`` and writes reasoning markers: a model that calls tools and thinks.
THINKING_TOOLS_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if tools %}<|tools|>{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}<|assistant|><think>{% endif %}"
)


def test_every_front_end_reports_the_same_capabilities(paired, client, tmp_path):
    """``localrun ls``, the TUI's library, /v1/models and /api/show all ask modelstore/capabilities.py
    (issue 32): a model with a projector and one whose template calls tools and thinks."""
    import json

    from click.testing import CliRunner

    from localrun.cli import main
    from localrun.tui.backend import LocalBackend
    from localrun.tui.library import read_rows
    from tests.factories import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "thinker.gguf", chat_template=THINKING_TOOLS_TEMPLATE)
    paired.store.import_path(path, name="thinker")
    expected = {
        "tiny-omni": ["completion", "vision", "audio"],
        "thinker": ["completion", "tools", "thinking"],
    }
    shown = {name: _show(client, name)["capabilities"] for name in expected}
    listed = {m["id"]: m["capabilities"] for m in client.get("/v1/models").json()["data"]}
    rows = json.loads(CliRunner().invoke(main, ["ls", "--json"], env={"COLUMNS": "200"}).output)
    in_ls = {r["name"]: r["capabilities"] for r in rows}
    library = {
        r.name: list(r.capabilities) for r in read_rows(LocalBackend(store=paired.store, manager=paired.manager))
    }
    for name, caps in expected.items():
        assert shown[name] == caps
        # /v1/models adds llama-server's "multimodal" for a model with a projector, which its clients look for
        assert [c for c in listed[name] if c != "multimodal"] == caps
        assert in_ls[name] == caps
        assert library[name] == caps
