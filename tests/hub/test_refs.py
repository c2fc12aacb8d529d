"""Ref parsing and file selection: pure functions over names, no hub needed."""

from __future__ import annotations

import pytest

from localrun.errors import InvalidName, ModelNotFound
from localrun.modelstore.refs import HubRef, model_name_for, parse_ref, quant_label, select_files
from localrun.types import Format
from tests.hub.hostile import HOSTILE_NAMES


@pytest.mark.parametrize(
    "text, repo, quant, file",
    [
        ("bartowski/Llama-3.2-1B-Instruct-GGUF", "bartowski/Llama-3.2-1B-Instruct-GGUF", None, None),
        ("org/repo:Q5_K_M", "org/repo", "Q5_K_M", None),
        ("org/repo:q5_k_m", "org/repo", "q5_k_m", None),
        ("hf.co/org/repo:IQ3_M", "org/repo", "IQ3_M", None),
        ("huggingface.co/org/repo", "org/repo", None, None),
        ("https://huggingface.co/org/repo:Q8_0", "org/repo", "Q8_0", None),
        ("HF.CO/org/repo", "org/repo", None, None),
        ("org/repo/model-Q4_K_M.gguf", "org/repo", None, "model-Q4_K_M.gguf"),
        ("org/repo/Q8_0/big-Q8_0-00001-of-00002.gguf", "org/repo", None, "Q8_0/big-Q8_0-00001-of-00002.gguf"),
        ("  org/repo:UD-Q4_K_XL  ", "org/repo", "UD-Q4_K_XL", None),
        ("unsloth/gemma-3-270m-it-GGUF:Q4_K_M", "unsloth/gemma-3-270m-it-GGUF", "Q4_K_M", None),
    ],
)
def test_parse_ref_table(text, repo, quant, file):
    ref = parse_ref(text)
    assert (ref.repo, ref.quant, ref.file) == (repo, quant, file)


def test_parse_ref_revision_is_validated():
    assert parse_ref("org/repo", revision="v1.0").revision == "v1.0"
    assert parse_ref("org/repo", revision="refs/pr/3").revision == "refs/pr/3"
    for bad in ("../main", "/abs", "a/../../b", "x y", ""):
        with pytest.raises(InvalidName):
            parse_ref("org/repo", revision=bad) if bad else parse_ref("org/repo", revision="..")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "repo-only",
        "org/",
        "/repo",
        "org//repo",
        "org/re po",
        "org/repo:",
        "org/repo:Q4 K",
        "org/repo/file.gguf:Q4_K_M",
        "org--x/repo",
        "org/re..po",
        "-org/repo",
        "org/repo-",
        "org/repo/../x.gguf",
        "org/repo/a\\b.gguf",
        "http://evil.com/org/repo",
        "org/repo:../../x",
        "o" * 100 + "/repo",
    ],
)
def test_parse_ref_rejects(text):
    with pytest.raises(InvalidName):
        parse_ref(text)


@pytest.mark.parametrize("name", [n for n in HOSTILE_NAMES if n and n == n.strip()])  # a ref is stripped first
def test_hostile_file_in_ref_is_refused(name):
    with pytest.raises(InvalidName):
        parse_ref(f"org/repo/{name}")


GGUF_REPO = [
    "README.md",
    "Tiny-Q2_K.gguf",
    "Tiny-Q4_0.gguf",
    "Tiny-Q4_K_M.gguf",
    "Tiny-Q4_K_S.gguf",
    "Tiny-Q8_0.gguf",
    "Tiny-IQ4_NL.gguf",
    "mmproj-Tiny-F16.gguf",
    "Tiny.imatrix.gguf",
    "mtp-Tiny-Q4_K_M.gguf",
]


@pytest.mark.parametrize(
    "quant, expected",
    [
        (None, "Tiny-Q4_K_M.gguf"),
        ("Q4_K_M", "Tiny-Q4_K_M.gguf"),
        ("q4_k_m", "Tiny-Q4_K_M.gguf"),
        ("Q4_K_S", "Tiny-Q4_K_S.gguf"),
        ("q8_0", "Tiny-Q8_0.gguf"),
        ("Q4_0", "Tiny-Q4_0.gguf"),
        ("IQ4_NL", "Tiny-IQ4_NL.gguf"),
        ("Q2_K", "Tiny-Q2_K.gguf"),
    ],
)
def test_quant_selection(quant, expected):
    sel = select_files(HubRef("org/Tiny-GGUF", quant=quant), GGUF_REPO)
    assert sel.format is Format.GGUF
    assert sel.files == (expected,) and sel.primary == expected
    assert sel.quant == quant_label(expected)


def test_quant_tag_needs_a_boundary():
    # "Q4_NL" must not match "IQ4_NL", nor "Q4_K" match "Q4_K_M"
    with pytest.raises(ModelNotFound):
        select_files(HubRef("org/r", quant="Q4_NL"), GGUF_REPO)
    with pytest.raises(ModelNotFound):
        select_files(HubRef("org/r", quant="Q4_K"), GGUF_REPO)


