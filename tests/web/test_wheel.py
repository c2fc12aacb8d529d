"""Every file the web page loads ships in the built wheel: the page, the files it names, and the
modules those import (followed from index.html), so an installed localrun serves the whole app."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.support.launch import REPO

pytestmark = pytest.mark.slow

STATIC = REPO / "server" / "web" / "static"
WHEEL_STATIC = "localrun/server/web/static/"


def files_the_page_loads() -> set[str]:
    """index.html, what it names under /web/, and each JavaScript module's imports, transitively."""
    found = {"index.html"}
    pending = re.findall(r'(?:src|href)="/web/([^"/]+)"', (STATIC / "index.html").read_text())
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found.add(name)
        if name.endswith(".js"):
            pending += re.findall(r'from\s+"\./([^"/]+)"', (STATIC / name).read_text())
    return found


def test_every_file_the_page_loads_is_in_the_wheel(tmp_path):
    loads = files_the_page_loads()
    assert {"app.js", "app.css", "chat.js", "markdown.js", "api.js", "machine.js", "convos.js"} <= loads
    # Build from a copy of the tracked sources (the build writes build/ and egg-info where it runs).
    source = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for rel in tracked.splitlines():
        if rel.startswith(("tests/", "benchmarks/", "docs/")) or not (REPO / rel).is_file():
            continue
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, source / rel)
    for name in (p.name for p in STATIC.iterdir()):  # the app's files even before they are committed
        shutil.copy2(STATIC / name, source / "server" / "web" / "static" / name)
    out = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    [wheel] = out.glob("localrun-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n[len(WHEEL_STATIC) :] for n in names if n.startswith(WHEEL_STATIC)}
    assert loads <= shipped, loads - shipped
    assert {p.name for p in STATIC.iterdir()} == shipped  # and nothing left behind or extra
    assert "localrun/server/web/routes.py" in names and "localrun/server/web/assets.py" in names
    # The routes the page calls (/v1, /api, /admin) are the server's families: each package ships too.
    families = {p.parent.name for p in (REPO / "server").glob("*/__init__.py")}
    missing = sorted(f for f in families if f"localrun/server/{f}/__init__.py" not in names)
    assert not missing, f"server packages missing from the wheel (pyproject.toml packages): {missing}"
