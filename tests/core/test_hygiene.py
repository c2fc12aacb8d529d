"""Import hygiene and dependency direction (design.md): the core never imports a UI,
runtimes and modelstore never import each other, heavy libraries load lazily."""

from __future__ import annotations

import ast
import json
import re
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
        "print(json.dumps({n: importlib.util.find_spec(n) is not None for n in "
        "('server','tui','runtimes','modelstore')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    found = json.loads(out.stdout)
    assert not any(found.values()), found
    assert _loaded_after("import localrun.server, localrun.tui")  # and the namespaced ones are


# --- The layer table (docs/architecture.md), read from the AST: tests/core/layers.py -----------------

from tests.core import layers as L  # noqa: E402

#: For every row of the table, imports it must refuse: (a module of the layer, the forbidden target).
PLANTED = [
    ("localrun.types", "localrun.chat.template"),
    ("localrun.settings", "localrun.upstreams.config_file"),
    ("localrun.chat.template", "localrun.runtimes.base"),
    ("localrun.chat.reasoning", "localrun.server.errors"),
    ("localrun.runtimes.fake", "localrun.modelstore.store"),
    ("localrun.runtimes.fake", "localrun.planning.planner"),
    ("localrun.modelstore.store", "localrun.runtimes.base"),
    ("localrun.modelstore.store", "localrun.manager"),
    ("localrun.planning.planner", "localrun.manager"),
    ("localrun.planning.planner", "localrun.upstreams.pool"),
    ("localrun.planning.planner", "localrun.runtimes.llamacpp.session"),
    ("localrun.upstreams.pool", "localrun.manager"),
    ("localrun.upstreams.pool", "localrun.worker.host"),
    ("localrun.upstreams.pool", "localrun.planning.planner"),
    ("localrun.worker.host", "localrun.manager"),
    ("localrun.worker.host", "localrun.upstreams.pool"),
    ("localrun.manager", "localrun.server.app"),
    ("localrun.manager", "localrun.tui.app"),
    ("localrun.server.generation", "localrun.runtimes.base"),
    ("localrun.server.generation", "localrun.server.openai.routes"),
    ("localrun.server.app", "localrun.runtimes.base"),
    ("localrun.server.openai.routes", "localrun.server.ollama.routes"),
    ("localrun.server.ollama.routes", "localrun.server.openai.routes"),
    ("localrun.server.anthropic.routes", "localrun.server.openai.routes"),
    ("localrun.server.responses.routes", "localrun.server.openai.routes"),
    ("localrun.server.llama_server.routes", "localrun.server.openai.routes"),
    ("localrun.server.mirror.routes", "localrun.server.ollama.routes"),
    ("localrun.server.mirror.routes", "localrun.manager"),
    ("localrun.server.web.routes", "localrun.server.openai.routes"),
    ("localrun.server.web.routes", "localrun.manager"),
    ("localrun.server.app", "localrun.planning.planner"),
    ("localrun.server.app", "localrun.upstreams.pool"),
    ("localrun.server.app", "localrun.worker.host"),
    ("localrun.server.app", "localrun.manager"),
    ("localrun.server.app", "localrun.tui.app"),
    ("localrun.tui.app", "localrun.runtimes.base"),
    ("localrun.tui.app", "localrun.upstreams.pool"),
    ("localrun.tui.app", "localrun.worker.host"),
    ("localrun.tui.app", "localrun.server.generation"),
    ("localrun.tui.app", "localrun.cli.output"),
]


def test_every_import_keeps_to_the_layer_table():
    found = L.violations(L.package_sources())
    assert not found, "\n".join(found)


def test_no_import_loop_at_import_or_call_time():
    loops = L.cycles(L.import_graph(L.package_sources()))
    assert not loops, loops


def _planted(sources: dict[str, str], module: str, line: str) -> dict[str, str]:
    assert module in sources, module
    return {**sources, module: sources[module] + f"\n\ndef _planted():\n    {line}\n"}


def test_each_row_of_the_table_fails_on_a_planted_violation():
    sources = L.package_sources()
    rows = {L.layer_of(m) for m, _ in PLANTED}
    assert rows == set(L.RULES) - {"cli"}, "every row but the CLI's (which may import anything) is planted"
    for module, target in PLANTED:
        parent, _, leaf = target.rpartition(".")
        for line in (f"import {target}", f"from {parent} import {leaf}"):
            found = L.violations(_planted(sources, module, line), only=[module])
            assert any(f"imports {target} " in f for f in found), (module, line, found)