def test_default_falls_back_to_q8_then_first_file():
    assert select_files(HubRef("o/r"), ["m-Q8_0.gguf", "m-Q5_K_M.gguf"]).primary == "m-Q8_0.gguf"
    assert select_files(HubRef("o/r"), ["b-Q6_K.gguf", "a-Q5_K_M.gguf", "mmproj-a.gguf"]).primary == "a-Q5_K_M.gguf"
    assert select_files(HubRef("o/r"), ["model.Q4_K_M.gguf", "model.Q8_0.gguf"]).primary == "model.Q4_K_M.gguf"


def test_sidecars_are_never_the_model():
    with pytest.raises(ModelNotFound):
        select_files(HubRef("o/r"), ["mmproj-x-f16.gguf", "x.imatrix.gguf", "README.md"])


def test_split_gguf_fetches_every_part_and_loads_the_first():
    paths = [f"Q8_0/Big-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)] + ["Big-Q4_0.gguf"]
    sel = select_files(HubRef("o/Big"), paths)
    assert sel.files == tuple(sorted(paths[:3])) and sel.primary == paths[0] and sel.quant == "Q8_0"
    # naming a middle shard means the whole set
    sel2 = select_files(HubRef("o/Big", file=paths[1]), paths)
    assert sel2.files == sel.files and sel2.primary == paths[0]


def test_incomplete_split_is_refused_naming_the_missing_part():
    paths = ["Big-Q4_K_M-00001-of-00003.gguf", "Big-Q4_K_M-00003-of-00003.gguf"]
    with pytest.raises(ModelNotFound, match="00002-of-00003"):
        select_files(HubRef("o/Big"), paths)


def test_unknown_quant_lists_what_the_repo_offers():
    with pytest.raises(ModelNotFound) as err:
        select_files(HubRef("org/Tiny-GGUF", quant="Q9_9"), GGUF_REPO)
    msg = str(err.value)
    for q in ("Q2_K", "Q4_0", "Q4_K_M", "Q8_0", "IQ4_NL"):
        assert q in msg
    assert "mmproj" not in msg


def test_unknown_exact_file_lists_the_offer():
    with pytest.raises(ModelNotFound, match="Tiny-Q4_K_M.gguf"):
        select_files(HubRef("org/Tiny-GGUF", file="nope.gguf"), GGUF_REPO)


MLX = [
    "config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
    "pytorch_model.bin",
    "chat_template.jinja",
]


def test_mlx_repo_recognised_by_files():
    sel = select_files(HubRef("mlx-community/x"), MLX)
    assert sel.format is Format.MLX and sel.primary == ""
    assert "pytorch_model.bin" not in sel.files and "README.md" not in sel.files
    assert {
        "config.json",
        "model-00001-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "chat_template.jinja",
    } <= set(sel.files)
    assert sel.code_files == ()


def test_mlx_code_is_flagged_and_only_fetched_when_trusted():
    paths = MLX + ["modeling_x.py"]
    sel = select_files(HubRef("o/x"), paths)
    assert sel.code_files == ("modeling_x.py",) and "modeling_x.py" not in sel.files
    assert "modeling_x.py" in select_files(HubRef("o/x"), paths, include_code=True).files


@pytest.mark.parametrize("cache", ["tensor-cache.json", "ndarray-cache.json"])
def test_mlc_repo_recognised_by_files(cache):
    paths = [
        "mlc-chat-config.json",
        cache,
        "params_shard_0.bin",
        "params_shard_1.bin",
        "tokenizer.json",
        "lib.so",
        "README.md",
    ]
    sel = select_files(HubRef("mlc-ai/x-MLC"), paths)
    assert sel.format is Format.MLC
    assert set(sel.files) == {
        "mlc-chat-config.json",
        cache,
        "params_shard_0.bin",
        "params_shard_1.bin",
        "tokenizer.json",
    }
    assert sel.native_files == ("lib.so",)
    assert "lib.so" in select_files(HubRef("mlc-ai/x-MLC"), paths, include_native=True).files


def test_repo_without_a_model_says_what_it_has():
    with pytest.raises(ModelNotFound, match="pytorch_model.bin"):
        select_files(HubRef("o/r"), ["config.json", "pytorch_model.bin"])


def test_quant_on_a_folder_format_is_an_error():
    with pytest.raises(ModelNotFound, match="MLX"):
        select_files(HubRef("o/x", quant="4bit"), MLX)


@pytest.mark.parametrize(
    "repo, sel_args, expected",
    [
        ("Org/Tiny-GGUF", (Format.GGUF, ("Tiny-Q4_K_M.gguf",), "Tiny-Q4_K_M.gguf", "Q4_K_M"), "org/tiny-gguf:q4_k_m"),
        (
            "mlx-community/Llama-3.2-1B-4bit",
            (Format.MLX, ("config.json",), "", None),
            "mlx-community/llama-3.2-1b-4bit",
        ),
        ("o/r", (Format.GGUF, ("plain.gguf",), "plain.gguf", None), "o/r:plain"),
    ],
)
def test_model_names(repo, sel_args, expected):
    from localrun.modelstore.names import validate_model_name
    from localrun.modelstore.refs import Selection

    name = model_name_for(repo, Selection(*sel_args))
    assert name == expected == validate_model_name(name)
