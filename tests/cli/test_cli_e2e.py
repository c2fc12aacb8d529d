"""The CLI as a person uses it, as real subprocesses: import → ls → run → rm, pull from the
(loopback) hub → run → a flipped byte refused by name, and the errors people meet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_llama
from tests.hub.conftest import fake_hub  # noqa: F401  (fixture)


def lr(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "localrun", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"localrun {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@needs_llama
def test_import_ls_run_rm_with_the_tiny_model(tiny_gguf):
    lr("import", str(tiny_gguf), "--name", "tiny")
    rows = json.loads(lr("ls", "--json").stdout)
    assert [r["name"] for r in rows] == ["tiny"] and rows[0]["architecture"] == "llama" and not rows[0]["owned"]
    out = lr("run", "tiny", "hello", "--max-tokens", "5", "--temperature", "0", "--raw")
    assert out.stdout.strip(), "a completion was printed"
    assert "5 tokens" in out.stderr and "tok/s" in out.stderr
    lr("rm", "tiny")
    assert json.loads(lr("ls", "--json").stdout) == []
    assert tiny_gguf.exists(), "rm never deletes a file localrun did not download"


def test_bad_input_gets_a_clear_message_and_exit_code(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    bad = lr("import", str(junk), check=False)
    assert bad.returncode == 4 and "junk.gguf" in bad.stderr and "GGUF" in bad.stderr
    missing = lr("run", "nope", "hi", check=False)
    assert missing.returncode == 3 and "'nope'" in missing.stderr
    assert json.loads(lr("ls", "--json").stdout) == [], "nothing was registered"
    wrong = lr("plan", str(junk), "--runtime", "bogus", check=False)
    assert wrong.returncode != 0 and "bogus" not in wrong.stdout


@needs_llama
@pytest.mark.gemma
def test_gemma_import_and_run_prints_a_continuation(gemma_gguf):
    lr("import", str(gemma_gguf), "--name", "gemma")
    out = lr("run", "gemma", "The capital of France is", "--max-tokens", "8", "--temperature", "0")
    assert len(out.stdout.split()) >= 3 and "8 tokens" in out.stderr  # a base model continues the text
    out = lr("run", "gemma", "The Eiffel Tower is located in the city of", "--max-tokens", "6", "--temperature", "0")
    assert "Paris" in out.stdout


@needs_llama
def test_pull_run_then_a_flipped_byte_is_refused_by_name(fake_hub, tiny_gguf):  # noqa: F811
    fake_hub.add_repo("acme/Tiny-Llama-GGUF", {"tiny-llama-Q4_K_M.gguf": tiny_gguf.read_bytes(), "README.md": b"hi\n"})
    out = lr("pull", "acme/Tiny-Llama-GGUF", "--yes")
    name = out.stdout.split("pulled ", 1)[1].split(" ", 1)[0]
    ran = lr("run", name, "hello", "--max-tokens", "3", "--raw", "--temperature", "0")  # greedy: no EOS by chance
    assert "3 tokens" in ran.stderr
    record = next(r for r in json.loads(lr("ls", "--json").stdout) if r["name"] == name)
    blob = Path(os.path.realpath(record["path"]))
    data = bytearray(blob.read_bytes())
    data[-5] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    refused = lr("run", name, "hello", "--max-tokens", "3", check=False)
    assert refused.returncode == 4 and "no longer matches" in refused.stderr, refused.stderr
    checked = lr("verify", name, check=False)
    assert checked.returncode == 4 and "bad" in checked.stdout and record["path"].split("/")[-1] in checked.stdout


@needs_llama
def test_plan_and_run_take_parallel(tiny_gguf):
    lr("import", str(tiny_gguf), "--name", "tiny")
    auto = json.loads(lr("plan", "tiny", "--json").stdout)["plan"]
    two = json.loads(lr("plan", "tiny", "--json", "--parallel", "2").stdout)["plan"]
    assert auto["options"]["n_slots"] == 4 and two["options"]["n_slots"] == 2
    assert two["options"]["slot_ctx"] == two["n_ctx"] == auto["n_ctx"]
    assert two["memory"]["kv_cache"] * 2 == auto["memory"]["kv_cache"]
    assert "parallel  2 requests at once" in lr("plan", "tiny", "--parallel", "2").stdout
    out = lr("run", "tiny", "hello", "--max-tokens", "3", "--temperature", "0", "--raw", "--parallel", "1")
    assert "3 tokens" in out.stderr
    bad = lr("plan", "tiny", "--parallel", "0", check=False)
    assert bad.returncode == 2 and "--parallel" in bad.stderr


@needs_llama
@pytest.mark.gemma
def test_gemma_chat_through_the_fallback_transcript_ends_at_the_next_turn(gemma_gguf):
    """Gemma 3 270M has no chat template: the transcript's turn labels stop it, even mid-line
    (with this seed it writes "… is Assistant: The capital…" when only a new-line "User:" stops it)."""
    lr("import", str(gemma_gguf), "--name", "gemma")
    out = lr(
        "run",
        "gemma",
        "The capital of France is",
        "--chat",
        "--max-tokens",
        "40",
        "--temperature",
        "0.7",
        "--seed",
        "2",
    )
    assert "Assistant:" not in out.stdout and "User:" not in out.stdout
    assert out.stderr.rstrip().endswith("stop")  # ended at the turn label, not by max_tokens
    out = lr("run", "gemma", "What is the capital of France?", "--chat", "--max-tokens", "60", "--temperature", "0")
    assert "Paris" in out.stdout and out.stderr.rstrip().endswith("stop")
