"""One unit system in the CLI's output: binary (KiB, MiB, GiB), the one `plan` and `hw` give memory
in, for a model's size in `ls`, `show`, `import`, `pull` and `ps` too (issue 33: MB/MiB/kB mixed)."""

from __future__ import annotations

import re

from click.testing import CliRunner

from localrun.cli import main
from localrun.cli.output import human_bytes
from localrun.modelstore.pull import human_size

DECIMAL = re.compile(r"\d (kB|KB|MB|GB|TB)\b")


def test_sizes_are_binary():
    assert human_bytes(None) == "—" and human_bytes(512) == "512 B"
    assert human_bytes(98_400_000) == "93.8 MiB" and human_bytes(253_000_000) == "241 MiB"
    assert human_bytes(4_400_000_000) == "4.1 GiB" and human_bytes(4608) == "4.5 KiB"
    assert human_size(98_400_000) == "93.8 MiB"


def test_ls_show_and_plan_speak_one_unit(tiny_gguf):
    runner = CliRunner()
    imported = runner.invoke(main, ["import", str(tiny_gguf), "--name", "tiny"])
    assert imported.exit_code == 0, imported.output
    for args in (["ls"], ["show", "tiny"], ["plan", "tiny", "--runtime", "llama.cpp"]):
        out = runner.invoke(main, args, env={"COLUMNS": "120"})
        assert out.exit_code == 0, out.output
        assert "iB" in out.output and not DECIMAL.search(out.output), (args, out.output)
    assert not DECIMAL.search(imported.output) and "iB" in imported.output
