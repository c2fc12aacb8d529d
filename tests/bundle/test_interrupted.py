"""kill -9 of an import at several points, then the same import again: it continues and ends
in exactly the state of an import that was never interrupted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localrun.modelstore.bundle.export import export_bundle
from localrun.modelstore.bundle.importer import import_bundle
from tests.bundle.conftest import Machine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_model_bundles(tmp_path_factory, tiny_gguf, tiny_gguf_no_template):
    """tiny + tiny2 exported as a folder and a tar, and the state a clean import leaves."""
    mp = pytest.MonkeyPatch()
    try:
        base = tmp_path_factory.mktemp("bundles")
        src = Machine(base / "src", mp)
        store = src.store()
        store.import_path(tiny_gguf, name="tiny")
        store.import_path(tiny_gguf_no_template, name="tiny2")
        export_bundle(store, ["tiny", "tiny2"], base / "b")
        export_bundle(store, ["tiny", "tiny2"], base / "b.tar")
        states = {}
        for form in ("b", "b.tar"):
            clean = Machine(base / f"clean-{form}", mp)
            import_bundle(clean.store(), base / form)
            states[form] = clean.state()
        yield base, states
    finally:
        mp.undo()


@pytest.mark.parametrize(
    "form,point,n",
    [
        ("b.tar", "write", 1),
        ("b.tar", "write", 2),
        ("b.tar", "journal", 1),
        ("b", "journal", 2),
        ("b", "after-journal", 1),
        ("b", "ref", 1),
        ("b.tar", "ref", 2),
        ("b", "index", 1),
        ("b.tar", "index", 1),
    ],
)
def test_kill_9_then_rerun_converges(form, point, n, two_model_bundles, target):
    base, states = two_model_bundles
    child = subprocess.run(
        [sys.executable, "-m", "tests.bundle.import_child", str(base / form), point, str(n)],
        env=target.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, (child.returncode, child.stdout, child.stderr)
    names_after_kill = {r.name for r in target.store().list()}
    assert names_after_kill <= {"tiny", "tiny2"}
    if point == "write":
        assert list(target.hf_cache.rglob("*.bundle-partial")), (
            "the kill should have left a half-written temporary file"
        )
    result = import_bundle(target.store(), base / form)
    assert {r.name for r in result.records} == {"tiny", "tiny2"}
    assert target.state() == states[form]
    if point in ("after-journal", "ref", "index"):
        assert result.reused >= 1 and result.bytes_hashed < sum(r.size for r in result.records)


@pytest.mark.parametrize("form", ["b", "b.tar"])
def test_two_imports_at_once_end_in_the_clean_state(form, two_model_bundles, target):
    base, states = two_model_bundles
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.bundle.import_child", str(base / form), "none", "1"],
            env=target.env(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [c.communicate(timeout=120) for c in children]
    assert [c.returncode for c in children] == [0, 0], outs
    assert all(set(out.split()) == {"tiny", "tiny2"} for out, _ in outs)
    assert target.state() == states[form]