def test_the_doors_and_type_checking_imports_are_allowed():
    sources = L.package_sources()
    before = set(L.violations(sources))
    for module, line in [
        ("localrun.upstreams.pool", "from localrun.runtimes.openai_compat.client import X"),
        ("localrun.planning.planner", "from localrun.runtimes import REGISTRY"),
        ("localrun.tui.app", "from localrun.server.app import create_app"),
        ("localrun.cli.run", "import localrun.runtimes.llamacpp.session"),
    ]:
        assert not set(L.violations(_planted(sources, module, line), only=[module])) - before, line
    typed = (
        sources["localrun.server.app"]
        + "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import localrun.manager\n"
    )
    assert not set(L.violations({**sources, "localrun.server.app": typed})) - before
    unlayered = set(L.violations({**sources, "localrun.nowhere": ""})) - before
    assert unlayered == {"localrun.nowhere has no layer: add its prefix to the layer table"}


def test_a_planted_loop_is_found():
    sources = _planted(L.package_sources(), "localrun.errors", "import localrun.types")
    sources = _planted(sources, "localrun.types", "from localrun import errors")
    assert ["localrun.errors", "localrun.types"] in L.cycles(L.import_graph(sources))


# --- ruff runs before the tests (scripts/dev test, so .ci/run) ---------------------------------------


def _lint_in(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    """``scripts/dev lint`` over a tree of one file, with this repository's ruff settings and venv."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "dev").write_bytes((ROOT / "scripts" / "dev").read_bytes())
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    (tmp_path / "mod.py").write_text(source)
    return subprocess.run(["bash", str(tmp_path / "scripts" / "dev"), "lint"], capture_output=True, text=True)


def test_lint_passes_a_clean_file_and_fails_planted_violations(tmp_path):
    (tmp_path / "clean").mkdir()
    clean = _lint_in(tmp_path / "clean", "import os\n\nprint(os.sep)\n")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    for name, source in [
        ("unused", "import os\n"),
        ("wide", "# " + "x" * 130 + "\n"),
        ("unformatted", "x = {  'a':1 }\n"),
    ]:
        (tmp_path / name).mkdir()
        bad = _lint_in(tmp_path / name, source)
        assert bad.returncode != 0 and "lint failed" in bad.stderr, (name, bad.stdout, bad.stderr)


def test_lint_fails_complex_functions_and_private_reaches(tmp_path):
    """C901 (15), PLR0912, PLR0915 and SLF001 hold in the package (tests/ and scripts/ may reach)."""
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(16))
    for name, source, code in [
        ("complex", f"def f(x):\n{branches}    return -1\n", "C901"),
        ("private", "class A:\n    _x = 1\n\n\nprint(A()._x)\n", "SLF001"),
    ]:
        (tmp_path / name).mkdir()
        bad = _lint_in(tmp_path / name, source)
        assert bad.returncode != 0 and code in bad.stdout, (name, bad.stdout, bad.stderr)


def test_the_test_command_lints_then_type_checks_then_tests():
    text = (ROOT / "scripts" / "dev").read_text()
    test_branch = text[text.index("  test)") :].split(";;")[0]
    assert test_branch.index("lint") < test_branch.index("typecheck") < test_branch.index("pytest")
    assert "scripts/dev test" in (ROOT / ".ci" / "run").read_text()


# --- mypy, strict, on the installed package names (scripts/typecheck) ---------------------------------

_TINY_PYPROJECT = """
[tool.setuptools]
package-dir = { "pkg" = "pkg", "pkg.sub" = "sub" }

[tool.mypy]
strict = true
cache_dir = ".cache/mypy"
"""


def _typecheck_in(tmp_path: Path, module: str) -> subprocess.CompletedProcess:
    """scripts/typecheck over a two-folder package whose ``pkg.sub`` lives in ``sub/`` (as server/ does)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "typecheck").write_bytes((ROOT / "scripts" / "typecheck").read_bytes())
    (tmp_path / "pyproject.toml").write_text(_TINY_PYPROJECT)
    for folder in ("pkg", "sub"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "sub" / "mod.py").write_text(module)
    (tmp_path / "pkg" / "use.py").write_text("from pkg.sub.mod import twice\n\nFOUR: int = twice(2)\n")
    return subprocess.run([sys.executable, str(tmp_path / "scripts" / "typecheck")], capture_output=True, text=True)


