"""The layer table of docs/architecture.md (and ../shared/layout.md) as data, and the checker
that reads every import of the package from the AST.

Every ``import`` and ``from … import`` counts, at module level and inside functions (a
call-time import is still an arrow), except those under ``if TYPE_CHECKING:``. A module's
layer is the longest prefix of its dotted name in :data:`LAYERS`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The repository's folders and the package each one is installed as (pyproject's package-dir).
PACKAGE_DIRS = {
    "localrun": "localrun",
    "runtimes": "localrun.runtimes",
    "modelstore": "localrun.modelstore",
    "server": "localrun.server",
    "tui": "localrun.tui",
}

#: The server's wire families: each a complete kit (routes, schemas, convert, answers, errors) that
#: imports the shared kit in ``server/`` and never another family.
SERVER_FAMILIES = ("openai", "ollama", "anthropic", "responses", "llama_server", "mirror", "web")
KERNEL = (
    "localrun.types",
    "localrun.chunks",
    "localrun.errors",
    "localrun.settings",
    "localrun.proc",
    "localrun.jsonfile",
    "localrun.frames",
)
#: Module prefix -> layer name. The package root itself (``localrun``: the version) is kernel; its
#: ``__main__`` is the CLI. A module no prefix covers is itself a violation: every module has a layer.
LAYERS = {
    **dict.fromkeys(KERNEL, "kernel"),
    "localrun.__main__": "cli",
    "localrun.chat": "chat",
    "localrun.runtimes": "runtimes",
    "localrun.modelstore": "modelstore",
    "localrun.planning": "planning",
    "localrun.upstreams": "upstreams",
    "localrun.worker": "worker",
    "localrun.manager": "manager",
    "localrun.reload": "manager",  # the manager's reload with a larger context
    "localrun.residency": "manager",  # the manager's table of loaded models
    "localrun.activity": "manager",  # the manager's request log and overflow hints
    "localrun.catalog": "manager",  # what every listing shows of a model (the manager builds it)
    "localrun.server": "server",  # the shared kit: schema primitives, errors, the stream tail
    **{f"localrun.server.{family}": f"server.{family}" for family in SERVER_FAMILIES},
    "localrun.server.app": "server.app",  # the one place that mounts every family's router
    "localrun.tui": "tui",
    "localrun.cli": "cli",
}
#: The runtimes' public doors for L3: the registry (package), the protocol, pieces and the HTTP dialect.
RUNTIME_DOORS = (
    "localrun.runtimes",
    "localrun.runtimes.base",
    "localrun.runtimes.pieces",
    "localrun.runtimes.openai_compat",
)


@dataclass(frozen=True)
class Rule:
    """What one layer may import: whole layers, or only some modules (prefixes) of a layer."""

    layers: frozenset[str]
    modules: tuple[str, ...] = ()


RULES: dict[str, Rule] = {
    "kernel": Rule(frozenset({"kernel"})),
    "chat": Rule(frozenset({"kernel", "chat"})),
    "runtimes": Rule(frozenset({"kernel", "chat", "runtimes"})),
    "modelstore": Rule(frozenset({"kernel", "chat", "modelstore"})),
    # L3: L0-L2, the runtimes only through their doors; never the manager, never each other.
    "planning": Rule(frozenset({"kernel", "chat", "modelstore", "planning"}), RUNTIME_DOORS),
    "upstreams": Rule(frozenset({"kernel", "chat", "modelstore", "upstreams"}), RUNTIME_DOORS),
    "worker": Rule(frozenset({"kernel", "chat", "modelstore", "worker"}), RUNTIME_DOORS),
    "manager": Rule(
        frozenset({"kernel", "chat", "runtimes", "modelstore", "planning", "upstreams", "worker", "manager"})
    ),
    # L5: the manager only as an object (app.state), so not imported; the store for the mirror and pulls.
    # The shared kit reaches the app only to build it (``localrun.server.create_app``, serve.py).
    "server": Rule(frozenset({"kernel", "chat", "modelstore", "server"}), ("localrun.server.app",)),
    **{
        f"server.{family}": Rule(frozenset({"kernel", "chat", "modelstore", "server", f"server.{family}"}))
        for family in SERVER_FAMILIES
    },
    "server.app": Rule(
        frozenset({"kernel", "chat", "modelstore", "server", "server.app", *(f"server.{f}" for f in SERVER_FAMILIES)})
    ),
    "tui": Rule(
        frozenset({"kernel", "chat", "modelstore", "planning", "manager", "tui"}),
        ("localrun.server.app", "localrun.server.serve", "localrun.server"),
    ),
    "cli": Rule(frozenset(LAYERS.values())),
}


def layer_of(module: str) -> str | None:
    if module == "localrun":
        return "kernel"
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    return LAYERS[best] if best else None


def allowed(src_layer: str, target: str) -> bool:
    rule = RULES[src_layer]
    if target == "localrun" or layer_of(target) in rule.layers:
        return True
    # a door names a module exactly (the runtimes package itself) or a package and its modules
    return any(
        target == m or (m != "localrun.runtimes" and m != "localrun.server" and target.startswith(m + "."))
        for m in rule.modules
    )


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    base = PACKAGE_DIRS[parts[0]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([base, *parts[1:]])


def package_sources(root: Path = ROOT) -> dict[str, str]:
    """Every package module's dotted name -> its source text."""
    out = {}
    for folder in PACKAGE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[module_name(path, root)] = path.read_text(encoding="utf-8")
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_runtime(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk that skips ``if TYPE_CHECKING:`` bodies (their imports never run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            yield from (n for o in child.orelse for n in (o, *_walk_runtime(o)))
            continue
        yield child
        yield from _walk_runtime(child)


def imports_of(module: str, source: str, known: Iterable[str]) -> list[tuple[str, int]]:
    """The localrun modules ``module`` imports, with line numbers. ``from pkg import sub`` is the
    submodule when ``pkg.sub`` is a module; otherwise the package."""
    known = set(known)
    is_pkg = any(k.startswith(module + ".") for k in known)
    out = []
    for node in _walk_runtime(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "localrun"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "localrun":
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            out += [(s, node.lineno) for s in subs] or [(target, node.lineno)]
    return out


def violations(sources: Mapping[str, str], only: Iterable[str] | None = None) -> list[str]:
    """One line per import that breaks the table: ``module:line imports target (layer -> layer)``;
    of the ``only`` modules when given (a planted import is checked without re-reading the rest)."""
    found = []
    for module in sources if only is None else only:
        source = sources[module]
        src_layer = layer_of(module)
        if src_layer is None:
            found.append(f"{module} has no layer: add its prefix to the layer table")
            continue
        for target, line in imports_of(module, source, sources):
            if not allowed(src_layer, target):
                found.append(f"{module}:{line} imports {target} ({src_layer} -> {layer_of(target)})")
    return found


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in sources}
    for module, source in sources.items():
        for target, _ in imports_of(module, source, sources):
            if target in sources and target != module:
                graph[module].add(target)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
