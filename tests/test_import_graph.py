"""The package's import graph (every import, also those inside functions): no cycle, and Dagster only
where the design puts it."""

from __future__ import annotations

import ast
from pathlib import Path

import ones_pipeline

ROOT = Path(ones_pipeline.__file__).parent
PKG = "ones_pipeline"
DAGSTER = ("dagster", "dagster_docker", "dagster_webserver", "dagster_graphql")  # dagster_pipes is the step's side
# Modules outside defs/ that may import Dagster: only the code location (the CLI reaches the instance
# through defs.instance). Listed exactly, so the list can only shrink.
DAGSTER_ALLOWED = {"ones_pipeline.definitions"}
# The live scheduler's plan and the configuration touch no outside system.
OUTSIDE_SYSTEMS = set(DAGSTER) | {"dagster_pipes", "mlflow", "docker", "torch", "pynvml", "sqlalchemy"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(package modules imported, top-level external packages imported) by module ``name``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    inside, outside = set(), set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            if t.split(".")[0] == PKG:
                # The deepest known module the name refers to (``from pkg.mod import func`` -> pkg.mod).
                parts = t.split(".")
                while parts and ".".join(parts) not in known:
                    parts.pop()
                if parts:
                    inside.add(".".join(parts))
            elif t:
                outside.add(t.split(".")[0])
    inside.discard(name)
    return inside, outside


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    mods = _modules()
    known = set(mods)
    edges, external = {}, {}
    for name, path in mods.items():
        inside, outside = _imports(name, path, known)
        # Importing pkg.a.b also runs pkg and pkg.a; those parent edges are not cycles of this module's own
        # making, so only the module itself counts.
        edges[name] = {m for m in inside if not name.startswith(m + ".")}
        external[name] = outside
    return edges, external


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = _cycle(_graph()[0])
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_dagster_only_in_defs_and_the_code_location():
    _, external = _graph()
    users = {m for m, ext in external.items() if set(ext) & set(DAGSTER)}
    outside = {m for m in users if not m.startswith(f"{PKG}.defs")}
    assert outside == DAGSTER_ALLOWED, f"modules outside defs/ importing Dagster: {sorted(outside)}"


def test_scheduler_and_config_import_no_outside_system():
    _, external = _graph()
    offenders = {m: sorted(ext & OUTSIDE_SYSTEMS) for m, ext in external.items()
                 if m.startswith((f"{PKG}.scheduler", f"{PKG}.config")) and ext & OUTSIDE_SYSTEMS}
    assert not offenders, f"scheduler/config modules importing an outside system: {offenders}"
    assert any(m.startswith(f"{PKG}.scheduler") for m in external)  # the package exists and was scanned


def _reached(edges: dict[str, set[str]], start: str) -> set[str]:
    """Every package module importing ``start`` runs (its imports, also those inside functions, and their
    parent packages), ``start`` included."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        parts = n.split(".")
        stack.extend([*edges.get(n, ()), *(".".join(parts[:i]) for i in range(1, len(parts)))])
    return seen & set(edges)


def test_the_training_launcher_never_imports_torch():
    """The launcher (``python -m ones_pipeline.train``) starts the ranks and never trains: torch's import cost
    it 2-3 s on every generation's start (docs/live.md, "What a restart costs")."""
    edges, external = _graph()
    reached = _reached(edges, f"{PKG}.train.__main__")
    assert f"{PKG}.train.launcher" in reached and f"{PKG}.train.placement" in reached
    offenders = sorted(m for m in reached if "torch" in external[m])
    assert not offenders, f"modules the launcher imports that import torch: {offenders}"
    assert "torch" in external[f"{PKG}.train.api"]  # the ranks' side does: the check can see it