def test_typecheck_follows_package_dir_and_fails_an_untyped_function(tmp_path):
    (tmp_path / "clean").mkdir()
    clean = _typecheck_in(tmp_path / "clean", "def twice(x: int) -> int:\n    return 2 * x\n")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    (tmp_path / "untyped").mkdir()
    bad = _typecheck_in(tmp_path / "untyped", "def twice(x):\n    return 2 * x\n")
    assert bad.returncode != 0, bad.stdout + bad.stderr
    assert "sub/mod.py:1: error" in bad.stdout and "no-untyped-def" in bad.stdout, bad.stdout  # the repo's path


def test_no_module_of_the_package_is_exempt_from_strict_types():
    """Every module is checked under ``strict``: an override may only say that a library ships
    no types (``ignore_missing_imports``), never relax a rule for a module of the package."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True
    relaxed = [
        (m, sorted(set(o) - {"module", "ignore_missing_imports"}))
        for o in config.get("overrides", [])
        for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])
        if m.startswith("localrun") or set(o) - {"module", "ignore_missing_imports"}
    ]
    assert not relaxed, f"these overrides relax mypy's strict rules; type the modules instead: {relaxed}"


# --- Rules on the package's shape ----------------------------------------------------------------------

MAX_MODULE_LINES = 450


def test_no_module_is_over_450_lines():
    long = {
        f"{path.relative_to(ROOT)}: {n}"
        for folder in L.PACKAGE_DIRS
        for path in _py_files(folder)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these by what they are about, not by line count: {sorted(long)}"


FILE_WIDE_ESCAPE = re.compile(r"#\s*(ruff|flake8)\s*:\s*noqa|#\s*mypy\s*:\s*ignore-errors")


def test_no_file_wide_lint_or_type_escape_in_the_package():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in L.PACKAGE_DIRS
        for path in _py_files(folder)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FILE_WIDE_ESCAPE.search(line)
    ]
    assert not found, found


def _runtime_branches(source: str, names: set[str]) -> list[int]:
    """Lines that branch on a runtime's name: a comparison (``==``, ``!=``, ``in``) or a ``match``
    case with a runtime's name as a literal, or a ``…runtime`` value compared with any literal."""

    def named(node: ast.AST) -> bool:
        elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return any(isinstance(e, ast.Constant) and e.value in names for e in elts)

    def literal(node: ast.AST) -> bool:
        elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return bool(elts) and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts)

    def runtime_value(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name.lower().endswith("runtime")

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(map(named, sides)) or (any(map(runtime_value, sides)) and any(map(literal, sides))):
                lines.append(node.lineno)
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            if named(node.pattern.value):
                lines.append(node.pattern.lineno)
    return lines


def _runtime_names() -> set[str]:
    from localrun.runtimes import REGISTRY

    return {*REGISTRY, "upstream"}  # "upstream": the manager's entries served by another engine


def test_no_branch_on_a_runtime_name_outside_the_placement_policies():
    """A runtime's rules live with the runtime (its module, its policy in planning/policies/),
    not in ``if runtime == "…"`` branches elsewhere (shared/style.md, habit 15)."""
    names = _runtime_names()
    found = [
        f"{module}:{line}"
        for module, source in L.package_sources().items()
        if not module.startswith("localrun.planning.policies")
        for line in _runtime_branches(source, names)
    ]
    assert not found, found


def test_a_planted_runtime_branch_is_found():
    names = _runtime_names()
    for source, line in (
        ('if plan.runtime == "llama.cpp":\n    pass\n', 1),
        ('if runtime in ("mlx", "mlc"):\n    pass\n', 1),
        ('if kind != "ollama":\n    pass\n', 1),
        ('if self.runtime == "whatever":\n    pass\n', 1),
        ('match name:\n    case "vllm":\n        pass\n', 2),
    ):
        assert _runtime_branches(source, names) == [line], source
    assert not _runtime_branches("if runtime in REGISTRY and plan.runtime == other:\n    pass\n", names)
