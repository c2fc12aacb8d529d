"""Import hygiene and dependency direction (design.md): the core never imports a UI,
runtimes and modelstore never import each other, heavy libraries load lazily."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UI = {"textual", "fastapi", "uvicorn", "starlette"}
HEAVY = {"llama_cpp", "mlx", "mlx_lm", "pynvml", "torch"}


def _loaded_after(imports: str) -> set[str]:
    code = f"import sys, json\n{imports}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    return set(json.loads(out.stdout))


def test_core_imports_load_no_ui_and_no_heavy_library():
    mods = _loaded_after(
        "import localrun, localrun.runtimes, localrun.modelstore, localrun.manager, localrun.types,"
        " localrun.errors, localrun.settings, localrun.worker.host, localrun.runtimes.base"
    )
    assert not (mods & UI), f"UI libraries imported by the core: {mods & UI}"
    assert not (mods & HEAVY), f"heavy libraries imported eagerly: {mods & HEAVY}"


def test_cli_help_path_loads_no_ui_and_no_heavy_library():
    mods = _loaded_after("import localrun.cli")
    assert not (mods & (UI | HEAVY)), mods & (UI | HEAVY)


def _module_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:  # module level only: imports inside functions are the lazy ones
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _py_files(folder: str) -> list[Path]:
    return [p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]


def test_core_runtimes_and_store_never_import_a_ui_at_module_level():
    offenders = []
    for folder in ("localrun", "runtimes", "modelstore"):
        for path in _py_files(folder):
            if "cli" in path.relative_to(ROOT).parts:
                continue
            bad = {m for m in _module_level_imports(path) if m.split(".")[0] in UI}
            if bad:
                offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert not offenders, offenders


def test_runtimes_and_modelstore_do_not_import_each_other():
    offenders = []
    for folder, other in (("runtimes", "localrun.modelstore"), ("modelstore", "localrun.runtimes")):
        for path in _py_files(folder):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                mod = node.module if isinstance(node, ast.ImportFrom) else None
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if any(n and n.startswith(other) for n in [mod, *names]):
                    offenders.append(f"{path.relative_to(ROOT)} imports {other}")
    assert not offenders, offenders


def test_no_plain_server_or_tui_package_is_installed():
    """Outside the checkout, only ``localrun.*`` is importable: no plain ``server`` or ``tui``."""
    code = (
        "import importlib.util, json; "
        "print(json.dumps({n: importlib.util.find_spec(n) is not None for n in ('server','tui','runtimes','modelstore')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    found = json.loads(out.stdout)
    assert not any(found.values()), found
    assert _loaded_after("import localrun.server, localrun.tui")  # and the namespaced ones are
